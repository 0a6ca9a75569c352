-- Roles for direct SQL users (since 0.8.0), who call the engine from their own
-- transactions: postbox_reader (stats, peek, get and list), postbox_writer
-- (send and publish) and postbox_admin (everything). Grant them to login
-- roles, e.g. GRANT postbox_writer TO app. Roles belong to the cluster, so a
-- second database reuses them (the roles an install created say so in their
-- comment, for uninstall). A script run by a role that may
-- not create roles skips them with a notice; then only the owner can call the
-- engine.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['postbox_reader', 'postbox_writer', 'postbox_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = role_name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXECUTE format('COMMENT ON ROLE %I IS %L', role_name, postbox._role_mark());
        END IF;
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'postbox: roles postbox_reader, postbox_writer and postbox_admin were not created (%); '
                 'only the owner of schema postbox can call its functions', SQLERRM;
END
$$;

-- Gives the engine's functions their privileges, and makes each public one
-- SECURITY DEFINER with a fixed search_path: a reader or writer then needs no
-- right on the tables (a writer can call send, not insert rows of its own), and
-- no schema of the caller's can shadow a function or operator the engine uses.
-- Pure (IMMUTABLE) functions and internal ones (named "_...") stay as they are:
-- they run inside a public function, whose path is fixed already, and a SET
-- clause would keep the planner from inlining them. CREATE OR REPLACE resets
-- a function's settings, so every install and upgrade script ends by calling
-- this. start, stop, uninstall, capture and release stay the owner's (since
-- 0.9.0): they schedule jobs, drop the engine and add triggers to tables.
CREATE FUNCTION postbox._secure() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    roles boolean := (SELECT count(*) = 3 FROM pg_catalog.pg_roles
                      WHERE rolname IN ('postbox_reader', 'postbox_writer', 'postbox_admin'));
    owner_only oid[] := array_remove(ARRAY[
        to_regprocedure('postbox.start(interval)'), to_regprocedure('postbox.stop()'),
        to_regprocedure('postbox.uninstall()'), to_regprocedure('postbox.capture(regclass,text,text)'),
        to_regprocedure('postbox.release(regclass)')]::oid[], NULL);
BEGIN
    FOR f IN SELECT p.oid, p.oid::regprocedure AS signature, p.proname AS name, p.provolatile, p.prorettype
             FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.signature);
        IF f.provolatile <> 'i' AND f.prorettype <> 'trigger'::regtype AND left(f.name, 1) <> '_' THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp',
                           f.signature);
        END IF;
        IF roles AND f.oid <> ALL (owner_only) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_admin', f.signature);
            IF f.name IN ('queue_stats', 'queue_metrics', 'queue_rates', 'peek_messages', 'get_message',
                          'list_archived_messages', 'get_queue', 'list_queues', 'list_dead_letter_source_queues', 'list_redrive_tasks',
                          'get_topic', 'list_topics', 'get_subscription', 'list_subscriptions',
                          'list_webhook_deliveries', 'get_schedule', 'list_schedules', 'get_consumer_group',
                          'list_consumer_groups', 'stream_metrics', 'stream_position',
                          'list_stream_dead_letters', 'stream_latency', 'consumer_group_health') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader', f.signature);
            ELSIF f.name IN ('send', 'send_batch', 'publish', 'publish_batch') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_writer', f.signature);
            ELSIF f.name = 'caller_tenant' THEN  -- since 0.9.0: which tenant a bound role acts for
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader, postbox_writer', f.signature);
            END IF;
        END IF;
    END LOOP;
    IF roles THEN
        GRANT USAGE ON SCHEMA postbox TO postbox_reader, postbox_writer, postbox_admin;
        GRANT ALL ON ALL TABLES IN SCHEMA postbox TO postbox_admin;
        GRANT ALL ON ALL SEQUENCES IN SCHEMA postbox TO postbox_admin;
        GRANT SELECT ON postbox.queue_health, postbox.queue_throughput, postbox.stream_health,
                        postbox.stream_rotation TO postbox_reader;
    END IF;
END
$$;

SELECT postbox._secure();

INSERT INTO postbox.schema_version (version) VALUES ('@VERSION@');
