-- Change data capture (since 0.9.0): a trigger that publishes each row change
-- of a table to a topic in the transaction that makes it, so a rollback
-- publishes nothing.

-- The trigger of capture: publishes {"operation", "schema", "table", "old",
-- "new"} (rows as JSON objects, NULL where the operation has none) to the
-- topic TG_ARGV[0], with routing key "<TG_ARGV[1]>.<insert|update|delete>" (or
-- the operation alone when TG_ARGV[1] is empty) and the table's oid as
-- ordering key (FIFO queues keep each table's changes in order; a table's
-- name may hold characters an ordering key may not). Runs as the schema's
-- owner, so whoever may write the table publishes without rights on postbox.
CREATE FUNCTION postbox._capture() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp AS $$
DECLARE
    operation text := lower(TG_OP);
BEGIN
    PERFORM postbox.publish(
        TG_ARGV[0],
        convert_to(jsonb_build_object(
            'operation', operation, 'schema', TG_TABLE_SCHEMA, 'table', TG_TABLE_NAME,
            'old', CASE WHEN TG_OP IN ('UPDATE', 'DELETE') THEN to_jsonb(OLD) END,
            'new', CASE WHEN TG_OP IN ('INSERT', 'UPDATE') THEN to_jsonb(NEW) END)::text, 'UTF8'),
        CASE WHEN TG_ARGV[1] = '' THEN operation ELSE TG_ARGV[1] || '.' || operation END,
        ordering_key => TG_RELID::text);
    RETURN NULL;
END
$$;

-- The tables capture publishes, with their topic and routing prefix (the
-- trigger's two arguments, each ended by a zero byte in pg_trigger.tgargs).
CREATE VIEW postbox.captures AS
SELECT t.tgrelid::regclass AS captured_table,
       convert_from(substring(t.tgargs FROM 1 FOR a.ends - 1), 'UTF8') AS topic_name,
       convert_from(substring(t.tgargs FROM a.ends + 1 FOR length(t.tgargs) - a.ends - 1), 'UTF8') AS routing_prefix
FROM pg_catalog.pg_trigger t
CROSS JOIN LATERAL (SELECT position('\x00'::bytea IN t.tgargs) AS ends) a
WHERE t.tgfoid = 'postbox._capture()'::regprocedure;

-- Publishes every row inserted into, updated in or deleted from `source` to
-- topic_name, in the same transaction (see _capture): routing key
-- "<routing_prefix>.<insert|update|delete>", or the operation alone. One
-- capture per table: capturing it again replaces the first. PB404 when the
-- topic does not exist, PB400 for a bad prefix or a relation that is not a
-- table. Row by row: a bulk change of N rows publishes N messages. For the
-- schema's owner only.
CREATE FUNCTION postbox.capture(source regclass, topic_name text, routing_prefix text DEFAULT '')
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM postbox._topic(topic_name);
    IF routing_prefix IS NULL OR (routing_prefix <> '' AND postbox.routing_key_problem(routing_prefix) IS NOT NULL) THEN
        PERFORM postbox._invalid(coalesce(postbox.routing_key_problem(routing_prefix),
                                          'routing_prefix must not be NULL; give '''' for none'));
    END IF;
    IF (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = source) NOT IN ('r', 'p')
       OR (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = source) = 'postbox'::regnamespace THEN
        PERFORM postbox._invalid(format('%s is not a table outside schema postbox', source));
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture ON %s', source);
    EXECUTE format('CREATE TRIGGER postbox_capture AFTER INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION postbox._capture(%L, %L)',
                   source, topic_name, routing_prefix);
END
$$;

-- Stops publishing the changes of `source`; false when it was not captured.
-- For the schema's owner only.
CREATE FUNCTION postbox.release(source regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = source AND t.tgfoid = 'postbox._capture()'::regprocedure) THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER postbox_capture ON %s', source);
    RETURN true;
END
$$;
