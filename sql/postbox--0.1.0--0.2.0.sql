-- postbox 0.1.0 -> 0.2.0: retries and dead letters, delays up to the retention
-- period, retention "forever" and archive, FIFO groups, deduplication,
-- idempotent enqueue, priority, pause/resume, max_depth and receive rate limits.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

ALTER TABLE postbox.queues
    ALTER COLUMN retention DROP NOT NULL,
    ADD COLUMN fifo boolean NOT NULL DEFAULT false,
    ADD COLUMN content_based_deduplication boolean NOT NULL DEFAULT false,
    ADD COLUMN deduplication_window interval NOT NULL DEFAULT '5 minutes',
    ADD COLUMN dead_letter_queue_id integer REFERENCES postbox.queues (id),
    ADD COLUMN max_receive_count integer,
    ADD COLUMN redrive_permission text NOT NULL DEFAULT 'allow_all',
    ADD COLUMN redrive_sources text[] NOT NULL DEFAULT '{}',
    ADD COLUMN retry_minimum_backoff interval NOT NULL DEFAULT '1 second',
    ADD COLUMN retry_maximum_backoff interval NOT NULL DEFAULT '10 minutes',
    ADD COLUMN archive_on_delete boolean NOT NULL DEFAULT false,
    ADD COLUMN archive_retention interval DEFAULT '7 days',
    ADD COLUMN max_depth bigint,
    ADD COLUMN receive_rate_limit double precision,
    ADD COLUMN send_paused boolean NOT NULL DEFAULT false,
    ADD COLUMN receive_paused boolean NOT NULL DEFAULT false,
    ADD COLUMN tags jsonb NOT NULL DEFAULT '{}';
-- The defaults above fill existing queues; new ones get theirs from
-- queue_defaults() through create_queue, as in a fresh install.
ALTER TABLE postbox.queues
    ALTER COLUMN fifo DROP DEFAULT,
    ALTER COLUMN content_based_deduplication DROP DEFAULT,
    ALTER COLUMN deduplication_window DROP DEFAULT,
    ALTER COLUMN redrive_permission DROP DEFAULT,
    ALTER COLUMN redrive_sources DROP DEFAULT,
    ALTER COLUMN retry_minimum_backoff DROP DEFAULT,
    ALTER COLUMN retry_maximum_backoff DROP DEFAULT,
    ALTER COLUMN archive_on_delete DROP DEFAULT,
    ALTER COLUMN archive_retention DROP DEFAULT,
    ALTER COLUMN send_paused DROP DEFAULT,
    ALTER COLUMN receive_paused DROP DEFAULT,
    ALTER COLUMN tags DROP DEFAULT;

ALTER TABLE postbox.messages
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN message_group_id text,
    ADD COLUMN deduplication_id text,
    ADD COLUMN dedupe_key text,
    ADD COLUMN source_queue_id integer,
    ADD COLUMN dead_lettered_at timestamptz,
    ADD COLUMN last_error text;

-- The partial indexes below hold only the rows that use a feature, so a plain
-- message pays nothing for them.
-- Receive takes messages of priority > 0 first, through this index.
CREATE INDEX messages_priority_idx ON postbox.messages (queue_id, priority DESC, visible_at, id)
    WHERE priority > 0;
-- The messages of a group in order: FIFO promotion and appends.
CREATE INDEX messages_group_idx ON postbox.messages (queue_id, message_group_id, id)
    WHERE message_group_id IS NOT NULL;
-- Idempotent enqueue: one waiting message per key.
CREATE UNIQUE INDEX messages_dedupe_key_idx ON postbox.messages (queue_id, dedupe_key)
    WHERE dedupe_key IS NOT NULL;

-- Deduplication ids seen within each queue's deduplication window. Kept after
-- the message itself is deleted: a duplicate must stay a duplicate.
CREATE TABLE postbox.deduplication (
    queue_id integer NOT NULL,
    deduplication_id text NOT NULL,
    message_id bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, deduplication_id)
);
CREATE INDEX deduplication_expiry_idx ON postbox.deduplication (expires_at);

-- Deleted and expired messages of queues with archive_on_delete.
CREATE TABLE postbox.archive (
    id bigint PRIMARY KEY,
    queue_id integer NOT NULL,
    receive_count integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    first_received_at timestamptz,
    archived_at timestamptz NOT NULL,
    reason text NOT NULL,  -- deleted or expired
    priority smallint NOT NULL,
    message_group_id text,
    deduplication_id text,
    source_queue_id integer,
    last_error text,
    attributes jsonb,
    body bytea NOT NULL
);
CREATE INDEX archive_queue_idx ON postbox.archive (queue_id, id);
CREATE INDEX archive_expiry_idx ON postbox.archive (queue_id, archived_at);

-- Token buckets of queues with a receive_rate_limit, shared by every server.
CREATE TABLE postbox.receive_tokens (
    queue_id integer PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);

-- Moves of dead letters back to a queue, run by the servers' maintenance worker.
CREATE TABLE postbox.redrive_tasks (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    dead_letter_queue_id integer NOT NULL,
    destination_queue_id integer,  -- NULL: each message's source queue
    max_messages bigint,  -- NULL: all
    rate double precision,  -- messages per second; NULL: as fast as possible
    status text NOT NULL DEFAULT 'running',  -- running, completed, cancelled, failed
    moved bigint NOT NULL DEFAULT 0,
    to_move bigint NOT NULL,
    credit double precision NOT NULL DEFAULT 0,  -- moves the rate allows but not yet made
    failure_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- One running redrive per dead-letter queue.
CREATE UNIQUE INDEX redrive_tasks_running_idx ON postbox.redrive_tasks (dead_letter_queue_id)
    WHERE status = 'running';

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.deduplication', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.archive', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.redrive_tasks', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- upgraded from a plain script, not by ALTER EXTENSION
END
$$;

-- Splits receipts into (position, message id, lease); malformed ones get NULLs.
CREATE OR REPLACE FUNCTION postbox._parse_receipts(receipts text[])
RETURNS TABLE (i bigint, receipt text, message_id bigint, lease uuid)
LANGUAGE sql IMMUTABLE AS $$
    -- String functions, not a regular expression: a pattern with counted
    -- repetitions costs more than the rest of a delete together.
    SELECT t.i, t.r,
           CASE WHEN t.ok THEN split_part(t.r, ':', 1)::bigint END,
           CASE WHEN t.ok THEN split_part(t.r, ':', 2)::uuid END
    FROM (SELECT r, i,
                 coalesce(length(split_part(r, ':', 1)) BETWEEN 1 AND 18
                          AND translate(split_part(r, ':', 1), '0123456789', '') = ''
                          AND length(r) = length(split_part(r, ':', 1)) + 37
                          AND translate(split_part(r, ':', 2), '0123456789abcdef', '') = '----'
                          AND substr(split_part(r, ':', 2), 9, 1) || substr(split_part(r, ':', 2), 14, 1)
                              || substr(split_part(r, ':', 2), 19, 1) || substr(split_part(r, ':', 2), 24, 1)
                              = '----', false) AS ok
          FROM unnest(receipts) WITH ORDINALITY AS u(r, i)) AS t
$$;

-- The attribute part of message_size. PL/pgSQL, so that its plan is cached:
-- a SQL function with a sub-SELECT is planned anew on every call.
CREATE OR REPLACE FUNCTION postbox._attributes_size(attributes jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(attributes) IS DISTINCT FROM 'object' THEN
        RETURN 0;
    END IF;
    RETURN coalesce((
        SELECT sum(octet_length(e.key) + octet_length(e.value ->> 'data_type')
                   + coalesce(octet_length(e.value ->> 'string_value'),
                              octet_length(decode(e.value ->> 'binary_value', 'base64')), 0))
        FROM jsonb_each(attributes) AS e), 0);
END
$$;

-- Size of a message as SQS counts it: body plus each attribute's name, type and
-- value. A plain expression, which the planner inlines into the caller.
CREATE OR REPLACE FUNCTION postbox.message_size(body bytea, attributes jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(body) + CASE WHEN attributes IS NULL THEN 0
                                     ELSE postbox._attributes_size(attributes) END
$$;

-- Signatures that changed.
DROP FUNCTION postbox.send(text, bytea, jsonb, interval);
DROP FUNCTION postbox.send_batch(text, bytea[], jsonb[], interval[]);
DROP FUNCTION postbox.receive(text, integer, interval);

-- The message of a name check, or NULL when the queue name is valid.
CREATE OR REPLACE FUNCTION postbox.queue_name_problem(name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN name IS NULL OR name = '' THEN 'queue name is required'
        WHEN length(name) > 80 THEN format('queue name is %s characters long; the limit is 80', length(name))
        WHEN name !~ '^[A-Za-z0-9_-]+(\.fifo)?$' THEN
            'queue name may only contain A-Z, a-z, 0-9, "_" and "-", and end in ".fifo" for a FIFO queue'
    END
$$;

-- Attribute defaults of a new queue; durations in seconds. A retention or
-- archive_retention of 0 keeps messages forever; a max_depth or
-- receive_rate_limit of 0 means no limit.
CREATE OR REPLACE FUNCTION postbox.queue_defaults() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"visibility_timeout": 30, "delivery_delay": 0, "retention": 345600,
             "max_message_size": 1048576, "receive_wait_time": 0,
             "content_based_deduplication": false, "deduplication_window": 300,
             "dead_letter_policy": null,
             "redrive_allow_policy": {"permission": "allow_all", "source_queues": []},
             "retry_policy": {"minimum_backoff": 1, "maximum_backoff": 600},
             "archive_on_delete": false, "archive_retention": 604800,
             "max_depth": 0, "receive_rate_limit": 0, "tags": {}}'::jsonb
$$;

-- The attributes of a queue as settings jsonb, in the shape of queue_defaults().
CREATE OR REPLACE FUNCTION postbox.queue_settings(q postbox.queues) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'visibility_timeout', extract(epoch FROM q.visibility_timeout),
        'delivery_delay', extract(epoch FROM q.delivery_delay),
        'retention', coalesce(extract(epoch FROM q.retention), 0),
        'max_message_size', q.max_message_size,
        'receive_wait_time', extract(epoch FROM q.receive_wait_time),
        'content_based_deduplication', q.content_based_deduplication,
        'deduplication_window', extract(epoch FROM q.deduplication_window),
        'dead_letter_policy', CASE WHEN q.dead_letter_queue_id IS NOT NULL THEN jsonb_build_object(
            'dead_letter_queue', (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id),
            'max_receive_count', q.max_receive_count) END,
        'redrive_allow_policy', jsonb_build_object(
            'permission', q.redrive_permission, 'source_queues', to_jsonb(q.redrive_sources)),
        'retry_policy', jsonb_build_object(
            'minimum_backoff', extract(epoch FROM q.retry_minimum_backoff),
            'maximum_backoff', extract(epoch FROM q.retry_maximum_backoff)),
        'archive_on_delete', q.archive_on_delete,
        'archive_retention', coalesce(extract(epoch FROM q.archive_retention), 0),
        'max_depth', coalesce(q.max_depth, 0),
        'receive_rate_limit', coalesce(q.receive_rate_limit, 0),
        'tags', q.tags)
$$;

-- The seconds of a setting as an interval: PB400 unless it lies in [low, high],
-- or is 0 where 0 is allowed (it then means "no limit": NULL).
CREATE OR REPLACE FUNCTION postbox._seconds_setting(settings jsonb, key text, low numeric, high numeric,
                                         zero_means_none boolean DEFAULT false)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    seconds numeric;
BEGIN
    IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
        PERFORM postbox._invalid(format('queue setting %s must be a number of seconds', key));
    END IF;
    seconds := (settings ->> key)::numeric;
    IF zero_means_none AND seconds = 0 THEN
        RETURN NULL;
    END IF;
    IF seconds < low OR seconds > high THEN
        PERFORM postbox._invalid(format('%s is %s s; it must be %s to %s s%s', key, seconds, low, high,
                                        CASE WHEN zero_means_none THEN ', or 0 for no limit' ELSE '' END));
    END IF;
    RETURN make_interval(secs => seconds);
END
$$;

-- Checks settings jsonb (a full set, in the shape of queue_defaults()) and
-- writes them into q; q.name and q.fifo must be set.
CREATE OR REPLACE FUNCTION postbox._apply_settings(q postbox.queues, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    unknown text;
    key text;
    number numeric;
    policy jsonb;
    dlq postbox.queues;
BEGIN
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k
    WHERE NOT postbox.queue_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown queue setting(s): %s', unknown));
    END IF;
    FOREACH key IN ARRAY ARRAY['max_message_size', 'max_depth', 'receive_rate_limit'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid(format('queue setting %s must be a number', key));
        END IF;
    END LOOP;
    FOREACH key IN ARRAY ARRAY['content_based_deduplication', 'archive_on_delete'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'boolean' THEN
            PERFORM postbox._invalid(format('queue setting %s must be true or false', key));
        END IF;
    END LOOP;

    q.visibility_timeout := postbox._seconds_setting(settings, 'visibility_timeout', 0, 43200);
    q.retention := postbox._seconds_setting(settings, 'retention', 60, 1209600, true);
    q.delivery_delay := postbox._seconds_setting(settings, 'delivery_delay', 0,
                                                 coalesce(extract(epoch FROM q.retention), 31536000));
    q.receive_wait_time := postbox._seconds_setting(settings, 'receive_wait_time', 0, 20);
    q.deduplication_window := postbox._seconds_setting(settings, 'deduplication_window', 1, 604800);
    q.archive_retention := postbox._seconds_setting(settings, 'archive_retention', 60, 1209600, true);

    number := (settings ->> 'max_message_size')::numeric;
    IF number <> trunc(number) OR number < 1024 OR number > 67108864 THEN
        PERFORM postbox._invalid(format(
            'max_message_size is %s; it must be a whole number of bytes from 1024 to 67108864', number));
    END IF;
    q.max_message_size := number::integer;
    number := (settings ->> 'max_depth')::numeric;
    IF number <> trunc(number) OR number < 0 OR number > 1e15 THEN
        PERFORM postbox._invalid(format('max_depth is %s; it must be a whole number, 0 for no limit', number));
    END IF;
    q.max_depth := nullif(number, 0)::bigint;
    number := (settings ->> 'receive_rate_limit')::numeric;
    IF number < 0 OR number > 1e6 THEN
        PERFORM postbox._invalid(format(
            'receive_rate_limit is %s; it must be 0 (no limit) to 1000000 messages per second', number));
    END IF;
    q.receive_rate_limit := nullif(number, 0)::double precision;
    q.content_based_deduplication := (settings ->> 'content_based_deduplication')::boolean;
    q.archive_on_delete := (settings ->> 'archive_on_delete')::boolean;

    -- Bounds left out keep their defaults.
    policy := (postbox.queue_defaults() -> 'retry_policy') || coalesce(settings -> 'retry_policy', '{}');
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('minimum_backoff', 'maximum_backoff')) THEN
        PERFORM postbox._invalid('retry_policy must be an object of minimum_backoff and maximum_backoff (seconds)');
    END IF;
    q.retry_minimum_backoff := postbox._seconds_setting(policy, 'minimum_backoff', 0, 43200);
    q.retry_maximum_backoff := postbox._seconds_setting(policy, 'maximum_backoff', 0, 43200);
    IF q.retry_minimum_backoff > q.retry_maximum_backoff THEN
        PERFORM postbox._invalid('retry_policy: minimum_backoff must not exceed maximum_backoff');
    END IF;

    policy := settings -> 'redrive_allow_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('permission', 'source_queues'))
       OR NOT coalesce(policy ->> 'permission' IN ('allow_all', 'deny_all', 'by_queue'), false)
       OR jsonb_typeof(coalesce(policy -> 'source_queues', '[]')) <> 'array'
       OR EXISTS (SELECT FROM jsonb_array_elements(coalesce(policy -> 'source_queues', '[]')) e
                  WHERE jsonb_typeof(e) <> 'string') THEN
        PERFORM postbox._invalid('redrive_allow_policy must be an object of permission (allow_all, '
                                 'deny_all or by_queue) and source_queues (queue names)');
    END IF;
    q.redrive_permission := policy ->> 'permission';
    q.redrive_sources := ARRAY(SELECT jsonb_array_elements_text(coalesce(policy -> 'source_queues', '[]')));
    IF (q.redrive_permission = 'by_queue') <> (cardinality(q.redrive_sources) > 0)
       OR cardinality(q.redrive_sources) > 10 THEN
        PERFORM postbox._invalid('redrive_allow_policy: by_queue takes 1 to 10 source_queues, '
                                 'allow_all and deny_all take none');
    END IF;

    policy := settings -> 'tags';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR (SELECT count(*) FROM jsonb_object_keys(policy)) > 50
       OR EXISTS (SELECT FROM jsonb_each(policy) e
                  WHERE length(e.key) NOT BETWEEN 1 AND 128 OR jsonb_typeof(e.value) <> 'string'
                        OR length(e.value #>> '{}') > 256) THEN
        PERFORM postbox._invalid('tags must be an object of at most 50 keys (1 to 128 characters) '
                                 'with string values (at most 256 characters)');
    END IF;
    q.tags := policy;

    policy := settings -> 'dead_letter_policy';
    IF policy IS NULL OR policy = 'null' THEN
        q.dead_letter_queue_id := NULL;
        q.max_receive_count := NULL;
    ELSE
        IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
           OR EXISTS (SELECT FROM jsonb_object_keys(policy) k
                      WHERE k NOT IN ('dead_letter_queue', 'max_receive_count'))
           OR jsonb_typeof(policy -> 'dead_letter_queue') IS DISTINCT FROM 'string'
           OR jsonb_typeof(policy -> 'max_receive_count') IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid('dead_letter_policy must be an object of dead_letter_queue (a queue '
                                     'name) and max_receive_count (1 to 1000)');
        END IF;
        number := (policy ->> 'max_receive_count')::numeric;
        IF number <> trunc(number) OR number NOT BETWEEN 1 AND 1000 THEN
            PERFORM postbox._invalid(format('max_receive_count is %s; it must be 1 to 1000', number));
        END IF;
        SELECT * INTO dlq FROM postbox.queues WHERE name = policy ->> 'dead_letter_queue';
        IF NOT FOUND THEN
            PERFORM postbox._invalid(format('dead-letter queue %s does not exist; create it first',
                                            quote_literal(policy ->> 'dead_letter_queue')));
        ELSIF dlq.name = q.name THEN
            PERFORM postbox._invalid('a queue cannot be its own dead-letter queue');
        ELSIF dlq.fifo <> q.fifo THEN
            PERFORM postbox._invalid('a FIFO queue needs a FIFO dead-letter queue, and a standard queue '
                                     'a standard one');
        ELSIF dlq.redrive_permission = 'deny_all'
              OR (dlq.redrive_permission = 'by_queue' AND NOT q.name = ANY (dlq.redrive_sources)) THEN
            PERFORM postbox._invalid(format('the redrive_allow_policy of %s does not let %s use it as '
                                            'dead-letter queue', quote_literal(dlq.name), quote_literal(q.name)));
        END IF;
        q.dead_letter_queue_id := dlq.id;
        q.max_receive_count := number::integer;
    END IF;
    RETURN q;
END
$$;

-- Creates a queue; a name ending in ".fifo" makes it a FIFO queue. settings:
-- any keys of queue_defaults(), e.g. '{"visibility_timeout": 60}'. PB409 if the
-- queue exists.
CREATE OR REPLACE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q.name := queue_name;
    q.fifo := right(queue_name, 5) = '.fifo';
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (
        name, visibility_timeout, delivery_delay, retention, max_message_size, receive_wait_time,
        fifo, content_based_deduplication, deduplication_window, dead_letter_queue_id,
        max_receive_count, redrive_permission, redrive_sources, retry_minimum_backoff,
        retry_maximum_backoff, archive_on_delete, archive_retention, max_depth, receive_rate_limit,
        send_paused, receive_paused, tags)
    VALUES (
        queue_name, q.visibility_timeout, q.delivery_delay, q.retention, q.max_message_size,
        q.receive_wait_time, q.fifo, q.content_based_deduplication, q.deduplication_window,
        q.dead_letter_queue_id, q.max_receive_count, q.redrive_permission, q.redrive_sources,
        q.retry_minimum_backoff, q.retry_maximum_backoff, q.archive_on_delete, q.archive_retention,
        q.max_depth, q.receive_rate_limit, false, false, q.tags)
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
CREATE OR REPLACE FUNCTION postbox.update_queue(queue_name text, settings jsonb) RETURNS postbox.queues
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
        receive_wait_time = q.receive_wait_time,
        content_based_deduplication = q.content_based_deduplication,
        deduplication_window = q.deduplication_window, dead_letter_queue_id = q.dead_letter_queue_id,
        max_receive_count = q.max_receive_count, redrive_permission = q.redrive_permission,
        redrive_sources = q.redrive_sources, retry_minimum_backoff = q.retry_minimum_backoff,
        retry_maximum_backoff = q.retry_maximum_backoff, archive_on_delete = q.archive_on_delete,
        archive_retention = q.archive_retention, max_depth = q.max_depth,
        receive_rate_limit = q.receive_rate_limit, tags = q.tags, updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

-- Deletes a queue and all its messages. PB412 while it is another queue's
-- dead-letter queue.
CREATE OR REPLACE FUNCTION postbox.drop_queue(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    sources text;
BEGIN
    SELECT string_agg(quote_literal(name), ', ' ORDER BY name) INTO sources
    FROM postbox.queues WHERE dead_letter_queue_id = q.id AND id <> q.id;
    IF sources IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'queue %s is the dead-letter queue of %s; remove their dead_letter_policy first',
            quote_literal(queue_name), sources);
    END IF;
    PERFORM postbox._lock_queue(q.id, true);
    DELETE FROM postbox.messages WHERE queue_id = q.id;
    DELETE FROM postbox.notify_throttle WHERE queue_id = q.id;
    DELETE FROM postbox.deduplication WHERE queue_id = q.id;
    DELETE FROM postbox.archive WHERE queue_id = q.id;
    DELETE FROM postbox.receive_tokens WHERE queue_id = q.id;
    DELETE FROM postbox.redrive_tasks WHERE dead_letter_queue_id = q.id;
    UPDATE postbox.redrive_tasks
    SET status = 'failed', failure_reason = 'the destination queue was deleted', updated_at = now()
    WHERE destination_queue_id = q.id AND status = 'running';
    DELETE FROM postbox.queues WHERE id = q.id;
END
$$;

-- Deletes every message of a queue; returns how many. Sends wait meanwhile, so
-- no FIFO message is parked behind a head that the purge removed.
CREATE OR REPLACE FUNCTION postbox.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    purged bigint;
BEGIN
    PERFORM postbox._lock_queue(q.id, true);
    DELETE FROM postbox.messages WHERE queue_id = q.id;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END
$$;

-- Live counts of a queue's messages. Parked FIFO messages count as visible
-- (waiting for their turn); expired ones do not count.
CREATE OR REPLACE FUNCTION postbox.queue_stats(queue_name text)
RETURNS TABLE (visible bigint, in_flight bigint, delayed bigint, oldest_age interval)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    RETURN QUERY
    SELECT count(*) FILTER (WHERE m.visible_at <= now() OR m.visible_at = 'infinity'),
           count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NOT NULL),
           count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NULL),
           coalesce(now() - min(m.enqueued_at), interval '0')
    FROM postbox.messages m
    WHERE m.queue_id = q.id AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention);
END
$$;

-- A one-element array of x, or NULL when x is NULL: single sends pass their
-- options this way, so that absent options stay absent for send_batch.
CREATE OR REPLACE FUNCTION postbox._array_of(x anyelement) RETURNS anyarray
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN x IS NOT NULL THEN ARRAY[x] END
$$;

-- Takes the advisory locks of FIFO message groups, in one global order so that
-- two callers never wait on each other in a circle.
CREATE OR REPLACE FUNCTION postbox._lock_groups(queue_id integer, groups text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    lock_key bigint;
BEGIN
    FOR lock_key IN
        SELECT DISTINCT hashtextextended(g, queue_id) FROM unnest(groups) AS g WHERE g IS NOT NULL ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(lock_key);
    END LOOP;
END
$$;

-- Makes the oldest message of each group visible when it is parked: the group's
-- head is gone. Callers hold the groups' locks.
CREATE OR REPLACE FUNCTION postbox._promote(q postbox.queues, groups text[]) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.messages m
    SET visible_at = greatest(now(), m.enqueued_at + q.delivery_delay)
    FROM (SELECT (SELECT x.id FROM postbox.messages x
                  WHERE x.queue_id = q.id AND x.message_group_id = g
                  ORDER BY x.id LIMIT 1) AS id
          FROM (SELECT DISTINCT g FROM unnest(groups) AS g) AS s) AS head
    WHERE m.id = head.id AND m.visible_at = 'infinity'
$$;

-- When a message sent at sent_at becomes visible: at deliver_at (a past time
-- meaning now), else after its delay, else after the queue's default delay.
CREATE OR REPLACE FUNCTION postbox._visible_at(sent_at timestamptz, delay interval, deliver_at timestamptz,
                                    default_delay interval)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN deliver_at IS NOT NULL THEN greatest(deliver_at, sent_at)
                ELSE sent_at + coalesce(delay, default_delay) END
$$;

-- Sends up to 1,000 messages in one go; returns their ids in input order, and
-- whether each was a duplicate (then nothing was enqueued and the id is the
-- original message's). Entry i of every array belongs to bodies[i]; an array may
-- be NULL or shorter (missing entries are NULL):
--   attributes       see attribute_problem
--   delays           invisible this long first (NULL: the queue's delivery_delay)
--   message_group_ids  FIFO queues: required; delivery is in order per group
--   deduplication_ids  a repeat within the queue's deduplication_window is
--                      dropped (content-based when the queue says so)
--   dedupe_keys      standard queues: replaces the body and attributes of a
--                    waiting (never received) message with the same key
--   priorities       0-9, standard queues; higher is received first
--   deliver_ats      invisible until then (instead of a delay)
-- Nothing is sent if any entry is invalid; the error names the entry by its
-- 0-based index. PB503 while sends are paused, PB429 when max_depth is reached.
CREATE OR REPLACE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(bodies), 0);
    problem text;
    sent_at timestamptz := clock_timestamp();
    latest timestamptz;
    ids bigint[];
    resolved bigint[];
    dedup text[];
    adding bigint;
    depth bigint;
BEGIN
    IF q.send_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for sending; ResumeQueue lets sends in again', quote_literal(queue_name));
    END IF;
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(attributes), cardinality(delays), cardinality(message_group_ids),
                cardinality(deduplication_ids), cardinality(dedupe_keys), cardinality(priorities),
                cardinality(deliver_ats)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    latest := sent_at + coalesce(q.retention, interval '365 days');
    SELECT postbox._entry_prefix(c.i, n) || c.problem INTO problem
    FROM (
        SELECT e.i, CASE
            WHEN e.b IS NULL THEN 'body must not be NULL'
            WHEN q.fifo AND (e.d IS NOT NULL OR e.t IS NOT NULL) THEN
                'FIFO queues take no per-message delay; set the queue''s delivery_delay instead'
            WHEN e.d IS NOT NULL AND e.t IS NOT NULL THEN 'give a delay or a delivery time, not both'
            WHEN e.d < interval '0' OR sent_at + e.d > latest THEN
                format('delay %s is outside 0 s to the retention period', e.d)
            WHEN e.t > latest THEN format('delivery time %s is beyond the retention period', e.t)
            WHEN e.p NOT BETWEEN 0 AND 9 THEN format('priority %s is outside 0 to 9', e.p)
            WHEN q.fifo AND e.p > 0 THEN 'FIFO queues deliver in order; priority is for standard queues'
            WHEN q.fifo AND e.g IS NULL THEN 'FIFO queues need a message_group_id'
            WHEN e.g !~ '^[!-~]{1,128}$' THEN 'message_group_id must be 1 to 128 printable ASCII characters'
            WHEN e.x !~ '^[!-~]{1,128}$' THEN 'deduplication_id must be 1 to 128 printable ASCII characters'
            WHEN q.fifo AND e.x IS NULL AND NOT q.content_based_deduplication THEN
                'FIFO queues need a deduplication_id unless the queue has content_based_deduplication'
            WHEN e.k IS NOT NULL AND q.fifo THEN
                'dedupe_key is for standard queues; FIFO queues deduplicate by deduplication_id'
            WHEN e.k IS NOT NULL AND e.x IS NOT NULL THEN 'give a dedupe_key or a deduplication_id, not both'
            WHEN length(e.k) NOT BETWEEN 1 AND 256 THEN 'dedupe_key must be 1 to 256 characters'
            WHEN postbox.message_size(e.b, e.a) > q.max_message_size THEN format(
                'message is %s bytes; the queue takes at most %s (body and attributes)',
                postbox.message_size(e.b, e.a), q.max_message_size)
        END AS problem
        FROM unnest(bodies, delays, deliver_ats, priorities, message_group_ids, deduplication_ids,
                    dedupe_keys, attributes) WITH ORDINALITY AS e(b, d, t, p, g, x, k, a, i)
    ) AS c
    WHERE c.problem IS NOT NULL
    ORDER BY c.i
    LIMIT 1;
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
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;

    PERFORM postbox._lock_queue(q.id, false);
    IF NOT q.fifo AND NOT q.content_based_deduplication AND q.max_depth IS NULL
       AND deduplication_ids IS NULL AND dedupe_keys IS NULL THEN
        -- The common case, in one statement: identity values are drawn in
        -- insertion order, so id order is input order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body, priority,
                                          message_group_id)
            SELECT q.id, postbox._visible_at(sent_at, d, t, q.delivery_delay), sent_at,
                   a, b, coalesce(p, 0), g
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, i)
            ORDER BY i
            RETURNING id
        )
        SELECT id, false FROM inserted ORDER BY id;
        PERFORM postbox._notify(q);
        RETURN;
    END IF;

    -- FIFO groups are locked before ids are drawn, so a group's id order is the
    -- order in which its sends commit.
    IF q.fifo THEN
        PERFORM postbox._lock_groups(q.id, message_group_ids);
    END IF;
    SELECT array_agg(nextval('postbox.messages_id_seq') ORDER BY s) INTO ids FROM generate_series(1, n) AS s;
    resolved := ids;

    -- Deduplication: the first entry with an id claims it unless the queue saw it
    -- within its window (a concurrent claimer is waited for); the rest resolve to
    -- the claimer's message.
    dedup := ARRAY(
        SELECT coalesce(x, CASE WHEN q.content_based_deduplication THEN encode(sha256(b), 'hex') END)
        FROM unnest(bodies, deduplication_ids) WITH ORDINALITY AS e(b, x, i) ORDER BY i);
    IF EXISTS (SELECT FROM unnest(dedup) AS x WHERE x IS NOT NULL) THEN
        INSERT INTO postbox.deduplication AS d (queue_id, deduplication_id, message_id, expires_at)
        SELECT DISTINCT ON (e.x) q.id, e.x, ids[e.i], sent_at + q.deduplication_window
        FROM unnest(dedup) WITH ORDINALITY AS e(x, i)
        WHERE e.x IS NOT NULL
        ORDER BY e.x, e.i
        ON CONFLICT (queue_id, deduplication_id) DO UPDATE
        SET message_id = excluded.message_id, expires_at = excluded.expires_at
        WHERE d.expires_at <= sent_at;
        resolved := ARRAY(
            SELECT coalesce((SELECT d.message_id FROM postbox.deduplication d
                             WHERE d.queue_id = q.id AND d.deduplication_id = e.x), ids[e.i])
            FROM unnest(dedup) WITH ORDINALITY AS e(x, i) ORDER BY e.i);
    END IF;

    -- Idempotent enqueue: the last entry of a key carries the content; a waiting
    -- message with the key takes it, otherwise a new message is inserted.
    IF dedupe_keys IS NOT NULL THEN
        WITH upserted AS (
            INSERT INTO postbox.messages AS m (id, queue_id, visible_at, enqueued_at, attributes, body,
                                               priority, message_group_id, dedupe_key)
            OVERRIDING SYSTEM VALUE
            SELECT DISTINCT ON (e.k) ids[e.i], q.id,
                   postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay), sent_at,
                   e.a, e.b, coalesce(e.p, 0), e.g, e.k
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedupe_keys)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, k, i)
            WHERE e.k IS NOT NULL
            ORDER BY e.k, e.i DESC
            ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO UPDATE
            SET body = excluded.body, attributes = excluded.attributes, priority = excluded.priority
            RETURNING m.id, m.dedupe_key
        )
        SELECT ARRAY(
            SELECT coalesce(u.id, resolved[e.i])
            FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
            LEFT JOIN upserted u ON u.dedupe_key = e.k
            ORDER BY e.i)
        INTO resolved;
    END IF;

    IF q.max_depth IS NOT NULL THEN
        -- Bounded queues take their sends one at a time, so the count is exact.
        PERFORM pg_advisory_xact_lock(1886350199, q.id);  -- 'posu'
        SELECT count(*) FILTER (WHERE r = id AND (k IS NULL)) INTO adding
        FROM unnest(resolved, ids, dedupe_keys) AS e(r, id, k);
        SELECT count(*) INTO depth
        FROM (SELECT FROM postbox.messages WHERE queue_id = q.id LIMIT q.max_depth + 1) AS s;
        IF depth + adding > q.max_depth THEN
            RAISE EXCEPTION USING ERRCODE = 'PB429', MESSAGE = format(
                'queue %s holds %s messages and its max_depth is %s, so %s more do not fit; '
                'receive some or raise max_depth', quote_literal(queue_name), depth, q.max_depth, adding);
        END IF;
    END IF;

    INSERT INTO postbox.messages (id, queue_id, visible_at, enqueued_at, attributes, body, priority,
                                  message_group_id, deduplication_id)
    OVERRIDING SYSTEM VALUE
    SELECT ids[e.i], q.id,
           CASE WHEN q.fifo AND (row_number() OVER (PARTITION BY e.g ORDER BY e.i) > 1
                                 OR EXISTS (SELECT FROM postbox.messages x
                                            WHERE x.queue_id = q.id AND x.message_group_id = e.g))
                THEN 'infinity'
                ELSE postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) END,
           sent_at, e.a, e.b, coalesce(e.p, 0), e.g, e.x
    FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedup,
                dedupe_keys, resolved)
         WITH ORDINALITY AS e(b, a, d, t, p, g, x, k, r, i)
    WHERE e.k IS NULL AND e.r = ids[e.i]
    ORDER BY e.i;
    PERFORM postbox._notify(q);
    RETURN QUERY SELECT e.r, e.r <> ids[e.i] FROM unnest(resolved) WITH ORDINALITY AS e(r, i) ORDER BY e.i;
END
$$;

-- Sends one message; returns its id (the original's, for a duplicate). See
-- send_batch for the options and rules.
CREATE OR REPLACE FUNCTION postbox.send(
    queue_name text, body bytea, attributes jsonb DEFAULT NULL, delay interval DEFAULT NULL,
    message_group_id text DEFAULT NULL, deduplication_id text DEFAULT NULL,
    dedupe_key text DEFAULT NULL, priority integer DEFAULT NULL, deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE sql AS $$
    SELECT message_id FROM postbox.send_batch(
        queue_name, ARRAY[body], postbox._array_of(attributes), postbox._array_of(delay),
        postbox._array_of(message_group_id), postbox._array_of(deduplication_id),
        postbox._array_of(dedupe_key), postbox._array_of(priority), postbox._array_of(deliver_at))
$$;

-- Takes up to `wanted` tokens of a rate-limited queue's bucket (capacity: one
-- second of the rate); returns how many it took.
CREATE OR REPLACE FUNCTION postbox._take_receive_tokens(q postbox.queues, wanted integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := clock_timestamp();
    capacity double precision := greatest(1, q.receive_rate_limit);
    level double precision;
    taken integer;
BEGIN
    INSERT INTO postbox.receive_tokens VALUES (q.id, capacity, at) ON CONFLICT DO NOTHING;
    SELECT least(capacity, t.tokens + q.receive_rate_limit * extract(epoch FROM at - t.refilled_at))
    INTO level
    FROM postbox.receive_tokens t WHERE t.queue_id = q.id FOR UPDATE;
    taken := least(wanted, floor(level))::integer;
    UPDATE postbox.receive_tokens SET tokens = level - taken, refilled_at = at WHERE queue_id = q.id;
    RETURN taken;
END
$$;

-- Gives back tokens that a receive took but did not use.
CREATE OR REPLACE FUNCTION postbox._return_receive_tokens(q postbox.queues, unused integer) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.receive_tokens
    SET tokens = least(greatest(1, q.receive_rate_limit), tokens + unused)
    WHERE queue_id = q.id AND unused > 0
$$;

-- Removes messages (all of ids, or, with leases, those whose lease still
-- matches), archiving them if the queue archives and promoting the next message
-- of their FIFO groups. Returns the ids removed.
CREATE OR REPLACE FUNCTION postbox._remove(q postbox.queues, ids bigint[], leases uuid[], why text) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    removed bigint[];
    groups text[];
BEGIN
    IF q.archive_on_delete THEN
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(ids, leases) AS t(id, lease)
            WHERE m.id = t.id AND m.queue_id = q.id AND (t.lease IS NULL OR m.lease = t.lease)
            RETURNING m.*
        ), archived AS (
            INSERT INTO postbox.archive (id, queue_id, receive_count, enqueued_at, first_received_at,
                                         archived_at, reason, priority, message_group_id,
                                         deduplication_id, source_queue_id, last_error, attributes, body)
            SELECT g.id, g.queue_id, g.receive_count, g.enqueued_at, g.first_received_at,
                   clock_timestamp(), why, g.priority, g.message_group_id, g.deduplication_id,
                   g.source_queue_id, g.last_error, g.attributes, g.body
            FROM gone g
        )
        SELECT array_agg(g.id), array_agg(g.message_group_id) INTO removed, groups FROM gone g;
    ELSE
        -- The same delete without the archive: a data-modifying CTE costs even
        -- when it inserts nothing, and this is the path of every plain delete.
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(ids, leases) AS t(id, lease)
            WHERE m.id = t.id AND m.queue_id = q.id AND (t.lease IS NULL OR m.lease = t.lease)
            RETURNING m.id, m.message_group_id
        )
        SELECT array_agg(g.id), array_agg(g.message_group_id) INTO removed, groups FROM gone g;
    END IF;
    IF q.fifo AND groups IS NOT NULL THEN
        PERFORM postbox._lock_groups(q.id, groups);
        PERFORM postbox._promote(q, groups);
        PERFORM postbox._notify(q);
    END IF;
    RETURN coalesce(removed, '{}');
END
$$;

-- Moves messages (locked by the caller) into queue `target`: as dead letters of
-- `source`, or back (redrive) with their deliveries uncounted. In a FIFO target
-- they join the end of their groups; in a FIFO source the next messages move up.
CREATE OR REPLACE FUNCTION postbox._move(ids bigint[], source postbox.queues, target postbox.queues,
                              as_dead_letters boolean)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    groups text[];
BEGIN
    SELECT array_agg(DISTINCT m.message_group_id) INTO groups
    FROM postbox.messages m WHERE m.id = ANY (ids) AND m.message_group_id IS NOT NULL;
    IF groups IS NOT NULL AND (source.fifo OR target.fifo) THEN
        -- Both queues' group locks, the lower queue id first.
        PERFORM postbox._lock_groups(least(source.id, target.id), groups);
        PERFORM postbox._lock_groups(greatest(source.id, target.id), groups);
    END IF;
    UPDATE postbox.messages m
    SET queue_id = target.id,
        source_queue_id = CASE WHEN as_dead_letters THEN source.id END,
        dead_lettered_at = CASE WHEN as_dead_letters THEN clock_timestamp() END,
        receive_count = CASE WHEN as_dead_letters THEN m.receive_count ELSE 0 END,
        first_received_at = CASE WHEN as_dead_letters THEN m.first_received_at END,
        lease = NULL,
        visible_at = v.visible_at
    FROM (SELECT x.id,
                 CASE WHEN target.fifo AND (
                          row_number() OVER (PARTITION BY x.message_group_id ORDER BY x.id) > 1
                          OR EXISTS (SELECT FROM postbox.messages y
                                     WHERE y.queue_id = target.id AND y.message_group_id = x.message_group_id))
                      THEN 'infinity'::timestamptz ELSE clock_timestamp() END AS visible_at
          FROM postbox.messages x WHERE x.id = ANY (ids)) AS v
    WHERE m.id = v.id;
    IF source.fifo AND groups IS NOT NULL THEN
        PERFORM postbox._promote(source, groups);
        PERFORM postbox._notify(source);
    END IF;
    PERFORM postbox._notify(target);
END
$$;

-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>". Order: priority, then visibility
-- time, then id; FIFO queues hand out only group heads. On the way, expired
-- messages are removed and messages received max_receive_count times already
-- move to the dead-letter queue instead. A rate-limited queue returns fewer
-- messages when its tokens run short. PB503 while receives are paused.
CREATE OR REPLACE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
                                visibility_timeout interval DEFAULT NULL)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, receipt text, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text)
LANGUAGE plpgsql
-- Receive must walk the ready index in order and stop at the first rows it can
-- claim. With stale statistics the planner may instead fetch every visible row
-- (a bitmap or sequential scan) and sort them, which on a deep queue, or one
-- full of dead index entries, costs more than everything else put together.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    timeout interval := coalesce(visibility_timeout, q.visibility_timeout);
    expired_before timestamptz := now() - q.retention;
    allowed integer;
    to_deliver bigint[];
    to_expire bigint[];
    to_bury bigint[];
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages is %s; it must be 1 to 1000', max_messages));
    END IF;
    IF timeout < interval '0' OR timeout > interval '12 hours' THEN
        PERFORM postbox._invalid(format('visibility timeout %s is outside 0 s to 12 h', timeout));
    END IF;
    IF q.receive_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for receiving; ResumeQueue lets receives in again', quote_literal(queue_name));
    END IF;
    -- Each round removes what it must not deliver; a few rounds find deliverable
    -- messages behind expired ones, the maintenance worker does the rest.
    FOR attempt IN 1..10 LOOP
        allowed := CASE WHEN q.receive_rate_limit IS NULL THEN max_messages
                        ELSE postbox._take_receive_tokens(q, max_messages) END;
        EXIT WHEN allowed = 0;
        SELECT array_agg(p.id) FILTER (WHERE NOT p.gone AND NOT p.dead),
               array_agg(p.id) FILTER (WHERE p.gone),
               array_agg(p.id) FILTER (WHERE p.dead AND NOT p.gone)
        INTO to_deliver, to_expire, to_bury
        FROM (
            SELECT * FROM (  -- priority > 0 first, through its partial index
                SELECT m.id, coalesce(m.enqueued_at < expired_before, false) AS gone,
                       coalesce(m.receive_count >= q.max_receive_count, false) AS dead
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority > 0 AND m.visible_at <= now()
                ORDER BY m.priority DESC, m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS high
            UNION ALL
            SELECT * FROM (  -- then the rest, in visibility order
                SELECT m.id, coalesce(m.enqueued_at < expired_before, false),
                       coalesce(m.receive_count >= q.max_receive_count, false)
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority = 0 AND m.visible_at <= now()
                ORDER BY m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS normal
            LIMIT allowed
        ) AS p;
        IF to_expire IS NOT NULL THEN
            PERFORM postbox._remove(q, to_expire, NULL, 'expired');
        END IF;
        IF to_bury IS NOT NULL THEN
            PERFORM postbox._move(to_bury, q, (SELECT d FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id),
                                  true);
        END IF;
        IF q.receive_rate_limit IS NOT NULL THEN
            PERFORM postbox._return_receive_tokens(q, allowed - coalesce(cardinality(to_deliver), 0));
        END IF;
        IF to_deliver IS NOT NULL THEN
            RETURN QUERY
            WITH claimed AS (
                UPDATE postbox.messages m
                SET visible_at = clock_timestamp() + timeout,
                    receive_count = m.receive_count + 1,
                    first_received_at = coalesce(m.first_received_at, clock_timestamp()),
                    lease = gen_random_uuid(),
                    dedupe_key = NULL
                WHERE m.id = ANY (to_deliver)
                RETURNING m.*
            )
            SELECT c.id, c.body, c.attributes, c.enqueued_at, c.receive_count, c.first_received_at,
                   c.id || ':' || c.lease, c.priority, c.message_group_id, c.deduplication_id,
                   (SELECT s.name FROM postbox.queues s WHERE s.id = c.source_queue_id), c.last_error
            FROM claimed c
            ORDER BY c.priority DESC, c.id;
            RETURN;
        END IF;
        EXIT WHEN to_expire IS NULL AND to_bury IS NULL;
    END LOOP;
END
$$;

-- Deletes received messages by receipt. One outcome per receipt, in order;
-- see _receipt_outcomes. Archives them if the queue archives.
CREATE OR REPLACE FUNCTION postbox.delete_batch(queue_name text, receipts text[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    parsed record;
    done bigint[];
BEGIN
    PERFORM postbox._check_batch_size(cardinality(receipts));
    SELECT array_agg(p.message_id) AS ids, array_agg(p.lease) AS leases INTO parsed
    FROM postbox._parse_receipts(receipts) p WHERE p.message_id IS NOT NULL;
    done := postbox._remove(q, parsed.ids, parsed.leases, 'deleted');
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- The backoff of a nack without delay: exponential in the number of
-- deliveries, between the queue's minimum and maximum, with equal jitter.
CREATE OR REPLACE FUNCTION postbox._backoff(q postbox.queues, deliveries integer) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT least(q.retry_maximum_backoff,
                 q.retry_minimum_backoff * power(2, least(greatest(deliveries - 1, 0), 30)))
           * (0.5 + random() / 2)
$$;

-- Gives received messages back: visible again after `delays[i]` (NULL: the
-- queue's retry backoff), recording errors[i] as the message's last error. The
-- receipt is spent. One outcome per receipt, in order; see _receipt_outcomes.
CREATE OR REPLACE FUNCTION postbox.nack_batch(queue_name text, receipts text[], delays interval[] DEFAULT NULL,
                                   errors text[] DEFAULT NULL)
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(receipts), 0);
    problem text;
    done bigint[];
BEGIN
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(delays), cardinality(errors)) > n THEN
        PERFORM postbox._invalid('delays and errors may not have more entries than receipts');
    END IF;
    SELECT postbox._entry_prefix(e.i, n) || CASE
               WHEN e.d < interval '0' OR e.d > interval '12 hours' THEN format('delay %s is outside 0 s to 12 h', e.d)
               ELSE format('error is %s characters; at most 4096 are kept', length(e.r)) END
    INTO problem
    FROM unnest(delays, errors) WITH ORDINALITY AS e(d, r, i)
    WHERE e.d < interval '0' OR e.d > interval '12 hours' OR length(e.r) > 4096
    ORDER BY e.i LIMIT 1;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    WITH nacked AS (
        UPDATE postbox.messages m
        SET visible_at = clock_timestamp() + coalesce(e.d, postbox._backoff(q, m.receive_count)),
            lease = NULL,
            last_error = coalesce(e.r, m.last_error)
        FROM postbox._parse_receipts(receipts) p
        LEFT JOIN unnest(delays, errors) WITH ORDINALITY AS e(d, r, i) ON e.i = p.i
        WHERE m.id = p.message_id AND m.queue_id = q.id AND m.lease = p.lease
        RETURNING m.id
    )
    SELECT array_agg(id) INTO done FROM nacked;
    IF done IS NOT NULL THEN
        PERFORM postbox._notify(q);
    END IF;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Gives one received message back; see nack_batch. PB412 for a stale receipt,
-- PB404 if the message is gone.
CREATE OR REPLACE FUNCTION postbox.nack(queue_name text, receipt text, delay interval DEFAULT NULL,
                             error text DEFAULT NULL)
RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.nack_batch(queue_name, ARRAY[receipt], postbox._array_of(delay), postbox._array_of(error))
$$;

-- The earliest time a message of the queue may be received: when the first
-- message becomes visible, or later when the queue's rate limit allows. NULL
-- when nothing is waiting or receives are paused. Waiting servers set a timer.
CREATE OR REPLACE FUNCTION postbox.next_visible_at(queue_name text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
-- An ordered walk of the ready index, whatever the statistics say (see receive).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    at timestamptz;
BEGIN
    IF q.receive_paused THEN
        RETURN NULL;
    END IF;
    SELECT nullif(min(m.visible_at), 'infinity') INTO at FROM postbox.messages m WHERE m.queue_id = q.id;
    IF at IS NOT NULL AND q.receive_rate_limit IS NOT NULL THEN
        SELECT greatest(at, t.refilled_at + make_interval(secs => greatest(0, 1 - t.tokens) / q.receive_rate_limit))
        INTO at
        FROM postbox.receive_tokens t WHERE t.queue_id = q.id;
    END IF;
    RETURN at;
END
$$;

-- Stops sends and/or receives of a queue (both when neither is named): they
-- fail with PB503 until resume_queue.
CREATE OR REPLACE FUNCTION postbox.pause_queue(queue_name text, sends boolean DEFAULT false,
                                    receives boolean DEFAULT false)
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    both_ boolean := NOT coalesce(sends, false) AND NOT coalesce(receives, false);
BEGIN
    UPDATE postbox.queues
    SET send_paused = send_paused OR sends OR both_,
        receive_paused = receive_paused OR receives OR both_,
        updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

-- Lets sends and/or receives of a queue in again (both when neither is named).
CREATE OR REPLACE FUNCTION postbox.resume_queue(queue_name text, sends boolean DEFAULT false,
                                     receives boolean DEFAULT false)
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    both_ boolean := NOT coalesce(sends, false) AND NOT coalesce(receives, false);
BEGIN
    UPDATE postbox.queues
    SET send_paused = send_paused AND NOT (sends OR both_),
        receive_paused = receive_paused AND NOT (receives OR both_),
        updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    PERFORM postbox._notify(q);  -- streams waiting on a receive-paused queue look again
    RETURN q;
END
$$;

-- The queues whose dead-letter queue this is, in name order after after_name.
CREATE OR REPLACE FUNCTION postbox.list_dead_letter_source_queues(queue_name text, page_size integer DEFAULT 100,
                                                       after_name text DEFAULT '')
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT s.name FROM postbox.queues s
    WHERE s.dead_letter_queue_id = (postbox._queue(queue_name)).id AND s.name > coalesce(after_name, '')
    ORDER BY s.name
    LIMIT page_size
$$;

-- Starts moving the dead letters of a queue back: to each message's source
-- queue, or to `destination`; at most max_messages (NULL: all), at most `rate`
-- per second (NULL: as fast as the maintenance worker goes). The servers'
-- maintenance worker runs the task (run_redrives). PB412 while one runs.
CREATE OR REPLACE FUNCTION postbox.start_redrive(dead_letter_queue text, destination text DEFAULT NULL,
                                      max_messages bigint DEFAULT NULL, rate double precision DEFAULT NULL)
RETURNS postbox.redrive_tasks
LANGUAGE plpgsql AS $$
DECLARE
    dlq postbox.queues := postbox._queue(dead_letter_queue);
    target postbox.queues;
    task postbox.redrive_tasks;
BEGIN
    IF destination IS NOT NULL THEN
        target := postbox._queue(destination);
        IF target.id = dlq.id THEN
            PERFORM postbox._invalid('the destination of a redrive must be another queue');
        ELSIF target.fifo <> dlq.fifo THEN
            PERFORM postbox._invalid('a redrive moves FIFO messages to a FIFO queue and standard ones '
                                     'to a standard queue');
        END IF;
    END IF;
    IF max_messages < 1 THEN
        PERFORM postbox._invalid(format('max_messages is %s; give at least 1, or none for all', max_messages));
    END IF;
    IF rate <= 0 OR rate > 1e6 THEN
        PERFORM postbox._invalid(format('rate is %s; it must be above 0 and at most 1000000 per second', rate));
    END IF;
    IF NOT EXISTS (SELECT FROM postbox.queues WHERE dead_letter_queue_id = dlq.id)
       AND NOT EXISTS (SELECT FROM postbox.messages WHERE queue_id = dlq.id AND source_queue_id IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'queue %s is no queue''s dead-letter queue and holds no dead letters', quote_literal(dead_letter_queue));
    END IF;
    IF EXISTS (SELECT FROM postbox.redrive_tasks WHERE dead_letter_queue_id = dlq.id AND status = 'running') THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'a redrive of %s is already running; cancel it or let it finish', quote_literal(dead_letter_queue));
    END IF;
    INSERT INTO postbox.redrive_tasks (dead_letter_queue_id, destination_queue_id, max_messages, rate, to_move)
    SELECT dlq.id, target.id, max_messages, rate, least(count(*), max_messages)
    FROM postbox.messages m
    WHERE m.queue_id = dlq.id AND (m.lease IS NULL OR m.visible_at <= now())
    RETURNING * INTO task;
    RETURN task;
END
$$;

-- The redrive tasks of a dead-letter queue, newest first.
CREATE OR REPLACE FUNCTION postbox.list_redrive_tasks(dead_letter_queue text, page_size integer DEFAULT 10)
RETURNS SETOF postbox.redrive_tasks
LANGUAGE plpgsql STABLE AS $$
DECLARE
    dlq postbox.queues := postbox._queue(dead_letter_queue);  -- PB404 even when no task exists
BEGIN
    RETURN QUERY
    SELECT * FROM postbox.redrive_tasks t
    WHERE t.dead_letter_queue_id = dlq.id
    ORDER BY t.created_at DESC, t.id
    LIMIT page_size;
END
$$;

-- Stops a running redrive; what it moved stays moved. PB404 for an unknown
-- task, PB412 when it is no longer running.
CREATE OR REPLACE FUNCTION postbox.cancel_redrive(task_id uuid) RETURNS postbox.redrive_tasks
LANGUAGE plpgsql AS $$
DECLARE
    task postbox.redrive_tasks;
BEGIN
    UPDATE postbox.redrive_tasks SET status = 'cancelled', updated_at = now()
    WHERE id = task_id AND status = 'running'
    RETURNING * INTO task;
    IF NOT FOUND THEN
        SELECT * INTO task FROM postbox.redrive_tasks WHERE id = task_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('redrive task %s does not exist', task_id);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'redrive task %s is %s, not running', task_id, task.status);
    END IF;
    RETURN task;
END
$$;

-- One step of every running redrive: moves up to batch_size messages per task,
-- fewer when its rate says so. Tasks are claimed with SKIP LOCKED, so servers
-- running this together never move the same messages. Returns how many moved.
CREATE OR REPLACE FUNCTION postbox.run_redrives(batch_size integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    task postbox.redrive_tasks;
    dlq postbox.queues;
    target postbox.queues;
    at timestamptz := clock_timestamp();
    credit double precision;
    allowance bigint;
    picked bigint[];
    moved bigint;
    total bigint := 0;
    stranded bigint;
BEGIN
    FOR task IN
        SELECT * FROM postbox.redrive_tasks WHERE status = 'running' ORDER BY created_at
        FOR UPDATE SKIP LOCKED
    LOOP
        SELECT * INTO dlq FROM postbox.queues WHERE id = task.dead_letter_queue_id;
        credit := CASE WHEN task.rate IS NULL THEN batch_size
                       ELSE least(task.credit + task.rate * extract(epoch FROM at - task.updated_at),
                                  greatest(task.rate, 1)) END;
        allowance := least(floor(credit)::bigint, batch_size,
                           coalesce(task.max_messages - task.moved, batch_size));
        moved := 0;
        IF allowance > 0 THEN
            SELECT array_agg(m.id) INTO picked
            FROM (SELECT m.id FROM postbox.messages m
                  WHERE m.queue_id = dlq.id AND (m.lease IS NULL OR m.visible_at <= now())
                        AND (task.destination_queue_id IS NOT NULL
                             OR m.source_queue_id IN (SELECT id FROM postbox.queues))
                  ORDER BY m.id LIMIT allowance
                  FOR UPDATE SKIP LOCKED) AS m;
            FOR target IN
                SELECT * FROM postbox.queues
                WHERE id IN (SELECT coalesce(task.destination_queue_id, m.source_queue_id)
                             FROM postbox.messages m WHERE m.id = ANY (picked))
            LOOP
                PERFORM postbox._move(
                    ARRAY(SELECT m.id FROM postbox.messages m
                          WHERE m.id = ANY (picked)
                                AND coalesce(task.destination_queue_id, m.source_queue_id) = target.id),
                    dlq, target, false);
            END LOOP;
            moved := coalesce(cardinality(picked), 0);
        END IF;
        task.moved := task.moved + moved;
        task.credit := CASE WHEN task.rate IS NULL THEN 0 ELSE credit - moved END;
        IF task.moved >= task.max_messages OR (allowance > 0 AND moved < allowance) THEN
            SELECT count(*) INTO stranded FROM postbox.messages m
            WHERE m.queue_id = dlq.id AND task.destination_queue_id IS NULL
                  AND m.source_queue_id IS NOT NULL AND m.source_queue_id NOT IN (SELECT id FROM postbox.queues);
            IF stranded > 0 AND NOT task.moved >= task.max_messages THEN
                task.status := 'failed';
                task.failure_reason := format(
                    '%s dead letters have no source queue any more; redrive them to a named destination',
                    stranded);
            ELSE
                task.status := 'completed';
            END IF;
        END IF;
        UPDATE postbox.redrive_tasks
        SET moved = task.moved, credit = task.credit, status = task.status,
            failure_reason = task.failure_reason, updated_at = at
        WHERE id = task.id;
        total := total + moved;
    END LOOP;
    RETURN total;
END
$$;

-- Removes up to batch_size expired messages (archiving them where the queue
-- archives), claimed with SKIP LOCKED so servers running this together never
-- touch the same rows. The ready index finds most of them cheaply, since
-- visible_at >= enqueued_at; parked FIFO messages are looked up by group.
-- Receive never delivers an expired message meanwhile. Returns how many.
CREATE OR REPLACE FUNCTION postbox.expire_messages(batch_size integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql
-- An ordered walk of the ready index, whatever the statistics say (see receive).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    q postbox.queues;
    picked bigint[];
    total bigint := 0;
BEGIN
    FOR q IN SELECT * FROM postbox.queues WHERE retention IS NOT NULL ORDER BY id LOOP
        EXIT WHEN total >= batch_size;
        SELECT array_agg(m.id) INTO picked
        FROM (SELECT m.id FROM postbox.messages m
              WHERE m.queue_id = q.id AND m.visible_at < now() - q.retention
              ORDER BY m.visible_at LIMIT batch_size - total
              FOR UPDATE SKIP LOCKED) AS m;
        IF picked IS NULL AND q.fifo THEN
            SELECT array_agg(m.id) INTO picked
            FROM (SELECT m.id FROM postbox.messages m
                  WHERE m.queue_id = q.id AND m.message_group_id IS NOT NULL
                        AND m.visible_at = 'infinity' AND m.enqueued_at < now() - q.retention
                  ORDER BY m.message_group_id, m.id LIMIT batch_size - total
                  FOR UPDATE SKIP LOCKED) AS m;
        END IF;
        IF picked IS NOT NULL THEN
            total := total + cardinality(postbox._remove(q, picked, NULL, 'expired'));
        END IF;
    END LOOP;
    RETURN total;
END
$$;

-- Forgets up to batch_size archived messages past their queue's
-- archive_retention and deduplication ids past their window. Returns how many.
CREATE OR REPLACE FUNCTION postbox.expire_records(batch_size integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    archived bigint;
    deduplicated bigint;
BEGIN
    DELETE FROM postbox.archive
    WHERE id IN (SELECT a.id FROM postbox.archive a JOIN postbox.queues q ON q.id = a.queue_id
                 WHERE a.archived_at < now() - q.archive_retention
                 LIMIT batch_size FOR UPDATE OF a SKIP LOCKED);
    GET DIAGNOSTICS archived = ROW_COUNT;
    DELETE FROM postbox.deduplication
    WHERE (queue_id, deduplication_id) IN (
        SELECT d.queue_id, d.deduplication_id FROM postbox.deduplication d
        WHERE d.expires_at < now() LIMIT batch_size FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deduplicated = ROW_COUNT;
    RETURN archived + deduplicated;
END
$$;

-- Where a message stands: visible (parked FIFO messages too), in_flight or delayed.
CREATE OR REPLACE FUNCTION postbox._state(visible_at timestamptz, lease uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN visible_at <= now() OR visible_at = 'infinity' THEN 'visible'
                WHEN lease IS NOT NULL THEN 'in_flight'
                ELSE 'delayed' END
$$;

-- Browses a queue's messages in id order without claiming them: all of them,
-- or those in one state (visible, in_flight, delayed), or the dead letters
-- ('dead', whatever their state). Expired messages are not shown.
CREATE OR REPLACE FUNCTION postbox.peek_messages(queue_name text, in_state text DEFAULT NULL, after_id bigint DEFAULT 0,
                                      page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    IF in_state IS NOT NULL AND in_state NOT IN ('visible', 'in_flight', 'delayed', 'dead') THEN
        PERFORM postbox._invalid(format('state %s is none of visible, in_flight, delayed, dead', in_state));
    END IF;
    IF page_size NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 1000', page_size));
    END IF;
    RETURN QUERY
    SELECT m.id, m.body, m.attributes, m.enqueued_at, m.receive_count, m.first_received_at, m.priority,
           m.message_group_id, m.deduplication_id,
           (SELECT s.name FROM postbox.queues s WHERE s.id = m.source_queue_id), m.last_error,
           postbox._state(m.visible_at, m.lease), m.visible_at
    FROM postbox.messages m
    WHERE m.queue_id = q.id AND m.id > coalesce(after_id, 0)
          AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention)
          AND (in_state IS NULL
               OR (in_state = 'dead' AND m.source_queue_id IS NOT NULL)
               OR postbox._state(m.visible_at, m.lease) = in_state)
    ORDER BY m.id
    LIMIT page_size;
END
$$;

-- One message of a queue, as peek_messages shows it. PB404 if it is not there.
CREATE OR REPLACE FUNCTION postbox.get_message(queue_name text, id bigint)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT * FROM postbox.peek_messages(queue_name, NULL, id - 1, 1) p WHERE p.message_id = id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'message %s is not in queue %s (deleted, expired, or never there)', id, quote_literal(queue_name));
    END IF;
END
$$;

-- A queue's archived messages in id order after after_id.
CREATE OR REPLACE FUNCTION postbox.list_archived_messages(queue_name text, after_id bigint DEFAULT 0,
                                               page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               archived_at timestamptz, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    IF page_size NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 1000', page_size));
    END IF;
    RETURN QUERY
    SELECT a.id, a.body, a.attributes, a.enqueued_at, a.receive_count, a.first_received_at, a.priority,
           a.message_group_id, a.deduplication_id,
           (SELECT s.name FROM postbox.queues s WHERE s.id = a.source_queue_id), a.last_error,
           a.archived_at, a.reason
    FROM postbox.archive a
    WHERE a.queue_id = q.id AND a.id > coalesce(after_id, 0)
    ORDER BY a.id
    LIMIT page_size;
END
$$;

INSERT INTO postbox.schema_version (version) VALUES ('0.2.0');
