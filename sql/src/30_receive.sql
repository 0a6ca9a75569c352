-- Takes up to `wanted` tokens of a rate-limited queue's bucket (capacity: one
-- second of the rate); returns how many it took.
CREATE FUNCTION postbox._take_receive_tokens(q postbox.queues, wanted integer) RETURNS integer
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
CREATE FUNCTION postbox._return_receive_tokens(q postbox.queues, unused integer) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.receive_tokens
    SET tokens = least(greatest(1, q.receive_rate_limit), tokens + unused)
    WHERE queue_id = q.id AND unused > 0
$$;

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

-- Deletes the dedupe_keys rows of `keys` that still name one of `message_ids`
-- (messages received or removed, which the caller holds), skipping rows that a
-- concurrent send has locked. That send holds the key's row and may be
-- waiting for one of those messages: waiting for the row here would close the
-- circle. It finds the message holds the key no more, and names its own.
-- plpgsql, for its cached plans (a SQL function is planned on every call),
-- which reach the rows by key, whatever the planner thinks (see _remove).
CREATE FUNCTION postbox._free_keys(queue_id integer, keys text[], message_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    free text[];
BEGIN
    SELECT array_agg(x.dedupe_key) INTO free
    FROM (SELECT x.dedupe_key FROM postbox.dedupe_keys x
          WHERE x.queue_id = _free_keys.queue_id AND x.dedupe_key = ANY (keys) AND x.message_id = ANY (message_ids)
          FOR UPDATE SKIP LOCKED) AS x;
    DELETE FROM postbox.dedupe_keys d WHERE d.queue_id = _free_keys.queue_id AND d.dedupe_key = ANY (free);
END
$$;

-- Functions that take messages by id reach them through the primary key,
-- whatever the planner thinks. A session plans each statement once, often while
-- the table was small, and keeps the plan until an ANALYZE, which a pinned xmin
-- horizon holds off: a sequential scan, bitmap scan or hash join chosen then
-- reads every dead row version on every later call. So they allow only index
-- scans and nested loops, and say `queue_id + 0` (offered queue_id as an index
-- condition, the planner fetched the whole queue through the ready index).
-- Removes messages (all of ids, or, with leases, those whose lease still
-- matches), archiving them if the queue archives, why being the reason (deleted,
-- expired, cancelled or failed) and results[i] what the consumer returned for
-- ids[i] (since 0.9.0); and promotes the next message of their FIFO groups.
-- Returns the ids removed.
CREATE FUNCTION postbox._remove(q postbox.queues, ids bigint[], leases uuid[], why text,
                                results bytea[] DEFAULT NULL)
RETURNS bigint[]
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
    expiring bigint[];
    keys text[];
BEGIN
    IF q.archive_on_delete THEN
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(ids, leases, results) AS t(id, lease, result)
            WHERE m.id = t.id AND m.queue_id + 0 = q.id AND (t.lease IS NULL OR m.lease = t.lease)
            RETURNING m.*, t.result
        ), archived AS (
            INSERT INTO postbox.archive (id, queue_id, receive_count, enqueued_at, first_received_at,
                                         archived_at, reason, priority, message_group_id,
                                         deduplication_id, source_queue_id, last_error, attributes, body,
                                         result, consumer_id, dead_lettered_at)
            SELECT g.id, g.queue_id, g.receive_count, g.enqueued_at, g.first_received_at,
                   clock_timestamp(), why, g.priority, g.message_group_id, g.deduplication_id,
                   g.source_queue_id, g.last_error, g.attributes, g.body, g.result, g.consumer_id,
                   g.dead_lettered_at
            FROM gone g
        )
        SELECT array_agg(g.id), array_agg(g.message_group_id), array_agg(g.id) FILTER (WHERE g.expires_at IS NOT NULL),
               array_agg(g.dedupe_key) FILTER (WHERE g.dedupe_key IS NOT NULL)
        INTO removed, groups, expiring, keys FROM gone g;
    ELSE
        -- The same delete without the archive: a data-modifying CTE costs even
        -- when it inserts nothing, and this is the path of every plain delete.
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(ids, leases) AS t(id, lease)
            WHERE m.id = t.id AND m.queue_id + 0 = q.id AND (t.lease IS NULL OR m.lease = t.lease)
            RETURNING m.id, m.message_group_id, m.expires_at, m.dedupe_key
        )
        SELECT array_agg(g.id), array_agg(g.message_group_id), array_agg(g.id) FILTER (WHERE g.expires_at IS NOT NULL),
               array_agg(g.dedupe_key) FILTER (WHERE g.dedupe_key IS NOT NULL)
        INTO removed, groups, expiring, keys FROM gone g;
    END IF;
    IF expiring IS NOT NULL THEN
        DELETE FROM postbox.message_expiries WHERE message_id = ANY (expiring);
    END IF;
    IF keys IS NOT NULL THEN
        PERFORM postbox._free_keys(q.id, keys, removed);
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
-- `source` (leaving their own max_receive_count behind, since 0.9.0), or back
-- (redrive) with their deliveries uncounted. In a FIFO target
-- they join the end of their groups; in a FIFO source the next messages move up.
CREATE FUNCTION postbox._move(ids bigint[], source postbox.queues, target postbox.queues,
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
    with_priority boolean;
BEGIN
    SELECT array_agg(DISTINCT m.message_group_id) FILTER (WHERE m.message_group_id IS NOT NULL),
           coalesce(bool_or(m.priority > 0), false)
    INTO groups, with_priority
    FROM postbox.messages m WHERE m.id = ANY (ids);
    IF with_priority AND NOT target.prioritized THEN
        PERFORM postbox._mark_queue(target.id, true, false);
    END IF;
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
        -- A message's own limit is its source queue's business: a dead letter
        -- follows the dead-letter queue's.
        max_receive_count = CASE WHEN NOT as_dead_letters THEN m.max_receive_count END,
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

-- Ends the tries of messages (locked by the caller) of queue q: into its
-- dead-letter queue, or where it has none, removed as failed (archived where the
-- queue archives). Since 0.9.0.
CREATE FUNCTION postbox._bury(q postbox.queues, ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    dlq postbox.queues;
BEGIN
    SELECT * INTO dlq FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id;
    IF FOUND THEN
        PERFORM postbox._move(ids, q, dlq, true);
    ELSE
        PERFORM postbox._remove(q, ids, NULL, 'failed');
    END IF;
END
$$;

-- What is wrong with a consumer id (NULL when nothing is): 1 to 128 characters
-- of letters, digits and _ . : @ / - (so that it is safe as a metrics label and
-- in logs). The id is quoted by a prefix and its length only.
CREATE FUNCTION postbox.consumer_id_problem(consumer_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(consumer_id) NOT BETWEEN 1 AND 128 OR consumer_id ~ '[^A-Za-z0-9_.:@/-]' THEN format(
        'consumer_id %s (%s characters) must be 1 to 128 characters of letters, digits and _ . : @ / -',
        quote_literal(left(consumer_id, 40)), length(consumer_id)) END
$$;

-- receive's work on a FIFO queue (since 0.9.0). A group's messages that are
-- not parked at 'infinity' are always its oldest ones (sends park behind any
-- message, promotion makes the oldest visible, removals keep the rest in
-- order), so a group's head is deliverable when it is the group's oldest
-- message and no message of its group is in flight. A receive then takes, behind
-- each head, the group's next messages in order (the group's run), as many as
-- fit in max_messages: the run stops at the first message it cannot take
-- (locked by another receive, expired, out of receives, still delayed), so a run
-- is always consecutive. While any message of a run is in flight the group is
-- blocked; a message of the run that becomes visible again is not the group's
-- oldest unless those before it are gone, so order is never broken. The checks
-- are in the scan's WHERE, before its SKIP LOCKED lock, so a receive never holds
-- a message it may not deliver.
CREATE FUNCTION postbox._receive_fifo(q postbox.queues, max_messages integer, timeout interval,
                                      scan_start timestamptz, max_bytes bigint, consumer_id text)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, receipt text, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               more boolean)
LANGUAGE plpgsql
-- As receive: an ordered walk of the ready index, and group look-ups through
-- the group index.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    expired_before timestamptz := now() - q.retention;
    allowed integer;
    head record;
    taken bigint[];     -- the claim, in order: each head, then its run
    sizes bigint[];     -- their sizes, as receive counts them
    run_ids bigint[];
    run_sizes bigint[];
    locked bigint[];
    to_deliver bigint[];
    to_expire bigint[];
    to_bury bigint[];
    left_over boolean;
    keys text[];
BEGIN
    FOR attempt IN 1..10 LOOP
        allowed := CASE WHEN q.receive_rate_limit IS NULL THEN max_messages
                        ELSE postbox._take_receive_tokens(q, max_messages) END;
        EXIT WHEN allowed = 0;
        taken := '{}';
        sizes := '{}';
        to_expire := NULL;
        to_bury := NULL;
        FOR head IN
            SELECT m.id, m.message_group_id,
                   coalesce(m.enqueued_at < expired_before, false) OR coalesce(m.expires_at <= now(), false) AS gone,
                   coalesce(m.receive_count >= coalesce(m.max_receive_count, q.max_receive_count), false) AS dead,
                   octet_length(m.body) + coalesce(pg_column_size(m.attributes), 0) + 256 AS size
            FROM postbox.messages m
            WHERE m.queue_id = q.id AND m.visible_at BETWEEN scan_start AND now()
                  AND (m.message_group_id IS NULL
                       OR NOT EXISTS (SELECT FROM postbox.messages x
                                      WHERE x.queue_id = q.id AND x.message_group_id = m.message_group_id
                                            AND x.id < m.id)
                          -- The first of the group's later messages that is not visible
                          -- is parked (or there is none): nothing of the group in flight.
                          AND coalesce((SELECT x.visible_at = 'infinity' FROM postbox.messages x
                                        WHERE x.queue_id = q.id AND x.message_group_id = m.message_group_id
                                              AND x.id > m.id AND x.visible_at > now()
                                        ORDER BY x.id LIMIT 1), true))
            ORDER BY m.visible_at, m.id
            LIMIT allowed
            FOR UPDATE SKIP LOCKED
        LOOP
            IF head.gone THEN
                to_expire := to_expire || head.id;
                CONTINUE;
            ELSIF head.dead THEN
                to_bury := to_bury || head.id;
                CONTINUE;
            END IF;
            EXIT WHEN cardinality(taken) >= allowed;
            taken := taken || head.id;
            sizes := sizes || head.size::bigint;
            CONTINUE WHEN head.message_group_id IS NULL OR cardinality(taken) >= allowed;
            -- The run: the group's next messages, in order, up to the first one that
            -- another transaction holds (the locked ones are compared with all).
            SELECT array_agg(x.id ORDER BY x.id),
                   array_agg(octet_length(x.body) + coalesce(pg_column_size(x.attributes), 0) + 256 ORDER BY x.id)
            INTO run_ids, run_sizes
            FROM (SELECT x.id, x.body, x.attributes, x.visible_at, x.enqueued_at, x.expires_at,
                         x.receive_count, x.max_receive_count
                  FROM postbox.messages x
                  WHERE x.queue_id = q.id AND x.message_group_id = head.message_group_id AND x.id > head.id
                  ORDER BY x.id LIMIT allowed - cardinality(taken)) AS x;
            CONTINUE WHEN run_ids IS NULL;
            SELECT array_agg(x.id ORDER BY x.id) INTO locked
            FROM (SELECT x.id FROM postbox.messages x
                  WHERE x.id = ANY (run_ids) AND x.queue_id + 0 = q.id
                        AND (x.visible_at = 'infinity' OR x.visible_at <= now())
                        AND x.enqueued_at + q.delivery_delay <= now()
                        AND NOT coalesce(x.enqueued_at < expired_before, false)
                        AND NOT coalesce(x.expires_at <= now(), false)
                        AND NOT coalesce(x.receive_count >= coalesce(x.max_receive_count, q.max_receive_count),
                                         false)
                  ORDER BY x.id
                  FOR UPDATE SKIP LOCKED) AS x;
            FOR i IN 1..cardinality(run_ids) LOOP
                EXIT WHEN locked IS NULL OR i > cardinality(locked) OR locked[i] <> run_ids[i];
                taken := taken || run_ids[i];
                sizes := sizes || run_sizes[i];
            END LOOP;
        END LOOP;
        IF to_expire IS NOT NULL THEN
            PERFORM postbox._remove(q, to_expire, NULL, 'expired');
        END IF;
        IF to_bury IS NOT NULL THEN
            PERFORM postbox._bury(q, to_bury);
        END IF;
        -- Within max_bytes: a prefix of the claim, at least its first message (a
        -- prefix keeps every run consecutive).
        SELECT array_agg(t.id ORDER BY t.n) FILTER (WHERE t.total <= max_bytes OR max_bytes IS NULL OR t.n = 1),
               coalesce(bool_or(max_bytes IS NOT NULL AND t.total > max_bytes AND t.n > 1), false)
        INTO to_deliver, left_over
        FROM (SELECT s.id, s.n, sum(s.size) OVER (ORDER BY s.n) AS total
              FROM unnest(taken, sizes) WITH ORDINALITY AS s(id, size, n)) AS t;
        IF q.receive_rate_limit IS NOT NULL THEN
            PERFORM postbox._return_receive_tokens(q, allowed - coalesce(cardinality(to_deliver), 0));
        END IF;
        IF to_deliver IS NOT NULL THEN
            SELECT array_agg(m.dedupe_key) INTO keys
            FROM postbox.messages m
            WHERE m.id = ANY (to_deliver) AND m.queue_id + 0 = q.id AND m.dedupe_key IS NOT NULL;
            IF keys IS NOT NULL THEN
                PERFORM postbox._free_keys(q.id, keys, to_deliver);
            END IF;
            RETURN QUERY
            WITH claimed AS (
                UPDATE postbox.messages m
                SET visible_at = clock_timestamp() + timeout,
                    receive_count = m.receive_count + 1,
                    first_received_at = coalesce(m.first_received_at, clock_timestamp()),
                    lease = (SELECT gen_random_uuid()),  -- once per call (see receive)
                    dedupe_key = NULL,
                    consumer_id = _receive_fifo.consumer_id,
                    received_at = clock_timestamp()
                WHERE m.id = ANY (to_deliver) AND m.queue_id + 0 = q.id
                RETURNING m.*
            )
            SELECT c.id, c.body, c.attributes, c.enqueued_at, c.receive_count, c.first_received_at,
                   c.id || ':' || c.lease, c.priority, c.message_group_id, c.deduplication_id,
                   CASE WHEN c.source_queue_id IS NOT NULL
                        THEN (SELECT s.name FROM postbox.queues s WHERE s.id = c.source_queue_id) END, c.last_error,
                   left_over
            FROM claimed c JOIN unnest(to_deliver) WITH ORDINALITY AS o(id, n) ON o.id = c.id
            ORDER BY o.n;
            RETURN;
        END IF;
        EXIT WHEN to_expire IS NULL AND to_bury IS NULL;
    END LOOP;
END
$$;

-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>". The messages of one call share a
-- lease: a call delivers a message once, so the pair names the delivery, and a
-- strong random draw per row cost 5% of a receive of ten. Order: priority, then
-- visibility time, then id; a FIFO queue hands out runs of its groups (see
-- _receive_fifo). On the way, expired
-- messages are removed and messages received max_receive_count times already
-- move to the dead-letter queue instead. A rate-limited queue returns fewer
-- messages when its tokens run short. PB503 while receives are paused.
-- scan_from: where to start in the ready index, from receive_floor (NULL: this
-- session's floor, see _kept_floor). max_bytes (since 0.8.0; NULL: no limit) bounds the claim by size: it
-- stops before the message that would take the sum of the claimed messages'
-- sizes (body, attributes and 256 bytes for the rest) past max_bytes, and always
-- claims one. `more` (on every row) says that deliverable messages were left for
-- the next call, so a caller that wants them all claims again at once.
-- consumer_id (since 0.9.0; NULL: unnamed; see consumer_id_problem) names who
-- takes the delivery: get_message and peek_messages show it while the message
-- is in flight. A message's own max_receive_count (see send_batch) overrides the
-- queue's; where the queue has no dead-letter queue, a message past it fails
-- for good (archived as failed where the queue archives).
CREATE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
                                visibility_timeout interval DEFAULT NULL, scan_from timestamptz DEFAULT NULL,
                                max_bytes bigint DEFAULT NULL, consumer_id text DEFAULT NULL)
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
-- Plans made once, not on every call: given the floor and now(), a custom plan
-- estimated the rows exactly and so looked cheaper than the generic one, and a
-- session beside a deep queue planned the claim anew each time (a third of a
-- receive and delete, valgrind). The settings above already fix its shape.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues;
    timeout interval;
    expired_before timestamptz;
    scan_start timestamptz;
    allowed integer;
    to_deliver bigint[];
    to_expire bigint[];
    to_bury bigint[];
    left_over boolean;
    keys text[];  -- dedupe keys of the messages to deliver
BEGIN
    -- Looked up here, not through _queue: a nested call costs more than the look.
    SELECT * INTO q FROM postbox.queues x WHERE x.name = queue_name;
    IF NOT FOUND THEN
        PERFORM postbox._queue(queue_name);  -- raises PB400 or PB404
    END IF;
    timeout := coalesce(visibility_timeout, q.visibility_timeout);
    expired_before := now() - q.retention;
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages is %s; it must be 1 to 1000', max_messages));
    END IF;
    IF timeout < interval '0' OR timeout > interval '12 hours' THEN
        PERFORM postbox._invalid(format('visibility timeout %s is outside 0 s to 12 h', timeout));
    END IF;
    IF consumer_id IS NOT NULL AND postbox.consumer_id_problem(consumer_id) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.consumer_id_problem(consumer_id));
    END IF;
    IF q.receive_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for receiving; ResumeQueue lets receives in again', quote_literal(queue_name));
    END IF;
    scan_start := coalesce(scan_from, postbox._kept_floor(q.id), postbox._session_floor(q.id), '-infinity');
    IF q.fifo THEN
        RETURN QUERY SELECT * FROM postbox._receive_fifo(q, max_messages, timeout, scan_start, max_bytes,
                                                         receive.consumer_id);
        RETURN;
    END IF;
    IF q.receive_rate_limit IS NULL AND max_bytes IS NULL AND NOT q.prioritized AND NOT q.keyed THEN
        -- The common case in one statement: the candidates are claimed when none of
        -- them has expired or run out of receives; else, or with none, the rounds.
        -- Without priorities: the priority index's scan cost 3% of a receive of ten.
        -- Without dedupe keys, whose rows the rounds free.
        RETURN QUERY
        WITH c AS MATERIALIZED (
            SELECT m.id, m.visible_at, coalesce(m.enqueued_at < expired_before, false)
                                       OR coalesce(m.expires_at <= now(), false) AS gone,
                   coalesce(m.receive_count >= coalesce(m.max_receive_count, q.max_receive_count), false) AS dead
            FROM postbox.messages m
            WHERE m.queue_id = q.id AND m.priority = 0 AND m.visible_at BETWEEN scan_start AND now()
            ORDER BY m.visible_at, m.id
            LIMIT max_messages
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE postbox.messages m
            SET visible_at = clock_timestamp() + timeout,
                receive_count = m.receive_count + 1,
                first_received_at = coalesce(m.first_received_at, clock_timestamp()),
                lease = (SELECT gen_random_uuid()),  -- once per call (above)
                dedupe_key = NULL,
                consumer_id = receive.consumer_id,
                received_at = clock_timestamp()
            FROM c
            WHERE m.id = c.id AND NOT EXISTS (SELECT FROM c x WHERE x.gone OR x.dead)
            RETURNING m.*, c.visible_at AS claim_visible_at
        )
        SELECT c.id, c.body, c.attributes, c.enqueued_at, c.receive_count, c.first_received_at,
               c.id || ':' || c.lease, c.priority, c.message_group_id, c.deduplication_id,
               -- Only a dead letter looks its source up.
               CASE WHEN c.source_queue_id IS NOT NULL
                    THEN (SELECT s.name FROM postbox.queues s WHERE s.id = c.source_queue_id) END, c.last_error, false
        FROM claimed c
        ORDER BY c.claim_visible_at, c.id;
        IF FOUND THEN
            RETURN;
        END IF;
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
               coalesce(bool_or(NOT p.gone AND NOT p.dead AND NOT p.deliver), false),
               array_agg(p.dedupe_key) FILTER (WHERE p.deliver AND p.dedupe_key IS NOT NULL)
        INTO to_deliver, to_expire, to_bury, left_over, keys
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
                       coalesce(m.receive_count >= coalesce(m.max_receive_count, q.max_receive_count), false) AS dead,
                       -- octet_length reads a TOASTed body's size without fetching it.
                       octet_length(m.body) + coalesce(pg_column_size(m.attributes), 0) + 256 AS size,
                       m.dedupe_key
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority > 0 AND m.visible_at BETWEEN scan_start AND now()
                ORDER BY m.priority DESC, m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS high
            UNION ALL
            SELECT * FROM (  -- then the rest, in visibility order
                SELECT m.id, m.priority, m.visible_at, coalesce(m.enqueued_at < expired_before, false)
                                                             OR coalesce(m.expires_at <= now(), false),
                       coalesce(m.receive_count >= coalesce(m.max_receive_count, q.max_receive_count), false),
                       octet_length(m.body) + coalesce(pg_column_size(m.attributes), 0) + 256,
                       m.dedupe_key
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
            PERFORM postbox._bury(q, to_bury);
        END IF;
        IF q.receive_rate_limit IS NOT NULL THEN
            PERFORM postbox._return_receive_tokens(q, allowed - coalesce(cardinality(to_deliver), 0));
        END IF;
        IF keys IS NOT NULL THEN
            -- The keys go with the first delivery (the claim clears them below).
            PERFORM postbox._free_keys(q.id, keys, to_deliver);
        END IF;
        IF to_deliver IS NOT NULL THEN
            RETURN QUERY
            WITH claimed AS (
                UPDATE postbox.messages m
                SET visible_at = clock_timestamp() + timeout,
                    receive_count = m.receive_count + 1,
                    first_received_at = coalesce(m.first_received_at, clock_timestamp()),
                    lease = (SELECT gen_random_uuid()),  -- once per call (above)
                    dedupe_key = NULL,
                    consumer_id = receive.consumer_id,
                    received_at = clock_timestamp()
                WHERE m.id = ANY (to_deliver)
                RETURNING m.*
            )
            SELECT c.id, c.body, c.attributes, c.enqueued_at, c.receive_count, c.first_received_at,
                   c.id || ':' || c.lease, c.priority, c.message_group_id, c.deduplication_id,
                   CASE WHEN c.source_queue_id IS NOT NULL
                        THEN (SELECT s.name FROM postbox.queues s WHERE s.id = c.source_queue_id) END, c.last_error,
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
