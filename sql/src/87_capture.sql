-- Change data capture (since 0.9.0): triggers that publish each row change
-- of a table to a topic in the transaction that makes it, so a rollback
-- publishes nothing.

-- The message of one row change: {"operation", "schema", "table", "old",
-- "new"}, rows as JSON objects, NULL where the operation has none.
CREATE FUNCTION postbox._change(operation text, schema_name name, table_name name, old_row jsonb, new_row jsonb)
RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to(jsonb_build_object('operation', operation, 'schema', schema_name, 'table', table_name,
                                         'old', old_row, 'new', new_row)::text, 'UTF8')
$$;

-- The routing key of capture's messages: "<prefix>.<operation>", or the
-- operation alone for the empty prefix.
CREATE FUNCTION postbox._change_key(prefix text, operation text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN prefix = '' THEN operation ELSE prefix || '.' || operation END
$$;

-- Capture's statement trigger for inserts and deletes: publishes the rows of
-- the statement's transition table (postbox_new or postbox_old) to the topic
-- TG_ARGV[0] with routing prefix TG_ARGV[1], a batch of 1000 at a time (a
-- row at a time costs ten times more). The ordering key is the table's oid:
-- FIFO queues keep each table's changes in order (a table's name may hold
-- characters an ordering key may not). Runs as the schema's owner, so whoever
-- may write the table publishes without rights on postbox.
CREATE FUNCTION postbox._capture_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp AS $$
DECLARE
    operation text := lower(TG_OP);
    changed jsonb[];
    bodies bytea[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        changed := ARRAY(SELECT to_jsonb(r) FROM postbox_new r);
    ELSE
        changed := ARRAY(SELECT to_jsonb(r) FROM postbox_old r);
    END IF;
    FOR from_index IN 1 .. coalesce(cardinality(changed), 0) BY 1000 LOOP
        bodies := ARRAY(SELECT postbox._change(operation, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                               CASE WHEN TG_OP = 'DELETE' THEN x.r END,
                                               CASE WHEN TG_OP = 'INSERT' THEN x.r END)
                        FROM unnest(changed[from_index:from_index + 999]) WITH ORDINALITY AS x(r, n) ORDER BY x.n);
        PERFORM postbox.publish_batch(
            TG_ARGV[0], bodies, array_fill(postbox._change_key(TG_ARGV[1], operation), ARRAY[cardinality(bodies)]),
            ordering_keys => array_fill(TG_RELID::text, ARRAY[cardinality(bodies)]));
    END LOOP;
    RETURN NULL;
END
$$;

-- Capture's row trigger for updates, which pair an old row with its new one:
-- publishes one change, as _capture_rows does.
CREATE FUNCTION postbox._capture_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp AS $$
BEGIN
    PERFORM postbox.publish(
        TG_ARGV[0], postbox._change('update', TG_TABLE_SCHEMA, TG_TABLE_NAME, to_jsonb(OLD), to_jsonb(NEW)),
        postbox._change_key(TG_ARGV[1], 'update'), ordering_key => TG_RELID::text);
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
WHERE t.tgfoid = 'postbox._capture_update()'::regprocedure;

-- Publishes every row inserted into, updated in or deleted from `source` to
-- topic_name, in the same transaction: routing key
-- "<routing_prefix>.<insert|update|delete>", or the operation alone, and a
-- body of {"operation", "schema", "table", "old", "new"}. Three triggers,
-- postbox_capture_insert, _update and _delete: inserts and deletes publish a
-- statement's rows in batches, updates one by one. TRUNCATE publishes
-- nothing. One capture per table: capturing it again replaces the first.
-- PB404 when the topic does not exist, PB400 for a bad prefix or a relation
-- that is not a table. For the schema's owner only.
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
    PERFORM postbox.release(source);
    EXECUTE format('CREATE TRIGGER postbox_capture_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS postbox_new '
                   'FOR EACH STATEMENT EXECUTE FUNCTION postbox._capture_rows(%L, %L)',
                   source, topic_name, routing_prefix);
    EXECUTE format('CREATE TRIGGER postbox_capture_update AFTER UPDATE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION postbox._capture_update(%L, %L)',
                   source, topic_name, routing_prefix);
    EXECUTE format('CREATE TRIGGER postbox_capture_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS postbox_old '
                   'FOR EACH STATEMENT EXECUTE FUNCTION postbox._capture_rows(%L, %L)',
                   source, topic_name, routing_prefix);
END
$$;

-- Stops publishing the changes of `source`; false when it was not captured.
-- For the schema's owner only.
CREATE FUNCTION postbox.release(source regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = source AND t.tgfoid = 'postbox._capture_update()'::regprocedure) THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture_insert ON %s', source);
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture_update ON %s', source);
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture_delete ON %s', source);
    RETURN true;
END
$$;
