-- postbox 0.4.0 -> 0.5.0: queues stay fast while something pins the xmin
-- horizon (a long transaction, a lagging replication slot), when every row
-- version the traffic leaves behind stays in the table and its indexes.
-- receive_floor says where a queue's receives may start their walk of the ready
-- index; receive and next_visible_at take it as scan_from (without it they walk
-- from the front, as before). FIFO promotion takes visibility times from the
-- clock, as every other writer does. Functions that take messages by id reach
-- them by primary key whatever the statistics said when a session planned
-- them. The NOTIFY throttle moves from a table row to a session setting.
-- _visible_at is STABLE, so send_batch inlines it instead of calling it per row.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

DROP FUNCTION postbox.receive(text, integer, interval);
DROP FUNCTION postbox.next_visible_at(text);
DROP TABLE postbox.notify_throttle;

-- When a message sent at sent_at becomes visible: at deliver_at (a past time
-- meaning now), else after its delay, else after the queue's default delay.
-- STABLE, as timestamptz + interval is (days follow the time zone): declared
-- IMMUTABLE it was not inlined, and ran as a function call per message.
CREATE OR REPLACE FUNCTION postbox._visible_at(sent_at timestamptz, delay interval, deliver_at timestamptz,
                                    default_delay interval)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN deliver_at IS NOT NULL THEN greatest(deliver_at, sent_at)
                ELSE sent_at + coalesce(delay, default_delay) END
$$;

-- Wakes receivers waiting on a queue: NOTIFY on channel "postbox" with the
-- queue name, delivered when the sending transaction commits. NOTIFY makes
-- committing transactions queue up behind one another, so one per send would
-- halve send throughput: a session notifies a queue at most once per 5 ms. A
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
    IF coalesce(nullif(current_setting(setting, true), ''), '0')::numeric > now_ms - 5 THEN
        RETURN;
    END IF;
    PERFORM set_config(setting, now_ms::text, false);
    PERFORM pg_notify('postbox', q.name);
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

-- Makes the oldest message of each group visible when it is parked: the group's
-- head is gone. Callers hold the groups' locks. The clock, not the
-- transaction's start: see receive_floor.
CREATE OR REPLACE FUNCTION postbox._promote(q postbox.queues, groups text[]) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.messages m
    SET visible_at = greatest(clock_timestamp(), m.enqueued_at + q.delivery_delay)
    FROM (SELECT (SELECT x.id FROM postbox.messages x
                  WHERE x.queue_id = q.id AND x.message_group_id = g
                  ORDER BY x.id LIMIT 1) AS id
          FROM (SELECT DISTINCT g FROM unnest(groups) AS g) AS s) AS head
    WHERE m.id = head.id AND m.visible_at = 'infinity'
$$;

-- Removes messages (all of ids, or, with leases, those whose lease still
-- matches), archiving them if the queue archives and promoting the next message
-- of their FIFO groups. Returns the ids removed.
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
    RETURN coalesce(removed, '{}');
END
$$;

-- Outcome per receipt of an operation that matched `done` of them:
-- 'ok', 'invalid' (malformed), 'stale' (delivered again since) or 'not_found'.
CREATE OR REPLACE FUNCTION postbox._receipt_outcomes(q postbox.queues, receipts text[], done bigint[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE sql STABLE AS $$
    SELECT p.i, CASE
        WHEN p.message_id IS NULL THEN 'invalid'
        WHEN p.message_id = ANY (done) THEN 'ok'
        WHEN EXISTS (SELECT FROM postbox.messages m WHERE m.id = p.message_id AND m.queue_id + 0 = q.id)
            THEN 'stale'
        ELSE 'not_found'
    END
    FROM postbox._parse_receipts(receipts) p
    ORDER BY p.i
$$;

-- Makes received messages visible again after `timeout` from now (0: at once).
-- One outcome per receipt, in order; see _receipt_outcomes.
CREATE OR REPLACE FUNCTION postbox.change_visibility_batch(queue_name text, receipts text[], timeouts interval[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql
-- By primary key (see _remove).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
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
        WHERE m.id = p.message_id AND m.queue_id + 0 = q.id AND m.lease = p.lease
        RETURNING m.id
    )
    SELECT array_agg(id) INTO done FROM changed;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Gives received messages back: visible again after `delays[i]` (NULL: the
-- queue's retry backoff), recording errors[i] as the message's last error. The
-- receipt is spent. One outcome per receipt, in order; see _receipt_outcomes.
CREATE OR REPLACE FUNCTION postbox.nack_batch(queue_name text, receipts text[], delays interval[] DEFAULT NULL,
                                   errors text[] DEFAULT NULL)
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql
-- By primary key (see _remove).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
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
        WHERE m.id = p.message_id AND m.queue_id + 0 = q.id AND m.lease = p.lease
        RETURNING m.id
    )
    SELECT array_agg(id) INTO done FROM nacked;
    IF done IS NOT NULL THEN
        PERFORM postbox._notify(q);
    END IF;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Gives back claimed messages that never reached a consumer (the server calls
-- it when a client goes away mid-delivery): visible at once, the delivery
-- uncounted, the receipt void. Receipts that are stale already are skipped.
CREATE OR REPLACE FUNCTION postbox.release(queue_name text, receipts text[]) RETURNS bigint
LANGUAGE plpgsql
-- By primary key (see _remove).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
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
    WHERE m.id = p.message_id AND m.queue_id + 0 = q.id AND m.lease = p.lease;
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM postbox._notify(q);
    END IF;
    RETURN released;
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
    PERFORM postbox._notify(target);
END
$$;

-- Deletes received messages by receipt. One outcome per receipt, in order;
-- see _receipt_outcomes. Archives them if the queue archives.
CREATE OR REPLACE FUNCTION postbox.delete_batch(queue_name text, receipts text[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql
-- By primary key (see _remove).
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
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

-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>". Order: priority, then visibility
-- time, then id; FIFO queues hand out only group heads. On the way, expired
-- messages are removed and messages received max_receive_count times already
-- move to the dead-letter queue instead. A rate-limited queue returns fewer
-- messages when its tokens run short. PB503 while receives are paused.
-- scan_from: where to start in the ready index, from receive_floor (NULL: the
-- front).
CREATE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
                                visibility_timeout interval DEFAULT NULL, scan_from timestamptz DEFAULT NULL)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, receipt text, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text)
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
                WHERE m.queue_id = q.id AND m.priority > 0 AND m.visible_at BETWEEN scan_start AND now()
                ORDER BY m.priority DESC, m.visible_at, m.id
                LIMIT allowed
                FOR UPDATE SKIP LOCKED) AS high
            UNION ALL
            SELECT * FROM (  -- then the rest, in visibility order
                SELECT m.id, m.priority, m.visible_at, coalesce(m.enqueued_at < expired_before, false),
                       coalesce(m.receive_count >= q.max_receive_count, false)
                FROM postbox.messages m
                WHERE m.queue_id = q.id AND m.priority = 0 AND m.visible_at BETWEEN scan_start AND now()
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

-- The earliest time a message of the queue may be received: when the first
-- message becomes visible, or later when the queue's rate limit allows. NULL
-- when nothing is waiting or receives are paused. Waiting servers set a timer.
CREATE FUNCTION postbox.next_visible_at(queue_name text, scan_from timestamptz DEFAULT NULL)
RETURNS timestamptz
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
    SELECT nullif(min(m.visible_at), 'infinity') INTO at FROM postbox.messages m
    WHERE m.queue_id = q.id AND m.visible_at >= coalesce(scan_from, '-infinity');
    IF at IS NOT NULL AND q.receive_rate_limit IS NOT NULL THEN
        SELECT greatest(at, t.refilled_at + make_interval(secs => greatest(0, 1 - t.tokens) / q.receive_rate_limit))
        INTO at
        FROM postbox.receive_tokens t WHERE t.queue_id = q.id;
    END IF;
    RETURN at;
END
$$;

-- Where receives of a queue may start their walk of the ready index: before it
-- lies no message of the queue that a receive could deliver, now or later. Dead
-- row versions stay in the index while some transaction could still see them (a
-- long transaction, a lagging replication slot), and a receive that starts at
-- the front of the index visits every one; from the floor on it skips them. The
-- floor is the earliest visibility time among the queue's rows, held back to a
-- second ago and to the start of the oldest transaction writing messages now
-- (whose rows this call cannot see). Every writer sets visibility times from
-- the clock at the time it writes, so a row written later is never behind it.
-- Call it outside a REPEATABLE READ transaction, as a role that can see the
-- writers' sessions (pg_read_all_stats, or the same role): a writer it cannot see
-- counts only when it commits within the second. It walks the dead entries once:
-- compute it every few seconds and pass it to every receive meanwhile.
CREATE FUNCTION postbox.receive_floor(queue_name text) RETURNS timestamptz
LANGUAGE plpgsql
-- The ordered walk, as in receive.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    writing_since timestamptz;
    earliest timestamptz;
BEGIN
    -- Writers first, then the rows in a later snapshot: a writer gone from the
    -- locks by then has committed (its rows are seen) or rolled back.
    SELECT min(a.xact_start) INTO writing_since
    FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.relation = 'postbox.messages'::regclass
      AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
      AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid();
    SELECT min(m.visible_at) INTO earliest FROM postbox.messages m WHERE m.queue_id = q.id;
    RETURN least(now() - interval '1 second', writing_since, earliest);
END
$$;

INSERT INTO postbox.schema_version (version) VALUES ('0.5.0');
