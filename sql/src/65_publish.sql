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
CREATE FUNCTION postbox.publish_batch(
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

-- Publishes one message; see publish_batch.
CREATE FUNCTION postbox.publish(topic_name text, body bytea, routing_key text DEFAULT '',
                                attributes jsonb DEFAULT NULL, ordering_key text DEFAULT NULL,
                                deduplication_id text DEFAULT NULL)
RETURNS TABLE (publish_id uuid, queues text[], message_ids bigint[], duplicates boolean[],
               webhook_deliveries integer)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM postbox.publish_batch(
        topic_name, ARRAY[body], ARRAY[routing_key], postbox._array_of(attributes),
        postbox._array_of(ordering_key), postbox._array_of(deduplication_id));
END
$$;
