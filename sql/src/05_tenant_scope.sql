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
-- with every role either belongs to, directly or not (pg_auth_members, not
-- pg_has_role, which makes a superuser a member of every role). A login role
-- may only SET ROLE to roles it belongs to, so it cannot shed its binding
-- that way; a superuser that sets a bound role acts for that role's tenant.
-- 42501 when the caller is bound to two tenants, or is bound and belongs to
-- postbox_admin, whose functions and table rights cross tenants. Costs one
-- look at an empty table while no role is bound.
CREATE FUNCTION postbox._caller_tenant() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    bound text[];
    admin boolean;
BEGIN
    IF NOT EXISTS (SELECT FROM postbox.tenant_roles) THEN
        RETURN NULL;
    END IF;
    WITH RECURSIVE held(oid) AS (
        SELECT r.oid FROM pg_catalog.pg_roles r
        WHERE r.rolname = session_user OR r.rolname = nullif(current_setting('role'), 'none')
        UNION
        SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN held h ON m.member = h.oid
    )
    SELECT array_agg(DISTINCT b.tenant_name) FILTER (WHERE b.tenant_name IS NOT NULL),
           bool_or(r.rolname = 'postbox_admin')
    INTO bound, admin
    FROM held h JOIN pg_catalog.pg_roles r ON r.oid = h.oid
    LEFT JOIN postbox.tenant_roles b ON b.role_name = r.rolname;
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
