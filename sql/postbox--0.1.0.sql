-- postbox 0.1.0: queues and messages.
--
-- Install from psql with `psql -1 -f postbox--0.1.0.sql` (one transaction), with
-- `CREATE EXTENSION postbox` where the files sit in the server's extension
-- directory, or let `postbox serve` / `postbox migrate` do it. Plain SQL and
-- PL/pgSQL only, so it runs on managed PostgreSQL 14-18.
--
-- Errors carry SQLSTATEs of class PB that the server maps to gRPC codes:
--   PB400 invalid argument, PB404 not found, PB409 already exists,
--   PB412 failed precondition (stale receipt).
-- Their messages are written for the caller: they say what was wrong.

CREATE SCHEMA IF NOT EXISTS postbox;

-- Installed versions, one row per install or upgrade script applied.
CREATE TABLE postbox.schema_version (
    version text PRIMARY KEY,
    installed_at timestamptz NOT NULL DEFAULT now()
);

-- The queue catalogue.
CREATE TABLE postbox.queues (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    visibility_timeout interval NOT NULL,
    delivery_delay interval NOT NULL,
    retention interval NOT NULL,
    max_message_size integer NOT NULL,
    receive_wait_time interval NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every queue's messages live in this one table, keyed by queue_id, rather than
-- in a table per queue (as PGMQ does). Why:
--   * no dynamic SQL anywhere: a queue name is only ever a bound value, so no
--     name can change a statement, and every function's plan is cached;
--   * moving a message between queues (dead letters, redrive) and fanning a
--     publish out to many queues are single statements;
--   * creating a queue is an INSERT, not DDL, so it takes no lock that blocks
--     traffic on other queues.
-- The price is one heap shared by all queues; vacuum settings below keep it lean.
--
-- visible_at orders delivery and is the visibility deadline: a message can be
-- claimed when visible_at <= now(). lease is the token of the current delivery
-- (NULL before the first one): receipts carry it, so a receipt goes stale the
-- moment the message is delivered again.
CREATE TABLE postbox.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id integer NOT NULL,
    receive_count integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL,
    enqueued_at timestamptz NOT NULL,
    first_received_at timestamptz,
    lease uuid,
    attributes jsonb,
    body bytea NOT NULL
) WITH (
    -- A queue table turns over constantly: vacuum early and without throttling,
    -- so dead tuples do not pile up in front of the receive index scan.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- Receive scans this index from the oldest visible_at of a queue: in-flight and
-- delayed messages sort after now() and are never visited.
CREATE INDEX messages_ready_idx ON postbox.messages (queue_id, visible_at, id);

-- When a queue last sent a wake-up notification (see postbox._notify). Unlogged:
-- losing it in a crash only costs one extra NOTIFY.
CREATE UNLOGGED TABLE postbox.notify_throttle (
    queue_id integer PRIMARY KEY,
    notified_at timestamptz NOT NULL
);

-- pg_dump keeps the data of extension tables only when told to.
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.schema_version', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.queues', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.messages', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- Raises a PB400 error with the given message.
CREATE FUNCTION postbox._invalid(message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = message;
END
$$;

-- The message of a name check, or NULL when the queue name is valid.
CREATE FUNCTION postbox.queue_name_problem(name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN name IS NULL OR name = '' THEN 'queue name is required'
        WHEN length(name) > 80 THEN format('queue name is %s characters long; the limit is 80', length(name))
        WHEN name ~ '\.fifo$' THEN 'queue names ending in ".fifo" are reserved for FIFO queues'
        WHEN name !~ '^[A-Za-z0-9_-]+$' THEN 'queue name may only contain A-Z, a-z, 0-9, "_" and "-"'
    END
$$;

-- The queue of that name; PB404 if there is none.
CREATE FUNCTION postbox._queue(queue_name text) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('queue %s does not exist', quote_literal(queue_name));
    END IF;
    RETURN q;
END
$$;

-- Attribute defaults of a new queue; durations in seconds.
CREATE FUNCTION postbox.queue_defaults() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"visibility_timeout": 30, "delivery_delay": 0, "retention": 345600,
             "max_message_size": 1048576, "receive_wait_time": 0}'::jsonb
$$;

-- The attributes of a queue as settings jsonb (durations in seconds).
CREATE FUNCTION postbox.queue_settings(q postbox.queues) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'visibility_timeout', extract(epoch FROM q.visibility_timeout),
        'delivery_delay', extract(epoch FROM q.delivery_delay),
        'retention', extract(epoch FROM q.retention),
        'max_message_size', q.max_message_size,
        'receive_wait_time', extract(epoch FROM q.receive_wait_time))
$$;

-- Checks settings jsonb (a full set, as queue_defaults() has) and writes them into q.
CREATE FUNCTION postbox._apply_settings(q postbox.queues, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    unknown text;
    key text;
    seconds numeric;
BEGIN
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k
    WHERE NOT postbox.queue_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown queue setting(s): %s', unknown));
    END IF;
    FOREACH key IN ARRAY ARRAY['visibility_timeout', 'delivery_delay', 'retention',
                               'receive_wait_time', 'max_message_size'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid(format('queue setting %s must be a number', key));
        END IF;
    END LOOP;

    seconds := (settings ->> 'visibility_timeout')::numeric;
    IF seconds < 0 OR seconds > 43200 THEN
        PERFORM postbox._invalid(format('visibility_timeout is %s s; it must be 0 to 43200 s (12 h)', seconds));
    END IF;
    q.visibility_timeout := make_interval(secs => seconds);

    seconds := (settings ->> 'retention')::numeric;
    IF seconds < 60 OR seconds > 1209600 THEN
        PERFORM postbox._invalid(format('retention is %s s; it must be 60 to 1209600 s (14 days)', seconds));
    END IF;
    q.retention := make_interval(secs => seconds);

    seconds := (settings ->> 'delivery_delay')::numeric;
    IF seconds < 0 OR make_interval(secs => seconds) > q.retention THEN
        PERFORM postbox._invalid(format(
            'delivery_delay is %s s; it must be 0 s to the retention period (%s s)',
            seconds, extract(epoch FROM q.retention)));
    END IF;
    q.delivery_delay := make_interval(secs => seconds);

    seconds := (settings ->> 'receive_wait_time')::numeric;
    IF seconds < 0 OR seconds > 20 THEN
        PERFORM postbox._invalid(format('receive_wait_time is %s s; it must be 0 to 20 s', seconds));
    END IF;
    q.receive_wait_time := make_interval(secs => seconds);

    seconds := (settings ->> 'max_message_size')::numeric;
    IF seconds <> trunc(seconds) OR seconds < 1024 OR seconds > 67108864 THEN
        PERFORM postbox._invalid(format(
            'max_message_size is %s; it must be a whole number of bytes from 1024 to 67108864', seconds));
    END IF;
    q.max_message_size := seconds::integer;
    RETURN q;
END
$$;

-- Creates a queue. settings: any of the keys of queue_defaults(), e.g.
-- '{"visibility_timeout": 60}'. PB409 if the queue exists.
CREATE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (name, visibility_timeout, delivery_delay, retention,
                                max_message_size, receive_wait_time)
    VALUES (queue_name, q.visibility_timeout, q.delivery_delay, q.retention,
            q.max_message_size, q.receive_wait_time)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('queue %s already exists', quote_literal(queue_name));
    END IF;
    RETURN q;
END
$$;

-- Changes the settings named in settings; a key whose value is null goes back
-- to its default.
CREATE FUNCTION postbox.update_queue(queue_name text, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues;
    changes jsonb;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name FOR UPDATE;
    IF NOT FOUND THEN
        q := postbox._queue(queue_name);  -- raises PB404
    END IF;
    SELECT coalesce(jsonb_object_agg(key, CASE WHEN value = 'null' THEN postbox.queue_defaults() -> key
                                               ELSE value END), '{}')
    INTO changes
    FROM jsonb_each(coalesce(settings, '{}'));
    q := postbox._apply_settings(q, postbox.queue_settings(q) || changes);
    UPDATE postbox.queues
    SET visibility_timeout = q.visibility_timeout, delivery_delay = q.delivery_delay,
        retention = q.retention, max_message_size = q.max_message_size,
        receive_wait_time = q.receive_wait_time, updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

-- The queue of that name; PB404 if there is none.
CREATE FUNCTION postbox.get_queue(queue_name text) RETURNS postbox.queues
LANGUAGE sql STABLE AS $$
    SELECT postbox._queue(queue_name)
$$;

-- Queues in name order after after_name, whose names start with name_prefix.
CREATE FUNCTION postbox.list_queues(page_size integer DEFAULT 100, after_name text DEFAULT '',
                                    name_prefix text DEFAULT '')
RETURNS SETOF postbox.queues
LANGUAGE sql STABLE AS $$
    SELECT * FROM postbox.queues
    WHERE name > coalesce(after_name, '') AND starts_with(name, coalesce(name_prefix, ''))
    ORDER BY name
    LIMIT page_size
$$;

-- Serialises queue deletion against sends: a send holds this lock shared, so a
-- message is never committed into a queue that a concurrent drop just removed.
CREATE FUNCTION postbox._lock_queue(queue_id integer, exclusive boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF exclusive THEN
        PERFORM pg_advisory_xact_lock(1886350198, queue_id);  -- 1886350198 = 'post'
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1886350198, queue_id);
    END IF;
END
$$;

-- Deletes a queue and all its messages.
CREATE FUNCTION postbox.drop_queue(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    PERFORM postbox._lock_queue(q.id, true);
    DELETE FROM postbox.messages WHERE queue_id = q.id;
    DELETE FROM postbox.notify_throttle WHERE queue_id = q.id;
    DELETE FROM postbox.queues WHERE id = q.id;
END
$$;

-- Deletes every message of a queue; returns how many.
CREATE FUNCTION postbox.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    purged bigint;
BEGIN
    DELETE FROM postbox.messages WHERE queue_id = q.id;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END
$$;

-- Live counts of a queue's messages.
CREATE FUNCTION postbox.queue_stats(queue_name text)
RETURNS TABLE (visible bigint, in_flight bigint, delayed bigint, oldest_age interval)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    RETURN QUERY
    SELECT count(*) FILTER (WHERE m.visible_at <= now()),
           count(*) FILTER (WHERE m.visible_at > now() AND m.lease IS NOT NULL),
           count(*) FILTER (WHERE m.visible_at > now() AND m.lease IS NULL),
           coalesce(now() - min(m.enqueued_at), interval '0')
    FROM postbox.messages m
    WHERE m.queue_id = q.id;
END
$$;

-- The message of an attribute check, or NULL when the attribute is valid.
-- Attributes are jsonb objects {"<name>": {"data_type": "String", "string_value": "..."}}
-- with "binary_value" (base64) for Binary types, as the API's AttributeValue.
CREATE FUNCTION postbox.attribute_problem(name text, attribute jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN length(name) NOT BETWEEN 1 AND 256 THEN
            format('attribute name %s must be 1 to 256 characters long', quote_literal(name))
        WHEN name !~ '^[A-Za-z0-9_.-]+$' THEN
            format('attribute name %s may only contain A-Z, a-z, 0-9, "_", "-" and "."', quote_literal(name))
        WHEN name ~* '^(aws|amazon)\.' THEN
            format('attribute name %s must not start with "AWS." or "Amazon."', quote_literal(name))
        WHEN name ~ '(^\.|\.$|\.\.)' THEN
            format('attribute name %s must not start or end with "." nor contain ".."', quote_literal(name))
        WHEN jsonb_typeof(attribute) IS DISTINCT FROM 'object' THEN
            format('attribute %s must be an object with data_type and a value', quote_literal(name))
        WHEN NOT coalesce(attribute ->> 'data_type' ~ '^(String|Number|Binary)(\.[^[:cntrl:]]+)?$', false)
             OR length(attribute ->> 'data_type') > 256 THEN
            format('attribute %s: data_type must be String, Number or Binary, optionally with a '
                   'custom suffix such as "Number.float" (256 characters at most)', quote_literal(name))
        WHEN attribute ->> 'data_type' ~ '^Binary' THEN CASE
            WHEN coalesce(attribute ->> 'binary_value', '') = '' THEN
                format('attribute %s of type %s needs a non-empty binary value',
                       quote_literal(name), attribute ->> 'data_type')
            WHEN attribute ? 'string_value' THEN
                format('attribute %s of type %s takes a binary value, not a string value',
                       quote_literal(name), attribute ->> 'data_type')
            END
        WHEN coalesce(attribute ->> 'string_value', '') = '' THEN
            format('attribute %s of type %s needs a non-empty string value',
                   quote_literal(name), attribute ->> 'data_type')
        WHEN attribute ? 'binary_value' THEN
            format('attribute %s of type %s takes a string value, not a binary value',
                   quote_literal(name), attribute ->> 'data_type')
        WHEN attribute ->> 'data_type' ~ '^Number'
             AND attribute ->> 'string_value' !~ '^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$' THEN
            format('attribute %s of type %s must hold a decimal number, not %s',
                   quote_literal(name), attribute ->> 'data_type', quote_literal(attribute ->> 'string_value'))
    END
$$;

-- Size of a message as SQS counts it: body plus each attribute's name, type and value.
CREATE FUNCTION postbox.message_size(body bytea, attributes jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(body) + coalesce((
        SELECT sum(octet_length(e.key) + octet_length(e.value ->> 'data_type')
                   + coalesce(octet_length(e.value ->> 'string_value'),
                              octet_length(decode(e.value ->> 'binary_value', 'base64')), 0))
        FROM jsonb_each(attributes) AS e
        WHERE jsonb_typeof(attributes) = 'object'), 0)
$$;

-- Wakes receivers waiting on a queue: NOTIFY on channel "postbox" with the
-- queue name, delivered when the sending transaction commits. NOTIFY makes
-- committing transactions queue up behind one another, so one per send would
-- halve send throughput: a queue is notified at most once per 5 ms, unless the
-- last notification has not committed yet. A sender that skips relies on the
-- notification another sender made moments before; servers poll once more a
-- little after each notification to pick up such messages.
CREATE FUNCTION postbox._notify(q postbox.queues) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    last_notified timestamptz;
BEGIN
    SELECT notified_at INTO last_notified FROM postbox.notify_throttle WHERE queue_id = q.id;
    IF last_notified > clock_timestamp() - interval '5 ms' THEN
        RETURN;
    END IF;
    -- Record the notification without waiting on a concurrent sender's row lock:
    -- whoever holds it is notifying too.
    IF last_notified IS NULL THEN
        INSERT INTO postbox.notify_throttle (queue_id, notified_at)
        VALUES (q.id, clock_timestamp()) ON CONFLICT DO NOTHING;
    ELSE
        UPDATE postbox.notify_throttle SET notified_at = clock_timestamp()
        WHERE queue_id = (SELECT queue_id FROM postbox.notify_throttle
                          WHERE queue_id = q.id FOR UPDATE SKIP LOCKED);
    END IF;
    PERFORM pg_notify('postbox', q.name);
END
$$;

-- PB400 unless a batch of n entries holds 1 to 1,000.
CREATE FUNCTION postbox._check_batch_size(n integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(n, 0) NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('a batch holds 1 to 1000 entries, not %s', coalesce(n, 0)));
    END IF;
END
$$;

-- How an error names the i-th (1-based) of n batch entries: by 0-based index,
-- or not at all when there is only one.
CREATE FUNCTION postbox._entry_prefix(i bigint, n integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN n > 1 THEN format('entry %s: ', i - 1) ELSE '' END
$$;

-- Sends up to 1,000 messages in one go; returns their ids in input order.
-- attributes[i] and delays[i] belong to bodies[i]; either array may be NULL or
-- shorter (missing entries are NULL). A NULL delay means the queue's
-- delivery_delay. Nothing is inserted if any entry is invalid; the error names
-- the entry by its 0-based index.
CREATE FUNCTION postbox.send_batch(queue_name text, bodies bytea[],
                                   attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(bodies), 0);
    problem text;
    sent_at timestamptz := clock_timestamp();
BEGIN
    PERFORM postbox._check_batch_size(n);
    IF cardinality(attributes) > n OR cardinality(delays) > n THEN
        PERFORM postbox._invalid('attributes and delays may not have more entries than bodies');
    END IF;
    IF delays IS NOT NULL THEN
        SELECT postbox._entry_prefix(i, n) || format('delay %s is outside 0 s to the retention period (%s)', d, q.retention)
        INTO problem
        FROM unnest(delays) WITH ORDINALITY AS t(d, i)
        WHERE d < interval '0' OR d > q.retention
        LIMIT 1;
    END IF;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        SELECT postbox._entry_prefix(i, n) || coalesce(
                   CASE WHEN jsonb_typeof(a) <> 'object'
                        THEN 'attributes must be a JSON object keyed by attribute name'
                        WHEN (SELECT count(*) FROM jsonb_object_keys(a)) > 10
                        THEN format('%s attributes; a message may have at most 10',
                                    (SELECT count(*) FROM jsonb_object_keys(a)))
                   END,
                   (SELECT postbox.attribute_problem(e.key, e.value)
                    FROM jsonb_each(a) AS e
                    WHERE postbox.attribute_problem(e.key, e.value) IS NOT NULL
                    LIMIT 1))
        INTO problem
        FROM unnest(attributes) WITH ORDINALITY AS t(a, i)
        WHERE a IS NOT NULL AND (
            jsonb_typeof(a) <> 'object'
            OR (SELECT count(*) FROM jsonb_object_keys(a)) > 10
            OR EXISTS (SELECT FROM jsonb_each(a) AS e WHERE postbox.attribute_problem(e.key, e.value) IS NOT NULL))
        LIMIT 1;
    END IF;
    IF problem IS NULL THEN
        SELECT postbox._entry_prefix(i, n) || 'body must not be NULL' INTO problem
        FROM unnest(bodies) WITH ORDINALITY AS t(b, i)
        WHERE b IS NULL
        LIMIT 1;
    END IF;
    IF problem IS NULL THEN
        SELECT postbox._entry_prefix(i, n) || format('message is %s bytes; the queue takes at most %s (body and attributes)',
                                              postbox.message_size(b, a), q.max_message_size)
        INTO problem
        FROM unnest(bodies, attributes) WITH ORDINALITY AS t(b, a, i)
        WHERE postbox.message_size(b, a) > q.max_message_size
        LIMIT 1;
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;

    PERFORM postbox._lock_queue(q.id, false);
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body)
        SELECT q.id, sent_at + coalesce(d, q.delivery_delay), sent_at, a, b
        FROM unnest(bodies, attributes, delays) WITH ORDINALITY AS t(b, a, d, i)
        ORDER BY i
        RETURNING id
    )
    -- Identity values are drawn in insertion order, so id order is input order.
    SELECT id FROM inserted ORDER BY id;
    PERFORM postbox._notify(q);
END
$$;

-- Sends one message; returns its id. See send_batch for the rules.
CREATE FUNCTION postbox.send(queue_name text, body bytea, attributes jsonb DEFAULT NULL,
                             delay interval DEFAULT NULL)
RETURNS bigint
LANGUAGE sql AS $$
    SELECT postbox.send_batch(queue_name, ARRAY[body], ARRAY[attributes], ARRAY[delay])
$$;

-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>".
CREATE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
                                visibility_timeout interval DEFAULT NULL)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, receipt text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    timeout interval := coalesce(visibility_timeout, q.visibility_timeout);
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages is %s; it must be 1 to 1000', max_messages));
    END IF;
    IF timeout < interval '0' OR timeout > interval '12 hours' THEN
        PERFORM postbox._invalid(format('visibility timeout %s is outside 0 s to 12 h', timeout));
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT m.id
        FROM postbox.messages m
        WHERE m.queue_id = q.id AND m.visible_at <= now()
        ORDER BY m.visible_at, m.id
        LIMIT max_messages
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE postbox.messages m
        SET visible_at = clock_timestamp() + timeout,
            receive_count = m.receive_count + 1,
            first_received_at = coalesce(m.first_received_at, clock_timestamp()),
            lease = gen_random_uuid()
        FROM picked
        WHERE m.id = picked.id
        RETURNING m.id, m.body, m.attributes, m.enqueued_at, m.receive_count,
                  m.first_received_at, m.lease
    )
    SELECT c.id, c.body, c.attributes, c.enqueued_at, c.receive_count, c.first_received_at,
           c.id || ':' || c.lease
    FROM claimed c
    ORDER BY c.id;
END
$$;

-- Splits receipts into (position, message id, lease); malformed ones get NULLs.
CREATE FUNCTION postbox._parse_receipts(receipts text[])
RETURNS TABLE (i bigint, receipt text, message_id bigint, lease uuid)
LANGUAGE sql IMMUTABLE AS $$
    SELECT t.i, t.r,
           CASE WHEN m IS NOT NULL THEN m[1]::bigint END,
           CASE WHEN m IS NOT NULL THEN m[2]::uuid END
    FROM unnest(receipts) WITH ORDINALITY AS t(r, i)
    LEFT JOIN LATERAL regexp_match(t.r, '^([0-9]{1,18}):([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$') AS m ON true
$$;

-- Outcome per receipt of an operation that matched `done` of them:
-- 'ok', 'invalid' (malformed), 'stale' (delivered again since) or 'not_found'.
CREATE FUNCTION postbox._receipt_outcomes(q postbox.queues, receipts text[], done bigint[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE sql STABLE AS $$
    SELECT p.i, CASE
        WHEN p.message_id IS NULL THEN 'invalid'
        WHEN p.message_id = ANY (done) THEN 'ok'
        WHEN EXISTS (SELECT FROM postbox.messages m WHERE m.id = p.message_id AND m.queue_id = q.id)
            THEN 'stale'
        ELSE 'not_found'
    END
    FROM postbox._parse_receipts(receipts) p
    ORDER BY p.i
$$;

-- Deletes received messages by receipt. One outcome per receipt, in order;
-- see _receipt_outcomes.
CREATE FUNCTION postbox.delete_batch(queue_name text, receipts text[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    done bigint[];
BEGIN
    PERFORM postbox._check_batch_size(cardinality(receipts));
    WITH deleted AS (
        DELETE FROM postbox.messages m
        USING postbox._parse_receipts(receipts) p
        WHERE m.id = p.message_id AND m.queue_id = q.id AND m.lease = p.lease
        RETURNING m.id
    )
    SELECT array_agg(id) INTO done FROM deleted;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Makes received messages visible again after `timeout` from now (0: at once).
-- One outcome per receipt, in order; see _receipt_outcomes.
CREATE FUNCTION postbox.change_visibility_batch(queue_name text, receipts text[], timeouts interval[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    done bigint[];
    bad interval;
BEGIN
    PERFORM postbox._check_batch_size(cardinality(receipts));
    IF cardinality(timeouts) IS DISTINCT FROM cardinality(receipts) THEN
        PERFORM postbox._invalid('receipts and timeouts must have the same number of entries');
    END IF;
    SELECT t INTO bad FROM unnest(timeouts) t WHERE t IS NULL OR t < interval '0' OR t > interval '12 hours' LIMIT 1;
    IF FOUND THEN
        PERFORM postbox._invalid(format('visibility timeout %s is outside 0 s to 12 h', coalesce(bad::text, 'NULL')));
    END IF;
    WITH changed AS (
        UPDATE postbox.messages m
        SET visible_at = clock_timestamp() + t.timeout
        FROM postbox._parse_receipts(receipts) p
        JOIN unnest(timeouts) WITH ORDINALITY AS t(timeout, i) ON t.i = p.i
        WHERE m.id = p.message_id AND m.queue_id = q.id AND m.lease = p.lease
        RETURNING m.id
    )
    SELECT array_agg(id) INTO done FROM changed;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Raises the error of a single-receipt operation's outcome.
CREATE FUNCTION postbox._raise_receipt_outcome(outcome text, receipt text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    CASE outcome
    WHEN 'ok' THEN
        RETURN;
    WHEN 'invalid' THEN
        PERFORM postbox._invalid(format('receipt %s is malformed; pass a receipt returned by receive',
                                        quote_literal(receipt)));
    WHEN 'stale' THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'receipt %s is stale: the message was delivered again since; use the newest receipt',
            quote_literal(receipt));
    ELSE
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'the message of receipt %s is gone (deleted or expired)', quote_literal(receipt));
    END CASE;
END
$$;

-- Deletes a received message. PB412 for a stale receipt, PB404 if it is gone.
CREATE FUNCTION postbox.delete(queue_name text, receipt text) RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.delete_batch(queue_name, ARRAY[receipt])
$$;

-- Sets when a received message becomes visible again, `timeout` from now.
-- PB412 for a stale receipt, PB404 if it is gone.
CREATE FUNCTION postbox.change_visibility(queue_name text, receipt text, timeout interval) RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.change_visibility_batch(queue_name, ARRAY[receipt], ARRAY[timeout])
$$;

-- Gives back claimed messages that never reached a consumer (the server calls
-- it when a client goes away mid-delivery): visible at once, the delivery
-- uncounted, the receipt void. Receipts that are stale already are skipped.
CREATE FUNCTION postbox.release(queue_name text, receipts text[]) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    released bigint;
BEGIN
    UPDATE postbox.messages m
    SET visible_at = clock_timestamp(),
        receive_count = m.receive_count - 1,
        first_received_at = CASE WHEN m.receive_count > 1 THEN m.first_received_at END,
        lease = NULL
    FROM postbox._parse_receipts(receipts) p
    WHERE m.id = p.message_id AND m.queue_id = q.id AND m.lease = p.lease;
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM postbox._notify(q);
    END IF;
    RETURN released;
END
$$;

-- The earliest time a message of the queue becomes visible, or NULL if the queue
-- is empty. Waiting servers set a timer for it.
CREATE FUNCTION postbox.next_visible_at(queue_name text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(visible_at) FROM postbox.messages WHERE queue_id = (postbox._queue(queue_name)).id
$$;

INSERT INTO postbox.schema_version (version) VALUES ('0.1.0');
