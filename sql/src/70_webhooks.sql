-- Claims up to max_deliveries due webhook deliveries (FOR UPDATE SKIP LOCKED,
-- so concurrent workers never get the same one) for one attempt each: counts
-- the attempt and leases the delivery until the subscription's timeout and a
-- margin have passed, after which another worker may try it. Report the
-- outcome with finish_webhook_deliveries. For a subscription with an SNS
-- delivery (`sns`, since 0.9.0) the body is what to POST as it is (see
-- publish_batch).
CREATE FUNCTION postbox.claim_webhook_deliveries(max_deliveries integer DEFAULT 10)
RETURNS TABLE (delivery_id bigint, lease uuid, attempt integer, publish_id uuid, published_at timestamptz,
               routing_key text, ordering_key text, attributes jsonb, body bytea, topic text,
               subscription text, url text, secret text, timeout interval, sns jsonb)
LANGUAGE plpgsql
-- An ordered walk of the due index, whatever the statistics say (see receive).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
BEGIN
    IF max_deliveries IS NULL OR max_deliveries NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_deliveries is %s; it must be 1 to 1000', max_deliveries));
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT d.id, s.webhook_timeout
        FROM postbox.webhook_deliveries d
        JOIN postbox.subscriptions s ON s.id = d.subscription_id
        WHERE d.state = 'pending' AND d.next_attempt_at <= now()
        ORDER BY d.next_attempt_at
        LIMIT max_deliveries
        FOR UPDATE OF d SKIP LOCKED
    ), claimed AS (
        UPDATE postbox.webhook_deliveries d
        SET attempts = d.attempts + 1,
            lease = gen_random_uuid(),
            last_attempt_at = clock_timestamp(),
            next_attempt_at = clock_timestamp() + due.webhook_timeout + interval '30 seconds'
        FROM due
        WHERE d.id = due.id
        RETURNING d.*
    )
    SELECT c.id, c.lease, c.attempts, c.publish_id, c.published_at, c.routing_key, c.ordering_key,
           c.attributes, c.body, t.name, s.name, s.webhook_url, s.webhook_secret, s.webhook_timeout, s.sns
    FROM claimed c
    JOIN postbox.subscriptions s ON s.id = c.subscription_id
    JOIN postbox.topics t ON t.id = s.topic_id
    ORDER BY c.id;
END
$$;

-- Records the outcome of claimed attempts: status_codes[i] is the HTTP status
-- that attempt `leases[i]` of delivery `delivery_ids[i]` got (NULL: no
-- response; errors[i] says why). A 2xx status delivered it and the row goes.
-- Otherwise the delivery is due again after its subscription's backoff, or,
-- its attempts used up, it fails and stays for inspection. A lease that is not
-- current (the attempt ran out of time and another worker took over) changes
-- nothing. Returns each delivery's outcome: delivered, retrying, failed or
-- stale.
CREATE FUNCTION postbox.finish_webhook_deliveries(delivery_ids bigint[], leases uuid[], status_codes integer[],
                                                  errors text[] DEFAULT NULL)
RETURNS TABLE (delivery_id bigint, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    delivered bigint[];
BEGIN
    WITH gone AS (
        DELETE FROM postbox.webhook_deliveries d
        USING unnest(delivery_ids, leases, status_codes) AS o(id, lease, status)
        WHERE d.id = o.id AND d.lease = o.lease AND o.status BETWEEN 200 AND 299
        RETURNING d.id
    )
    SELECT array_agg(id) INTO delivered FROM gone;
    RETURN QUERY
    WITH retried AS (
        UPDATE postbox.webhook_deliveries d
        SET lease = NULL,
            last_status = o.status,
            last_error = left(o.error, 1000),
            state = CASE WHEN d.attempts >= s.webhook_max_attempts THEN 'failed' ELSE 'pending' END,
            next_attempt_at = CASE WHEN d.attempts < s.webhook_max_attempts THEN clock_timestamp()
                + least(s.webhook_maximum_backoff, s.webhook_minimum_backoff * power(2, least(d.attempts - 1, 30)))
                  * (0.5 + random() / 2) END
        FROM unnest(delivery_ids, leases, status_codes, errors) AS o(id, lease, status, error),
             postbox.subscriptions s
        WHERE d.id = o.id AND d.lease = o.lease AND NOT coalesce(o.status BETWEEN 200 AND 299, false)
              AND s.id = d.subscription_id
        RETURNING d.id, d.state
    )
    SELECT o.id, CASE WHEN o.id = ANY (delivered) THEN 'delivered'
                      WHEN r.id IS NULL THEN 'stale'
                      WHEN r.state = 'failed' THEN 'failed'
                      ELSE 'retrying' END
    FROM unnest(delivery_ids) WITH ORDINALITY AS o(id, i)
    LEFT JOIN retried r ON r.id = o.id
    ORDER BY o.i;
END
$$;

-- When the next webhook attempt is due (or a claimed one's lease runs out);
-- NULL when none is pending. Idle workers sleep until then.
CREATE FUNCTION postbox.next_webhook_attempt_at() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(next_attempt_at) FROM postbox.webhook_deliveries WHERE state = 'pending'
$$;

-- A subscription's webhook deliveries in id (publish) order after after_id:
-- all, or those in one state (pending, failed).
CREATE FUNCTION postbox.list_webhook_deliveries(topic_name text, subscription_name text,
                                                in_state text DEFAULT NULL, after_id bigint DEFAULT 0,
                                                page_size integer DEFAULT 100)
RETURNS SETOF postbox.webhook_deliveries
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s postbox.subscriptions := postbox.get_subscription(topic_name, subscription_name);
BEGIN
    IF in_state IS NOT NULL AND in_state NOT IN ('pending', 'failed') THEN
        PERFORM postbox._invalid(format('state %s is neither pending nor failed', in_state));
    END IF;
    -- The API pages by at most 1000 and asks for one more row to see whether a
    -- next page exists; psql callers get the same ten-fold headroom.
    IF page_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('page_size is %s; it must be 1 to 10000', page_size));
    END IF;
    RETURN QUERY
    SELECT * FROM postbox.webhook_deliveries d
    WHERE d.subscription_id = s.id AND d.id > coalesce(after_id, 0) AND (in_state IS NULL OR d.state = in_state)
    ORDER BY d.id
    LIMIT page_size;
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

-- Forgets up to batch_size failed webhook deliveries whose last attempt is
-- more than 7 days old. Returns how many.
CREATE FUNCTION postbox.expire_webhook_deliveries(batch_size integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    expired bigint;
BEGIN
    DELETE FROM postbox.webhook_deliveries
    WHERE id IN (SELECT id FROM postbox.webhook_deliveries
                 WHERE state = 'failed' AND last_attempt_at < now() - interval '7 days'
                 LIMIT batch_size FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS expired = ROW_COUNT;
    RETURN expired;
END
$$;

-- Schedules (since 0.3.0). The server computes every next_fire_at (a cron
-- expression needs a library); these functions check and store.
