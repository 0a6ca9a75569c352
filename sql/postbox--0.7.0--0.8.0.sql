-- postbox 0.7.0 -> 0.8.0.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

-- One rule for names (since 0.8.0): every field that names a resource is
-- checked against its grammar before anything is looked up, so a malformed
-- name is PB400 (saying what is allowed) and a well-formed absent one PB404.

-- The message of a check of the queue names in queue settings (the
-- dead-letter queue and the redrive sources), or NULL when each is well formed
-- or absent. Callers check names before they look anything up, so that a
-- malformed name is PB400 whether the queues exist or not.
CREATE FUNCTION postbox._settings_name_problem(settings jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT field || ': ' || postbox.queue_name_problem(name)
    FROM (SELECT 'dead_letter_queue' AS field, settings #>> '{dead_letter_policy,dead_letter_queue}' AS name
          WHERE jsonb_typeof(settings #> '{dead_letter_policy,dead_letter_queue}') = 'string'
          UNION ALL
          SELECT 'source_queues', e #>> '{}'
          FROM jsonb_array_elements(CASE WHEN jsonb_typeof(settings #> '{redrive_allow_policy,source_queues}') = 'array'
                                         THEN settings #> '{redrive_allow_policy,source_queues}' END) e
          WHERE jsonb_typeof(e) = 'string') names
    WHERE postbox.queue_name_problem(name) IS NOT NULL
    LIMIT 1
$$;

-- The message of a check of a schedule's target names, or NULL when they are
-- well formed.
CREATE FUNCTION postbox._target_problem(target_queue text, target_topic text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce('target: ' || CASE WHEN target_queue IS NOT NULL THEN postbox.queue_name_problem(target_queue) END,
                    'target: ' || CASE WHEN target_topic IS NOT NULL THEN postbox.name_problem('topic', target_topic) END)
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
    PERFORM postbox._invalid(postbox._settings_name_problem(settings))
    WHERE postbox._settings_name_problem(settings) IS NOT NULL;
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
    q.delivery_delay := postbox._seconds_setting(settings, 'delivery_delay', 0, 31536000);
    -- Otherwise every message would expire before it became visible.
    IF q.delivery_delay >= q.retention THEN
        PERFORM postbox._invalid(format(
            'delivery_delay is %s s and retention %s s: delivery_delay must be shorter than retention, '
            'or messages would expire before they became visible; lower delivery_delay or raise retention',
            trim_scale(extract(epoch FROM q.delivery_delay)), trim_scale(extract(epoch FROM q.retention))));
    END IF;
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
        IF policy ->> 'dead_letter_queue' = q.name THEN
            PERFORM postbox._invalid('a queue cannot be its own dead-letter queue');
        END IF;
        SELECT * INTO dlq FROM postbox.queues WHERE name = policy ->> 'dead_letter_queue';
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
                'dead-letter queue %s does not exist; create it first', quote_literal(policy ->> 'dead_letter_queue'));
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
        PERFORM postbox._invalid(postbox._settings_name_problem(settings))
        WHERE postbox._settings_name_problem(settings) IS NOT NULL;
        q := postbox._queue(queue_name);  -- raises PB400 or PB404
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

-- The topic of that name; PB400 if the name is malformed (no topic can have
-- it), PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox._topic(topic_name text) RETURNS postbox.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics;
BEGIN
    SELECT * INTO t FROM postbox.topics WHERE name = topic_name;
    IF NOT FOUND THEN
        -- Checked only on a miss, as in _queue: publish pays nothing for it.
        PERFORM postbox._invalid(postbox.name_problem('topic', topic_name))
        WHERE postbox.name_problem('topic', topic_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('topic %s does not exist', quote_literal(topic_name));
    END IF;
    RETURN t;
END
$$;

-- The subscription of a topic; PB400 if either name is malformed, PB404 if
-- there is none.
CREATE OR REPLACE FUNCTION postbox.get_subscription(topic_name text, subscription_name text)
RETURNS postbox.subscriptions
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics;
    s postbox.subscriptions;
BEGIN
    PERFORM postbox._invalid(postbox.name_problem('subscription', subscription_name))
    WHERE postbox.name_problem('subscription', subscription_name) IS NOT NULL;
    t := postbox._topic(topic_name);
    SELECT * INTO s FROM postbox.subscriptions WHERE topic_id = t.id AND name = subscription_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'topic %s has no subscription %s', quote_literal(topic_name), quote_literal(subscription_name));
    END IF;
    RETURN s;
END
$$;

-- The schedule of that name; PB400 if the name is malformed, PB404 if there
-- is none.
CREATE OR REPLACE FUNCTION postbox._schedule(schedule_name text) RETURNS postbox.schedules
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s postbox.schedules;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.name_problem('schedule', schedule_name))
        WHERE postbox.name_problem('schedule', schedule_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('schedule %s does not exist', quote_literal(schedule_name));
    END IF;
    RETURN s;
END
$$;

-- Checks a schedule before it is stored: PB400 for a bad field, PB404 when
-- its target does not exist.
CREATE OR REPLACE FUNCTION postbox._check_schedule(s postbox.schedules) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    problem text := postbox.name_problem('schedule', s.name);
    q postbox.queues;
BEGIN
    problem := coalesce(problem, CASE
        WHEN num_nonnulls(s.cron_expression, s.every, s.run_at) <> 1 THEN
            'give exactly one of a cron expression, an interval and a run_at time'
        WHEN length(s.cron_expression) NOT BETWEEN 1 AND 255 THEN 'a cron expression has 1 to 255 characters'
        WHEN s.cron_expression IS NOT NULL AND coalesce(s.time_zone, '') = '' THEN 'a cron schedule needs a time zone'
        WHEN s.cron_expression IS NULL AND s.time_zone IS NOT NULL THEN 'a time zone is for cron schedules'
        WHEN s.every < interval '1 second' OR s.every > interval '366 days' THEN
            format('interval %s is outside 1 s to 366 days', s.every)
        WHEN num_nonnulls(s.target_queue, s.target_topic) <> 1 THEN 'give a target queue or a target topic'
        WHEN postbox._target_problem(s.target_queue, s.target_topic) IS NOT NULL THEN
            postbox._target_problem(s.target_queue, s.target_topic)
        WHEN s.target_queue IS NOT NULL AND s.routing_key <> '' THEN 'a routing key is for topic targets'
        WHEN s.body IS NULL THEN 'body must not be NULL'
        WHEN NOT s.paused AND s.next_fire_at IS NULL THEN
            'next_fire_at is required: the server computes it from the timing'
        ELSE postbox.routing_key_problem(s.routing_key) END);
    IF problem IS NULL AND s.attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(ARRAY[s.attributes], 1);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF s.target_queue IS NOT NULL THEN
        q := postbox._queue(s.target_queue);
        IF postbox.message_size(s.body, s.attributes) > q.max_message_size THEN
            PERFORM postbox._invalid(format(
                'the message is %s bytes; queue %s takes at most %s (body and attributes)',
                postbox.message_size(s.body, s.attributes), quote_literal(q.name), q.max_message_size));
        END IF;
    ELSE
        PERFORM postbox._topic(s.target_topic);
    END IF;
END
$$;

-- Changes the fields of a schedule named in `fields`, any of: cron (with
-- time_zone), interval, run_at (each replaces the timing, and next_fire_at
-- must come with it), target (target_queue or target_topic, with
-- routing_key), body, attributes. A paused schedule stays paused.
CREATE OR REPLACE FUNCTION postbox.update_schedule(
    schedule_name text, fields text[], next_fire_at timestamptz DEFAULT NULL, body bytea DEFAULT NULL,
    target_queue text DEFAULT NULL, target_topic text DEFAULT NULL, routing_key text DEFAULT '',
    attributes jsonb DEFAULT NULL, cron_expression text DEFAULT NULL, time_zone text DEFAULT NULL,
    every interval DEFAULT NULL, run_at timestamptz DEFAULT NULL)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
    unknown text;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox._target_problem(target_queue, target_topic))
        WHERE 'target' = ANY (fields) AND postbox._target_problem(target_queue, target_topic) IS NOT NULL;
        s := postbox._schedule(schedule_name);  -- raises PB400 or PB404
    END IF;
    SELECT string_agg(f, ', ') INTO unknown
    FROM unnest(fields) AS f WHERE f NOT IN ('cron', 'interval', 'run_at', 'target', 'body', 'attributes');
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of cron, interval, run_at, target, body, '
                                        'attributes (not %s)', coalesce(unknown, 'none')));
    END IF;
    IF (SELECT count(*) FROM unnest(fields) AS f WHERE f IN ('cron', 'interval', 'run_at')) > 1 THEN
        PERFORM postbox._invalid('change the timing to one of cron, interval and run_at, not several');
    END IF;
    IF fields && ARRAY['cron', 'interval', 'run_at'] THEN
        s.cron_expression := CASE WHEN 'cron' = ANY (fields) THEN cron_expression END;
        s.time_zone := CASE WHEN 'cron' = ANY (fields) THEN time_zone END;
        s.every := CASE WHEN 'interval' = ANY (fields) THEN every END;
        s.run_at := CASE WHEN 'run_at' = ANY (fields) THEN run_at END;
        IF next_fire_at IS NULL THEN
            PERFORM postbox._invalid('a new timing needs its next_fire_at: the server computes it');
        END IF;
        s.next_fire_at := next_fire_at;
    END IF;
    IF 'target' = ANY (fields) THEN
        s.target_queue := target_queue;
        s.target_topic := target_topic;
        s.routing_key := coalesce(routing_key, '');
    END IF;
    IF 'body' = ANY (fields) THEN
        s.body := body;
    END IF;
    IF 'attributes' = ANY (fields) THEN
        s.attributes := attributes;
    END IF;
    PERFORM postbox._check_schedule(s);
    UPDATE postbox.schedules
    SET cron_expression = s.cron_expression, time_zone = s.time_zone, every = s.every, run_at = s.run_at,
        target_queue = s.target_queue, target_topic = s.target_topic, routing_key = s.routing_key,
        body = s.body, attributes = s.attributes, next_fire_at = s.next_fire_at, updated_at = now()
    WHERE id = s.id
    RETURNING * INTO s;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

-- API v1 (since 0.8.0): per-message expiry, cancel, redrive by id, run a
-- schedule now, update a subscription, retry webhook deliveries, and paged
-- redrive tasks.
ALTER TABLE postbox.messages ADD COLUMN expires_at timestamptz;
-- Maintenance finds messages past their own expiry through this index.
CREATE INDEX messages_expiry_idx ON postbox.messages (expires_at) WHERE expires_at IS NOT NULL;
ALTER TABLE postbox.redrive_tasks ADD COLUMN message_ids bigint[];

DROP FUNCTION postbox.send(text, bytea, jsonb, interval, text, text, text, integer, timestamptz);
DROP FUNCTION postbox.send_batch(text, bytea[], jsonb[], interval[], text[], text[], text[], integer[], timestamptz[]);
DROP FUNCTION postbox.start_redrive(text, text, bigint, double precision);
DROP FUNCTION postbox.list_redrive_tasks(text, integer);
DROP FUNCTION postbox.get_message(text, bigint);
DROP FUNCTION postbox.peek_messages(text, text, bigint, integer);

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
CREATE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(bodies), 0);
    problem text;
    sent_at timestamptz;
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
    -- A writer of the messages table from here on, before the clock is read:
    -- receive_floor stays at or before the start of every transaction that holds
    -- this lock, so a message stamped sent_at can never land behind the floor,
    -- however long the locks below keep the send waiting. (The lock is the one
    -- the insert takes anyway, and conflicts with no other writer.)
    LOCK TABLE postbox.messages IN ROW EXCLUSIVE MODE;
    sent_at := clock_timestamp();
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(attributes), cardinality(delays), cardinality(message_group_ids),
                cardinality(deduplication_ids), cardinality(dedupe_keys), cardinality(priorities),
                cardinality(deliver_ats), cardinality(ttls), cardinality(expire_ats)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    -- A message must become visible before it expires, so a delay stays below
    -- the retention (with none, below a year).
    latest := sent_at + coalesce(q.retention, interval '365 days');
    SELECT postbox._entry_prefix(c.i, n) || c.problem INTO problem
    FROM (
        SELECT e.i, CASE
            WHEN e.b IS NULL THEN 'body must not be NULL'
            WHEN q.fifo AND (e.d IS NOT NULL OR e.t IS NOT NULL) THEN
                'FIFO queues take no per-message delay; set the queue''s delivery_delay instead'
            WHEN e.d IS NOT NULL AND e.t IS NOT NULL THEN 'give a delay or a delivery time, not both'
            WHEN e.d < interval '0' THEN format('delay %s s is negative', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest AND q.retention IS NULL THEN
                format('delay %s s is beyond the longest delay, 365 days', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest THEN format(
                'delay %s s is not shorter than the queue''s retention, %s s: the message would expire before '
                'it became visible; shorten the delay or raise retention',
                trim_scale(extract(epoch FROM e.d)), trim_scale(extract(epoch FROM q.retention)))
            WHEN e.t >= latest AND q.retention IS NULL THEN
                format('delivery time %s is beyond the longest delay, 365 days from now', e.t)
            WHEN e.t >= latest THEN format(
                'delivery time %s is not before %s, when the message would expire (the queue''s retention is '
                '%s s): deliver it sooner or raise retention', e.t, latest, trim_scale(extract(epoch FROM q.retention)))
            WHEN e.l IS NOT NULL AND e.e IS NOT NULL THEN 'give a ttl or an expire_time, not both'
            WHEN e.l <= interval '0' THEN format('ttl %s s must be above 0', trim_scale(extract(epoch FROM e.l)))
            WHEN coalesce(e.e, sent_at + e.l) <= postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) THEN format(
                'the message would expire (at %s) before it became visible (at %s): expire it later or deliver it '
                'sooner', coalesce(e.e, sent_at + e.l), postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay))
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
                    dedupe_keys, attributes, ttls, expire_ats) WITH ORDINALITY AS e(b, d, t, p, g, x, k, a, l, e, i)
    ) AS c
    WHERE c.problem IS NOT NULL
    ORDER BY c.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
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
                                          message_group_id, expires_at)
            SELECT q.id, postbox._visible_at(sent_at, d, t, q.delivery_delay), sent_at,
                   a, b, coalesce(p, 0), g, coalesce(x, sent_at + l)
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, ttls, expire_ats)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, l, x, i)
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
    -- the claimer's message. An entry with a dedupe_key is never deduplicated by
    -- content: its key decides, and it may not become a message of its own id, so
    -- a recorded hash would point later sends at a message that never existed.
    dedup := ARRAY(
        SELECT CASE WHEN k IS NULL THEN
                   coalesce(x, CASE WHEN q.content_based_deduplication THEN encode(sha256(b), 'hex') END)
               END
        FROM unnest(bodies, deduplication_ids, dedupe_keys) WITH ORDINALITY AS e(b, x, k, i) ORDER BY i);
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
        -- An expired message is gone for receivers already, though maintenance
        -- has not removed it yet: it gives up its key, so the send makes a new
        -- message rather than filling one that will never be delivered.
        IF q.retention IS NOT NULL THEN
            UPDATE postbox.messages m SET dedupe_key = NULL
            WHERE m.queue_id = q.id AND m.dedupe_key = ANY (dedupe_keys) AND m.enqueued_at < now() - q.retention;
        END IF;
        UPDATE postbox.messages m SET dedupe_key = NULL
        WHERE m.queue_id = q.id AND m.dedupe_key = ANY (dedupe_keys) AND m.expires_at <= now();
        WITH upserted AS (
            INSERT INTO postbox.messages AS m (id, queue_id, visible_at, enqueued_at, attributes, body,
                                               priority, message_group_id, dedupe_key, expires_at)
            OVERRIDING SYSTEM VALUE
            SELECT DISTINCT ON (e.k) ids[e.i], q.id,
                   postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay), sent_at,
                   e.a, e.b, coalesce(e.p, 0), e.g, e.k, coalesce(e.x, sent_at + e.l)
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedupe_keys,
                        ttls, expire_ats)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, k, l, x, i)
            WHERE e.k IS NOT NULL
            ORDER BY e.k, e.i DESC
            ON CONFLICT (queue_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO UPDATE
            SET body = excluded.body, attributes = excluded.attributes, priority = excluded.priority,
                expires_at = excluded.expires_at
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
                                  message_group_id, deduplication_id, expires_at)
    OVERRIDING SYSTEM VALUE
    SELECT ids[e.i], q.id,
           CASE WHEN q.fifo AND (row_number() OVER (PARTITION BY e.g ORDER BY e.i) > 1
                                 OR EXISTS (SELECT FROM postbox.messages x
                                            WHERE x.queue_id = q.id AND x.message_group_id = e.g))
                THEN 'infinity'
                ELSE postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) END,
           sent_at, e.a, e.b, coalesce(e.p, 0), e.g, e.x, coalesce(e.e, sent_at + e.l)
    FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedup,
                dedupe_keys, resolved, ttls, expire_ats)
         WITH ORDINALITY AS e(b, a, d, t, p, g, x, k, r, l, e, i)
    WHERE e.k IS NULL AND e.r = ids[e.i]
    ORDER BY e.i;
    PERFORM postbox._notify(q);
    RETURN QUERY SELECT e.r, e.r <> ids[e.i] FROM unnest(resolved) WITH ORDINALITY AS e(r, i) ORDER BY e.i;
END
$$;

-- Sends one message; returns its id (the original's, for a duplicate). See
-- send_batch for the options and rules. A message that is nothing but a body,
-- into a queue without FIFO order, deduplication or a depth limit (the common
-- transactional send), takes a straight path: send_batch's checks and branches
-- cost as much as the insert itself when many sessions each send one.
CREATE FUNCTION postbox.send(
    queue_name text, body bytea, attributes jsonb DEFAULT NULL, delay interval DEFAULT NULL,
    message_group_id text DEFAULT NULL, deduplication_id text DEFAULT NULL,
    dedupe_key text DEFAULT NULL, priority integer DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    ttl interval DEFAULT NULL, expire_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues;
    sent_at timestamptz;
    sent_id bigint;
BEGIN
    IF body IS NOT NULL AND num_nonnulls(attributes, delay, message_group_id, deduplication_id, dedupe_key,
                                         priority, deliver_at, ttl, expire_at) = 0 THEN
        SELECT * INTO q FROM postbox.queues x WHERE x.name = queue_name;
    END IF;
    IF q.id IS NULL OR q.fifo OR q.content_based_deduplication OR q.max_depth IS NOT NULL OR q.send_paused
       OR octet_length(body) > q.max_message_size THEN
        -- Everything else, and every error, as send_batch has it.
        RETURN (SELECT s.message_id FROM postbox.send_batch(
            queue_name, ARRAY[body], postbox._array_of(attributes), postbox._array_of(delay),
            postbox._array_of(message_group_id), postbox._array_of(deduplication_id),
            postbox._array_of(dedupe_key), postbox._array_of(priority), postbox._array_of(deliver_at),
            postbox._array_of(ttl), postbox._array_of(expire_at)) s);
    END IF;
    -- As send_batch: the table lock before the clock (see there), then the queue's.
    LOCK TABLE postbox.messages IN ROW EXCLUSIVE MODE;
    sent_at := clock_timestamp();
    PERFORM pg_advisory_xact_lock_shared(1886350198, q.id);  -- postbox._lock_queue, inline
    -- Joined to the queue, read after the lock: nothing when a drop committed meanwhile.
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT x.id, sent_at + q.delivery_delay, sent_at, body, 0
    FROM postbox.queues x WHERE x.id = q.id
    RETURNING messages.id INTO sent_id;
    IF sent_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = 'the queue was deleted while the message was being sent';
    END IF;
    IF EXISTS (SELECT FROM postbox.queue_listeners l WHERE l.queue_id = q.id) THEN
        PERFORM postbox._notify(q);  -- which looks again: a call saved when nobody listens
    END IF;
    RETURN sent_id;
END
$$;

DROP FUNCTION postbox.receive(text, integer, interval, timestamptz);
-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>". Order: priority, then visibility
-- time, then id; FIFO queues hand out only group heads. On the way, expired
-- messages are removed and messages received max_receive_count times already
-- move to the dead-letter queue instead. A rate-limited queue returns fewer
-- messages when its tokens run short. PB503 while receives are paused.
-- scan_from: where to start in the ready index, from receive_floor (NULL: the
-- front). max_bytes (since 0.8.0; NULL: no limit) bounds the claim by size: it
-- stops before the message that would take the sum of the claimed messages'
-- sizes (body, attributes and 256 bytes for the rest) past max_bytes, and always
-- claims one. `more` (on every row) says that deliverable messages were left for
-- the next call, so a caller that wants them all claims again at once.
CREATE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
                                visibility_timeout interval DEFAULT NULL, scan_from timestamptz DEFAULT NULL,
                                max_bytes bigint DEFAULT NULL)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, receipt text, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               more boolean)
LANGUAGE plpgsql
-- Receive must walk the ready index in order and stop at the first rows it can
-- claim. With stale statistics the planner may instead fetch every visible row
-- (a bitmap or sequential scan) and sort them, which on a deep queue, or one
-- full of dead index entries, costs more than everything else put together.
-- Nor may it read the ready index and sort: a range on visible_at (scan_from to
-- now) looks like a few rows to the planner, which then fetched every visible
-- message of a priority queue to sort them instead of reading the priority index.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
-- The size budget's window sorts a claim's few rows, which enable_sort = off
-- prices as enormous; that price must not buy a JIT compilation (hundreds of
-- milliseconds) on every receive.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    timeout interval := coalesce(visibility_timeout, q.visibility_timeout);
    expired_before timestamptz := now() - q.retention;
    scan_start timestamptz := coalesce(scan_from, '-infinity');
    allowed integer;
    to_deliver bigint[];
    to_expire bigint[];
    to_bury bigint[];
    left_over boolean;
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
        SELECT array_agg(p.id ORDER BY p.priority DESC, p.visible_at, p.id) FILTER (WHERE p.deliver),
               array_agg(p.id) FILTER (WHERE p.gone),
               array_agg(p.id) FILTER (WHERE p.dead AND NOT p.gone),
               coalesce(bool_or(NOT p.gone AND NOT p.dead AND NOT p.deliver), false)
        INTO to_deliver, to_expire, to_bury, left_over
        FROM (
          SELECT c.*,
                 NOT c.gone AND NOT c.dead
                 AND (max_bytes IS NULL
                      -- A prefix of the deliverable candidates, in claim order, within
                      -- max_bytes; at least the first.
                      OR sum(c.size) FILTER (WHERE NOT c.gone AND NOT c.dead)
                             OVER (ORDER BY c.priority DESC, c.visible_at, c.id) <= max_bytes
                      OR count(*) FILTER (WHERE NOT c.gone AND NOT c.dead)
                             OVER (ORDER BY c.priority DESC, c.visible_at, c.id) = 1) AS deliver
          FROM (
            SELECT * FROM (  -- priority > 0 first, through its partial index
                SELECT m.id, m.priority, m.visible_at, coalesce(m.enqueued_at < expired_before, false)
                                                                  OR coalesce(m.expires_at <= now(), false) AS gone,
                       coalesce(m.receive_count >= q.max_receive_count, false) AS dead,
                       -- octet_length reads a TOASTed body's size without fetching it.
                       octet_length(m.body) + coalesce(pg_column_size(m.attributes), 0) + 256 AS size
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority > 0 AND m.visible_at BETWEEN scan_start AND now()
                ORDER BY m.priority DESC, m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS high
            UNION ALL
            SELECT * FROM (  -- then the rest, in visibility order
                SELECT m.id, m.priority, m.visible_at, coalesce(m.enqueued_at < expired_before, false)
                                                             OR coalesce(m.expires_at <= now(), false),
                       coalesce(m.receive_count >= q.max_receive_count, false),
                       octet_length(m.body) + coalesce(pg_column_size(m.attributes), 0) + 256
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority = 0 AND m.visible_at BETWEEN scan_start AND now()
                ORDER BY m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS normal
            LIMIT allowed
          ) AS c
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
                   (SELECT s.name FROM postbox.queues s WHERE s.id = c.source_queue_id), c.last_error,
                   left_over
            -- In claim order: the claim overwrote visible_at, so the order comes from to_deliver.
            FROM claimed c JOIN unnest(to_deliver) WITH ORDINALITY AS o(id, n) ON o.id = c.id
            ORDER BY o.n;
            RETURN;
        END IF;
        EXIT WHEN to_expire IS NULL AND to_bury IS NULL;
    END LOOP;
END
$$;

-- Removes up to batch_size expired messages (archiving them where the queue
-- archives), claimed with SKIP LOCKED so servers running this together never
-- touch the same rows. The ready index finds most of them cheaply, since
-- visible_at >= enqueued_at; parked FIFO messages are looked up by group.
-- Receive never delivers an expired message meanwhile. Messages past their
-- own expires_at (a ttl or expire_time) come through messages_expiry_idx.
-- Returns how many.
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
    -- Messages past their own expiry, oldest expiry first, a queue at a time.
    FOR q IN SELECT * FROM postbox.queues
             WHERE id IN (SELECT m.queue_id FROM postbox.messages m
                          WHERE m.expires_at <= now() ORDER BY m.expires_at LIMIT batch_size)
             ORDER BY id LOOP
        EXIT WHEN total >= batch_size;
        SELECT array_agg(m.id) INTO picked
        FROM (SELECT m.id FROM postbox.messages m
              WHERE m.expires_at <= now() AND m.queue_id = q.id
              ORDER BY m.expires_at LIMIT batch_size - total
              FOR UPDATE SKIP LOCKED) AS m;
        IF picked IS NOT NULL THEN
            total := total + cardinality(postbox._remove(q, picked, NULL, 'expired'));
        END IF;
    END LOOP;
    RETURN total;
END
$$;

-- Browses a queue's messages in id order without claiming them: all of them,
-- or those in one state (visible, in_flight, delayed), or the dead letters
-- ('dead', whatever their state). Expired messages are not shown.
CREATE FUNCTION postbox.peek_messages(queue_name text, in_state text DEFAULT NULL, after_id bigint DEFAULT 0,
                                      page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    IF in_state IS NOT NULL AND in_state NOT IN ('visible', 'in_flight', 'delayed', 'dead') THEN
        PERFORM postbox._invalid(format('state %s is none of visible, in_flight, delayed, dead', in_state));
    END IF;
    -- The API pages by at most 1000 and asks for one more row to see whether a
    -- next page exists; psql callers get the same ten-fold headroom.
    IF page_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 10000', page_size));
    END IF;
    RETURN QUERY
    SELECT m.id, m.body, m.attributes, m.enqueued_at, m.receive_count, m.first_received_at, m.priority,
           m.message_group_id, m.deduplication_id,
           (SELECT s.name FROM postbox.queues s WHERE s.id = m.source_queue_id), m.last_error,
           postbox._state(m.visible_at, m.lease), m.visible_at, m.expires_at
    FROM postbox.messages m
    WHERE m.queue_id = q.id AND m.id > coalesce(after_id, 0)
          AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention)
          AND (m.expires_at IS NULL OR m.expires_at > now())
          AND (in_state IS NULL
               OR (in_state = 'dead' AND m.source_queue_id IS NOT NULL)
               OR postbox._state(m.visible_at, m.lease) = in_state)
    ORDER BY m.id
    LIMIT page_size;
END
$$;

-- One message of a queue, as peek_messages shows it. PB404 if it is not there.
CREATE FUNCTION postbox.get_message(queue_name text, id bigint)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT * FROM postbox.peek_messages(queue_name, NULL, id - 1, 1) p WHERE p.message_id = id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'message %s is not in queue %s (deleted, expired, or never there)', id, quote_literal(queue_name));
    END IF;
END
$$;

-- Removes a message no consumer holds (waiting, delayed, or back from a lease
-- that ran out), archiving it as cancelled where the queue archives. PB404 if
-- it is not in the queue; PB412 while a consumer holds it. The row lock makes a
-- concurrent receive skip the message, so it is cancelled or delivered, never
-- both.
CREATE FUNCTION postbox.cancel_message(queue_name text, message_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    m record;
BEGIN
    SELECT x.lease, x.visible_at INTO m
    FROM postbox.messages x WHERE x.id = message_id AND x.queue_id = q.id
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'message %s is not in queue %s: never sent there, or deleted or expired since',
            message_id, quote_literal(queue_name));
    END IF;
    IF m.lease IS NOT NULL AND m.visible_at > clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'message %s is in flight: a consumer holds it until %s; delete it with its receipt, or '
            'cancel it after the lease runs out', message_id, m.visible_at);
    END IF;
    PERFORM postbox._remove(q, ARRAY[message_id], ARRAY[NULL::uuid], 'cancelled');
END
$$;

-- Starts moving the dead letters of a queue back: to each message's source
-- queue, or to `destination`; at most max_messages (NULL: all), at most `rate`
-- per second (NULL: as fast as the maintenance worker goes); only the dead
-- letters in message_ids when given (NULL: all), PB404 naming the first id
-- that is not one of the queue's. The servers' maintenance worker runs the
-- task (run_redrives). PB412 while one runs.
CREATE FUNCTION postbox.start_redrive(dead_letter_queue text, destination text DEFAULT NULL,
                                      max_messages bigint DEFAULT NULL, rate double precision DEFAULT NULL,
                                      message_ids bigint[] DEFAULT NULL)
RETURNS postbox.redrive_tasks
LANGUAGE plpgsql AS $$
DECLARE
    dlq postbox.queues;
    target postbox.queues;
    task postbox.redrive_tasks;
    missing bigint;
BEGIN
    PERFORM postbox._invalid('destination: ' || postbox.queue_name_problem(destination))
    WHERE destination IS NOT NULL AND postbox.queue_name_problem(destination) IS NOT NULL;
    dlq := postbox._queue(dead_letter_queue);
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
    IF cardinality(message_ids) NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('message_ids names %s messages; name 1 to 1000, or none for all',
                                        cardinality(message_ids)));
    END IF;
    SELECT i INTO missing FROM unnest(message_ids) AS i
    WHERE NOT EXISTS (SELECT FROM postbox.messages m WHERE m.id = i AND m.queue_id = dlq.id)
    LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'message %s is not in queue %s: redrive only its dead letters', missing, quote_literal(dead_letter_queue));
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
    INSERT INTO postbox.redrive_tasks (dead_letter_queue_id, destination_queue_id, max_messages, rate, to_move,
                                       message_ids)
    SELECT dlq.id, target.id, max_messages, rate, least(count(*), max_messages), start_redrive.message_ids
    FROM postbox.messages m
    WHERE m.queue_id = dlq.id AND (m.lease IS NULL OR m.visible_at <= now())
          AND (start_redrive.message_ids IS NULL OR m.id = ANY (start_redrive.message_ids))
    RETURNING * INTO task;
    PERFORM postbox._signal('redrives');
    RETURN task;
END
$$;

-- The redrive tasks of a dead-letter queue, newest first; a page after
-- after_task, the last task of the page before.
CREATE FUNCTION postbox.list_redrive_tasks(dead_letter_queue text, page_size integer DEFAULT 10,
                                           after_task uuid DEFAULT NULL)
RETURNS SETOF postbox.redrive_tasks
LANGUAGE plpgsql STABLE AS $$
DECLARE
    dlq postbox.queues := postbox._queue(dead_letter_queue);  -- PB404 even when no task exists
    after postbox.redrive_tasks;
BEGIN
    SELECT * INTO after FROM postbox.redrive_tasks WHERE id = after_task;
    RETURN QUERY
    SELECT * FROM postbox.redrive_tasks t
    WHERE t.dead_letter_queue_id = dlq.id
      -- After it in (created_at DESC, id) order: older, or as old with a greater id.
      AND (after_task IS NULL OR (t.created_at, after.id) < (after.created_at, t.id))
    ORDER BY t.created_at DESC, t.id
    LIMIT page_size;
END
$$;

-- One step of every running redrive: moves up to batch_size messages per task,
-- fewer when its rate says so. Tasks are claimed with SKIP LOCKED, so servers
-- running this together never move the same messages. Returns how many moved,
-- or NULL (since 0.8.0) when it found no task to step: the maintenance worker
-- then sleeps until a redrive starts.
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
    total bigint;
    stranded bigint;
BEGIN
    FOR task IN
        SELECT * FROM postbox.redrive_tasks WHERE status = 'running' ORDER BY created_at
        FOR UPDATE SKIP LOCKED
    LOOP
        total := coalesce(total, 0);
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
                        AND (task.message_ids IS NULL OR m.id = ANY (task.message_ids))
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
                  AND (task.message_ids IS NULL OR m.id = ANY (task.message_ids))
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

-- Checks a webhook endpoint and writes it into s: the URL, the secret (a new
-- one when empty) and the settings (a full set, in the shape of
-- webhook_defaults()).
CREATE FUNCTION postbox._webhook(s postbox.subscriptions, webhook_url text, webhook_secret text, settings jsonb)
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    unknown text;
    number numeric;
BEGIN
    IF length(webhook_url) > 2048 OR webhook_url !~* '^https?://[^/?#[:space:]]+([/?#][^[:space:]]*)?$' THEN
        PERFORM postbox._invalid(format(
            'webhook URL %s must be an http:// or https:// URL of at most 2048 characters',
            quote_literal(left(webhook_url, 100))));
    END IF;
    s.webhook_url := webhook_url;
    IF coalesce(webhook_secret, '') = '' THEN
        -- gen_random_uuid draws from the server's strong random source.
        s.webhook_secret := 'whsec_' || encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                                               'base64');
    ELSIF webhook_secret !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' OR (length(webhook_secret) - 6) % 4 <> 0
          OR length(decode(substr(webhook_secret, 7), 'base64')) NOT BETWEEN 24 AND 64 THEN
        PERFORM postbox._invalid('webhook secret must be "whsec_" followed by the base64 of 24 to 64 bytes; '
                                 'leave it empty to have one generated');
    ELSE
        s.webhook_secret := webhook_secret;
    END IF;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k WHERE NOT postbox.webhook_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown webhook setting(s): %s', unknown));
    END IF;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k WHERE jsonb_typeof(settings -> k) <> 'number';
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('webhook setting(s) %s must be numbers', unknown));
    END IF;
    number := (settings ->> 'timeout')::numeric;
    IF number NOT BETWEEN 1 AND 60 THEN
        PERFORM postbox._invalid(format('webhook timeout is %s s; it must be 1 to 60 s', number));
    END IF;
    s.webhook_timeout := make_interval(secs => number);
    number := (settings ->> 'max_attempts')::numeric;
    IF number <> trunc(number) OR number NOT BETWEEN 1 AND 100 THEN
        PERFORM postbox._invalid(format('webhook max_attempts is %s; it must be 1 to 100', number));
    END IF;
    s.webhook_max_attempts := number::integer;
    number := (settings ->> 'minimum_backoff')::numeric;
    IF number NOT BETWEEN 0.1 AND 3600 THEN
        PERFORM postbox._invalid(format('webhook minimum_backoff is %s s; it must be 0.1 s to 1 h', number));
    END IF;
    s.webhook_minimum_backoff := make_interval(secs => number);
    number := (settings ->> 'maximum_backoff')::numeric;
    IF number < extract(epoch FROM s.webhook_minimum_backoff) OR number > 86400 THEN
        PERFORM postbox._invalid(format(
            'webhook maximum_backoff is %s s; it must be minimum_backoff to 24 h', number));
    END IF;
    s.webhook_maximum_backoff := make_interval(secs => number);
    RETURN s;
END
$$;

-- Subscribes a queue (queue_name) or a webhook (webhook_url) to a topic, for
-- the messages whose routing key matches `pattern` (see _compile_pattern).
-- A webhook's secret is "whsec_" and the base64 of 24 to 64 bytes, generated
-- (32 random bytes) when not given; webhook_settings take the keys of
-- webhook_defaults(). PB409 if the topic has a subscription of that name.
CREATE OR REPLACE FUNCTION postbox.create_subscription(
    topic_name text, subscription_name text, pattern text DEFAULT '#', queue_name text DEFAULT NULL,
    webhook_url text DEFAULT NULL, webhook_secret text DEFAULT NULL, webhook_settings jsonb DEFAULT '{}')
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics;
    problem text := coalesce(postbox.name_problem('subscription', subscription_name),
                             postbox.name_problem('topic', topic_name));
    compiled record;
    s postbox.subscriptions;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    compiled := postbox._compile_pattern(coalesce(nullif(pattern, ''), '#'));
    s.name := subscription_name;
    s.pattern := coalesce(nullif(pattern, ''), '#');
    s.match_kind := compiled.match_kind;
    s.match_text := compiled.match_text;
    IF (queue_name IS NULL) = (webhook_url IS NULL) THEN
        PERFORM postbox._invalid('a subscription sends to a queue or to a webhook URL: give exactly one');
    ELSIF queue_name IS NOT NULL THEN
        IF webhook_secret IS NOT NULL OR coalesce(webhook_settings, '{}') <> '{}' THEN
            PERFORM postbox._invalid('a webhook secret and webhook settings are for webhook subscriptions');
        END IF;
        s.queue_id := (postbox._queue(queue_name)).id;
    ELSE
        s := postbox._webhook(s, webhook_url, webhook_secret,
                              postbox.webhook_defaults() || jsonb_strip_nulls(coalesce(webhook_settings, '{}')));
    END IF;
    -- Looked up last, so that a malformed field is PB400 whether the topic exists or not.
    t := postbox._topic(topic_name);
    s.topic_id := t.id;
    INSERT INTO postbox.subscriptions (
        topic_id, name, pattern, match_kind, match_text, queue_id, webhook_url, webhook_secret,
        webhook_timeout, webhook_max_attempts, webhook_minimum_backoff, webhook_maximum_backoff)
    VALUES (
        s.topic_id, s.name, s.pattern, s.match_kind, s.match_text, s.queue_id, s.webhook_url,
        s.webhook_secret, s.webhook_timeout, s.webhook_max_attempts, s.webhook_minimum_backoff,
        s.webhook_maximum_backoff)
    ON CONFLICT (topic_id, name) DO NOTHING
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format(
            'topic %s already has a subscription %s', quote_literal(topic_name), quote_literal(subscription_name));
    END IF;
    RETURN s;
END
$$;

-- Changes the fields of a subscription named in `fields`: pattern, queue
-- (queue subscriptions), webhook.url, webhook.secret, webhook.timeout,
-- webhook.max_attempts, webhook.minimum_backoff, webhook.maximum_backoff
-- (webhook subscriptions; the settings in webhook_settings, in the shape of
-- webhook_defaults()). A named field whose value is NULL goes back to its
-- default, and an empty secret is generated anew. A subscription keeps its
-- kind. Takes the topic's lock, as create and delete do, so no publish sees
-- half a change.
CREATE FUNCTION postbox.update_subscription(
    topic_name text, subscription_name text, fields text[], pattern text DEFAULT NULL,
    queue_name text DEFAULT NULL, webhook_url text DEFAULT NULL, webhook_secret text DEFAULT NULL,
    webhook_settings jsonb DEFAULT '{}')
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.subscriptions;
    hooks text[] := ARRAY['webhook.url', 'webhook.secret', 'webhook.timeout', 'webhook.max_attempts',
                          'webhook.minimum_backoff', 'webhook.maximum_backoff'];
    unknown text;
    compiled record;
    settings jsonb;
    field text;
BEGIN
    -- Every name is checked before anything is looked up (see _settings_name_problem).
    PERFORM postbox._invalid('queue: ' || postbox.queue_name_problem(queue_name))
    WHERE 'queue' = ANY (fields) AND queue_name IS NOT NULL AND postbox.queue_name_problem(queue_name) IS NOT NULL;
    s := postbox.get_subscription(topic_name, subscription_name);
    SELECT string_agg(f, ', ') INTO unknown FROM unnest(fields) AS f WHERE NOT f = ANY ('{pattern,queue}' || hooks);
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of pattern, queue, %s (not %s)',
                                        array_to_string(hooks, ', '), coalesce(unknown, 'none')));
    ELSIF s.queue_id IS NOT NULL AND fields && hooks THEN
        PERFORM postbox._invalid(format('subscription %s delivers to a queue: it has no webhook to change',
                                        quote_literal(subscription_name)));
    ELSIF s.webhook_url IS NOT NULL AND 'queue' = ANY (fields) THEN
        PERFORM postbox._invalid(format('subscription %s delivers to a webhook: it has no queue to change',
                                        quote_literal(subscription_name)));
    END IF;
    PERFORM postbox._lock_topic(s.topic_id, true);
    SELECT * INTO s FROM postbox.subscriptions WHERE id = s.id FOR UPDATE;
    IF 'pattern' = ANY (fields) THEN
        compiled := postbox._compile_pattern(coalesce(nullif(pattern, ''), '#'));
        s.pattern := coalesce(nullif(pattern, ''), '#');
        s.match_kind := compiled.match_kind;
        s.match_text := compiled.match_text;
    END IF;
    IF 'queue' = ANY (fields) THEN
        IF queue_name IS NULL THEN
            PERFORM postbox._invalid('a queue subscription needs its queue');
        END IF;
        s.queue_id := (postbox._queue(queue_name)).id;
    END IF;
    IF s.webhook_url IS NOT NULL AND fields && hooks THEN
        settings := jsonb_build_object(
            'timeout', extract(epoch FROM s.webhook_timeout), 'max_attempts', s.webhook_max_attempts,
            'minimum_backoff', extract(epoch FROM s.webhook_minimum_backoff),
            'maximum_backoff', extract(epoch FROM s.webhook_maximum_backoff));
        FOREACH field IN ARRAY fields LOOP
            field := substr(field, length('webhook.') + 1);
            IF postbox.webhook_defaults() ? field THEN
                settings := settings || jsonb_build_object(
                    field, coalesce(webhook_settings -> field, postbox.webhook_defaults() -> field));
            END IF;
        END LOOP;
        s := postbox._webhook(
            s, CASE WHEN 'webhook.url' = ANY (fields) THEN webhook_url ELSE s.webhook_url END,
            CASE WHEN 'webhook.secret' = ANY (fields) THEN coalesce(webhook_secret, '') ELSE s.webhook_secret END,
            settings);
    END IF;
    UPDATE postbox.subscriptions
    SET pattern = s.pattern, match_kind = s.match_kind, match_text = s.match_text, queue_id = s.queue_id,
        webhook_url = s.webhook_url, webhook_secret = s.webhook_secret, webhook_timeout = s.webhook_timeout,
        webhook_max_attempts = s.webhook_max_attempts, webhook_minimum_backoff = s.webhook_minimum_backoff,
        webhook_maximum_backoff = s.webhook_maximum_backoff
    WHERE id = s.id
    RETURNING * INTO s;
    RETURN s;
END
$$;

-- Sends a failed webhook delivery (or, with no delivery_id, every failed
-- delivery of the subscription) back to pending, due now and with its
-- attempts counted afresh; a pending one becomes due now. Returns how many.
-- PB404 for a delivery the subscription does not have.
CREATE FUNCTION postbox.retry_webhook_deliveries(topic_name text, subscription_name text,
                                                 delivery_id bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.subscriptions := postbox.get_subscription(topic_name, subscription_name);
    retried bigint;
BEGIN
    IF s.webhook_url IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'subscription %s of topic %s delivers to a queue, not a webhook',
            quote_literal(subscription_name), quote_literal(topic_name));
    END IF;
    UPDATE postbox.webhook_deliveries d
    SET state = 'pending', next_attempt_at = now(), lease = NULL,
        attempts = CASE WHEN d.state = 'failed' THEN 0 ELSE d.attempts END
    WHERE d.subscription_id = s.id
      AND CASE WHEN delivery_id IS NULL THEN d.state = 'failed'
               ELSE d.id = delivery_id AND d.lease IS NULL END;
    GET DIAGNOSTICS retried = ROW_COUNT;
    IF retried > 0 THEN
        PERFORM postbox._signal('webhooks');
    END IF;
    IF delivery_id IS NOT NULL AND retried = 0 THEN
        IF EXISTS (SELECT FROM postbox.webhook_deliveries WHERE id = delivery_id AND subscription_id = s.id) THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'delivery %s is being attempted now; retry it if that attempt fails', delivery_id);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'subscription %s of topic %s has no delivery %s (delivered, or forgotten 7 days after it failed)',
            quote_literal(subscription_name), quote_literal(topic_name), delivery_id);
    END IF;
    RETURN retried;
END
$$;

-- Sends a schedule's message into its target with the given deduplication id:
-- the ids of the committed messages (one per queue the message reached) and
-- how many webhook deliveries it queued. Errors reach the caller.
CREATE FUNCTION postbox._fire(s postbox.schedules, deduplication_id text,
                              OUT message_ids bigint[], OUT webhook_deliveries integer)
LANGUAGE plpgsql AS $$
DECLARE
    fifo boolean;
BEGIN
    webhook_deliveries := 0;
    IF s.target_queue IS NOT NULL THEN
        SELECT q.fifo INTO fifo FROM postbox.queues q WHERE q.name = s.target_queue;
        message_ids := ARRAY(
            SELECT b.message_id FROM postbox.send_batch(
                s.target_queue, ARRAY[s.body], postbox._array_of(s.attributes),
                message_group_ids => CASE WHEN fifo THEN ARRAY[s.name] END,
                deduplication_ids => ARRAY[deduplication_id]) b);
    ELSE
        SELECT p.message_ids, p.webhook_deliveries INTO message_ids, webhook_deliveries
        FROM postbox.publish(s.target_topic, s.body, s.routing_key, s.attributes,
                             deduplication_id => deduplication_id) p;
    END IF;
END
$$;

-- Fires a due schedule that the caller claimed: sends its message, or
-- publishes it, and sets when it fires next (next_fire_at, computed by the
-- caller; ignored for a one-shot schedule, which is paused for good), all in
-- the caller's transaction, so a fire happens exactly once. The message's
-- deduplication id is "<schedule>@<due time>", which keeps content-based
-- deduplication from eating repeats; FIFO queues get the schedule name as
-- message group. A fire that the target refuses (missing, paused, full, ...)
-- is skipped, not retried: `error` says why, and so does the schedule's
-- last_error. Returns the error and how many webhook deliveries were queued.
CREATE OR REPLACE FUNCTION postbox.fire_schedule(schedule_id integer, next_fire_at timestamptz)
RETURNS TABLE (error text, webhook_deliveries integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    s postbox.schedules;
    deduplication_id text;
    problem text;
    state text;
    hooks integer := 0;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE id = schedule_id FOR UPDATE;
    IF NOT FOUND OR s.paused OR NOT s.next_fire_at <= now() THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format('schedule %s is not due', schedule_id);
    END IF;
    deduplication_id := s.name || '@' || to_char(s.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    BEGIN
        hooks := (postbox._fire(s, deduplication_id)).webhook_deliveries;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
        IF state NOT LIKE 'PB%' THEN
            RAISE;
        END IF;
    END;
    UPDATE postbox.schedules
    SET next_fire_at = CASE WHEN s.run_at IS NULL THEN fire_schedule.next_fire_at END,
        paused = s.run_at IS NOT NULL,
        last_fire_at = CASE WHEN problem IS NULL THEN now() ELSE last_fire_at END,
        fire_count = fire_count + CASE WHEN problem IS NULL THEN 1 ELSE 0 END,
        last_error = problem
    WHERE id = s.id;
    RETURN QUERY SELECT problem, coalesce(hooks, 0);
END
$$;

-- Fires a schedule once now, paused or not, without moving its next fire
-- time; counted as a fire. Unlike a due fire, a refusal (target missing,
-- paused or full) is the caller's error and is not kept in last_error. The
-- fire's deduplication id is "<name>@run:<now>". Returns the schedule and the
-- ids of the committed messages.
CREATE FUNCTION postbox.run_schedule(schedule_name text, OUT schedule postbox.schedules,
                                     OUT message_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        s := postbox._schedule(schedule_name);  -- raises PB400 or PB404
    END IF;
    message_ids := (postbox._fire(
        s, s.name || '@run:' || to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))).message_ids;
    UPDATE postbox.schedules
    SET last_fire_at = now(), fire_count = fire_count + 1, last_error = NULL
    WHERE id = s.id
    RETURNING * INTO schedule;
END
$$;

-- The queues whose dead-letter queue this is, in name order after after_name.
CREATE OR REPLACE FUNCTION postbox.list_dead_letter_source_queues(queue_name text, page_size integer DEFAULT 100,
                                                       after_name text DEFAULT '')
RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    -- Looked up first: in the query's filter it would run only if some queue
    -- were scanned, and an absent queue must be PB404 on an empty database too.
    dlq postbox.queues := postbox._queue(queue_name);
BEGIN
    RETURN QUERY
    SELECT s.name FROM postbox.queues s
    WHERE s.dead_letter_queue_id = dlq.id AND s.name > coalesce(after_name, '')
    ORDER BY s.name
    LIMIT page_size;
END
$$;

-- Tells the servers' workers that work of a kind arrived (since 0.8.0):
-- 'webhooks' (deliveries due now), 'schedules' (a due time changed) or
-- 'redrives' (a task started). A NOTIFY on the queues' channel with a payload no
-- queue name can have; PostgreSQL sends one per transaction however many
-- statements signal, and only at commit. Idle workers sleep until their next
-- due time, so work made elsewhere (another server, psql) would otherwise wait
-- for their slow fallback poll.
CREATE FUNCTION postbox._signal(kind text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('postbox', '#' || kind)
$$;

-- The queues among `names` that hold a message a receive could claim now
-- (since 0.8.0): the servers' safety net for wake-ups lost in a reconnect, one
-- statement for every queue that has streams waiting.
CREATE FUNCTION postbox.ready_queues(names text[]) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT q.name FROM postbox.queues q
    WHERE q.name = ANY (names) AND NOT q.receive_paused
      AND EXISTS (SELECT FROM postbox.messages m WHERE m.queue_id = q.id AND m.visible_at <= now())
$$;

-- Publishes up to 1,000 messages to a topic. Entry i of every array belongs to
-- bodies[i]; an array may be NULL or shorter (missing entries are NULL):
--   routing_keys     matched against subscription patterns; NULL or '' is the
--                    empty key, which only "#" matches
--   attributes       see attribute_problem
--   ordering_keys    FIFO queues take it as message group (else the routing
--                    key, else the topic name); standard queues ignore it
--   deduplication_ids  passed to every queue (see send_batch); FIFO queues
--                    without content_based_deduplication get the publish id
-- Each matching queue gets each message once, however many of its
-- subscriptions match, through send_batch, so the queue's rules apply (size,
-- pause, max_depth, FIFO, deduplication). Each matching webhook subscription
-- gets a delivery row (messages for webhooks hold at most 1 MiB). It is all or
-- nothing: when a queue refuses, the error names the entry and the
-- subscription, and nothing is published. Returns one row per entry, in
-- order: its publish id, the queues (in name order) with the message id each
-- took and whether it was a duplicate there, and how many webhook deliveries
-- were queued.
CREATE OR REPLACE FUNCTION postbox.publish_batch(
    topic_name text, bodies bytea[], routing_keys text[] DEFAULT NULL, attributes jsonb[] DEFAULT NULL,
    ordering_keys text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL)
RETURNS TABLE (publish_id uuid, queues text[], message_ids bigint[], duplicates boolean[],
               webhook_deliveries integer)
LANGUAGE plpgsql
-- Plan each statement once per session. Custom plans (the default for the first
-- calls, and for good when they look cheaper) re-plan every publish, which
-- costs more than the publish itself.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    t postbox.topics := postbox._topic(topic_name);
    n integer := coalesce(cardinality(bodies), 0);
    published_at timestamptz := clock_timestamp();
    problem text;
    ids uuid[];
    keys text[];
    dest record;
    subset boolean;
    groups text[];
    dedup text[];
    sent_ids bigint[];
    sent_duplicates boolean[];
    done_entries integer[] := '{}';
    done_queues text[] := '{}';
    done_ids bigint[] := '{}';
    done_duplicates boolean[] := '{}';
    hook_subscriptions integer[];
    hook_entries integer[];
    refusing text;
    refusing_queue text;
    refusing_entries integer[];
    state text;
    entry_of text[];
BEGIN
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(routing_keys), cardinality(attributes), cardinality(ordering_keys),
                cardinality(deduplication_ids)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    SELECT postbox._entry_prefix(e.i, n) || CASE
               WHEN e.b IS NULL THEN 'body must not be NULL'
               WHEN length(e.o) > 128 OR e.o !~ '^[!-~]+$' THEN
                   'ordering_key must be 1 to 128 printable ASCII characters'
               WHEN length(e.x) > 128 OR e.x !~ '^[!-~]+$' THEN
                   'deduplication_id must be 1 to 128 printable ASCII characters'
               ELSE postbox.routing_key_problem(e.k) END
    INTO problem
    FROM unnest(bodies, routing_keys, ordering_keys, deduplication_ids) WITH ORDINALITY AS e(b, k, o, x, i)
    WHERE e.b IS NULL OR length(e.o) > 128 OR e.o !~ '^[!-~]+$' OR length(e.x) > 128 OR e.x !~ '^[!-~]+$'
          OR postbox.routing_key_problem(e.k) IS NOT NULL
    ORDER BY e.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    ids := CASE WHEN n = 1 THEN ARRAY[gen_random_uuid()]
                ELSE ARRAY(SELECT gen_random_uuid() FROM generate_series(1, n)) END;
    keys := CASE WHEN n = 1 THEN ARRAY[coalesce(routing_keys[1], '')]
                 ELSE ARRAY(SELECT coalesce(routing_keys[i], '') FROM generate_series(1, n) AS i) END;

    PERFORM postbox._lock_topic(t.id, false);
    -- One send_batch per queue, in queue name order (so concurrent publishes
    -- take the queues' locks in one order). One subtransaction for all of them,
    -- to say which subscription refused.
    BEGIN
        FOR dest IN
            SELECT q.name AS queue, q.fifo, q.content_based_deduplication, min(s.name) AS subscription,
                   array_agg(DISTINCT e.i::integer ORDER BY e.i::integer) AS entries
            FROM postbox.subscriptions s
            JOIN postbox.queues q ON q.id = s.queue_id
            CROSS JOIN unnest(keys) WITH ORDINALITY AS e(k, i)
            WHERE s.topic_id = t.id AND s.queue_id IS NOT NULL
                  AND postbox._key_matches(s.match_kind, s.match_text, e.k)
            GROUP BY q.id
            ORDER BY q.name
        LOOP
            refusing := dest.subscription;
            refusing_queue := dest.queue;
            refusing_entries := dest.entries;
            subset := cardinality(dest.entries) < n;
            groups := NULL;
            dedup := NULL;
            IF dest.fifo OR deduplication_ids IS NOT NULL THEN
                SELECT CASE WHEN dest.fifo THEN
                           array_agg(coalesce(ordering_keys[p], nullif(keys[p], ''), topic_name) ORDER BY o)
                       END,
                       array_agg(coalesce(deduplication_ids[p],
                                          CASE WHEN dest.fifo AND NOT dest.content_based_deduplication
                                               THEN ids[p]::text END) ORDER BY o)
                INTO groups, dedup
                FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o);
                IF array_remove(dedup, NULL) = '{}' THEN
                    dedup := NULL;  -- keeps send_batch's fast path
                END IF;
            END IF;
            SELECT array_agg(r.message_id ORDER BY r.o), array_agg(r.duplicate ORDER BY r.o)
            INTO sent_ids, sent_duplicates
            FROM postbox.send_batch(
                dest.queue,
                CASE WHEN subset THEN ARRAY(SELECT bodies[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o)
                                            ORDER BY o)
                     ELSE bodies END,
                CASE WHEN subset AND attributes IS NOT NULL
                     THEN ARRAY(SELECT attributes[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o)
                                ORDER BY o)
                     ELSE attributes END,
                message_group_ids => groups,
                deduplication_ids => dedup) WITH ORDINALITY AS r(message_id, duplicate, o);
            done_entries := done_entries || dest.entries;
            done_queues := done_queues || array_fill(dest.queue, ARRAY[cardinality(dest.entries)]);
            done_ids := done_ids || sent_ids;
            done_duplicates := done_duplicates || sent_duplicates;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
        IF refusing IS NULL OR state NOT LIKE 'PB%' THEN
            RAISE;
        END IF;
        -- send_batch names entries of the batch it got; name the publish's.
        entry_of := regexp_match(problem, '^entry ([0-9]+): (.*)$');
        IF entry_of IS NOT NULL THEN
            entry_of := ARRAY[format('entry %s: ', refusing_entries[entry_of[1]::integer + 1] - 1), entry_of[2]];
        ELSIF n > 1 AND cardinality(refusing_entries) = 1 THEN
            entry_of := ARRAY[format('entry %s: ', refusing_entries[1] - 1), problem];
        ELSE
            entry_of := ARRAY['', problem];
        END IF;
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = format(
            '%ssubscription %s (queue %s) refused the publish, so nothing was published: %s',
            entry_of[1], quote_literal(refusing), quote_literal(refusing_queue), entry_of[2]);
    END;

    SELECT array_agg(s.id ORDER BY e.i, s.name), array_agg(e.i::integer ORDER BY e.i, s.name),
           (array_agg(format('%ssubscription %s takes webhook messages of at most 1048576 bytes, not %s',
                             postbox._entry_prefix(e.i, n), quote_literal(s.name),
                             postbox.message_size(bodies[e.i], attributes[e.i])) ORDER BY e.i)
               FILTER (WHERE postbox.message_size(bodies[e.i], attributes[e.i]) > 1048576))[1]
    INTO hook_subscriptions, hook_entries, problem
    FROM postbox.subscriptions s
    CROSS JOIN unnest(keys) WITH ORDINALITY AS e(k, i)
    WHERE s.topic_id = t.id AND s.webhook_url IS NOT NULL
          AND postbox._key_matches(s.match_kind, s.match_text, e.k);
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF hook_subscriptions IS NOT NULL THEN
        INSERT INTO postbox.webhook_deliveries (subscription_id, publish_id, published_at, routing_key,
                                                ordering_key, attributes, body, next_attempt_at)
        SELECT h.s, ids[h.i], published_at, keys[h.i], ordering_keys[h.i],
               attributes[h.i], bodies[h.i], published_at
        FROM unnest(hook_subscriptions, hook_entries) AS h(s, i);
        PERFORM postbox._signal('webhooks');
    END IF;

    RETURN QUERY
    SELECT ids[e.i], coalesce(d.queue_names, '{}'), coalesce(d.queue_message_ids, '{}'),
           coalesce(d.queue_duplicates, '{}'), coalesce(h.deliveries, 0)::integer
    FROM generate_series(1, n) AS e(i)
    LEFT JOIN (SELECT x, array_agg(q ORDER BY q) AS queue_names, array_agg(m ORDER BY q) AS queue_message_ids,
                      array_agg(dup ORDER BY q) AS queue_duplicates
               FROM unnest(done_entries, done_queues, done_ids, done_duplicates) AS u(x, q, m, dup)
               GROUP BY x) AS d ON d.x = e.i
    LEFT JOIN (SELECT x, count(*) AS deliveries FROM unnest(hook_entries) AS x GROUP BY x) AS h ON h.x = e.i
    ORDER BY e.i;
END
$$;

-- Creates a schedule that fires `body` (with `attributes`) into target_queue
-- or target_topic (with routing_key): on cron_expression read in time_zone,
-- every `every`, or once at run_at; first at next_fire_at, which the caller
-- computes (for an interval, now() + every; for run_at, run_at). PB409 if a
-- schedule of that name exists.
CREATE OR REPLACE FUNCTION postbox.create_schedule(
    schedule_name text, next_fire_at timestamptz, body bytea, target_queue text DEFAULT NULL,
    target_topic text DEFAULT NULL, routing_key text DEFAULT '', attributes jsonb DEFAULT NULL,
    cron_expression text DEFAULT NULL, time_zone text DEFAULT NULL, every interval DEFAULT NULL,
    run_at timestamptz DEFAULT NULL)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    s.name := schedule_name;
    s.next_fire_at := next_fire_at;
    s.body := body;
    s.target_queue := target_queue;
    s.target_topic := target_topic;
    s.routing_key := coalesce(routing_key, '');
    s.attributes := attributes;
    s.cron_expression := cron_expression;
    s.time_zone := time_zone;
    s.every := every;
    s.run_at := run_at;
    s.paused := false;
    PERFORM postbox._check_schedule(s);
    INSERT INTO postbox.schedules (name, cron_expression, time_zone, every, run_at, target_queue, target_topic,
                                   routing_key, body, attributes, next_fire_at)
    VALUES (s.name, s.cron_expression, s.time_zone, s.every, s.run_at, s.target_queue, s.target_topic,
            s.routing_key, s.body, s.attributes, s.next_fire_at)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('schedule %s already exists', quote_literal(schedule_name));
    END IF;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

-- Lets a schedule fire again, next at next_fire_at (computed by the caller
-- from the row lock_schedule returned), or at its stored next_fire_at when
-- NULL. PB412 for a one-shot schedule that has fired: give it a new run_at.
CREATE OR REPLACE FUNCTION postbox.resume_schedule(schedule_name text, next_fire_at timestamptz DEFAULT NULL)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules := postbox.lock_schedule(schedule_name);
BEGIN
    IF coalesce(next_fire_at, s.next_fire_at) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'schedule %s fired at its run_at time already; update run_at to have it fire again',
            quote_literal(schedule_name));
    END IF;
    UPDATE postbox.schedules
    SET paused = false, next_fire_at = coalesce(resume_schedule.next_fire_at, s.next_fire_at), updated_at = now()
    WHERE id = s.id
    RETURNING * INTO s;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

-- Roles for direct SQL users (since 0.8.0), who call the engine from their own
-- transactions: postbox_reader (stats, peek, get and list), postbox_writer
-- (send and publish) and postbox_admin (everything). Grant them to login
-- roles, e.g. GRANT postbox_writer TO app. Roles belong to the cluster, so a
-- second database reuses them. A script run by a role that may not create
-- roles skips them with a notice; then only the owner can call the engine.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['postbox_reader', 'postbox_writer', 'postbox_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = role_name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'postbox: roles postbox_reader, postbox_writer and postbox_admin were not created (%); '
                 'only the owner of schema postbox can call its functions', SQLERRM;
END
$$;

-- What happened to each queue's messages that no message keeps a trace of: counts
-- since the queue was made (since 0.8.0). Written only when messages expire or
-- become dead letters, never on a send, receive or delete.
CREATE TABLE postbox.queue_counters (
    queue_id integer PRIMARY KEY REFERENCES postbox.queues (id) ON DELETE CASCADE,
    expired bigint NOT NULL DEFAULT 0,        -- past their retention or their own expiry
    dead_lettered bigint NOT NULL DEFAULT 0   -- moved to the queue's dead-letter queue
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.queue_counters', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- Removes messages (all of ids, or, with leases, those whose lease still
-- matches), archiving them if the queue archives and promoting the next message
-- of their FIFO groups. Returns the ids removed.
-- Adds to a queue's counters (postbox.queue_counters).
CREATE FUNCTION postbox._count(counted_queue integer, expired_count bigint, dead_lettered_count bigint)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO postbox.queue_counters AS c (queue_id, expired, dead_lettered)
    VALUES (counted_queue, expired_count, dead_lettered_count)
    ON CONFLICT ON CONSTRAINT queue_counters_pkey
    DO UPDATE SET expired = c.expired + excluded.expired,
                  dead_lettered = c.dead_lettered + excluded.dead_lettered
$$;

-- Functions that take messages by id reach them through the primary key,
-- whatever the planner thinks. A session plans each statement once, often while
-- the table was small, and keeps the plan until an ANALYZE, which a pinned xmin
-- horizon holds off: a sequential scan, bitmap scan or hash join chosen then
-- reads every dead row version on every later call. So they allow only index
-- scans and nested loops, and say `queue_id + 0` (offered queue_id as an index
-- condition, the planner fetched the whole queue through the ready index).
CREATE OR REPLACE FUNCTION postbox._remove(q postbox.queues, ids bigint[], leases uuid[], why text) RETURNS bigint[]
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    removed bigint[];
    groups text[];
BEGIN
    IF q.archive_on_delete THEN
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(ids, leases) AS t(id, lease)
            WHERE m.id = t.id AND m.queue_id + 0 = q.id AND (t.lease IS NULL OR m.lease = t.lease)
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
            WHERE m.id = t.id AND m.queue_id + 0 = q.id AND (t.lease IS NULL OR m.lease = t.lease)
            RETURNING m.id, m.message_group_id
        )
        SELECT array_agg(g.id), array_agg(g.message_group_id) INTO removed, groups FROM gone g;
    END IF;
    IF q.fifo AND groups IS NOT NULL THEN
        PERFORM postbox._lock_groups(q.id, groups);
        PERFORM postbox._promote(q, groups);
        PERFORM postbox._notify(q);
    END IF;
    IF why = 'expired' AND removed IS NOT NULL THEN
        PERFORM postbox._count(q.id, cardinality(removed), 0);
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
LANGUAGE plpgsql
-- By primary key (see _remove).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
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
    IF as_dead_letters THEN
        PERFORM postbox._count(source.id, 0, cardinality(ids));
    END IF;
    PERFORM postbox._notify(target);
END
$$;

-- queue_metrics returns the counters too; queue_health reads it.
DROP VIEW postbox.queue_health;
DROP FUNCTION postbox.queue_metrics(integer);

-- Live figures of the first max_queues queues in name order, for a metrics
-- scrape: the counts of queue_stats, the oldest message's age in seconds, the
-- depth of the queue's dead-letter queue (NULL without one), its pause flags
-- and its counters (expired and dead-lettered messages, since 0.8.0).
-- One pass over the messages of those queues and their dead-letter queues, not
-- a call per queue.
CREATE FUNCTION postbox.queue_metrics(max_queues integer DEFAULT 1000)
RETURNS TABLE (queue_name text, visible bigint, in_flight bigint, delayed bigint,
               oldest_age_seconds double precision, dead_letter_depth bigint,
               send_paused boolean, receive_paused boolean,
               expired_total bigint, dead_lettered_total bigint)
LANGUAGE sql STABLE AS $$
    WITH shown AS (
        SELECT q.id, q.name, q.dead_letter_queue_id, q.send_paused, q.receive_paused
        FROM postbox.queues q ORDER BY q.name LIMIT max_queues
    ), depth AS (
        SELECT m.queue_id,
               count(*) FILTER (WHERE m.visible_at <= now() OR m.visible_at = 'infinity') AS visible,
               count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity'
                                      AND m.lease IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity'
                                      AND m.lease IS NULL) AS delayed,
               min(m.enqueued_at) AS oldest
        FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id
        WHERE m.queue_id IN (SELECT id FROM shown UNION SELECT dead_letter_queue_id FROM shown)
          AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention)
        GROUP BY m.queue_id
    )
    SELECT s.name, coalesce(d.visible, 0), coalesce(d.in_flight, 0), coalesce(d.delayed, 0),
           greatest(coalesce(extract(epoch FROM now() - d.oldest), 0), 0)::double precision,
           CASE WHEN s.dead_letter_queue_id IS NOT NULL
                THEN coalesce(dl.visible + dl.in_flight + dl.delayed, 0) END,
           s.send_paused, s.receive_paused,
           coalesce(c.expired, 0), coalesce(c.dead_lettered, 0)
    FROM shown s
    LEFT JOIN depth d ON d.queue_id = s.id
    LEFT JOIN depth dl ON dl.queue_id = s.dead_letter_queue_id
    LEFT JOIN postbox.queue_counters c ON c.queue_id = s.id
    ORDER BY s.name
$$;

-- Each queue's health, for people who live in psql: 'critical' when its oldest
-- message is older than postbox.health_critical_age (default 1 hour) or its
-- dead-letter queue holds postbox.health_critical_dlq_depth messages (default
-- 100); 'warning' past postbox.health_warning_age (5 minutes) or
-- postbox.health_warning_dlq_depth (1), or while paused; else 'ok'. reason says
-- which. Thresholds are settings, per database or role, e.g.
-- ALTER DATABASE app SET postbox.health_warning_age = '10 min'.
CREATE VIEW postbox.queue_health AS
SELECT m.queue_name,
       CASE WHEN h.critical <> '{}' THEN 'critical'
            WHEN h.warning <> '{}' THEN 'warning'
            ELSE 'ok' END AS status,
       array_to_string(h.critical || h.warning, '; ') AS reason,
       m.visible, m.in_flight, m.delayed, m.oldest_age_seconds, m.dead_letter_depth,
       m.send_paused, m.receive_paused
FROM postbox.queue_metrics(2147483647) m,
     LATERAL (SELECT coalesce(nullif(current_setting('postbox.health_warning_age', true), ''), '5 minutes')::interval AS warning_age,
                     coalesce(nullif(current_setting('postbox.health_critical_age', true), ''), '1 hour')::interval AS critical_age,
                     coalesce(nullif(current_setting('postbox.health_warning_dlq_depth', true), ''), '1')::bigint AS warning_dlq,
                     coalesce(nullif(current_setting('postbox.health_critical_dlq_depth', true), ''), '100')::bigint AS critical_dlq) t,
     LATERAL (SELECT array_remove(ARRAY[
                         CASE WHEN m.visible + m.in_flight + m.delayed > 0
                                   AND m.oldest_age_seconds >= extract(epoch FROM t.critical_age)
                              THEN format('oldest message %s s old', round(m.oldest_age_seconds)) END,
                         CASE WHEN m.dead_letter_depth >= t.critical_dlq
                              THEN format('%s dead letters', m.dead_letter_depth) END], NULL) AS critical,
                     array_remove(ARRAY[
                         CASE WHEN m.visible + m.in_flight + m.delayed > 0
                                   AND m.oldest_age_seconds >= extract(epoch FROM t.warning_age)
                                   AND m.oldest_age_seconds < extract(epoch FROM t.critical_age)
                              THEN format('oldest message %s s old', round(m.oldest_age_seconds)) END,
                         CASE WHEN m.dead_letter_depth >= t.warning_dlq AND m.dead_letter_depth < t.critical_dlq
                              THEN format('%s dead letters', m.dead_letter_depth) END,
                         CASE WHEN m.send_paused OR m.receive_paused THEN 'paused' END], NULL) AS warning) h;

-- Queues that a server has streams waiting on, by the backend pid of that
-- server's LISTEN connection (since 0.8.0). A send NOTIFYs only a queue listed
-- here: NOTIFY makes committing transactions queue up behind one another, and a
-- send into a queue nobody waits on should not pay for it. Runtime state, so not
-- in pg_dump; rows of a session that is gone are cleared by the next listen_to.
CREATE TABLE postbox.queue_listeners (
    queue_id integer NOT NULL REFERENCES postbox.queues (id) ON DELETE CASCADE,
    listener integer NOT NULL,
    PRIMARY KEY (queue_id, listener)
);

-- Wakes receivers waiting on a queue: NOTIFY on channel "postbox" with the
-- queue name, delivered when the sending transaction commits. NOTIFY makes
-- committing transactions queue up behind one another, so only a queue that a
-- server waits on (postbox.queue_listeners) is notified; the look runs after the
-- caller's change, and listen_to's caller covers a registration that commits
-- meanwhile. And a session notifies a queue at most once per 5 ms. A
-- send that skips commits moments after the notification of the same session's
-- previous, committed transaction (a rolled-back one takes its setting along);
-- servers poll once more a little after each notification to pick it up. The
-- time sits in a session setting, not a table row: a row updated this often
-- would leave a dead version per notification while the xmin horizon is pinned,
-- and every sender would walk them all to find the live one.
CREATE OR REPLACE FUNCTION postbox._notify(q postbox.queues) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    setting text := 'postbox.notified_' || q.id;
    now_ms numeric := extract(epoch FROM clock_timestamp()) * 1000;
BEGIN
    IF NOT EXISTS (SELECT FROM postbox.queue_listeners l WHERE l.queue_id = q.id) THEN
        RETURN;
    END IF;
    IF coalesce(nullif(current_setting(setting, true), ''), '0')::numeric > now_ms - 5 THEN
        RETURN;
    END IF;
    PERFORM set_config(setting, now_ms::text, false);
    PERFORM pg_notify('postbox', q.name);
END
$$;

-- Lists this session (a server's LISTEN connection) as waiting on the named
-- queues, so that sends into them notify (since 0.8.0), and clears the rows of
-- sessions that are gone. A send that looked for listeners before this commits
-- does not notify: the caller takes pg_current_snapshot() once this has
-- committed, waits until every transaction in progress then has ended, and
-- looks at the queues itself (ready_queues).
CREATE FUNCTION postbox.listen_to(queue_names text[]) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM postbox.queue_listeners l
    WHERE l.listener <> pg_backend_pid()
      AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = l.listener);
    INSERT INTO postbox.queue_listeners (queue_id, listener)
    SELECT q.id, pg_backend_pid() FROM postbox.queues q WHERE q.name = ANY (queue_names)
    ON CONFLICT DO NOTHING;
$$;

-- Takes this session off the named queues' listeners (since 0.8.0).
CREATE FUNCTION postbox.unlisten(queue_names text[]) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM postbox.queue_listeners l
    USING postbox.queues q
    WHERE l.queue_id = q.id AND q.name = ANY (queue_names) AND l.listener = pg_backend_pid();
$$;

-- Gives the engine's functions their privileges, and makes each public one
-- SECURITY DEFINER with a fixed search_path: a reader or writer then needs no
-- right on the tables (a writer can call send, not insert rows of its own), and
-- no schema of the caller's can shadow a function or operator the engine uses.
-- Pure (IMMUTABLE) functions and internal ones (named "_...") stay as they are:
-- they run inside a public function, whose path is fixed already, and a SET
-- clause would keep the planner from inlining them. CREATE OR REPLACE resets
-- a function's settings, so every install and upgrade script ends by calling
-- this.
CREATE FUNCTION postbox._secure() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    roles boolean := (SELECT count(*) = 3 FROM pg_catalog.pg_roles
                      WHERE rolname IN ('postbox_reader', 'postbox_writer', 'postbox_admin'));
BEGIN
    FOR f IN SELECT p.oid::regprocedure AS signature, p.proname AS name, p.provolatile, p.prorettype
             FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.signature);
        IF f.provolatile <> 'i' AND f.prorettype <> 'trigger'::regtype AND left(f.name, 1) <> '_' THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp',
                           f.signature);
        END IF;
        IF roles THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_admin', f.signature);
            IF f.name IN ('queue_stats', 'queue_metrics', 'peek_messages', 'get_message', 'list_archived_messages',
                          'get_queue', 'list_queues', 'list_dead_letter_source_queues', 'list_redrive_tasks',
                          'get_topic', 'list_topics', 'get_subscription', 'list_subscriptions',
                          'list_webhook_deliveries', 'get_schedule', 'list_schedules') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader', f.signature);
            ELSIF f.name IN ('send', 'send_batch', 'publish', 'publish_batch') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_writer', f.signature);
            END IF;
        END IF;
    END LOOP;
    IF roles THEN
        GRANT USAGE ON SCHEMA postbox TO postbox_reader, postbox_writer, postbox_admin;
        GRANT ALL ON ALL TABLES IN SCHEMA postbox TO postbox_admin;
        GRANT ALL ON ALL SEQUENCES IN SCHEMA postbox TO postbox_admin;
        GRANT SELECT ON postbox.queue_health TO postbox_reader;
    END IF;
END
$$;

SELECT postbox._secure();

INSERT INTO postbox.schema_version (version) VALUES ('0.8.0');
