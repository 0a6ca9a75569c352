-- Uninstall (since 0.9.0): removes what postbox made and nothing else.

-- The roles this database's install created (see 90_security.sql): roles
-- belong to the cluster, so one that existed before, made by hand or by an
-- install in another database, is not this install's to drop.
CREATE TABLE postbox.installed_roles (
    role_name text PRIMARY KEY
);

-- Removes postbox from this database: its pg_cron job, its capture triggers,
-- the schema with everything in it (the extension, when installed as one) and
-- the roles the install created. A role still needed elsewhere (privileges in
-- another database, or objects it owns) is kept, and named in the result.
-- Returns {"cron_jobs", "captures", "dropped_roles", "kept_roles"}. For the
-- schema's owner only; the owner needs CREATEROLE to drop the roles.
CREATE FUNCTION postbox.uninstall() RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    cron_jobs integer := postbox.stop();
    captures integer := 0;
    captured regclass;
    roles text[] := ARRAY(SELECT i.role_name FROM postbox.installed_roles i
                          WHERE i.role_name IN ('postbox_admin', 'postbox_reader', 'postbox_writer')
                          ORDER BY i.role_name);
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
