-- Recent throughput and receive latency per queue (since 0.9.0). The engine
-- counts no sends, receives or deletes itself: a write to a shared row per call
-- would make concurrent senders wait on one another. Each server process counts
-- in memory instead and adds its counts here every few seconds, off the
-- request path: one row per queue and 10-second bucket (of the time of the
-- flush), which every process adds to. Kept for an hour (expire_activity).
-- Sends made in SQL (postbox.send in an application's own transaction, schedule
-- fires, redrives) pass no server and are not counted.
CREATE TABLE postbox.queue_activity (
    queue_id integer NOT NULL REFERENCES postbox.queues (id) ON DELETE CASCADE,
    bucket timestamptz NOT NULL,
    sent bigint NOT NULL DEFAULT 0,
    received bigint NOT NULL DEFAULT 0,  -- deliveries, redeliveries too
    deleted bigint NOT NULL DEFAULT 0,
    -- Enqueue to first delivery, in seconds, of the first deliveries received.
    latency_sum double precision NOT NULL DEFAULT 0,
    latency_count bigint NOT NULL DEFAULT 0,
    latency_max double precision,
    PRIMARY KEY (queue_id, bucket)
);

-- Adds one server process's counts since its last flush, an entry per queue
-- (arrays in step), to the current bucket, and its sends to the queues'
-- lifetime counts (queue_counters.sent, since 0.9.0). Queues since dropped are
-- skipped. Rows are written in queue id order, activity then counters, so two
-- processes flushing at once wait for each other rather than deadlock.
CREATE FUNCTION postbox.record_activity(queue_names text[], sent bigint[], received bigint[], deleted bigint[],
                                        latency_sum double precision[], latency_count bigint[],
                                        latency_max double precision[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO postbox.queue_activity AS a (queue_id, bucket, sent, received, deleted,
                                             latency_sum, latency_count, latency_max)
    SELECT q.id, date_bin('10 seconds', now(), 'epoch'), t.sent, t.received, t.deleted,
           t.latency_sum, t.latency_count, t.latency_max
    FROM unnest(queue_names, sent, received, deleted, latency_sum, latency_count, latency_max)
         AS t(name, sent, received, deleted, latency_sum, latency_count, latency_max)
    JOIN postbox.queues q ON q.name = t.name
    ORDER BY q.id
    ON CONFLICT (queue_id, bucket) DO UPDATE
    SET sent = a.sent + excluded.sent,
        received = a.received + excluded.received,
        deleted = a.deleted + excluded.deleted,
        latency_sum = a.latency_sum + excluded.latency_sum,
        latency_count = a.latency_count + excluded.latency_count,
        latency_max = greatest(a.latency_max, excluded.latency_max);
    INSERT INTO postbox.queue_counters AS c (queue_id, sent)
    SELECT q.id, t.sent
    FROM unnest(queue_names, sent) AS t(name, sent)
    JOIN postbox.queues q ON q.name = t.name
    WHERE t.sent > 0
    ORDER BY q.id
    ON CONFLICT ON CONSTRAINT queue_counters_pkey DO UPDATE SET sent = c.sent + excluded.sent
$$;

-- Forgets activity older than an hour, the longest window worth asking for,
-- and consumer groups' latency counts as old (stream_latency). Returns how
-- many activity rows went. One session at a time (an advisory lock, since
-- 0.9.0): another, a server's worker or tick, returns 0 at once.
CREATE FUNCTION postbox.expire_activity() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    removed bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(1886350201, 1) THEN
        RETURN 0;
    END IF;
    DELETE FROM postbox.queue_activity WHERE bucket < now() - interval '1 hour';
    GET DIAGNOSTICS removed = ROW_COUNT;
    DELETE FROM postbox.stream_latency WHERE bucket < now() - interval '1 hour';
    RETURN removed;
END
$$;

-- Each queue's counts and rates over the last `span` (30 seconds to an hour), or
-- one queue's (only_queue): the buckets that began in the span, divided by the
-- seconds from the first of them to now, so the current, partial bucket counts
-- and the rate is neither diluted nor inflated. Figures lag by up to the
-- servers' flush period (5 s by default). Receive latency is enqueue to first
-- delivery (a delay counts), NULL when nothing was delivered for the first time.
-- A bound role's tenant's queues only, named as it names them.
CREATE FUNCTION postbox.queue_rates(span interval DEFAULT '1 minute', only_queue text DEFAULT NULL)
RETURNS TABLE (queue_name text, sent bigint, received bigint, deleted bigint,
               sent_per_second double precision, received_per_second double precision,
               deleted_per_second double precision, receive_latency_avg_seconds double precision,
               receive_latency_max_seconds double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    since timestamptz := date_bin('10 seconds', now() - span, 'epoch') + interval '10 seconds';
    seconds double precision := extract(epoch FROM now() - since);
    tenant text := postbox._caller_tenant();
BEGIN
    only_queue := postbox._in_tenant(only_queue, tenant);
    IF span IS NULL OR span < interval '30 seconds' OR span > interval '1 hour' THEN
        RAISE EXCEPTION 'span must be from 30 seconds to 1 hour, not %', span
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'activity is kept in 10-second buckets for an hour';
    END IF;
    RETURN QUERY
    SELECT postbox._shown(q.name, tenant), coalesce(sum(a.sent), 0)::bigint, coalesce(sum(a.received), 0)::bigint,
           coalesce(sum(a.deleted), 0)::bigint,
           coalesce(sum(a.sent), 0) / seconds, coalesce(sum(a.received), 0) / seconds,
           coalesce(sum(a.deleted), 0) / seconds,
           sum(a.latency_sum) / nullif(sum(a.latency_count), 0), max(a.latency_max)
    FROM postbox.queues q
    LEFT JOIN postbox.queue_activity a ON a.queue_id = q.id AND a.bucket >= since
    WHERE (only_queue IS NULL OR q.name = only_queue) AND starts_with(q.name, postbox._tenant_prefix(tenant))
    GROUP BY q.name
    ORDER BY q.name;
END
$$;

-- For people who live in psql: every queue's throughput and receive latency
-- over the last 1, 5 and 15 minutes, as the servers counted them (see
-- queue_activity: sends made in SQL are not counted).
CREATE VIEW postbox.queue_throughput AS
SELECT r.queue_name, w.span, r.sent, r.received, r.deleted, r.sent_per_second, r.received_per_second,
       r.deleted_per_second, r.receive_latency_avg_seconds, r.receive_latency_max_seconds
FROM (VALUES (interval '1 minute'), (interval '5 minutes'), (interval '15 minutes')) w(span),
     LATERAL postbox.queue_rates(w.span) r
ORDER BY r.queue_name, w.span;
