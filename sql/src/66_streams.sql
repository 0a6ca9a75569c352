-- Since 0.9.0: stream topics. A topic with a stream_retention keeps every
-- message published to it in one shared, append-only log, beside its queue and
-- webhook subscriptions. Consumer groups read the log through a cursor each, so
-- a publish costs one row however many groups read it, a new group can replay
-- what the log holds, and lag is a count behind the cursor.
--
-- Order. Each row carries the id of the transaction that appended it (tx) and
-- an offset from one sequence. A group reads rows in (tx, offset) order, and
-- only rows whose transaction is older than every transaction still running
-- (tx < xmin of the current snapshot): those rows are final, and every row
-- still to come sorts after them, so a cursor never passes a row that commits
-- later. Offsets grow with publish time; two transactions that overlap may be
-- read in the other order. The price, as Kafka's last stable offset: a
-- transaction that holds a transaction id open (a write, anywhere in the
-- database) holds stream reads back until it ends. A read-only transaction,
-- however long, does not.
--
-- Rotation. The log is a table partitioned in four slots. Appends go to the
-- current slot; rotate_streams retires it once it is older than the rotation
-- period and an empty slot can take over, and TRUNCATEs a retired slot once
-- every consumer group of every topic in it has acknowledged its rows and the
-- topics' retention has passed since the slot was retired. TRUNCATE leaves no
-- dead tuples, whatever the xmin horizon; it waits for its lock at most
-- lock_wait and otherwise tries again on the next pass, so it never holds
-- writers or readers behind a long transaction.
--
-- Consumer groups. One batch of a group is out at a time, under a lease: a
-- group is one cursor, as a Kafka partition is one offset per group, so
-- ordering holds across the whole topic and acknowledging is one update.
-- Readers that want parallelism take larger batches, or more groups.

CREATE SEQUENCE postbox.stream_offsets AS bigint;

CREATE TABLE postbox.stream_log (
    slot smallint NOT NULL,
    topic_id integer NOT NULL,  -- no foreign key: a deleted topic's rows go with their slot
    tx xid8 NOT NULL,
    stream_offset bigint NOT NULL,
    published_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL
) PARTITION BY LIST (slot);
CREATE TABLE postbox.stream_log_0 PARTITION OF postbox.stream_log FOR VALUES IN (0);
CREATE TABLE postbox.stream_log_1 PARTITION OF postbox.stream_log FOR VALUES IN (1);
CREATE TABLE postbox.stream_log_2 PARTITION OF postbox.stream_log FOR VALUES IN (2);
CREATE TABLE postbox.stream_log_3 PARTITION OF postbox.stream_log FOR VALUES IN (3);
-- Reads walk it from a cursor; rotation finds a topic's last row in a slot.
-- published_at rides along: a read finds its batch's end and latency from
-- the index alone, where the visibility map allows.
CREATE INDEX stream_log_position_idx ON postbox.stream_log (topic_id, tx, stream_offset) INCLUDE (published_at);

-- The log's slots: one current (appends go there), the others retired (since
-- `since`, waiting to be truncated) or empty.
CREATE TABLE postbox.stream_slots (
    slot smallint PRIMARY KEY CHECK (slot BETWEEN 0 AND 3),
    state text NOT NULL CHECK (state IN ('current', 'retired', 'empty')),
    since timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX stream_slots_current_idx ON postbox.stream_slots (state) WHERE state = 'current';
INSERT INTO postbox.stream_slots (slot, state) VALUES (0, 'current'), (1, 'empty'), (2, 'empty'), (3, 'empty');

-- A consumer group: a cursor into a stream topic's log, the position (tx,
-- offset) of the last row it acknowledged ((0, 0): before every row), and the
-- batch out now, if any: its lease token and deadline, its last position and
-- how many times it has gone out.
CREATE TABLE postbox.consumer_groups (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id integer NOT NULL REFERENCES postbox.topics (id) ON DELETE CASCADE,
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    cursor_tx xid8 NOT NULL,
    cursor_offset bigint NOT NULL,
    acked_at timestamptz,
    lease uuid,
    lease_expires_at timestamptz,
    lease_end_tx xid8,
    lease_end_offset bigint,
    lease_deliveries integer,
    paused boolean NOT NULL DEFAULT false,  -- reads refused until resume_consumer_group
    -- Deliveries after which a message the group fails on goes to its dead
    -- letters; NULL: never.
    max_deliveries integer CHECK (max_deliveries BETWEEN 1 AND 1000),
    read_at timestamptz,  -- when a batch last went out: stream_health finds stuck groups by it
    UNIQUE (topic_id, name)
) WITH (fillfactor = 50);  -- every read and ack updates the row: room for HOT updates

-- Messages a group's reader gave back (ack_stream's nack_offsets), to go out
-- to the group again from visible_at: a copy of the log's row, since rotation
-- may truncate the log before then. deliveries counts the times it went out
-- to the group; batch is the group's batch it is out with (NULL, or a batch
-- called back by a seek, while it waits). The rest of the group reads on past
-- it: one bad message holds no cursor back.
CREATE TABLE postbox.stream_retries (
    group_id integer NOT NULL REFERENCES postbox.consumer_groups (id) ON DELETE CASCADE,
    stream_offset bigint NOT NULL,
    published_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL,
    deliveries integer NOT NULL,
    visible_at timestamptz NOT NULL,
    batch uuid,
    PRIMARY KEY (group_id, stream_offset)
);
CREATE INDEX stream_retries_due_idx ON postbox.stream_retries (group_id, visible_at);

-- A consumer group's dead letters: messages that went out to the group
-- max_deliveries times and failed the last time too (reason: 'nacked', or
-- 'lease expired' when their batch's lease ran out). A copy of the log's row,
-- as a retry is, with the deliveries it had; kept until replayed or purged.
CREATE TABLE postbox.stream_dead_letters (
    group_id integer NOT NULL REFERENCES postbox.consumer_groups (id) ON DELETE CASCADE,
    stream_offset bigint NOT NULL,
    published_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL,
    deliveries integer NOT NULL,
    dead_at timestamptz NOT NULL DEFAULT now(),
    reason text NOT NULL CHECK (reason IN ('nacked', 'lease expired')),
    PRIMARY KEY (group_id, stream_offset)
);

-- Publish-to-first-read latency of consumer groups: per group and 10-second
-- bucket (of the read), how many of the log's messages its new batches took
-- at each latency, counted in the bins of _stream_latency_bounds. read_stream
-- adds to it once per new batch (not per message); a message going out again
-- is not counted again. Kept for an hour (expire_activity).
CREATE TABLE postbox.stream_latency (
    group_id integer NOT NULL REFERENCES postbox.consumer_groups (id) ON DELETE CASCADE,
    bucket timestamptz NOT NULL,
    counts bigint[] NOT NULL,
    PRIMARY KEY (group_id, bucket)
);

-- The upper bounds, in seconds, of stream_latency's bins, 5 ms to 30 minutes
-- (a bin takes latencies up to and including its bound); a 16th bin takes
-- everything above.
CREATE FUNCTION postbox._stream_latency_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}'::double precision[]
$$;

-- Messages published to a stream topic with a delay (publish_delayed), held
-- here until deliver_at, when they are appended to the log (see
-- _publish_due_streams): until then no consumer group sees them, nor counts
-- them in its lag.
CREATE TABLE postbox.stream_delayed (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id integer NOT NULL REFERENCES postbox.topics (id) ON DELETE CASCADE,
    deliver_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL
);
-- Reads find a topic's due ones, tick and the workers everybody's.
CREATE INDEX stream_delayed_topic_idx ON postbox.stream_delayed (topic_id, deliver_at);
CREATE INDEX stream_delayed_due_idx ON postbox.stream_delayed (deliver_at);

-- The slots' states are not dumped: this script makes them, and a restore that
-- starts them afresh loses nothing (a slot marked empty that holds rows is
-- truncated only once it has been current and then retired).
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_0', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_1', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_2', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_3', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.consumer_groups', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_retries', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_dead_letters', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_delayed', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_latency', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- The message of a check of a stream retention, or NULL when it is NULL (no
-- stream) or from 1 second to 30 days.
CREATE FUNCTION postbox._stream_retention_problem(retention interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('stream_retention must be from 1 second to 30 days, not %s', retention)
    WHERE retention < interval '1 second' OR retention > interval '30 days'
$$;

-- Appends a publish's entries to the stream log (publish_batch calls it for
-- stream topics). The transaction id is taken before any offset, so that every
-- offset this transaction takes sorts after the rows of transactions that
-- finished before it.
CREATE FUNCTION postbox._append_to_stream(topic postbox.topics, publish_ids uuid[], published_at timestamptz,
                                          routing_keys text[], ordering_keys text[], subjects text[],
                                          attributes jsonb[], bodies bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    tx xid8 := pg_current_xact_id();
    problem text;
BEGIN
    SELECT format('%stopic %s is a stream topic: its messages hold at most 1048576 bytes, not %s',
                  postbox._entry_prefix(e.i::integer, cardinality(bodies)), quote_literal(topic.name),
                  postbox.message_size(e.b, e.a))
    INTO problem
    FROM unnest(bodies, attributes) WITH ORDINALITY AS e(b, a, i)
    WHERE postbox.message_size(e.b, e.a) > 1048576
    ORDER BY e.i
    LIMIT 1;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    INSERT INTO postbox.stream_log (slot, topic_id, tx, stream_offset, published_at, publish_id, routing_key,
                                    ordering_key, subject, attributes, body)
    SELECT (SELECT s.slot FROM postbox.stream_slots s WHERE s.state = 'current'), topic.id, tx,
           nextval('postbox.stream_offsets'), published_at, e.id, e.k, e.o, e.s, e.a, e.b
    FROM unnest(publish_ids, routing_keys, ordering_keys, subjects, attributes, bodies) AS e(id, k, o, s, a, b);
END
$$;

-- Publishes a message to a stream topic's log after a delay (0 to 30 days):
-- no consumer group sees it before then. It is appended to the log when it
-- is due, by the first read of one of the topic's groups, a tick or a
-- server's maintenance worker after then, and takes its offset and its
-- published_at at that time: it sorts after what was published before it
-- became due, as if published then. Messages due together go in deliver_at,
-- then publish, order. Only for stream topics without subscriptions (PB412
-- otherwise): queue and webhook subscribers would want it now. With no delay
-- it is appended at once. Returns its publish_id.
CREATE FUNCTION postbox.publish_delayed(topic_name text, body bytea, delay interval, routing_key text DEFAULT '',
                                        attributes jsonb DEFAULT NULL, ordering_key text DEFAULT NULL,
                                        subject text DEFAULT NULL) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics := postbox._stream_topic(topic_name);
    id uuid := gen_random_uuid();
    problem text;
BEGIN
    routing_key := coalesce(routing_key, '');
    problem := CASE
        WHEN delay IS NULL OR delay < interval '0' OR delay > interval '30 days' THEN
            format('delay must be from 0 seconds to 30 days, not %s', coalesce(delay::text, 'NULL'))
        WHEN body IS NULL THEN 'body must not be NULL'
        WHEN length(ordering_key) > 128 OR ordering_key !~ '^[!-~]+$' THEN
            'ordering_key must be 1 to 128 printable ASCII characters'
        WHEN length(subject) > 100 OR subject ~ '[[:cntrl:]]' THEN
            'subject must be at most 100 characters without control characters'
        WHEN routing_key <> '' THEN postbox.routing_key_problem(routing_key)
        WHEN attributes IS NOT NULL THEN postbox._attributes_problem(ARRAY[attributes], 1) END;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF EXISTS (SELECT FROM postbox.subscriptions s WHERE s.topic_id = t.id) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'topic %s has subscriptions: a delayed publish goes to the stream log only, and its queues and '
            'webhooks would not get it; publish without a delay, or send to the queues with one',
            quote_literal(topic_name));
    END IF;
    IF delay = interval '0' THEN
        PERFORM postbox._append_to_stream(t, ARRAY[id], clock_timestamp(), ARRAY[routing_key],
                                          ARRAY[ordering_key], ARRAY[subject], ARRAY[attributes], ARRAY[body]);
        RETURN id;
    END IF;
    IF postbox.message_size(body, attributes) > 1048576 THEN
        PERFORM postbox._invalid(format('topic %s is a stream topic: its messages hold at most 1048576 bytes, not %s',
                                        quote_literal(topic_name), postbox.message_size(body, attributes)));
    END IF;
    INSERT INTO postbox.stream_delayed (topic_id, deliver_at, publish_id, routing_key, ordering_key, subject,
                                        attributes, body)
    VALUES (t.id, now() + delay, id, routing_key, ordering_key, subject, attributes, body);
    RETURN id;
END
$$;

-- Appends up to max_messages delayed messages that are due to their topics'
-- logs, those of topic_id (NULL: of every topic), as one transaction's rows:
-- the transaction id first, then an offset each, in deliver_at then publish
-- order. Rows another session is appending are skipped. A topic that is no
-- stream topic any more drops its own. Returns how many it appended.
CREATE FUNCTION postbox._publish_due_streams(topic_id integer, max_messages integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    tx xid8 := pg_current_xact_id();
    appended integer;
BEGIN
    WITH due AS (
        DELETE FROM postbox.stream_delayed d
        WHERE d.id IN (SELECT x.id FROM postbox.stream_delayed x
                       WHERE x.deliver_at <= now()
                             AND (_publish_due_streams.topic_id IS NULL OR x.topic_id = _publish_due_streams.topic_id)
                       ORDER BY x.deliver_at, x.id
                       LIMIT max_messages
                       FOR UPDATE SKIP LOCKED)
        RETURNING d.*),
    appended_rows AS (
        INSERT INTO postbox.stream_log (slot, topic_id, tx, stream_offset, published_at, publish_id, routing_key,
                                        ordering_key, subject, attributes, body)
        SELECT (SELECT s.slot FROM postbox.stream_slots s WHERE s.state = 'current'), o.topic_id, tx,
               nextval('postbox.stream_offsets'), clock_timestamp(), o.publish_id, o.routing_key, o.ordering_key,
               o.subject, o.attributes, o.body
        FROM (SELECT due.* FROM due JOIN postbox.topics t ON t.id = due.topic_id
              WHERE t.stream_retention IS NOT NULL
              ORDER BY due.deliver_at, due.id) AS o
        RETURNING 1)
    SELECT count(*) INTO appended FROM appended_rows;
    RETURN appended;
END
$$;

-- Appends up to max_messages (1-10000) delayed messages that are due to
-- their topics' logs (see publish_delayed); tick and the servers'
-- maintenance workers run it. Returns how many it appended.
CREATE FUNCTION postbox.publish_due_streams(max_messages integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 10000, not %s', max_messages));
    END IF;
    RETURN postbox._publish_due_streams(NULL, max_messages);
END
$$;

-- The stream topic of that name; PB404 if there is none, PB412 if it is no
-- stream topic.
CREATE FUNCTION postbox._stream_topic(topic_name text) RETURNS postbox.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._topic(topic_name);
BEGIN
    IF t.stream_retention IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'topic %s is not a stream topic: give it a stream_retention first', quote_literal(topic_name));
    END IF;
    RETURN t;
END
$$;

-- The group name, when it keeps the grammar of names; INVALID_ARGUMENT saying
-- what is allowed otherwise. Called first, so a malformed name is refused
-- whatever else the call names (an absent topic included). A well-formed name
-- passes one cached regular expression: name_problem, a SQL function, is
-- parsed and planned at every call (a tenth of a read and ack of 1,000).
CREATE FUNCTION postbox._group_name(group_name text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF length(group_name) <= 80 AND group_name ~ '^[A-Za-z0-9_-]+$' THEN
        RETURN group_name;
    END IF;
    PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
    WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
    RETURN group_name;
END
$$;

-- The consumer group of that name on a stream topic, locked for update;
-- PB404 if there is none. With skip_locked, NULL when another transaction
-- holds it (a concurrent read of the same group).
CREATE FUNCTION postbox._consumer_group(t postbox.topics, group_name text, skip_locked boolean DEFAULT false)
RETURNS postbox.consumer_groups
LANGUAGE plpgsql AS $$
DECLARE
    g postbox.consumer_groups;
BEGIN
    IF skip_locked THEN
        SELECT * INTO g FROM postbox.consumer_groups WHERE topic_id = t.id AND name = group_name
        FOR UPDATE SKIP LOCKED;
    ELSE
        SELECT * INTO g FROM postbox.consumer_groups WHERE topic_id = t.id AND name = group_name FOR UPDATE;
    END IF;
    IF NOT FOUND AND NOT EXISTS (SELECT FROM postbox.consumer_groups WHERE topic_id = t.id AND name = group_name)
    THEN
        PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
        WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(t.name));
    END IF;
    RETURN g;
END
$$;

-- Where a cursor goes to read from a point on: just before the first row (in
-- read order) of the topic with an offset of at least from_offset, or
-- published at from_time or later. Where no such row is in the log yet: the
-- end (see _stream_end). Rows of transactions that overlapped the point may
-- come again: the cursor errs towards reading twice, never towards skipping.
CREATE FUNCTION postbox._stream_position(topic_id integer, from_offset bigint, from_time timestamptz,
                                         OUT tx xid8, OUT stream_offset bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT l.tx, l.stream_offset - 1 INTO tx, stream_offset
    FROM postbox.stream_log l
    WHERE l.topic_id = _stream_position.topic_id
          AND (l.stream_offset >= from_offset OR l.published_at >= from_time)
    ORDER BY l.tx, l.stream_offset
    LIMIT 1;
    IF NOT FOUND THEN
        SELECT e.tx, e.stream_offset INTO tx, stream_offset FROM postbox._stream_end() e;
    END IF;
END
$$;

-- The end of every stream: a cursor here has read every row of a finished
-- transaction, and reads those of transactions still running.
CREATE FUNCTION postbox._stream_end(OUT tx xid8, OUT stream_offset bigint)
LANGUAGE sql STABLE AS $$
    SELECT pg_snapshot_xmin(pg_current_snapshot()), 0::bigint
$$;

-- A consumer group as get_ and list_consumer_groups show it: its cursor (the
-- offset of the last acknowledged row, 0 before any), the batch out now, its
-- lag: the rows of the log past its cursor, and how long ago the first of
-- them was published (0 with none), whether it is paused, how many
-- messages it gave back wait to go out again (retry_messages), its
-- max_deliveries and how many dead letters it holds.
CREATE FUNCTION postbox._consumer_group_view(g postbox.consumer_groups, topic_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE sql STABLE AS $$
    SELECT topic_name, g.name, g.created_at, g.cursor_offset, g.acked_at,
           CASE WHEN g.lease IS NOT NULL THEN g.lease_expires_at END,
           (SELECT count(*) FROM postbox.stream_log l
            WHERE l.topic_id = g.topic_id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)),
           coalesce((SELECT greatest(extract(epoch FROM now() - l.published_at), 0)::double precision
                     FROM postbox.stream_log l
                     WHERE l.topic_id = g.topic_id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                     ORDER BY l.tx, l.stream_offset LIMIT 1), 0),
           g.paused,
           (SELECT count(*) FROM postbox.stream_retries r WHERE r.group_id = g.id),
           g.max_deliveries,
           (SELECT count(*) FROM postbox.stream_dead_letters d WHERE d.group_id = g.id)
$$;

-- The message of a check of a group's max_deliveries, or NULL when it is
-- NULL (never) or from 1 to 1000.
CREATE FUNCTION postbox._max_deliveries_problem(max_deliveries integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('max_deliveries must be from 1 to 1000 (or none: never), not %s', max_deliveries)
    WHERE max_deliveries NOT BETWEEN 1 AND 1000
$$;

-- Creates a consumer group on a stream topic, reading from `start`: earliest
-- (everything the log holds), latest (what is published from now on) or time
-- (what was published at start_time or later; a time in the future is
-- refused), with delivery_limit as its max_deliveries (1-1000, NULL: never;
-- see stream_dead_letters).
-- PB409 if it exists.
CREATE FUNCTION postbox.create_consumer_group(topic_name text, group_name text, start text DEFAULT 'earliest',
                                              start_time timestamptz DEFAULT NULL,
                                              delivery_limit integer DEFAULT NULL)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
    start_at record;
BEGIN
    PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
    WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
    IF start IS NULL OR start NOT IN ('earliest', 'latest', 'time') THEN
        PERFORM postbox._invalid(format('start must be earliest, latest or time, not %s',
                                        coalesce(quote_literal(start), 'NULL')));
    ELSIF (start = 'time') <> (start_time IS NOT NULL) THEN
        PERFORM postbox._invalid('start_time is required with start time, and only with it');
    ELSIF start_time > now() THEN
        PERFORM postbox._invalid(format('start_time %s is in the future', start_time));
    END IF;
    PERFORM postbox._invalid(postbox._max_deliveries_problem(delivery_limit))
    WHERE postbox._max_deliveries_problem(delivery_limit) IS NOT NULL;
    IF start = 'earliest' THEN
        SELECT '0'::xid8 AS tx, 0::bigint AS stream_offset INTO start_at;
    ELSIF start = 'latest' THEN
        SELECT * INTO start_at FROM postbox._stream_end();
    ELSE
        SELECT * INTO start_at FROM postbox._stream_position(t.id, NULL, start_time);
    END IF;
    INSERT INTO postbox.consumer_groups (topic_id, name, cursor_tx, cursor_offset, max_deliveries)
    VALUES (t.id, group_name, start_at.tx, start_at.stream_offset, delivery_limit)
    ON CONFLICT ON CONSTRAINT consumer_groups_topic_id_name_key DO NOTHING
    RETURNING * INTO g;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format(
            'consumer group %s of topic %s already exists', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- A consumer group with its lag; PB404 if there is none.
CREATE FUNCTION postbox.get_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    tenant text := postbox._caller_tenant();
    t postbox.topics := postbox._topic(postbox._in_tenant(topic_name, tenant));
    g postbox.consumer_groups;
BEGIN
    SELECT * INTO g FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
        WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, postbox._shown(t.name, tenant));
END
$$;

-- A topic's consumer groups in name order after after_name, with their lag.
CREATE FUNCTION postbox.list_consumer_groups(topic_name text, page_size integer DEFAULT 100,
                                             after_name text DEFAULT '')
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
    t postbox.topics := postbox._topic(postbox._in_tenant(topic_name, tenant));
BEGIN
    RETURN QUERY
    SELECT v.* FROM postbox.consumer_groups g, LATERAL postbox._consumer_group_view(g, postbox._shown(t.name, tenant)) v
    WHERE g.topic_id = t.id AND g.name > coalesce(after_name, '')
    ORDER BY g.name
    LIMIT page_size;
END
$$;

-- Sets whether a consumer group is paused; the group as get_consumer_group
-- shows it.
CREATE FUNCTION postbox._set_group_paused(topic_name text, group_name text, pause boolean)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
BEGIN
    UPDATE postbox.consumer_groups c SET paused = pause WHERE c.id = g.id RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- Pauses a consumer group (since 0.9.0): its reads fail with PB503 until
-- resume_consumer_group; a batch out now may still be acknowledged. The group
-- keeps its cursor, so rotation keeps the rows past it. Pausing a paused group
-- changes nothing.
CREATE FUNCTION postbox.pause_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE sql AS $$
    SELECT * FROM postbox._set_group_paused(topic_name, group_name, true)
$$;

-- Lets a paused consumer group read again, from its cursor.
CREATE FUNCTION postbox.resume_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE sql AS $$
    SELECT * FROM postbox._set_group_paused(topic_name, group_name, false)
$$;

-- Deletes a consumer group; its rows of the log no longer wait for it.
CREATE FUNCTION postbox.delete_consumer_group(topic_name text, group_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._topic(topic_name), group_name);
BEGIN
    DELETE FROM postbox.consumer_groups WHERE id = g.id;
END
$$;

-- Reads the next batch of a consumer group: up to max_messages (1-1000) rows
-- past its cursor, leased for lease_duration (1 second to 12 hours), with a
-- token (batch) that ack_stream takes. Returns no rows when the group's batch
-- is out with another consumer (its lease running, or a read of the group in
-- progress), when nothing is past the cursor, or, as batch controls, when
-- fewer than min_messages (1 to max_messages) are and the first of them has
-- waited less than max_batch_wait (NULL: no limit). A batch whose lease ran out
-- comes back whole, to the next read, with its delivery_count one higher: a
-- group gets every message at least once. Messages given back (ack_stream's
-- nack_offsets) whose delay has passed lead a new batch, in offset order,
-- whatever the batch controls say (they waited already), each with its own
-- delivery_count (batch_delivery_count is the batch's); new messages of the
-- log fill the rest of it. With max_deliveries, the messages of a batch whose
-- lease ran out that have gone out that many times become dead letters
-- ('lease expired') rather than go out again; the cursor moves past the log's.
-- A read appends its topic's delayed messages that are due to the log (see
-- _publish_due_streams): the next read can have them.
CREATE FUNCTION postbox.read_stream(topic_name text, group_name text, max_messages integer DEFAULT 100,
                                    lease_duration interval DEFAULT '30 seconds', min_messages integer DEFAULT 1,
                                    max_batch_wait interval DEFAULT NULL)
RETURNS TABLE (batch uuid, stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               batch_delivery_count integer)
LANGUAGE plpgsql
-- Plan each statement once per session: the generic plans walk the log's
-- index in its order, where custom plans, re-made at every read, would
-- gather a batch's rows and sort them.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
    horizon xid8;
    waiting integer;
    first_at timestamptz;
    end_tx xid8;
    end_offset bigint;
    due integer := 0;
    previous uuid;
    read_clock timestamptz := clock_timestamp();
    -- The bins' bounds as publish times, oldest first, between -infinity and
    -- infinity: bin i (0 to 15) holds the messages published from
    -- edges[16 - i] to before edges[17 - i].
    edges timestamptz[] := '{-infinity}'::timestamptz[]
                           || ARRAY(SELECT read_clock - b * interval '1 second'
                                    FROM unnest(postbox._stream_latency_bounds()) AS b ORDER BY b DESC)
                           || '{infinity}'::timestamptz[];
    publish_times timestamptz[];
    last_at timestamptz;
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000, not %s', max_messages));
    ELSIF lease_duration IS NULL OR lease_duration < interval '1 second' OR lease_duration > interval '12 hours' THEN
        PERFORM postbox._invalid(format('lease_duration must be from 1 second to 12 hours, not %s', lease_duration));
    ELSIF min_messages IS NULL OR min_messages NOT BETWEEN 1 AND max_messages THEN
        PERFORM postbox._invalid(format('min_messages must be from 1 to max_messages (%s), not %s', max_messages,
                                        min_messages));
    ELSIF max_batch_wait < interval '0' THEN
        PERFORM postbox._invalid(format('max_batch_wait must not be negative, not %s', max_batch_wait));
    END IF;
    g := postbox._consumer_group(t, group_name, skip_locked => true);
    IF g.paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'consumer group %s of topic %s is paused; ResumeConsumerGroup lets reads in again',
            quote_literal(group_name), quote_literal(topic_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.stream_delayed d WHERE d.topic_id = t.id AND d.deliver_at <= now()) THEN
        PERFORM postbox._publish_due_streams(t.id, 1000);
    END IF;
    IF g.id IS NULL OR (g.lease IS NOT NULL AND g.lease_expires_at > now()) THEN
        RETURN;
    END IF;
    IF g.lease IS NOT NULL AND g.max_deliveries IS NOT NULL THEN
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT g.id, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, 'lease expired'
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries
        UNION ALL
        SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
               l.attributes, l.body, g.lease_deliveries, 'lease expired'
        FROM postbox.stream_log l
        WHERE g.lease_deliveries >= g.max_deliveries AND l.topic_id = t.id
              AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
              AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
        DELETE FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries;
        IF g.lease_deliveries >= g.max_deliveries THEN
            -- The batch is done with: a new one goes out, the batch's retries left
            -- under the limit are due in it.
            g.cursor_tx := g.lease_end_tx;
            g.cursor_offset := g.lease_end_offset;
            g.lease := NULL;
            UPDATE postbox.consumer_groups c
            SET cursor_tx = g.cursor_tx, cursor_offset = g.cursor_offset, acked_at = now(), lease = NULL,
                lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
            WHERE c.id = g.id;
        END IF;
    END IF;
    previous := g.lease;
    IF g.lease IS NULL THEN
        -- Given-back messages out with a batch a seek called back wait no longer.
        SELECT count(*) INTO due
        FROM (SELECT FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.visible_at <= now()
              LIMIT max_messages) AS d;
        horizon := pg_snapshot_xmin(pg_current_snapshot());
        -- One walk of the log: what the batch would take, its end (the sorted
        -- sub-select's last row: the aggregates take the rows in its order, an
        -- ORDER BY in them would sort again) and its messages' publish times.
        SELECT count(*), min(r.published_at), max(r.published_at), (array_agg(r.tx))[count(*)],
               (array_agg(r.stream_offset))[count(*)], array_agg(r.published_at)
        INTO waiting, first_at, last_at, g.lease_end_tx, g.lease_end_offset, publish_times
        FROM (SELECT l.tx, l.stream_offset, l.published_at FROM postbox.stream_log l
              WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset) AND l.tx < horizon
              ORDER BY l.tx, l.stream_offset
              LIMIT max_messages - due) AS r;
        IF due = 0 AND (waiting = 0 OR (waiting < min_messages
                                        AND (max_batch_wait IS NULL OR first_at > now() - max_batch_wait))) THEN
            RETURN;
        ELSIF waiting = 0 THEN
            g.lease_end_tx := g.cursor_tx;  -- given-back messages alone: the ack leaves the cursor
            g.lease_end_offset := g.cursor_offset;
        END IF;
        g.lease_deliveries := 0;
    END IF;
    UPDATE postbox.consumer_groups c
    SET lease = gen_random_uuid(), lease_expires_at = now() + lease_duration, lease_end_tx = g.lease_end_tx,
        lease_end_offset = g.lease_end_offset, lease_deliveries = g.lease_deliveries + 1, read_at = now()
    WHERE c.id = g.id
    RETURNING c.lease, c.lease_deliveries INTO g.lease, g.lease_deliveries;
    IF previous IS NULL AND waiting > 0 THEN
        -- The new batch's messages of the log, first read now: their latency.
        -- The oldest and newest message bound the bins that hold any: a bin
        -- that holds both holds the whole batch, one outside them nothing, and
        -- only the others (a batch mostly spans one or two bins) count their
        -- messages.
        INSERT INTO postbox.stream_latency AS s (group_id, bucket, counts)
        SELECT g.id, date_bin('10 seconds', now(), 'epoch'),
               ARRAY(SELECT CASE WHEN first_at >= edges[16 - b.i] AND last_at < edges[17 - b.i] THEN waiting
                                 WHEN first_at >= edges[17 - b.i] OR last_at < edges[16 - b.i] THEN 0
                                 ELSE (SELECT count(*) FROM unnest(publish_times) AS p
                                       WHERE p >= edges[16 - b.i] AND p < edges[17 - b.i]) END
                     FROM generate_series(0, 15) AS b(i) ORDER BY b.i)
        ON CONFLICT ON CONSTRAINT stream_latency_pkey DO UPDATE
        SET counts = ARRAY(SELECT u.x + u.y FROM unnest(s.counts, excluded.counts) WITH ORDINALITY AS u(x, y, k)
                           ORDER BY u.k);
    END IF;
    -- The given-back messages go out with the batch: those that are due to a new
    -- batch, those of the batch whose lease ran out with it again.
    -- Then they go out first, in offset order, and the log's after them in its
    -- order: two statements, each in the order of its index (one over both
    -- would sort the batch, bodies and all).
    IF due > 0 OR previous IS NOT NULL THEN
        UPDATE postbox.stream_retries r SET batch = g.lease, deliveries = r.deliveries + 1
        WHERE r.group_id = g.id
              AND CASE WHEN previous IS NULL
                       THEN r.stream_offset IN (SELECT d.stream_offset FROM postbox.stream_retries d
                                                WHERE d.group_id = g.id AND d.visible_at <= now()
                                                ORDER BY d.stream_offset LIMIT due)
                       ELSE r.batch = previous END;
        RETURN QUERY
        SELECT g.lease, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, g.lease_deliveries
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease
        ORDER BY r.stream_offset;
    END IF;
    RETURN QUERY
    SELECT g.lease, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
           l.attributes, l.body, g.lease_deliveries, g.lease_deliveries
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
    ORDER BY l.tx, l.stream_offset
    LIMIT 1000;  -- a batch's most: with it, the plan walks the index rather than sort
END
$$;

-- Acknowledges a batch of read_stream: the group's cursor moves past it.
-- The messages of the batch whose offsets are in nack_offsets are given back
-- instead (a nack): they go out to the group again, in a later batch, once
-- nack_delay (0 to 12 hours) has passed, while the group reads on; those that
-- have gone out max_deliveries times become dead letters ('nacked'). PB412 when
-- the batch is no longer the group's: its lease ran out and it went out again,
-- it was acknowledged already, or the group was sought since. Returns the
-- group's cursor (the offset of the batch's last row of the log).
CREATE FUNCTION postbox.ack_stream(topic_name text, group_name text, batch uuid,
                                   nack_offsets bigint[] DEFAULT '{}', nack_delay interval DEFAULT '0 seconds')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    g postbox.consumer_groups;
BEGIN
    -- A well-formed group of a stream topic is found and locked in one
    -- statement; anything else takes the checks one by one, for their errors.
    SELECT c.* INTO g
    FROM postbox.consumer_groups c JOIN postbox.topics t ON t.id = c.topic_id
    WHERE t.name = topic_name AND t.stream_retention IS NOT NULL AND c.name = group_name
          AND length(group_name) <= 80 AND group_name ~ '^[A-Za-z0-9_-]+$'
    FOR UPDATE OF c;
    IF NOT FOUND THEN
        PERFORM postbox._group_name(group_name);  -- before any lookup
        g := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    END IF;
    IF batch IS NULL THEN
        PERFORM postbox._invalid('batch is required: the token read_stream returned with the batch');
    ELSIF nack_delay IS NULL OR nack_delay < interval '0' OR nack_delay > interval '12 hours' THEN
        PERFORM postbox._invalid(format('nack_delay must be from 0 seconds to 12 hours, not %s', nack_delay));
    END IF;
    IF g.lease IS DISTINCT FROM batch THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'batch %s is not the batch out of consumer group %s: its lease ran out and it went out again, it was '
            'acknowledged already, or the group was sought since', batch, quote_literal(group_name));
    END IF;
    IF cardinality(nack_offsets) > 0 THEN
        PERFORM postbox._nack_stream(g, batch, nack_offsets, nack_delay);
    END IF;
    -- The batch's given-back messages are done.
    DELETE FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.batch = g.lease;
    UPDATE postbox.consumer_groups
    SET cursor_tx = lease_end_tx, cursor_offset = lease_end_offset, acked_at = now(), lease = NULL,
        lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE id = g.id;
    RETURN g.lease_end_offset;
END
$$;

-- ack_stream's nacks, when it has any: checks that each offset is one of the
-- batch's, copies nacked messages of the log aside to go out again after
-- nack_delay, lets nacked ones that were given back before wait again, and
-- moves those out of deliveries to the dead letters. The rest of the batch's
-- given-back messages are left to ack_stream to delete.
CREATE FUNCTION postbox._nack_stream(g postbox.consumer_groups, batch uuid, nack_offsets bigint[],
                                     nack_delay interval) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    stray bigint;
BEGIN
    SELECT o INTO stray FROM unnest(nack_offsets) AS o
    WHERE o IS NULL
          OR (NOT EXISTS (SELECT FROM postbox.stream_retries r
                          WHERE r.group_id = g.id AND r.batch = g.lease AND r.stream_offset = o)
              AND NOT EXISTS (SELECT FROM postbox.stream_log l
                              WHERE l.topic_id = g.topic_id AND l.stream_offset = o
                                    AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                                    AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)))
    LIMIT 1;
    IF FOUND THEN
        PERFORM postbox._invalid(format('nack_offsets: %s is not the offset of a message of batch %s',
                                        coalesce(stray::text, 'NULL'), batch));
    END IF;
    -- Nacked messages of the log are copied aside; nacked ones that were given
    -- back before wait again. Then the nacked ones out of deliveries go on to
    -- the dead letters.
    INSERT INTO postbox.stream_retries AS r (group_id, stream_offset, published_at, publish_id, routing_key,
                                             ordering_key, subject, attributes, body, deliveries, visible_at)
    SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
           l.attributes, l.body, g.lease_deliveries, now() + nack_delay
    FROM postbox.stream_log l
    WHERE l.topic_id = g.topic_id AND l.stream_offset = ANY (nack_offsets)
          AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
    ON CONFLICT ON CONSTRAINT stream_retries_pkey DO UPDATE
    SET deliveries = greatest(r.deliveries, excluded.deliveries), visible_at = excluded.visible_at, batch = NULL;
    UPDATE postbox.stream_retries r SET batch = NULL, visible_at = now() + nack_delay
    WHERE r.group_id = g.id AND r.batch = g.lease AND r.stream_offset = ANY (nack_offsets);
    IF g.max_deliveries IS NOT NULL THEN
        WITH dead AS (
            DELETE FROM postbox.stream_retries r
            WHERE r.group_id = g.id AND r.stream_offset = ANY (nack_offsets) AND r.deliveries >= g.max_deliveries
            RETURNING r.*)
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT dead.group_id, dead.stream_offset, dead.published_at, dead.publish_id, dead.routing_key,
               dead.ordering_key, dead.subject, dead.attributes, dead.body, dead.deliveries, 'nacked'
        FROM dead
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
    END IF;
END
$$;

-- Sets a consumer group's max_deliveries to delivery_limit (1-1000; NULL:
-- never): a message
-- the group fails on after that many deliveries goes to its dead letters.
-- Returns the group as get_consumer_group.
CREATE FUNCTION postbox.set_consumer_group_max_deliveries(topic_name text, group_name text,
                                                          delivery_limit integer)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
BEGIN
    PERFORM postbox._invalid(postbox._max_deliveries_problem(delivery_limit))
    WHERE postbox._max_deliveries_problem(delivery_limit) IS NOT NULL;
    UPDATE postbox.consumer_groups c SET max_deliveries = delivery_limit WHERE c.id = g.id RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- A consumer group's dead letters in offset order after after_offset (0: from
-- the first), at most page_size (1-1001), each with the deliveries it had,
-- when and why it died. PB404 if the group does not exist.
CREATE FUNCTION postbox.list_stream_dead_letters(topic_name text, group_name text, page_size integer DEFAULT 100,
                                                 after_offset bigint DEFAULT 0)
RETURNS TABLE (stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               dead_at timestamptz, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(postbox._scoped_name(topic_name));
    dead_group integer;
BEGIN
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1001 THEN
        PERFORM postbox._invalid(format('page_size must be from 1 to 1001, not %s', page_size));
    END IF;
    SELECT c.id INTO dead_group FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY
    SELECT d.stream_offset, d.published_at, d.publish_id, d.routing_key, d.ordering_key, d.subject, d.attributes,
           d.body, d.deliveries, d.dead_at, d.reason
    FROM postbox.stream_dead_letters d
    WHERE d.group_id = dead_group AND d.stream_offset > coalesce(after_offset, 0)
    ORDER BY d.stream_offset
    LIMIT page_size;
END
$$;

-- Replays a consumer group's dead letters, those with the given offsets
-- (NULL: all): each goes out to the group again in its next batch, as a
-- message given back, with max_deliveries deliveries to go. An offset that is
-- no dead letter of the group is passed over. Returns how many were replayed.
CREATE FUNCTION postbox.replay_stream_dead_letters(topic_name text, group_name text, offsets bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    replayed bigint;
BEGIN
    -- Under the group's lock (_consumer_group): no read of the group runs meanwhile.
    WITH replay AS (
        DELETE FROM postbox.stream_dead_letters d
        WHERE d.group_id = g.id AND (offsets IS NULL OR d.stream_offset = ANY (offsets))
        RETURNING d.*),
    queued AS (
        INSERT INTO postbox.stream_retries (group_id, stream_offset, published_at, publish_id, routing_key,
                                            ordering_key, subject, attributes, body, deliveries, visible_at)
        SELECT r.group_id, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key,
               r.subject, r.attributes, r.body, 0, now()
        FROM replay r
        ON CONFLICT ON CONSTRAINT stream_retries_pkey DO NOTHING  -- it is to go out again already
        RETURNING 1)
    SELECT count(*) INTO replayed FROM replay;
    RETURN replayed;
END
$$;

-- Deletes a consumer group's dead letters that died before older_than.
-- Returns how many it deleted.
CREATE FUNCTION postbox.purge_stream_dead_letters(topic_name text, group_name text, older_than timestamptz)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    purged bigint;
BEGIN
    IF older_than IS NULL THEN
        PERFORM postbox._invalid('older_than is required: dead letters that died before it are purged');
    END IF;
    DELETE FROM postbox.stream_dead_letters d WHERE d.group_id = g.id AND d.dead_at < older_than;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END
$$;

-- Moves a consumer group's cursor to read again, or skip, from a point on:
-- just before the message with offset to_offset (0 or more), or the first
-- published at to_time or later (one of them; see _stream_position). A batch
-- out is called back: its ack fails. Returns the group as get_consumer_group.
CREATE FUNCTION postbox.seek_consumer_group(topic_name text, group_name text, to_offset bigint DEFAULT NULL,
                                            to_time timestamptz DEFAULT NULL)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
    target record;
BEGIN
    IF (to_offset IS NULL) = (to_time IS NULL) THEN
        PERFORM postbox._invalid('give one of to_offset and to_time');
    ELSIF to_offset < 0 THEN
        PERFORM postbox._invalid(format('to_offset must be 0 or more, not %s', to_offset));
    END IF;
    SELECT * INTO target FROM postbox._stream_position(t.id, to_offset, to_time);
    UPDATE postbox.consumer_groups c
    SET cursor_tx = target.tx, cursor_offset = target.stream_offset, lease = NULL, lease_expires_at = NULL,
        lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE c.id = g.id
    RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- Whether a retired slot of the log may go: for every stream topic with rows
-- in it, the slot was retired longer ago than the topic's retention, and every
-- consumer group of the topic has acknowledged the topic's last row there.
CREATE FUNCTION postbox._stream_slot_done(slot smallint, retired_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT FROM postbox.topics t
        CROSS JOIN LATERAL (SELECT l.tx, l.stream_offset FROM postbox.stream_log l
                            WHERE l.slot = _stream_slot_done.slot AND l.topic_id = t.id
                            ORDER BY l.tx DESC, l.stream_offset DESC LIMIT 1) last
        WHERE t.stream_retention IS NOT NULL
              AND (retired_at > now() - t.stream_retention
                   OR EXISTS (SELECT FROM postbox.consumer_groups g
                              WHERE g.topic_id = t.id
                                    AND (g.cursor_tx, g.cursor_offset) < (last.tx, last.stream_offset))))
$$;

-- One pass of the log's rotation (the servers' maintenance workers run it):
-- truncates every retired slot that is done (see _stream_slot_done), then
-- retires the current slot, if it holds rows and has been current for
-- rotation_period (NULL: half the shortest stream retention, at most an hour),
-- in favour of an empty one. A slot whose lock is not free
-- within lock_wait (a reader, or a transaction that appended to it, holds it)
-- is left for the next pass: nobody waits behind a TRUNCATE for longer. Returns
-- how many slots it truncated. One pass at a time; a second returns 0 at once.
CREATE FUNCTION postbox.rotate_streams(rotation_period interval DEFAULT NULL,
                                       lock_wait interval DEFAULT '20 milliseconds') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.stream_slots;
    truncated integer := 0;
    previous_lock_timeout text := current_setting('lock_timeout');
    empty_slot smallint;
BEGIN
    IF rotation_period < interval '0' THEN
        PERFORM postbox._invalid(format('rotation_period must not be negative, not %s', rotation_period));
    ELSIF lock_wait IS NULL OR lock_wait < interval '1 millisecond' OR lock_wait > interval '10 seconds' THEN
        PERFORM postbox._invalid(format('lock_wait must be from 1 millisecond to 10 seconds, not %s', lock_wait));
    END IF;
    IF NOT pg_try_advisory_xact_lock(1886350201, 0) THEN
        RETURN 0;
    END IF;
    FOR s IN SELECT * FROM postbox.stream_slots WHERE state = 'retired' ORDER BY since LOOP
        CONTINUE WHEN NOT postbox._stream_slot_done(s.slot, s.since);
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::integer::text, true);
            EXECUTE format('LOCK TABLE postbox.stream_log_%s IN ACCESS EXCLUSIVE MODE', s.slot);
            PERFORM set_config('lock_timeout', previous_lock_timeout, true);
            -- Again under the lock: a publish that read the slot as current before
            -- it was retired may have added rows since.
            IF postbox._stream_slot_done(s.slot, s.since) THEN
                EXECUTE format('TRUNCATE postbox.stream_log_%s', s.slot);
                UPDATE postbox.stream_slots SET state = 'empty', since = now() WHERE slot = s.slot;
                truncated := truncated + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', previous_lock_timeout, true);
        END;
    END LOOP;
    rotation_period := coalesce(rotation_period, least(interval '1 hour', (SELECT min(t.stream_retention) / 2
                                                                         FROM postbox.topics t)));
    SELECT * INTO s FROM postbox.stream_slots WHERE state = 'current';
    IF s.since <= now() - rotation_period AND EXISTS (SELECT FROM postbox.stream_log l WHERE l.slot = s.slot) THEN
        SELECT e.slot INTO empty_slot FROM postbox.stream_slots e
        WHERE e.state = 'empty' ORDER BY (e.slot - s.slot + 4) % 4 LIMIT 1;
        IF FOUND THEN
            -- Retention counts from here: a publish that still appends to this slot
            -- read it as current, so it took its publish time before this commits.
            UPDATE postbox.stream_slots SET state = 'retired', since = clock_timestamp() WHERE slot = s.slot;
            UPDATE postbox.stream_slots SET state = 'current', since = now() WHERE slot = empty_slot;
        END IF;
    END IF;
    RETURN truncated;
END
$$;

-- Reads by position, for readers that keep their own positions (Spark's stream
-- source): a position is a row's (tx, offset), the order groups read in, given
-- as two bigints. read_stream_range reads without a lease or a group: up to
-- max_messages (1-1000) rows after (after_tx, after_offset) and at or before
-- (until_tx, until_offset) (NULL: no bound), in read order, and only rows whose
-- transaction is below the horizon (see Order above), so that reading a range
-- again gives the same rows, as long as rotation has not truncated them (a
-- group whose cursor stays at or before the range keeps them).
CREATE FUNCTION postbox.read_stream_range(topic_name text, after_tx bigint, after_offset bigint,
                                          until_tx bigint DEFAULT NULL, until_offset bigint DEFAULT NULL,
                                          max_messages integer DEFAULT 100)
RETURNS TABLE (tx bigint, stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._stream_topic(topic_name);
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000, not %s', max_messages));
    ELSIF after_tx IS NULL OR after_offset IS NULL OR after_tx < 0 OR after_offset < 0 THEN
        PERFORM postbox._invalid(format('after must be a position of 0 or more, not (%s, %s)', after_tx,
                                        after_offset));
    ELSIF (until_tx IS NULL) <> (until_offset IS NULL) THEN
        PERFORM postbox._invalid('give both until_tx and until_offset, or neither');
    ELSIF (until_tx, until_offset) < (after_tx, after_offset) THEN
        PERFORM postbox._invalid(format('the range ends at (%s, %s), before it starts at (%s, %s)', until_tx,
                                        until_offset, after_tx, after_offset));
    END IF;
    RETURN QUERY
    SELECT l.tx::text::bigint, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key,
           l.subject, l.attributes, l.body
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (after_tx::text::xid8, after_offset)
          AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
          AND (until_tx IS NULL OR (l.tx, l.stream_offset) <= (until_tx::text::xid8, until_offset))
    ORDER BY l.tx, l.stream_offset
    LIMIT max_messages;
END
$$;

-- Positions only, for readers that plan their reads of a range (Spark's stream
-- source finds the end of a batch, and splits it into partitions, with it):
-- where read_stream_range with the same bounds would end after max_messages
-- (1-1000000) rows, without reading a row. last_tx and last_offset are the
-- position of the max_messages-th row after (after_tx, after_offset), at or
-- before (until_tx, until_offset) (NULL: no bound) and below the horizon, or of
-- the range's last row when it holds fewer, or (after_tx, after_offset) when it
-- holds none; message_count is how many rows that passes over. It walks the
-- index on (topic_id, tx, stream_offset) alone, never a body.
CREATE FUNCTION postbox.read_stream_positions(topic_name text, after_tx bigint, after_offset bigint,
                                              until_tx bigint DEFAULT NULL, until_offset bigint DEFAULT NULL,
                                              max_messages integer DEFAULT 100, OUT last_tx bigint,
                                              OUT last_offset bigint, OUT message_count bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._stream_topic(topic_name);
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000000, not %s', max_messages));
    ELSIF after_tx IS NULL OR after_offset IS NULL OR after_tx < 0 OR after_offset < 0 THEN
        PERFORM postbox._invalid(format('after must be a position of 0 or more, not (%s, %s)', after_tx,
                                        after_offset));
    ELSIF (until_tx IS NULL) <> (until_offset IS NULL) THEN
        PERFORM postbox._invalid('give both until_tx and until_offset, or neither');
    ELSIF (until_tx, until_offset) < (after_tx, after_offset) THEN
        PERFORM postbox._invalid(format('the range ends at (%s, %s), before it starts at (%s, %s)', until_tx,
                                        until_offset, after_tx, after_offset));
    END IF;
    -- The rows in read order, numbered; the last of them is the highest number.
    SELECT r.tx::text::bigint, r.stream_offset, r.n INTO last_tx, last_offset, message_count
    FROM (SELECT l.tx, l.stream_offset, row_number() OVER (ORDER BY l.tx, l.stream_offset) AS n
          FROM postbox.stream_log l
          WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (after_tx::text::xid8, after_offset)
                AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
                AND (until_tx IS NULL OR (l.tx, l.stream_offset) <= (until_tx::text::xid8, until_offset))
          ORDER BY l.tx, l.stream_offset
          LIMIT max_messages) AS r
    ORDER BY r.n DESC
    LIMIT 1;
    IF NOT FOUND THEN
        last_tx := after_tx;
        last_offset := after_offset;
        message_count := 0;
    END IF;
END
$$;

-- Where a consumer group's cursor stands, and where the topic's log ends for
-- readers now: its last row below the horizon, or the cursor when no such row
-- is past it. PB404 if the group does not exist.
CREATE FUNCTION postbox.stream_position(topic_name text, group_name text, OUT cursor_tx bigint,
                                        OUT cursor_offset bigint, OUT end_tx bigint, OUT end_offset bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(postbox._scoped_name(topic_name));
    g postbox.consumer_groups;
BEGIN
    SELECT * INTO g FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    cursor_tx := g.cursor_tx::text::bigint;
    cursor_offset := g.cursor_offset;
    SELECT l.tx::text::bigint, l.stream_offset INTO end_tx, end_offset
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY l.tx DESC, l.stream_offset DESC
    LIMIT 1;
    IF NOT FOUND THEN
        end_tx := cursor_tx;
        end_offset := cursor_offset;
    END IF;
END
$$;

-- Moves a consumer group's cursor to just after a position (one that
-- read_stream_range or stream_position gave): what a reader keeping its own
-- positions commits, so that lag and rotation follow it. A batch out is called
-- back. A position past the horizon is refused: rows of transactions still
-- running could commit behind it and be skipped. Returns the group as
-- get_consumer_group.
CREATE FUNCTION postbox.set_consumer_group_cursor(topic_name text, group_name text, to_tx bigint,
                                                  to_offset bigint)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
    horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
BEGIN
    IF to_tx IS NULL OR to_offset IS NULL OR to_tx < 0 OR to_offset < 0 THEN
        PERFORM postbox._invalid(format('the position must be of 0 or more, not (%s, %s)', to_tx, to_offset));
    ELSIF (to_tx::text::xid8, to_offset) > (horizon, 0::bigint) THEN
        PERFORM postbox._invalid(format(
            'position (%s, %s) is past the end readers see now (%s, 0): rows still to commit could fall behind it',
            to_tx, to_offset, horizon));
    END IF;
    UPDATE postbox.consumer_groups c
    SET cursor_tx = to_tx::text::xid8, cursor_offset = to_offset, acked_at = now(), lease = NULL,
        lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE c.id = g.id
    RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- Consumer groups' lag for the servers' metrics: up to max_groups groups, in
-- topic and group name order; a bound role's tenant's only, its topics named
-- as it names them.
CREATE FUNCTION postbox.stream_metrics(max_groups integer DEFAULT 1000)
RETURNS TABLE (topic text, name text, lag_messages bigint, lag_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT v.topic, v.name, v.lag_messages, v.lag_seconds
    FROM postbox.consumer_groups g
    JOIN postbox.topics t ON t.id = g.topic_id
    CROSS JOIN LATERAL postbox._consumer_group_view(g, postbox._shown(t.name, (SELECT postbox._caller_tenant()))) v
    WHERE starts_with(t.name, postbox._tenant_prefix((SELECT postbox._caller_tenant())))
    ORDER BY t.name, g.name
    LIMIT max_groups
$$;

-- Publish-to-first-read latency of each consumer group that read in the last
-- `recent` (10 seconds to 1 hour, in whole 10-second buckets): how many
-- messages its new batches took, and the 50th, 95th and 99th percentiles of
-- their latency, each the upper bound of the bin it falls in (5 ms to 30
-- minutes; Infinity above), so never understated. Latency counts from the
-- publish to the read that took the message first: time waiting for the
-- group's batch, for the horizon (see Order above), or for a delay. A bound
-- role's tenant's groups only, its topics named as it names them.
CREATE FUNCTION postbox.stream_latency(recent interval DEFAULT '5 minutes')
RETURNS TABLE (topic text, consumer_group text, messages bigint, p50_seconds double precision,
               p95_seconds double precision, p99_seconds double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    IF recent IS NULL OR recent < interval '10 seconds' OR recent > interval '1 hour' THEN
        PERFORM postbox._invalid(format('recent must be from 10 seconds to 1 hour, not %s', recent));
    END IF;
    RETURN QUERY
    WITH bins AS (
        SELECT s.group_id, b.i, sum(b.n) AS n
        FROM postbox.stream_latency s, unnest(s.counts) WITH ORDINALITY AS b(n, i)
        WHERE s.bucket > now() - recent
        GROUP BY s.group_id, b.i),
    cumulative AS (
        SELECT bins.group_id, bins.i, sum(bins.n) OVER (PARTITION BY bins.group_id ORDER BY bins.i) AS upto,
               sum(bins.n) OVER (PARTITION BY bins.group_id) AS total
        FROM bins)
    SELECT postbox._shown(t.name, tenant), g.name, max(c.total)::bigint,
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.50 * c.total)], 'Infinity'),
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.95 * c.total)], 'Infinity'),
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.99 * c.total)], 'Infinity')
    FROM cumulative c
    JOIN postbox.consumer_groups g ON g.id = c.group_id
    JOIN postbox.topics t ON t.id = g.topic_id
    WHERE c.total > 0 AND starts_with(t.name, postbox._tenant_prefix(tenant))
    GROUP BY t.name, g.name
    ORDER BY t.name, g.name;
END
$$;

-- Each consumer group's health (the view stream_health), as queue_health is
-- each queue's: 'critical'
-- when its oldest unacknowledged message (past its cursor, or given back) is
-- older than postbox.health_critical_age (default 1 hour) or it holds
-- postbox.health_critical_dlq_depth dead letters (100); 'warning' past
-- postbox.health_warning_age (5 minutes) or postbox.health_warning_dlq_depth
-- (1), while paused, or when stuck: messages wait for it and no batch has
-- gone out to it for postbox.health_stuck_after (5 minutes). reason says
-- which. held_slots counts the log's retired slots it keeps from rotating
-- (they hold messages of its topic past its cursor); p95 and p99 are its
-- publish-to-first-read latency over the last 5 minutes (stream_latency;
-- NULL without reads). Reads the log past each cursor: seconds for a group
-- millions behind. A bound role's tenant's groups only, its topics named as it
-- names them.
CREATE FUNCTION postbox.consumer_group_health()
RETURNS TABLE (topic text, consumer_group text, status text, reason text, lag_messages bigint,
               oldest_unacked_seconds double precision, retry_messages bigint, dead_letters bigint,
               paused boolean, last_read_at timestamptz, lease_expires_at timestamptz, held_slots bigint,
               latency_p95_seconds double precision, latency_p99_seconds double precision)
LANGUAGE sql STABLE AS $$
SELECT v.topic, v.name AS consumer_group,
       CASE WHEN h.critical <> '{}' THEN 'critical'
            WHEN h.warning <> '{}' THEN 'warning'
            ELSE 'ok' END AS status,
       array_to_string(h.critical || h.warning, '; ') AS reason,
       v.lag_messages, o.oldest_unacked_seconds, v.retry_messages, v.dead_letters, v.paused,
       g.read_at AS last_read_at, v.lease_expires_at, r.held_slots, lat.p95_seconds AS latency_p95_seconds,
       lat.p99_seconds AS latency_p99_seconds
FROM (SELECT postbox._caller_tenant() AS tenant) AS me
JOIN postbox.topics t ON starts_with(t.name, postbox._tenant_prefix(me.tenant))
JOIN postbox.consumer_groups g ON g.topic_id = t.id
CROSS JOIN LATERAL postbox._consumer_group_view(g, postbox._shown(t.name, me.tenant)) v
CROSS JOIN LATERAL (
    SELECT greatest(v.lag_seconds,
                    (SELECT extract(epoch FROM now() - min(x.published_at))::double precision
                     FROM postbox.stream_retries x WHERE x.group_id = g.id), 0) AS oldest_unacked_seconds) o
CROSS JOIN LATERAL (
    SELECT count(*) AS held_slots FROM postbox.stream_slots s
    WHERE s.state = 'retired'
          AND EXISTS (SELECT FROM postbox.stream_log l
                      WHERE l.slot = s.slot AND l.topic_id = g.topic_id
                            AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset))) r
LEFT JOIN postbox.stream_latency('5 minutes') lat ON lat.topic = v.topic AND lat.consumer_group = g.name
CROSS JOIN LATERAL (
    SELECT coalesce(nullif(current_setting('postbox.health_warning_age', true), ''), '5 minutes')::interval AS warning_age,
           coalesce(nullif(current_setting('postbox.health_critical_age', true), ''), '1 hour')::interval AS critical_age,
           coalesce(nullif(current_setting('postbox.health_warning_dlq_depth', true), ''), '1')::bigint AS warning_dlq,
           coalesce(nullif(current_setting('postbox.health_critical_dlq_depth', true), ''), '100')::bigint AS critical_dlq,
           coalesce(nullif(current_setting('postbox.health_stuck_after', true), ''), '5 minutes')::interval AS stuck_after) k
CROSS JOIN LATERAL (
    SELECT array_remove(ARRAY[
               CASE WHEN o.oldest_unacked_seconds >= extract(epoch FROM k.critical_age)
                    THEN format('oldest unacknowledged message %s s old', round(o.oldest_unacked_seconds::numeric)) END,
               CASE WHEN v.dead_letters >= k.critical_dlq THEN format('%s dead letters', v.dead_letters) END],
               NULL) AS critical,
           array_remove(ARRAY[
               CASE WHEN o.oldest_unacked_seconds >= extract(epoch FROM k.warning_age)
                         AND o.oldest_unacked_seconds < extract(epoch FROM k.critical_age)
                    THEN format('oldest unacknowledged message %s s old', round(o.oldest_unacked_seconds::numeric)) END,
               CASE WHEN v.dead_letters >= k.warning_dlq AND v.dead_letters < k.critical_dlq
                    THEN format('%s dead letters', v.dead_letters) END,
               CASE WHEN v.paused THEN 'paused' END,
               CASE WHEN NOT v.paused AND v.lag_messages + v.retry_messages > 0
                         AND coalesce(g.read_at, g.created_at) <= now() - k.stuck_after
                    THEN format('stuck: no batch taken for %s s while %s messages wait',
                                round(extract(epoch FROM now() - coalesce(g.read_at, g.created_at))),
                                v.lag_messages + v.retry_messages) END],
               NULL) AS warning) h
ORDER BY v.topic, v.name
$$;

-- consumer_group_health as a view, beside queue_health.
CREATE VIEW postbox.stream_health AS SELECT * FROM postbox.consumer_group_health();

-- The stream log's slots (see Rotation above): each one's state and since
-- when (the current slot's since is the last rotation), how many messages it
-- holds, and for a retired slot the consumer groups that keep it from being
-- truncated, as topic/group: those with messages of their topic in it past
-- their cursor. Counts each slot's rows. A role bound to a tenant sees only
-- its tenant's groups in held_by, its topics named as it names them (the
-- slots and their counts are the whole log's, shared by the tenants).
CREATE VIEW postbox.stream_rotation AS
SELECT s.slot, s.state, s.since,
       (SELECT count(*) FROM postbox.stream_log l WHERE l.slot = s.slot) AS messages,
       -- A view calls functions as its user, so only caller_tenant, not the
       -- internal _shown and _tenant_prefix, whose work is written out here.
       ARRAY(SELECT substr(t.name, coalesce(length(me.tenant) + 2, 1)) || '/' || g.name
             FROM (SELECT postbox.caller_tenant() AS tenant) AS me
             JOIN postbox.topics t ON starts_with(t.name, coalesce(me.tenant || '/', ''))
             JOIN postbox.consumer_groups g ON t.id = g.topic_id
             WHERE s.state = 'retired'
                   AND EXISTS (SELECT FROM postbox.stream_log l
                               WHERE l.slot = s.slot AND l.topic_id = g.topic_id
                                     AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset))
             ORDER BY 1) AS held_by
FROM postbox.stream_slots s
ORDER BY s.slot;
