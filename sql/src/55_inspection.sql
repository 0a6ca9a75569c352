-- Where a message stands: visible (parked FIFO messages too), in_flight or delayed.
CREATE FUNCTION postbox._state(visible_at timestamptz, lease uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN visible_at <= now() OR visible_at = 'infinity' THEN 'visible'
                WHEN lease IS NOT NULL THEN 'in_flight'
                ELSE 'delayed' END
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

-- A queue's archived messages in id order after after_id.
CREATE FUNCTION postbox.list_archived_messages(queue_name text, after_id bigint DEFAULT 0,
                                               page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               archived_at timestamptz, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    -- The API pages by at most 1000 and asks for one more row to see whether a
    -- next page exists; psql callers get the same ten-fold headroom.
    IF page_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 10000', page_size));
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

-- Topics (since 0.3.0).
