-- Tenants (since 0.9.0). A tenant is a namespace: its queues, topics and
-- schedules are named <tenant>/<name>, and its API keys (api_keys.tenant) reach
-- only those. The default tenant has no row: its resources are the names
-- without "/", its keys have no tenant. account_id is the AWS account id the
-- SQS and SNS shim shows in the tenant's queue URLs and ARNs. The max_ columns
-- are its quotas (NULL: no limit): queues and topics it may own, checked here
-- as it creates one, and messages and bytes of message bodies its queues may
-- hold, which the servers check on each send against postbox.tenant_usage.
-- rate_limits (since 0.9.0) are shared by all its keys, as the API's RateLimits
-- message in JSON (proto field names); NULL: none. The server checks the values.
CREATE TABLE postbox.tenants (
    name text PRIMARY KEY,
    account_id text NOT NULL UNIQUE,
    description text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    max_queues bigint,
    max_topics bigint,
    max_messages bigint,
    max_bytes bigint,
    rate_limits jsonb CHECK (jsonb_typeof(rate_limits) = 'object')
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.tenants', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- The message of a check of a tenant's fields, or NULL when they are valid: a
-- name of 1-32 characters of a-z, 0-9 and "-", starting with a letter or digit;
-- an account id of 12 digits; a description of at most 256 characters.
CREATE FUNCTION postbox.tenant_problem(tenant_name text, account_id text DEFAULT '000000000001',
                                       description text DEFAULT '') RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN tenant_name IS NULL OR tenant_name = '' THEN 'tenant name is required'
        WHEN length(tenant_name) > 32 THEN
            format('tenant name is %s characters long; the limit is 32', length(tenant_name))
        WHEN tenant_name !~ '^[a-z0-9][a-z0-9-]*$' THEN
            'tenant name may only contain a-z, 0-9 and "-", and must start with a letter or digit'
        WHEN account_id IS NULL OR account_id !~ '^[0-9]{12}$' THEN
            'account_id must be 12 digits, as an AWS account id'
        WHEN length(coalesce(description, '')) > 256 THEN
            format('description is %s characters long; the limit is 256', length(description))
    END
$$;

-- The tenant of that name; PB400 for a malformed name, PB404 if there is none.
CREATE FUNCTION postbox._tenant(tenant_name text) RETURNS postbox.tenants
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.tenants;
BEGIN
    SELECT * INTO t FROM postbox.tenants WHERE name = tenant_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.tenant_problem(tenant_name))
        WHERE postbox.tenant_problem(tenant_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('tenant %s does not exist', quote_literal(tenant_name));
    END IF;
    RETURN t;
END
$$;

-- The message of a check of a tenant's quota, or NULL when it is valid: a
-- JSON object of any of max_queues and max_topics (0 to 1,000,000),
-- max_messages (0 to 10^12) and max_bytes (0 to 2^50, a pebibyte), each a
-- whole number; 0: no limit.
CREATE FUNCTION postbox.tenant_quota_problem(quota jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    field text;
    value jsonb;
    ceiling numeric;
BEGIN
    IF quota IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(quota) <> 'object' THEN
        RETURN 'quota must be an object of max_queues, max_topics, max_messages and max_bytes';
    END IF;
    FOR field, value IN SELECT * FROM jsonb_each(quota) LOOP
        ceiling := CASE field WHEN 'max_queues' THEN 1000000 WHEN 'max_topics' THEN 1000000
                              WHEN 'max_messages' THEN 1000000000000 WHEN 'max_bytes' THEN 1125899906842624 END;
        IF ceiling IS NULL THEN
            RETURN format('quota has no field %s: give any of max_queues, max_topics, max_messages and max_bytes',
                          postbox._quoted(field));
        END IF;
        IF jsonb_typeof(value) <> 'number' OR value::text::numeric <> trunc(value::text::numeric)
           OR value::text::numeric NOT BETWEEN 0 AND ceiling THEN
            RETURN format('quota.%s is %s; give a whole number from 0 (no limit) to %s',
                          field, postbox._quoted(value::text), ceiling);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- The tenant with the quota fields present in `quota` set (0: no limit);
-- PB400 for a bad quota.
CREATE FUNCTION postbox._with_quota(t postbox.tenants, quota jsonb) RETURNS postbox.tenants
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM postbox._invalid(postbox.tenant_quota_problem(quota))
    WHERE postbox.tenant_quota_problem(quota) IS NOT NULL;
    IF quota ? 'max_queues' THEN
        t.max_queues := nullif((quota ->> 'max_queues')::bigint, 0);
    END IF;
    IF quota ? 'max_topics' THEN
        t.max_topics := nullif((quota ->> 'max_topics')::bigint, 0);
    END IF;
    IF quota ? 'max_messages' THEN
        t.max_messages := nullif((quota ->> 'max_messages')::bigint, 0);
    END IF;
    IF quota ? 'max_bytes' THEN
        t.max_bytes := nullif((quota ->> 'max_bytes')::bigint, 0);
    END IF;
    RETURN t;
END
$$;

-- Creates a tenant. Without an account id it gets a random one no other
-- tenant has. quota: see tenant_quota_problem; rate_limits: shared by its
-- keys, NULL for none (both since 0.9.0). PB409 if the name or the account id
-- is taken; PB400 for bad fields.
CREATE FUNCTION postbox.create_tenant(tenant_name text, account_id text DEFAULT NULL, description text DEFAULT '',
                                      quota jsonb DEFAULT NULL, rate_limits jsonb DEFAULT NULL)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._with_quota(NULL, quota);
    chosen text := nullif(account_id, '');
BEGIN
    WHILE chosen IS NULL LOOP
        chosen := lpad((floor(random() * 1e12))::bigint::text, 12, '0');
        IF chosen = '000000000000' OR EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
            chosen := NULL;
        END IF;
    END LOOP;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, chosen, description))
    WHERE postbox.tenant_problem(tenant_name, chosen, description) IS NOT NULL;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.name = tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s already exists', quote_literal(tenant_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', chosen);
    END IF;
    INSERT INTO postbox.tenants (name, account_id, description, max_queues, max_topics, max_messages, max_bytes,
                                 rate_limits)
    VALUES (tenant_name, chosen, coalesce(description, ''), t.max_queues, t.max_topics, t.max_messages, t.max_bytes,
            create_tenant.rate_limits)
    RETURNING * INTO t;
    RETURN t;
EXCEPTION WHEN unique_violation THEN  -- created meanwhile
    RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s or account id %s exists already',
                                                              quote_literal(tenant_name), chosen);
END
$$;

CREATE FUNCTION postbox.get_tenant(tenant_name text) RETURNS postbox.tenants
LANGUAGE sql STABLE AS $$
    SELECT postbox._tenant(tenant_name)
$$;

-- Tenants in name order after after_name, page_size of them.
CREATE FUNCTION postbox.list_tenants(page_size integer DEFAULT 100, after_name text DEFAULT '')
RETURNS SETOF postbox.tenants
LANGUAGE sql STABLE AS $$
    SELECT * FROM postbox.tenants WHERE name > coalesce(after_name, '') ORDER BY name LIMIT page_size
$$;

-- Changes a tenant's account id (when set_account_id) and/or its description
-- (when set_description), the quota fields present in quota and its rate
-- limits (when set_rate_limits; NULL: none) (both since 0.9.0). PB404 if
-- there is none, PB409 if the account id is taken.
CREATE FUNCTION postbox.update_tenant(tenant_name text, set_account_id boolean, account_id text,
                                      set_description boolean, description text, quota jsonb DEFAULT NULL,
                                      set_rate_limits boolean DEFAULT false, rate_limits jsonb DEFAULT NULL)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
BEGIN
    IF set_account_id THEN
        t.account_id := account_id;
    END IF;
    IF set_description THEN
        t.description := coalesce(description, '');
    END IF;
    IF set_rate_limits THEN
        t.rate_limits := update_tenant.rate_limits;
    END IF;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, t.account_id, t.description))
    WHERE postbox.tenant_problem(tenant_name, t.account_id, t.description) IS NOT NULL;
    t := postbox._with_quota(t, quota);
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = t.account_id AND x.name <> tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', t.account_id);
    END IF;
    UPDATE postbox.tenants x SET account_id = t.account_id, description = t.description, updated_at = now(),
                                 max_queues = t.max_queues, max_topics = t.max_topics,
                                 max_messages = t.max_messages, max_bytes = t.max_bytes,
                                 rate_limits = t.rate_limits
    WHERE x.name = tenant_name
    RETURNING * INTO t;
    RETURN t;
END
$$;

-- How many queues, topics and schedules a tenant owns (those named <tenant>/...).
CREATE FUNCTION postbox.tenant_resources(tenant_name text)
RETURNS TABLE (queues bigint, topics bigint, schedules bigint)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM postbox.queues q WHERE starts_with(q.name, tenant_name || '/')),
           (SELECT count(*) FROM postbox.topics t WHERE starts_with(t.name, tenant_name || '/')),
           (SELECT count(*) FROM postbox.schedules s WHERE starts_with(s.name, tenant_name || '/'))
$$;

-- Deletes a tenant and its keys. PB412 while it owns queues, topics or
-- schedules, unless force: then they go too, with their messages. PB412 while
-- SQL roles are bound to it (since 0.9.0), force or not: unbound, a role would
-- see every tenant.
CREATE FUNCTION postbox.delete_tenant(tenant_name text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
    owned record;
    prefix text := tenant_name || '/';
    resource text;
    roles text;
BEGIN
    PERFORM 1 FROM postbox.tenants x WHERE x.name = t.name FOR UPDATE;
    SELECT string_agg(quote_ident(b.role_name), ', ' ORDER BY b.role_name) INTO roles
    FROM postbox.tenant_roles b WHERE b.tenant_name = delete_tenant.tenant_name;
    IF roles IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'tenant %s has SQL roles bound to it (%s); unbind them first (postbox.unbind_tenant_role) or '
            'drop them: an unbound role sees every tenant', quote_literal(tenant_name), roles);
    END IF;
    SELECT * INTO owned FROM postbox.tenant_resources(tenant_name);
    IF owned.queues + owned.topics + owned.schedules > 0 THEN
        IF NOT force THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'tenant %s still owns %s queues, %s topics and %s schedules; delete them first, or pass force',
                quote_literal(tenant_name), owned.queues, owned.topics, owned.schedules);
        END IF;
        FOR resource IN SELECT s.name FROM postbox.schedules s WHERE starts_with(s.name, prefix) ORDER BY s.name LOOP
            PERFORM postbox.delete_schedule(resource);
        END LOOP;
        FOR resource IN SELECT x.name FROM postbox.topics x WHERE starts_with(x.name, prefix) ORDER BY x.name LOOP
            PERFORM postbox.delete_topic(resource);
        END LOOP;
        -- Dead-letter links only join a tenant's own queues (a name never holds
        -- another tenant's), so cutting them lets every queue go.
        UPDATE postbox.queues q SET dead_letter_queue_id = NULL, max_receive_count = NULL
        WHERE starts_with(q.name, prefix) AND q.dead_letter_queue_id IS NOT NULL;
        FOR resource IN SELECT q.name FROM postbox.queues q WHERE starts_with(q.name, prefix) ORDER BY q.name LOOP
            PERFORM postbox.drop_queue(resource);
        END LOOP;
    END IF;
    DELETE FROM postbox.tenants x WHERE x.name = tenant_name;
END
$$;

-- Binds a PostgreSQL role to a tenant (since 0.9.0): the role, and every role
-- that belongs to it, then sees through the reader and writer functions only
-- that tenant's resources, under their own names (see _caller_tenant). A role
-- holds one binding; binding it again moves it. PB404 for an unknown tenant or
-- role; PB400 for a superuser, a role that bypasses row security, the owner of
-- schema postbox, or a member of postbox_admin: none of them can be confined.
CREATE FUNCTION postbox.bind_tenant_role(role_name name, tenant_name text) RETURNS postbox.tenant_roles
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
    r pg_catalog.pg_roles;
    b postbox.tenant_roles;
BEGIN
    SELECT * INTO r FROM pg_catalog.pg_roles x WHERE x.rolname = role_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('role %s does not exist', postbox._quoted(role_name));
    ELSIF r.rolsuper OR r.rolbypassrls THEN
        PERFORM postbox._invalid(format('role %s is a superuser or bypasses row security: it cannot be confined '
                                        'to a tenant', quote_ident(role_name)));
    ELSIF r.oid = (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'postbox') THEN
        PERFORM postbox._invalid(format('role %s owns schema postbox (the servers connect as it): it cannot be '
                                        'confined to a tenant', quote_ident(role_name)));
    ELSIF EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.rolname = 'postbox_admin'
                  AND pg_catalog.pg_has_role(r.oid, a.oid, 'MEMBER')) THEN
        PERFORM postbox._invalid(format('role %s is a member of postbox_admin, whose rights cross tenants: '
                                        'grant it postbox_reader or postbox_writer instead', quote_ident(role_name)));
    END IF;
    INSERT INTO postbox.tenant_roles AS x (role_name, tenant_name) VALUES (role_name, t.name)
    ON CONFLICT ON CONSTRAINT tenant_roles_pkey DO UPDATE SET tenant_name = excluded.tenant_name, created_at = now()
    RETURNING * INTO b;
    RETURN b;
END
$$;

-- Unbinds a role from its tenant: it sees every tenant again. Returns whether
-- it was bound.
CREATE FUNCTION postbox.unbind_tenant_role(role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM postbox.tenant_roles b WHERE b.role_name = unbind_tenant_role.role_name;
    RETURN FOUND;
END
$$;

-- The roles bound to tenants, of one tenant or (NULL) all, in role name order.
CREATE FUNCTION postbox.list_tenant_roles(tenant_name text DEFAULT NULL) RETURNS SETOF postbox.tenant_roles
LANGUAGE sql STABLE AS $$
    SELECT * FROM postbox.tenant_roles b
    WHERE list_tenant_roles.tenant_name IS NULL OR b.tenant_name = list_tenant_roles.tenant_name
    ORDER BY b.role_name
$$;

-- PB429 when the queue or topic (kind) just created as resource_name puts its
-- tenant over its max_queues or max_topics; the error undoes the create. Locks
-- the tenant's row first, so that one tenant's creates count one after another.
-- The default tenant's names (no "/") have no quota.
CREATE FUNCTION postbox._check_resource_quota(kind text, resource_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    tenant_name text := split_part(resource_name, '/', 1);
    quota bigint;
    owned bigint;
BEGIN
    IF strpos(resource_name, '/') = 0 THEN
        RETURN;
    END IF;
    SELECT CASE kind WHEN 'queue' THEN t.max_queues ELSE t.max_topics END INTO quota
    FROM postbox.tenants t WHERE t.name = tenant_name FOR NO KEY UPDATE;
    IF quota IS NULL THEN
        RETURN;
    END IF;
    IF kind = 'queue' THEN
        SELECT count(*) INTO owned FROM postbox.queues q WHERE starts_with(q.name, tenant_name || '/');
    ELSE
        SELECT count(*) INTO owned FROM postbox.topics x WHERE starts_with(x.name, tenant_name || '/');
    END IF;
    IF owned > quota THEN
        RAISE EXCEPTION USING ERRCODE = 'PB429', MESSAGE = format(
            'tenant %s is at its quota of %s %ss (max_%ss); delete one or raise the quota',
            quote_literal(tenant_name), quota, kind, kind);
    END IF;
END
$$;

-- What each tenant held at the last count (see tenant_usage): every server's
-- snapshot comes from here, so the tenants' messages are counted once per
-- interval, not once per server. Runtime state, not in pg_dump.
CREATE TABLE postbox.tenant_usage_counts (
    tenant_name text PRIMARY KEY,
    queues bigint NOT NULL,
    topics bigint NOT NULL,
    messages bigint NOT NULL,
    bytes bigint NOT NULL,
    counted_at timestamptz NOT NULL
);

-- Each tenant's quotas and what it holds: its queues and topics, and the
-- messages in its queues (visible, in flight, delayed, dead letters) with the
-- bytes of their bodies. The figures are those of the last count; one older
-- than max_age is counted again first, in one pass over the tenants' queues'
-- messages (not the default tenant's), by one session at a time (an advisory
-- lock: another returns the last count at once). Every server calls it every
-- --quota-refresh-interval seconds and checks each send against what it got.
CREATE FUNCTION postbox.tenant_usage(max_age interval DEFAULT '0 seconds')
RETURNS TABLE (tenant_name text, max_queues bigint, max_topics bigint, max_messages bigint, max_bytes bigint,
               queues bigint, topics bigint, messages bigint, bytes bigint, counted_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce((SELECT max(c.counted_at) FROM postbox.tenant_usage_counts c) <= now() - max_age, true)
       AND pg_try_advisory_xact_lock(1886350201, 2) THEN
        DELETE FROM postbox.tenant_usage_counts;
        INSERT INTO postbox.tenant_usage_counts (tenant_name, queues, topics, messages, bytes, counted_at)
        WITH owned AS (
            SELECT split_part(q.name, '/', 1) AS tenant_name, q.id
            FROM postbox.queues q WHERE strpos(q.name, '/') > 0
        ), queue_counts AS (
            SELECT o.tenant_name, count(*) AS queues FROM owned o GROUP BY o.tenant_name
        ), topic_counts AS (
            SELECT split_part(x.name, '/', 1) AS tenant_name, count(*) AS topics
            FROM postbox.topics x WHERE strpos(x.name, '/') > 0 GROUP BY 1
        ), stored AS (
            SELECT o.tenant_name, count(*) AS messages, sum(octet_length(m.body)) AS bytes
            FROM owned o JOIN postbox.messages m ON m.queue_id = o.id GROUP BY o.tenant_name
        )
        SELECT t.name, coalesce(qc.queues, 0), coalesce(tc.topics, 0), coalesce(s.messages, 0),
               coalesce(s.bytes, 0)::bigint, now()
        FROM postbox.tenants t
        LEFT JOIN queue_counts qc ON qc.tenant_name = t.name
        LEFT JOIN topic_counts tc ON tc.tenant_name = t.name
        LEFT JOIN stored s ON s.tenant_name = t.name;
    END IF;
    RETURN QUERY
    SELECT t.name, t.max_queues, t.max_topics, t.max_messages, t.max_bytes,
           coalesce(c.queues, 0), coalesce(c.topics, 0), coalesce(c.messages, 0), coalesce(c.bytes, 0),
           c.counted_at
    FROM postbox.tenants t LEFT JOIN postbox.tenant_usage_counts c ON c.tenant_name = t.name
    ORDER BY t.name;
END
$$;
