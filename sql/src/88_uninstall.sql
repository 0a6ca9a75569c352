-- Uninstall (since 0.9.0): removes what postbox made and nothing else.

-- The comment on the roles an install created.
CREATE FUNCTION postbox._role_mark() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'created by postbox; postbox.uninstall() drops it'::text
$$;

-- Removes postbox from this database: its pg_cron job, its capture triggers,
-- the schema with everything in it (the extension, when installed as one) and
-- postbox's roles, those an install created (their comment says so: roles
-- belong to the cluster, and one made by hand is not postbox's to drop). A
-- role still needed elsewhere (postbox in another database, privileges or
-- objects of its own) is kept and named in the result: the last uninstall in
-- the cluster drops it.
-- Returns {"cron_jobs", "captures", "dropped_roles", "kept_roles"}. For the
-- schema's owner only; the owner needs CREATEROLE to drop the roles.
CREATE FUNCTION postbox.uninstall() RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    cron_jobs integer := postbox.stop();
    captures integer := 0;
    captured regclass;
    roles text[] := ARRAY(SELECT r.rolname FROM pg_catalog.pg_roles r
                          WHERE r.rolname IN ('postbox_admin', 'postbox_reader', 'postbox_writer')
                                AND pg_catalog.shobj_description(r.oid, 'pg_authid') = postbox._role_mark()
                          ORDER BY r.rolname);
    role_name text;
    dropped text[] := '{}';
    kept text[] := '{}';
BEGIN
    FOR captured IN SELECT c.captured_table FROM postbox.captures c LOOP
        PERFORM postbox.release(captured);
        captures := captures + 1;
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'postbox') THEN
        DROP EXTENSION postbox CASCADE;
    END IF;
    DROP SCHEMA IF EXISTS postbox CASCADE;
    FOREACH role_name IN ARRAY roles LOOP
        CONTINUE WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = role_name);
        BEGIN
            EXECUTE format('DROP ROLE %I', role_name);
            dropped := dropped || role_name;
        EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN
            RAISE NOTICE 'postbox: role % is kept: %', role_name, SQLERRM;
            kept := kept || role_name;
        END;
    END LOOP;
    RETURN jsonb_build_object('cron_jobs', cron_jobs, 'captures', captures,
                              'dropped_roles', to_jsonb(dropped), 'kept_roles', to_jsonb(kept));
END
$$;
