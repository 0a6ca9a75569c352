-- postbox 0.3.0 -> 0.4.0: message semantics. receive returns messages in the
-- order it claims them (priority, then visibility time, then id). send_batch:
-- a dedupe_key send never returns the id of a message that is gone (an expired
-- keyed message gives up its key; keyed entries are not deduplicated by content).
-- A delay, a delivery time and a queue's delivery_delay must be shorter than
-- the retention (existing queues are left as they are until their next update).
-- Every function that takes a queue name answers a malformed one with PB400.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

-- The queue of that name; PB400 if the name is malformed (no queue can have
-- it), PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox._queue(queue_name text) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name;
    IF NOT FOUND THEN
        -- Checked only on a miss: create_queue refuses malformed names, so the
        -- lookup of an existing queue pays nothing for the check.
        IF postbox.queue_name_problem(queue_name) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.queue_name_problem(queue_name));
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('queue %s does not exist', quote_literal(queue_name));
    END IF;
    RETURN q;
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
        SELECT array_agg(p.id ORDER BY p.priority DESC, p.visible_at, p.id) FILTER (WHERE NOT p.gone AND NOT p.dead),
               array_agg(p.id) FILTER (WHERE p.gone),
               array_agg(p.id) FILTER (WHERE p.dead AND NOT p.gone)
        INTO to_deliver, to_expire, to_bury
        FROM (
            SELECT * FROM (  -- priority > 0 first, through its partial index
                SELECT m.id, m.priority, m.visible_at, coalesce(m.enqueued_at < expired_before, false) AS gone,
                       coalesce(m.receive_count >= q.max_receive_count, false) AS dead
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority > 0 AND m.visible_at <= now()
                ORDER BY m.priority DESC, m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS high
            UNION ALL
            SELECT * FROM (  -- then the rest, in visibility order
                SELECT m.id, m.priority, m.visible_at, coalesce(m.enqueued_at < expired_before, false),
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
            -- In claim order: the claim overwrote visible_at, so the order comes from to_deliver.
            FROM claimed c JOIN unnest(to_deliver) WITH ORDINALITY AS o(id, n) ON o.id = c.id
            ORDER BY o.n;
            RETURN;
        END IF;
        EXIT WHEN to_expire IS NULL AND to_bury IS NULL;
    END LOOP;
END
$$;

INSERT INTO postbox.schema_version (version) VALUES ('0.4.0');
