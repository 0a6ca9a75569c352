-- Removes up to batch_size expired messages (archiving them where the queue
-- archives), claimed with SKIP LOCKED so servers running this together never
-- touch the same rows. The ready index finds most of them cheaply, since
-- visible_at >= enqueued_at; parked FIFO messages are looked up by group.
-- Receive never delivers an expired message meanwhile. Messages past their
-- own expires_at (a ttl or expire_time) come through message_expiries.
-- Returns how many.
CREATE FUNCTION postbox.expire_messages(batch_size integer DEFAULT 1000) RETURNS bigint
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
             WHERE id IN (SELECT m.queue_id FROM postbox.message_expiries e
                          JOIN postbox.messages m ON m.id = e.message_id
                          WHERE e.expires_at <= now() ORDER BY e.expires_at LIMIT batch_size)
             ORDER BY id LOOP
        EXIT WHEN total >= batch_size;
        SELECT array_agg(m.id) INTO picked
        FROM (SELECT m.id FROM postbox.message_expiries e JOIN postbox.messages m ON m.id = e.message_id
              WHERE e.expires_at <= now() AND m.queue_id = q.id AND m.expires_at <= now()
              ORDER BY e.expires_at LIMIT batch_size - total
              FOR UPDATE OF m SKIP LOCKED) AS m;
        IF picked IS NOT NULL THEN
            total := total + cardinality(postbox._remove(q, picked, NULL, 'expired'));
        END IF;
    END LOOP;
    RETURN total;
END
$$;

-- Forgets up to batch_size archived messages past their queue's
-- archive_retention, deduplication ids and (since 0.9.0) SendBatch request ids
-- past their window. Returns how many.
CREATE FUNCTION postbox.expire_records(batch_size integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    archived bigint;
    deduplicated bigint;
    requests bigint;
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
    DELETE FROM postbox.batch_requests
    WHERE (queue_id, request_id) IN (
        SELECT r.queue_id, r.request_id FROM postbox.batch_requests r
        WHERE r.expires_at < now() LIMIT batch_size FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS requests = ROW_COUNT;
    RETURN archived + deduplicated + requests;
END
$$;
