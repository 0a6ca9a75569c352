-- API keys (since 0.7.0). A key authenticates calls to the server (a bearer
-- secret) and to the SQS shim (SigV4). The secret itself never reaches the
-- database: the server stores its SHA-256 (secrets are 256 random bits, so a
-- fast hash is as strong as a slow one) and sigv4_secret, the AWS secret
-- access key derived from it. SigV4 is an HMAC, so its verifier needs a
-- secret-equivalent; a derived one works for SigV4 only, never as a bearer.
-- Every change notifies channel postbox_keys, on which each server process
-- reloads its cache of keys.
CREATE TABLE postbox.api_keys (
    name text PRIMARY KEY,
    secret_sha256 bytea NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    sigv4_secret text NOT NULL,
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Since 0.9.0: the key's rate limits, as the API's RateLimits message in JSON
    -- (proto field names); NULL: none. The server checks the values.
    rate_limits jsonb CHECK (jsonb_typeof(rate_limits) = 'object'),
    -- Since 0.9.0: the tenant the key belongs to (79_tenants.sql); NULL: the
    -- default tenant. Its grants cover that tenant's names only.
    tenant text REFERENCES postbox.tenants (name) ON DELETE CASCADE
);

-- A grant: `permission` on every resource whose name matches `pattern`, where
-- "*" matches any run of characters.
CREATE TABLE postbox.api_key_grants (
    key_name text NOT NULL REFERENCES postbox.api_keys (name) ON DELETE CASCADE ON UPDATE CASCADE,
    permission text NOT NULL CHECK (permission IN ('send', 'receive', 'publish', 'read', 'manage', 'admin')),
    pattern text NOT NULL,
    PRIMARY KEY (key_name, permission, pattern)
);

-- When each key was last used (since 0.9.0). Each server process writes a key's
-- time at most once a minute, for all keys of a flush in one statement. A table
-- of its own, without api_keys' trigger: a write here must not make every
-- server reload its keys. Runtime state: pg_dump leaves its rows out.
CREATE TABLE postbox.api_key_usage (
    key_name text PRIMARY KEY REFERENCES postbox.api_keys (name) ON DELETE CASCADE ON UPDATE CASCADE,
    last_used_at timestamptz NOT NULL
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.api_keys', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.api_key_grants', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- Tells every server process that keys changed; sent on commit, once per statement.
CREATE FUNCTION postbox._keys_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postbox_keys', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON postbox.api_keys
FOR EACH STATEMENT EXECUTE FUNCTION postbox._keys_changed();
CREATE TRIGGER api_key_grants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON postbox.api_key_grants
FOR EACH STATEMENT EXECUTE FUNCTION postbox._keys_changed();
-- The servers cache the tenants' account ids with the keys (the SQS shim's URLs).
CREATE TRIGGER tenants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON postbox.tenants
FOR EACH STATEMENT EXECUTE FUNCTION postbox._keys_changed();

-- The message of a check of grants (parallel arrays of permissions and
-- patterns), or NULL when they are valid: at least one, each permission one
-- of send, receive, publish, read, manage, admin, each pattern 1-80 characters
-- of A-Z, a-z, 0-9, "_", "-", "." and "*".
CREATE FUNCTION postbox.grants_problem(permissions text[], patterns text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN coalesce(cardinality(permissions), 0) = 0 THEN
            'a key needs at least one grant (permission:pattern, e.g. read:*)'
        WHEN cardinality(permissions) <> coalesce(cardinality(patterns), 0) THEN
            'give one pattern per permission'
        WHEN cardinality(permissions) > 100 THEN
            format('a key has %s grants; the limit is 100', cardinality(permissions))
        ELSE (
            SELECT CASE
                WHEN g.permission IS NULL OR g.permission NOT IN ('send', 'receive', 'publish', 'read', 'manage', 'admin') THEN
                    format('permission %s is not one of send, receive, publish, read, manage, admin',
                           quote_literal(left(coalesce(g.permission, ''), 20)))
                WHEN g.pattern IS NULL OR g.pattern = '' THEN
                    format('grant %s needs a resource pattern, e.g. orders-* or *', g.permission)
                WHEN length(g.pattern) > 80 THEN
                    format('pattern of grant %s is %s characters long; the limit is 80', g.permission, length(g.pattern))
                WHEN g.pattern !~ '^[A-Za-z0-9_.*-]+$' THEN
                    format('pattern of grant %s may only contain A-Z, a-z, 0-9, "_", "-", "." and "*"', g.permission)
            END
            FROM unnest(permissions, patterns) AS g (permission, pattern)
            WHERE g.permission IS NULL OR g.permission NOT IN ('send', 'receive', 'publish', 'read', 'manage', 'admin')
               OR g.pattern IS NULL OR g.pattern = '' OR length(g.pattern) > 80 OR g.pattern !~ '^[A-Za-z0-9_.*-]+$'
            LIMIT 1)
    END
$$;

-- A key with its grants, as the API and the server's cache see it.
CREATE TYPE postbox.api_key AS (
    name text,
    secret_sha256 bytea,
    sigv4_secret text,
    expires_at timestamptz,
    created_at timestamptz,
    updated_at timestamptz,
    permissions text[],
    patterns text[],
    last_used_at timestamptz,
    rate_limits jsonb,
    tenant text
);

-- The key of that name with its grants; PB400 for a malformed name, PB404 if there is none.
CREATE FUNCTION postbox._api_key(key_name text) RETURNS postbox.api_key
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k postbox.api_key;
BEGIN
    SELECT a.name, a.secret_sha256, a.sigv4_secret, a.expires_at, a.created_at, a.updated_at,
           array(SELECT g.permission FROM postbox.api_key_grants g WHERE g.key_name = a.name ORDER BY g.permission, g.pattern),
           array(SELECT g.pattern FROM postbox.api_key_grants g WHERE g.key_name = a.name ORDER BY g.permission, g.pattern),
           (SELECT u.last_used_at FROM postbox.api_key_usage u WHERE u.key_name = a.name),
           a.rate_limits, a.tenant
    INTO k FROM postbox.api_keys a WHERE a.name = key_name;
    IF NOT FOUND THEN
        IF postbox.name_problem('key', key_name) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.name_problem('key', key_name));
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('key %s does not exist', quote_literal(key_name));
    END IF;
    RETURN k;
END
$$;

-- The key of that name if it belongs to key_tenant ('': the default tenant;
-- NULL: any); PB404 as for a missing key otherwise, so that a tenant cannot
-- tell another tenant's key from none.
CREATE FUNCTION postbox._tenant_key(key_name text, key_tenant text) RETURNS postbox.api_key
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k postbox.api_key := postbox._api_key(key_name);
BEGIN
    IF key_tenant IS NOT NULL AND coalesce(k.tenant, '') <> key_tenant THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('key %s does not exist', quote_literal(key_name));
    END IF;
    RETURN k;
END
$$;

-- Creates a key from the SHA-256 of its secret and its derived SigV4 secret
-- (the server makes the secret and shows it once), with grants, an optional
-- expiry and optional rate limits, in a tenant ('' or NULL: the default
-- tenant). PB409 if a key of that name exists (key names are unique across
-- tenants: a SigV4 access key id is the name); PB400 for a bad name, grant or
-- an expiry in the past; PB404 if there is no such tenant.
CREATE FUNCTION postbox.create_key(
    key_name text, secret_sha256 bytea, sigv4_secret text, permissions text[], patterns text[],
    expires_at timestamptz DEFAULT NULL, rate_limits jsonb DEFAULT NULL, key_tenant text DEFAULT '')
RETURNS postbox.api_key
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(key_tenant, '') <> '' THEN
        PERFORM postbox._tenant(key_tenant);  -- raises PB400 or PB404
    END IF;
    IF postbox.name_problem('key', key_name) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.name_problem('key', key_name));
    END IF;
    IF postbox.grants_problem(permissions, patterns) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.grants_problem(permissions, patterns));
    END IF;
    IF expires_at <= now() THEN
        PERFORM postbox._invalid('expiry must lie in the future');
    END IF;
    INSERT INTO postbox.api_keys (name, secret_sha256, sigv4_secret, expires_at, rate_limits, tenant)
    VALUES (key_name, secret_sha256, sigv4_secret, expires_at, rate_limits, nullif(key_tenant, ''))
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('key %s already exists', quote_literal(key_name));
    END IF;
    INSERT INTO postbox.api_key_grants (key_name, permission, pattern)
    SELECT DISTINCT key_name, g.permission, g.pattern FROM unnest(permissions, patterns) AS g (permission, pattern);
    RETURN postbox._api_key(key_name);
END
$$;

-- Replaces a key's grants (when `permissions` is not NULL), its expiry (when
-- set_expiry; NULL expires_at: never) and/or its rate limits (when
-- set_rate_limits; NULL: none). PB404 if there is no such key in key_tenant
-- ('': the default tenant; NULL: any).
CREATE FUNCTION postbox.update_key(
    key_name text, permissions text[], patterns text[], set_expiry boolean, expires_at timestamptz,
    set_rate_limits boolean DEFAULT false, rate_limits jsonb DEFAULT NULL, key_tenant text DEFAULT NULL)
RETURNS postbox.api_key
LANGUAGE plpgsql AS $$
DECLARE
    k postbox.api_key;
BEGIN
    PERFORM 1 FROM postbox.api_keys a WHERE a.name = key_name FOR UPDATE;
    k := postbox._tenant_key(key_name, key_tenant);  -- raises PB400 or PB404
    IF permissions IS NOT NULL THEN
        IF postbox.grants_problem(permissions, patterns) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.grants_problem(permissions, patterns));
        END IF;
        DELETE FROM postbox.api_key_grants g WHERE g.key_name = update_key.key_name;
        INSERT INTO postbox.api_key_grants (key_name, permission, pattern)
        SELECT DISTINCT update_key.key_name, g.permission, g.pattern
        FROM unnest(permissions, patterns) AS g (permission, pattern);
    END IF;
    IF set_expiry THEN
        IF expires_at <= now() THEN
            PERFORM postbox._invalid('expiry must lie in the future');
        END IF;
        UPDATE postbox.api_keys a SET expires_at = update_key.expires_at WHERE a.name = key_name;
    END IF;
    IF set_rate_limits THEN
        UPDATE postbox.api_keys a SET rate_limits = update_key.rate_limits WHERE a.name = key_name;
    END IF;
    UPDATE postbox.api_keys a SET updated_at = now() WHERE a.name = key_name;
    RETURN postbox._api_key(key_name);
END
$$;

-- The key of that name in key_tenant ('': the default tenant; NULL: any);
-- PB404 if there is none.
CREATE FUNCTION postbox.get_key(key_name text, key_tenant text DEFAULT NULL) RETURNS postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT postbox._tenant_key(key_name, key_tenant)
$$;

-- Keys of key_tenant ('': the default tenant; NULL: all) in name order after
-- after_name, page_size of them.
CREATE FUNCTION postbox.list_keys(page_size integer DEFAULT 100, after_name text DEFAULT '',
                                  key_tenant text DEFAULT NULL)
RETURNS SETOF postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT (postbox._api_key(a.name)).*
    FROM postbox.api_keys a
    WHERE a.name > coalesce(after_name, '')
      AND (key_tenant IS NULL OR coalesce(a.tenant, '') = key_tenant)
    ORDER BY a.name LIMIT page_size
$$;

-- Every key with its grants: what a server process caches.
CREATE FUNCTION postbox.all_keys() RETURNS SETOF postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT a.name, a.secret_sha256, a.sigv4_secret, a.expires_at, a.created_at, a.updated_at,
           coalesce(array_agg(g.permission ORDER BY g.permission, g.pattern) FILTER (WHERE g.permission IS NOT NULL), '{}'),
           coalesce(array_agg(g.pattern ORDER BY g.permission, g.pattern) FILTER (WHERE g.permission IS NOT NULL), '{}'),
           NULL::timestamptz,  -- the cache checks calls; it has no use for the last use
           a.rate_limits, a.tenant
    FROM postbox.api_keys a LEFT JOIN postbox.api_key_grants g ON g.key_name = a.name
    GROUP BY a.name
$$;

-- The tenants with rate limits and those limits (since 0.9.0): the servers cache
-- them with the keys (a change to a tenant notifies postbox_keys too), and
-- every call of a tenant's key counts against them as well as the key's.
CREATE FUNCTION postbox.tenant_rate_limits() RETURNS TABLE (tenant_name text, rate_limits jsonb)
LANGUAGE sql STABLE AS $$
    SELECT t.name, t.rate_limits FROM postbox.tenants t WHERE t.rate_limits IS NOT NULL
$$;

-- Records when keys were last used: key_names[i] at used_at[i]. A time older
-- than the one stored leaves it (several servers flush out of order); keys
-- deleted meanwhile are skipped.
CREATE FUNCTION postbox.record_key_use(key_names text[], used_at timestamptz[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO postbox.api_key_usage AS u (key_name, last_used_at)
    SELECT a.name, max(x.used_at)
    FROM unnest(key_names, used_at) AS x (key_name, used_at)
    JOIN postbox.api_keys a ON a.name = x.key_name
    GROUP BY a.name
    ON CONFLICT (key_name) DO UPDATE SET last_used_at = greatest(u.last_used_at, excluded.last_used_at)
$$;

-- Revokes a key: deleted, it stops working on every server within a second.
-- PB404 if there is no such key in key_tenant ('': the default tenant; NULL: any).
CREATE FUNCTION postbox.delete_key(key_name text, key_tenant text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM postbox._tenant_key(key_name, key_tenant);  -- raises PB400 or PB404
    DELETE FROM postbox.api_keys a WHERE a.name = key_name;
END
$$;
