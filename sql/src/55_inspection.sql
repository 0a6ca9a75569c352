-- Where a message stands: visible (parked FIFO messages too), in_flight or delayed.
CREATE FUNCTION postbox._state(visible_at timestamptz, lease uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN visible_at <= now() OR visible_at = 'infinity' THEN 'visible'
                WHEN lease IS NOT NULL THEN 'in_flight'
                ELSE 'delayed' END
$$;

-- Browses a queue's messages in id order without claiming them: all of them,
-- or those in one state (visible, in_flight, delayed), or the dead letters
-- ('dead', whatever their state). Expired messages are not shown. Since 0.9.0
-- with the consumer that took the latest delivery, when, and the message's own
-- max_receive_count.
CREATE FUNCTION postbox.peek_messages(queue_name text, in_state text DEFAULT NULL, after_id bigint DEFAULT 0,
                                      page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz,
               consumer_id text, received_at timestamptz, max_receive_count integer)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    tenant text := postbox._caller_tenant();
    q postbox.queues := postbox._queue(postbox._in_tenant(queue_name, tenant));
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
           (SELECT postbox._shown(s.name, tenant) FROM postbox.queues s WHERE s.id = m.source_queue_id), m.last_error,
           postbox._state(m.visible_at, m.lease), m.visible_at, m.expires_at,
           m.consumer_id, m.received_at, m.max_receive_count
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

-- The lives of messages in id order from first_id to last_id (at most
-- page_size), in one state or all: the messages of queue seen_from, those that
-- left it as dead letters, and, where queues archive, the finished ones
-- (since 0.9.0). State, as seen from seen_from:
--   visible, in_flight, delayed   waiting, or held by a consumer (consumer_id,
--                                 since received_at), or waiting to be retried
--   dead_lettered                 moved to another queue (`queue`) as a dead
--                                 letter, at finished_at
--   expired                       past its retention or expiry (finished_at)
--   succeeded, failed, cancelled  deleted by a consumer (with its result),
--                                 failed for good, or cancelled; archived
-- and 'dead' as a filter: dead letters held by seen_from, in any state. With
-- seen_from NULL, every queue's messages, each as seen from the queue that
-- holds it. Each side is walked by id, so a rare state or a small queue among
-- many messages reads the messages between.
CREATE FUNCTION postbox._message_lives(seen_from integer, in_state text, first_id bigint, last_id bigint,
                                       page_size integer)
RETURNS TABLE (message_id bigint, queue text, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz, consumer_id text,
               received_at timestamptz, finished_at timestamptz, result bytea, max_receive_count integer)
LANGUAGE sql STABLE AS $$
    SELECT l.* FROM (
        (SELECT m.id, h.name, m.body, m.attributes, m.enqueued_at, m.receive_count, m.first_received_at,
                m.priority, m.message_group_id, m.deduplication_id,
                (SELECT s.name FROM postbox.queues s WHERE s.id = m.source_queue_id), m.last_error,
                x.state, m.visible_at, m.expires_at, m.consumer_id, m.received_at,
                CASE x.state WHEN 'dead_lettered' THEN m.dead_lettered_at
                             WHEN 'expired' THEN least(m.expires_at, m.enqueued_at + h.retention) END,
                NULL::bytea, m.max_receive_count
         FROM postbox.messages m
         JOIN postbox.queues h ON h.id = m.queue_id
         CROSS JOIN LATERAL (
             SELECT CASE WHEN m.queue_id <> seen_from THEN 'dead_lettered'
                         WHEN m.enqueued_at < now() - h.retention OR m.expires_at <= now() THEN 'expired'
                         ELSE postbox._state(m.visible_at, m.lease) END AS state) x
         WHERE m.id BETWEEN first_id AND last_id
           AND (seen_from IS NULL OR m.queue_id = seen_from OR m.source_queue_id = seen_from)
           AND (in_state IS NULL OR x.state = in_state
                OR (in_state = 'dead' AND m.source_queue_id IS NOT NULL AND x.state <> 'dead_lettered'))
         ORDER BY m.id LIMIT page_size)
        UNION ALL
        (SELECT a.id, h.name, a.body, a.attributes, a.enqueued_at, a.receive_count, a.first_received_at,
                a.priority, a.message_group_id, a.deduplication_id,
                (SELECT s.name FROM postbox.queues s WHERE s.id = a.source_queue_id), a.last_error,
                x.state, NULL::timestamptz, NULL::timestamptz, a.consumer_id, NULL::timestamptz,
                CASE x.state WHEN 'dead_lettered' THEN a.dead_lettered_at ELSE a.archived_at END,
                a.result, NULL::integer
         FROM postbox.archive a
         JOIN postbox.queues h ON h.id = a.queue_id
         CROSS JOIN LATERAL (
             SELECT CASE WHEN a.queue_id <> seen_from THEN 'dead_lettered'
                         WHEN a.reason = 'deleted' THEN 'succeeded'
                         ELSE a.reason END AS state) x
         WHERE a.id BETWEEN first_id AND last_id
           AND (seen_from IS NULL OR a.queue_id = seen_from OR a.source_queue_id = seen_from)
           AND (in_state IS NULL OR x.state = in_state
                OR (in_state = 'dead' AND a.source_queue_id IS NOT NULL AND x.state <> 'dead_lettered'))
         ORDER BY a.id LIMIT page_size)
    ) AS l
    ORDER BY l.id
    LIMIT page_size
$$;

-- One message's life as seen from a queue (see _message_lives): waiting, in
-- flight, or (since 0.9.0) dead-lettered, expired, and where the queue archives
-- succeeded with its result, failed or cancelled. PB404 if the queue never
-- held it, or forgot it.
CREATE FUNCTION postbox.get_message(queue_name text, id bigint)
RETURNS TABLE (message_id bigint, queue text, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz, consumer_id text,
               received_at timestamptz, finished_at timestamptz, result bytea, max_receive_count integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
    q postbox.queues := postbox._queue(postbox._in_tenant(queue_name, tenant));
BEGIN
    RETURN QUERY
    SELECT l.message_id, postbox._shown(l.queue, tenant), l.body, l.attributes, l.enqueued_at, l.receive_count,
           l.first_received_at, l.priority, l.message_group_id, l.deduplication_id,
           postbox._shown(l.dead_letter_source, tenant), l.last_error, l.state, l.visible_at, l.expires_at,
           l.consumer_id, l.received_at, l.finished_at, l.result, l.max_receive_count
    FROM postbox._message_lives(q.id, NULL, id, id, 1) AS l;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'message %s is not in queue %s: never sent there, or finished where the queue keeps no history '
            '(archive_on_delete), or its archive_retention passed', id, quote_literal(queue_name));
    END IF;
END
$$;

-- The lives of one queue's messages (see _message_lives), or with queue_name
-- NULL every queue's, in id order after after_id; in_state one of visible,
-- in_flight, delayed, dead_lettered, expired, succeeded, failed, cancelled or
-- dead, or NULL for all (since 0.9.0).
CREATE FUNCTION postbox.list_messages(queue_name text DEFAULT NULL, in_state text DEFAULT NULL,
                                      after_id bigint DEFAULT 0, page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, queue text, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz, consumer_id text,
               received_at timestamptz, finished_at timestamptz, result bytea, max_receive_count integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    seen_from integer;
BEGIN
    IF queue_name IS NOT NULL THEN
        seen_from := (postbox._queue(queue_name)).id;
    END IF;
    IF in_state IS NOT NULL AND in_state NOT IN ('visible', 'in_flight', 'delayed', 'dead_lettered', 'expired',
                                                 'succeeded', 'failed', 'cancelled', 'dead') THEN
        PERFORM postbox._invalid(format(
            'state %s is none of visible, in_flight, delayed, dead_lettered, expired, succeeded, failed, '
            'cancelled, dead', quote_literal(left(in_state, 40))));
    END IF;
    -- As peek_messages: the API pages by at most 1000 and asks for one more row.
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 10000', page_size));
    END IF;
    RETURN QUERY SELECT * FROM postbox._message_lives(seen_from, in_state, coalesce(after_id, 0) + 1,
                                                      9223372036854775807, page_size);
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

-- A queue's archived messages in id order after after_id.
CREATE FUNCTION postbox.list_archived_messages(queue_name text, after_id bigint DEFAULT 0,
                                               page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               archived_at timestamptz, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
    q postbox.queues := postbox._queue(postbox._in_tenant(queue_name, tenant));
BEGIN
    -- The API pages by at most 1000 and asks for one more row to see whether a
    -- next page exists; psql callers get the same ten-fold headroom.
    IF page_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 10000', page_size));
    END IF;
    RETURN QUERY
    SELECT a.id, a.body, a.attributes, a.enqueued_at, a.receive_count, a.first_received_at, a.priority,
           a.message_group_id, a.deduplication_id,
           (SELECT postbox._shown(s.name, tenant) FROM postbox.queues s WHERE s.id = a.source_queue_id), a.last_error,
           a.archived_at, a.reason
    FROM postbox.archive a
    WHERE a.queue_id = q.id AND a.id > coalesce(after_id, 0)
    ORDER BY a.id
    LIMIT page_size;
END
$$;

-- Topics (since 0.3.0).

-- In-flight messages per queue and consumer, for metrics (since 0.9.0): the
-- max_consumers (queue, consumer) pairs that hold the most, and per queue one
-- row '(other)' for the rest; deliveries taken without a consumer id count as
-- '(none)'. Neither is a valid consumer id, so neither is mistaken for one. So
-- a scrape has at most max_consumers rows plus one per queue.
CREATE FUNCTION postbox.consumer_metrics(max_consumers integer DEFAULT 20)
RETURNS TABLE (queue_name text, consumer_id text, in_flight bigint)
LANGUAGE sql STABLE AS $$
    WITH held AS (
        SELECT m.queue_id, coalesce(m.consumer_id, '(none)') AS consumer, count(*) AS n
        FROM postbox.messages m
        WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NOT NULL
        GROUP BY 1, 2
    ), ranked AS (
        SELECT h.*, row_number() OVER (ORDER BY h.n DESC, h.queue_id, h.consumer) <= max_consumers AS shown
        FROM held h
    )
    SELECT q.name, CASE WHEN r.shown THEN r.consumer ELSE '(other)' END, sum(r.n)::bigint
    FROM ranked r JOIN postbox.queues q ON q.id = r.queue_id
    GROUP BY 1, 2
    ORDER BY 1, 2
$$;
