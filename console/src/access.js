// What the session's key may do, read from its grants with the server's own rules
// (server/postbox_server/auth/keys.py): admin includes everything, manage includes read, and "*" in a
// pattern matches any run of characters. The API still decides every call; this only
// hides what it would refuse.

function gives(held, needed) {
  return held === needed || held === "admin" || (held === "manage" && needed === "read");
}

function patternRegex(pattern) {
  const parts = pattern.split("*").map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  return new RegExp(`^${parts.join(".*")}$`, "s");
}

export function accessOf(session) {
  // No key exists: the console is open, as the API is.
  if (!session.auth) return { can: () => true, holds: () => true, managesTenants: true, name: null };
  const grants = (session.key?.grants ?? []).map((grant) => ({
    permission: grant.permission,
    regex: patternRegex(grant.pattern),
  }));
  const can = (permission, resource) =>
    grants.some((grant) => gives(grant.permission, permission) && grant.regex.test(resource));
  return {
    name: session.key?.name ?? null,
    can,
    holds: (permission) => grants.some((grant) => gives(grant.permission, permission)),
    // Only an admin of the default tenant (which has no name) manages tenants.
    managesTenants: !session.key?.tenant && can("admin", "*"),
  };
}
