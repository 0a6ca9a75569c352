-- SQL roles bound to tenants (since 0.9.0). A direct SQL user whose role is
-- bound to a tenant (bind_tenant_role), itself or through a role it belongs
-- to, sees through the reader and writer functions only that tenant's queues,
-- topics and schedules, under their own names: `orders` is the tenant's
-- `acme/orders`, lists show the tenant's resources without the prefix, and
-- another tenant's resource answers as a missing one. An unbound role sees
-- every tenant, as before. Bindings name roles (a role's name survives
-- pg_dump to another cluster, its oid does not): a binding outlives its role,
-- and a new role of that name is bound.
CREATE TABLE postbox.tenant_roles (
    role_name name PRIMARY KEY,
    tenant_name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.tenant_roles', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- The tenant the caller acts for, NULL when it is bound to none. Inside a
-- SECURITY DEFINER function current_user is the engine's owner, so the caller
-- is session_user and, after SET ROLE, the role set (current_setting('role')),
-- each with every role it belongs to, directly or not (pg_has_role's MEMBER,
-- which counts a membership without INHERIT too). A superuser is a member of
-- every role, so it counts only through a role it sets. A login role may only
-- SET ROLE to roles it belongs to, so it cannot shed its binding that way; a
-- superuser that sets a bound role acts for that role's tenant. 42501 when the
-- caller is bound to two tenants, or is bound and belongs to postbox_admin,
-- whose functions and table rights cross tenants. The owner (the servers'
-- role: it cannot be bound) and everyone while no role is bound pay no query
-- of the roles.
CREATE FUNCTION postbox._caller_tenant() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    bound text[];
    admin boolean;
BEGIN
    IF (session_user = current_user AND current_setting('role') = 'none')
       OR NOT EXISTS (SELECT FROM postbox.tenant_roles) THEN
        RETURN NULL;
    END IF;
    -- One statement: each one a plpgsql function runs costs as much as a
    -- send's insert. Bound roles are looked up with to_regrole (NULL for a
    -- dropped role, which then matches nothing).
    SELECT array_agg(DISTINCT b.tenant_name ORDER BY b.tenant_name),
           bool_or(pg_catalog.pg_has_role(c.oid, to_regrole('postbox_admin'), 'MEMBER'))
    INTO bound, admin
    FROM pg_catalog.pg_roles c
    JOIN postbox.tenant_roles b ON pg_catalog.pg_has_role(c.oid, to_regrole(quote_ident(b.role_name)), 'MEMBER')
    WHERE (c.rolname = session_user OR c.rolname = nullif(current_setting('role'), 'none')) AND NOT c.rolsuper;
    IF bound IS NULL THEN
        RETURN NULL;
    ELSIF cardinality(bound) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
            'role %s is bound to tenants %s (itself or through its roles); a role acts for one tenant: '
            'unbind all but one (postbox.unbind_tenant_role)',
            quote_ident(coalesce(nullif(current_setting('role'), 'none'), session_user)),
            array_to_string(bound, ', '));
    ELSIF admin THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
            'role %s is bound to tenant %s and is a member of postbox_admin, whose rights cross tenants: '
            'revoke postbox_admin from it or unbind it',
            quote_ident(coalesce(nullif(current_setting('role'), 'none'), session_user)), bound[1]);
    END IF;
    RETURN bound[1];
END
$$;

-- The tenant the calling role acts for (see _caller_tenant): NULL when it is
-- bound to none and sees every tenant. For readers and writers too.
CREATE FUNCTION postbox.caller_tenant() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT postbox._caller_tenant()
$$;

-- The resource a caller of tenant `tenant` means by resource_name: its own
-- name `orders` is `tenant/orders`, and `tenant/orders` is taken as it is (the
-- engine's functions pass full names to one another). Any other name with "/"
-- is PB400, whether or not it exists, so it tells nothing of other tenants.
-- Unbound (tenant NULL) and NULL names: the name itself.
CREATE FUNCTION postbox._in_tenant(resource_name text, tenant text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF tenant IS NULL OR resource_name IS NULL OR starts_with(resource_name, tenant || '/') THEN
        RETURN resource_name;
    ELSIF strpos(resource_name, '/') > 0 THEN
        PERFORM postbox._invalid(format(
            'name %s has a "/": a role bound to a tenant names its resources without the tenant',
            postbox._quoted(resource_name)));
    END IF;
    RETURN tenant || '/' || resource_name;
END
$$;

-- resource_name as the caller means it (see _in_tenant).
CREATE FUNCTION postbox._scoped_name(resource_name text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT postbox._in_tenant(resource_name, postbox._caller_tenant())
$$;

-- A name as a caller of tenant `tenant` sees it: without the tenant's prefix.
CREATE FUNCTION postbox._shown(resource_name text, tenant text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN tenant IS NOT NULL AND starts_with(resource_name, tenant || '/')
                THEN substr(resource_name, length(tenant) + 2) ELSE resource_name END
$$;

-- The first characters of the names a caller of tenant `tenant` may see:
-- 'tenant/', or '' when unbound. Lists compare names with this || the caller's
-- bounds, so the name index still serves them.
CREATE FUNCTION postbox._tenant_prefix(tenant text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(tenant || '/', '')
$$;
