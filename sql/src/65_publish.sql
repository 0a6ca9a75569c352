-- A message in Amazon SNS's notification JSON, for subscriptions with an SNS
-- delivery that is not raw: Message is the body as text (so it must be
-- UTF-8), MessageId the publish id, and the attributes go inside. The keys
-- come in SNS's order. signatures (the server's, which holds the key: see
-- postbox_server/sns_signing.py) maps topic ARNs to the entry's Signature
-- under signature_version; an envelope whose topic ARN it lacks (a publish
-- made in SQL: capture, schedules) goes without Signature, as before 0.9.0.
-- SigningCertURL is at the shim that made the subscription (the base of its
-- UnsubscribeURL).
CREATE FUNCTION postbox._sns_envelope(sns jsonb, publish_id uuid, published_at timestamptz, subject text,
                                      body bytea, attributes jsonb, signatures jsonb DEFAULT NULL,
                                      signature_version text DEFAULT NULL) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    message text;
    signature text := signatures ->> (sns ->> 'topic_arn');
BEGIN
    BEGIN
        message := convert_from(body, 'UTF8');
    EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
        PERFORM postbox._invalid('the message body must be UTF-8 text for an SNS envelope, whose Message it is');
    END;
    RETURN convert_to(json_strip_nulls(json_build_object(
        'Type', 'Notification',
        'MessageId', publish_id,
        'TopicArn', sns ->> 'topic_arn',
        'Subject', subject,
        'Message', message,
        'Timestamp', to_char(published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'SignatureVersion', CASE WHEN signature IS NOT NULL THEN signature_version END,
        'Signature', signature,
        'SigningCertURL', CASE WHEN signature IS NOT NULL THEN
                              split_part(sns ->> 'unsubscribe_url', '/?', 1) || '/SimpleNotificationService.pem' END,
        'UnsubscribeURL', sns ->> 'unsubscribe_url',
        'MessageAttributes', (SELECT json_object_agg(a.key, json_build_object(
                                  'Type', a.value ->> 'data_type',
                                  'Value', coalesce(a.value ->> 'string_value', a.value ->> 'binary_value')))
                              FROM jsonb_each(attributes) a)))::text, 'UTF8');
END
$$;

-- Publishes into plain queues (no FIFO order, deduplication or max_depth;
-- since 0.9.0) in one INSERT for all of them: a send_batch per queue cost most
-- of a publish to many queues. The pairs are publish_batch's, one per (queue,
-- entry) that takes a message, in queue name then entry order; those whose
-- `plain` is true go in, as send_batch's straight path would put them. Returns
-- their message ids in pair order, or NULL, having inserted nothing, when one of
-- the queues refuses (paused, too small for its message, dropped meanwhile):
-- the caller then sends queue by queue, for send_batch's word on it. Raises
-- what _sns_envelope raises.
-- plain_queue_ids are those pairs' queues, in id order. delays are the
-- entries' (NULL: the queue's delivery_delay); a delay the queue's retention
-- does not exceed is a refusal. It runs under publish_batch's plan_cache_mode.
CREATE FUNCTION postbox._publish_to_plain_queues(
    queue_ids integer[], entries integer[], envelopes jsonb[], plain boolean[], plain_queue_ids integer[],
    bodies bytea[], attributes jsonb[], subjects text[], publish_ids uuid[], published_at timestamptz,
    signatures jsonb[] DEFAULT NULL, signature_version text DEFAULT NULL,
    delays interval[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    sent_at timestamptz;
    sent_ids bigint[];
BEGIN
    -- As send_batch: the table lock before the clock, then the queues' locks
    -- (postbox._lock_queue, shared, in id order), before the statement that
    -- reads the queues, so that it sees a drop that committed meanwhile.
    LOCK TABLE postbox.messages IN ROW EXCLUSIVE MODE;
    sent_at := clock_timestamp();
    PERFORM pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(x.name))
    FROM (SELECT x.name FROM postbox.queues x WHERE x.id = ANY (plain_queue_ids) ORDER BY x.id) AS x;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- The insert's look reads the transaction's snapshot, which may predate
        -- a drop: a serialization failure instead (see _lock_queue).
        PERFORM FROM postbox.queues x WHERE x.id = ANY (plain_queue_ids) ORDER BY x.id FOR KEY SHARE;
    END IF;
    -- All or none: nothing goes in when some pair's queue is gone, paused, or
    -- too small for its message. Identity values are drawn in insertion order,
    -- so id order is pair order.
    WITH pair AS MATERIALIZED (
        SELECT p.o, q.id, coalesce(delays[p.i], q.delivery_delay) AS delay, q.send_paused, q.max_message_size,
               delays[p.i] >= q.retention AS beyond_retention,
               CASE WHEN p.env IS NULL THEN bodies[p.i]
                    ELSE postbox._sns_envelope(p.env, publish_ids[p.i], published_at, subjects[p.i], bodies[p.i],
                                               attributes[p.i], signatures[p.i], signature_version) END AS b,
               -- SNS's notification JSON carries the attributes inside it.
               CASE WHEN p.env IS NULL THEN attributes[p.i] END AS a
        FROM unnest(queue_ids, entries, envelopes, plain) WITH ORDINALITY AS p(q, i, env, plain, o)
        LEFT JOIN postbox.queues q ON q.id = p.q
        WHERE p.plain
    ), inserted AS (
        INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body, priority)
        SELECT pair.id, sent_at + pair.delay, sent_at, pair.a, pair.b, 0
        FROM pair
        WHERE NOT EXISTS (SELECT FROM pair x
                          WHERE x.id IS NULL OR x.send_paused OR x.beyond_retention
                                OR postbox.message_size(x.b, x.a) > x.max_message_size)
        ORDER BY pair.o
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO sent_ids FROM inserted;
    IF sent_ids IS NOT NULL THEN
        PERFORM postbox._notify(q) FROM postbox.queues q WHERE q.id = ANY (plain_queue_ids) AND q.listened
        ORDER BY q.id;
    END IF;
    RETURN sent_ids;
END
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
--   subjects         up to 100 characters that SNS envelopes carry
--   signatures       SNS Signatures by topic ARN (see _sns_envelope), under
--                    signature_version; the server signs given_publish_ids and
--                    given_published_at, which are then the publish's ids and
--                    time (else they are made here)
--   delays           each queue makes the message visible this long after the
--                    publish (NULL: the queue's delivery_delay), 0 to 365 days
--                    and below the queue's retention; FIFO queues refuse one,
--                    as send_batch does; webhooks attempt the delivery then.
--                    Not on a stream topic, whose delay is publish_delayed's.
-- A FIFO topic (its name ends in .fifo) needs an ordering key on every entry.
-- Suspended subscriptions, and those whose filter policy the entry does not
-- match, take nothing. A subscription with an SNS delivery that is not raw
-- takes the entry wrapped in SNS's notification JSON (see _sns_envelope).
-- Each matching queue gets each message once, however many of its
-- subscriptions match (as the first of them by name delivers it), under the
-- queue's rules, as send_batch has them (size, pause, max_depth, FIFO,
-- deduplication). Each matching webhook subscription gets a delivery row
-- (messages for webhooks hold at most 1 MiB). It is all or nothing: when a
-- queue refuses, the error names the entry and the subscription, and nothing
-- is published. Returns one row per entry, in order: its publish id, the
-- queues (in name order) with the message id each took and whether it was a
-- duplicate there, and how many webhook deliveries were queued.
-- Plain queues take their messages in one INSERT (_publish_to_plain_queues);
-- when one of them refuses, the publish goes queue by queue through
-- send_batch instead, which reports the first refusal by queue name.
CREATE FUNCTION postbox.publish_batch(
    topic_name text, bodies bytea[], routing_keys text[] DEFAULT NULL, attributes jsonb[] DEFAULT NULL,
    ordering_keys text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL, subjects text[] DEFAULT NULL,
    signatures jsonb[] DEFAULT NULL, signature_version text DEFAULT NULL, given_publish_ids uuid[] DEFAULT NULL,
    given_published_at timestamptz DEFAULT NULL, delays interval[] DEFAULT NULL)
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
    t postbox.topics;
    n integer := coalesce(cardinality(bodies), 0);
    published_at timestamptz := coalesce(given_published_at, clock_timestamp());
    problem text;
    any_webhooks boolean;
    ids uuid[];
    keys text[];
    -- One entry per (queue, publish entry) that takes a message, in queue name
    -- then entry order; plain: the queue takes it in the one INSERT.
    pair_queue_ids integer[];
    pair_queues text[];
    pair_fifo boolean[];
    pair_content_based boolean[];
    pair_subscriptions text[];
    pair_entries integer[];
    pair_envelopes jsonb[];
    pair_plain boolean[];
    plain_count integer;
    plain_queue_ids integer[];
    plain_entries integer[];
    plain_queues text[];
    plain_ids bigint[];
    one_by_one boolean := false;
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
    hook_bodies bytea[];
    refusing text;
    refusing_queue text;
    refusing_entries integer[];
    state text;
    entry_of text[];
    dest_bodies bytea[];
    dest_attributes jsonb[];
    dest_delays interval[];
    tenant text := postbox._caller_tenant();
BEGIN
    topic_name := postbox._in_tenant(topic_name, tenant);  -- a bound role's own name (see _caller_tenant)
    SELECT * INTO t FROM postbox.topics x WHERE x.name = topic_name;
    IF NOT FOUND THEN
        t := postbox._topic(topic_name);  -- raises the error
    END IF;
    IF n NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._check_batch_size(n);
    END IF;
    IF greatest(cardinality(routing_keys), cardinality(attributes), cardinality(ordering_keys),
                cardinality(deduplication_ids), cardinality(subjects), cardinality(delays)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    IF delays IS NOT NULL THEN
        SELECT postbox._entry_prefix(e.i, n) || CASE
                   WHEN e.d < interval '0' THEN format('delay %s s is negative', trim_scale(extract(epoch FROM e.d)))
                   ELSE format('delay %s s is beyond the longest delay, 365 days', trim_scale(extract(epoch FROM e.d)))
               END
        INTO problem
        FROM unnest(delays) WITH ORDINALITY AS e(d, i)
        WHERE e.d < interval '0' OR e.d >= interval '365 days'
        ORDER BY e.i
        LIMIT 1;
        IF problem IS NOT NULL THEN
            PERFORM postbox._invalid(problem);
        END IF;
        IF t.stream_retention IS NOT NULL AND array_remove(delays, NULL) <> '{}' THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'topic %s is a stream topic: hold a message out of its log with stream_delay, not delay',
                quote_literal(t.name));
        END IF;
    END IF;
    SELECT postbox._entry_prefix(e.i, n) || CASE
               WHEN e.b IS NULL THEN 'body must not be NULL'
               WHEN length(e.o) > 128 OR e.o !~ '^[!-~]+$' THEN
                   'ordering_key must be 1 to 128 printable ASCII characters'
               WHEN length(e.x) > 128 OR e.x !~ '^[!-~]+$' THEN
                   'deduplication_id must be 1 to 128 printable ASCII characters'
               WHEN length(e.s) > 100 OR e.s ~ '[[:cntrl:]]' THEN
                   'subject must be at most 100 characters without control characters'
               WHEN e.o IS NULL AND t.name LIKE '%.fifo' THEN
                   format('topic %s is a FIFO topic: every message needs an ordering_key (its message group)',
                          quote_literal(t.name))
               ELSE postbox.routing_key_problem(e.k) END
    INTO problem
    FROM unnest(bodies, routing_keys, ordering_keys, deduplication_ids, subjects)
         WITH ORDINALITY AS e(b, k, o, x, s, i)
    WHERE e.b IS NULL OR length(e.o) > 128 OR e.o !~ '^[!-~]+$' OR length(e.x) > 128 OR e.x !~ '^[!-~]+$'
          OR length(e.s) > 100 OR e.s ~ '[[:cntrl:]]' OR (e.o IS NULL AND t.name LIKE '%.fifo')
          OR (e.k <> '' AND postbox.routing_key_problem(e.k) IS NOT NULL)
    ORDER BY e.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF given_publish_ids IS NOT NULL THEN
        IF cardinality(given_publish_ids) <> n OR array_position(given_publish_ids, NULL) IS NOT NULL THEN
            PERFORM postbox._invalid('given_publish_ids must hold one publish id per body');
        END IF;
        ids := given_publish_ids;
        keys := ARRAY(SELECT coalesce(routing_keys[i], '') FROM generate_series(1, n) AS i);
    ELSIF n = 1 THEN
        ids := ARRAY[gen_random_uuid()];
        keys := ARRAY[coalesce(routing_keys[1], '')];
    ELSE
        ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, n));
        keys := ARRAY(SELECT coalesce(routing_keys[i], '') FROM generate_series(1, n) AS i);
    END IF;

    PERFORM postbox._append_to_stream(t, ids, published_at, keys, ordering_keys, subjects, attributes, bodies)
    WHERE t.stream_retention IS NOT NULL;
    PERFORM pg_advisory_xact_lock_shared(1886350200, t.id);  -- postbox._lock_topic, inline
    -- A stream topic without subscriptions: the log has the batch, nothing else
    -- takes it (looked at under the lock, as the subscriptions' query below).
    IF t.stream_retention IS NOT NULL AND NOT EXISTS (SELECT FROM postbox.subscriptions s WHERE s.topic_id = t.id) THEN
        RETURN QUERY SELECT e.id, '{}'::text[], '{}'::bigint[], '{}'::boolean[], 0 FROM unnest(ids) AS e(id);
        RETURN;
    END IF;
    -- The aggregates take the pairs in the order of the sorted sub-select (an
    -- ORDER BY in each aggregate would sort eight times). None of them may have
    -- DISTINCT or ORDER BY: PostgreSQL 16 and later then sort the input for it,
    -- and every aggregate would see the pairs in that order instead.
    SELECT array_agg(p.queue_id), array_agg(p.queue), array_agg(p.fifo), array_agg(p.content_based_deduplication),
           array_agg(p.subscription), array_agg(p.i), array_agg(p.envelope), array_agg(p.plain),
           count(*) FILTER (WHERE p.plain), array_agg(p.queue_id) FILTER (WHERE p.plain),
           array_agg(p.i) FILTER (WHERE p.plain),
           array_agg(p.queue) FILTER (WHERE p.plain),
           -- Here, rather than a statement of its own (each costs its start).
           (SELECT count(*) > 0 FROM postbox.subscriptions w
            WHERE w.topic_id = t.id AND w.webhook_url IS NOT NULL AND NOT w.suspended)
    INTO pair_queue_ids, pair_queues, pair_fifo, pair_content_based, pair_subscriptions, pair_entries,
         pair_envelopes, pair_plain, plain_count, plain_queue_ids, plain_entries, plain_queues, any_webhooks
    FROM (SELECT q.id AS queue_id, q.name AS queue, q.fifo, q.content_based_deduplication, m.subscription, m.i,
                 m.envelope,
                 NOT q.fifo AND NOT q.content_based_deduplication AND q.max_depth IS NULL
                     AND (deduplication_ids IS NULL OR deduplication_ids[m.i] IS NULL) AS plain
          FROM (SELECT DISTINCT ON (s.queue_id, e.i) s.queue_id, s.name AS subscription, e.i::integer AS i,
                       -- The envelope the entry goes in (NULL: none).
                       CASE WHEN NOT coalesce((s.sns ->> 'raw')::boolean, false) THEN s.sns END AS envelope
                FROM postbox.subscriptions s
                CROSS JOIN unnest(keys) WITH ORDINALITY AS e(k, i)
                WHERE s.topic_id = t.id AND s.queue_id IS NOT NULL AND NOT s.suspended
                      AND postbox._key_matches(s.match_kind, s.match_text, e.k)
                      AND (s.filter_policy IS NULL
                           OR postbox.filter_matches(s.filter_policy, s.filter_scope, attributes[e.i], bodies[e.i]))
                ORDER BY s.queue_id, e.i, s.name) AS m
          JOIN postbox.queues q ON q.id = m.queue_id
          ORDER BY q.name, m.i) AS p;

    IF plain_count > 0 THEN
        IF array_remove(pair_envelopes, NULL) = '{}' THEN
            plain_ids := postbox._publish_to_plain_queues(
                pair_queue_ids, pair_entries, pair_envelopes, pair_plain, plain_queue_ids, bodies, attributes,
                subjects, ids, published_at, signatures, signature_version, delays);
        ELSE
            -- An envelope refuses a body that is not UTF-8 by raising, in a
            -- subtransaction, then, so that queue by queue can take over.
            BEGIN
                plain_ids := postbox._publish_to_plain_queues(
                    pair_queue_ids, pair_entries, pair_envelopes, pair_plain, plain_queue_ids, bodies, attributes,
                    subjects, ids, published_at, signatures, signature_version, delays);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
                IF state NOT LIKE 'PB%' THEN
                    RAISE;
                END IF;
                plain_ids := NULL;
            END;
        END IF;
        IF plain_ids IS NULL THEN
            one_by_one := true;
        ELSE
            done_entries := plain_entries;
            done_queues := plain_queues;
            done_ids := plain_ids;
            done_duplicates := array_fill(false, ARRAY[plain_count]);
        END IF;
    END IF;

    IF one_by_one OR plain_count < cardinality(pair_plain) THEN
        -- One send_batch per queue, in queue name order (so concurrent publishes
        -- take the queues' locks in one order). One subtransaction for all of
        -- them, to say which subscription refused.
        BEGIN
            FOR dest IN
                SELECT p.queue, p.fifo, p.content_based_deduplication, min(p.subscription) AS subscription,
                       array_agg(p.i ORDER BY p.i) AS entries,
                       -- Per entry, the envelope it goes in; NULL when no entry has one.
                       CASE WHEN bool_or(p.envelope IS NOT NULL) THEN array_agg(p.envelope ORDER BY p.i) END
                           AS envelopes
                FROM unnest(pair_queue_ids, pair_queues, pair_fifo, pair_content_based, pair_subscriptions,
                            pair_entries, pair_envelopes, pair_plain)
                     AS p(queue_id, queue, fifo, content_based_deduplication, subscription, i, envelope, plain)
                WHERE one_by_one OR NOT p.plain
                GROUP BY p.queue_id, p.queue, p.fifo, p.content_based_deduplication
                ORDER BY p.queue
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
                IF dest.envelopes IS NOT NULL THEN
                    -- SNS's notification JSON carries the attributes inside it.
                    SELECT array_agg(CASE WHEN u.env IS NULL THEN bodies[u.p]
                                          ELSE postbox._sns_envelope(u.env, ids[u.p], published_at, subjects[u.p],
                                                                     bodies[u.p], attributes[u.p], signatures[u.p],
                                                                     signature_version) END ORDER BY u.o),
                           array_agg(CASE WHEN u.env IS NULL THEN attributes[u.p] END ORDER BY u.o)
                    INTO dest_bodies, dest_attributes
                    FROM unnest(dest.entries, dest.envelopes) WITH ORDINALITY AS u(p, env, o);
                ELSIF subset THEN
                    dest_bodies := ARRAY(SELECT bodies[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o)
                                         ORDER BY o);
                    dest_attributes := CASE WHEN attributes IS NOT NULL THEN
                        ARRAY(SELECT attributes[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o) ORDER BY o)
                    END;
                ELSE
                    dest_bodies := bodies;
                    dest_attributes := attributes;
                END IF;
                dest_delays := CASE WHEN delays IS NOT NULL THEN
                    ARRAY(SELECT delays[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o) ORDER BY o)
                END;
                SELECT array_agg(r.message_id ORDER BY r.o), array_agg(r.duplicate ORDER BY r.o)
                INTO sent_ids, sent_duplicates
                FROM postbox.send_batch(
                    dest.queue,
                    dest_bodies,
                    dest_attributes,
                    delays => dest_delays,
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
    END IF;

    IF any_webhooks THEN
        SELECT array_agg(s.id ORDER BY e.i, s.name), array_agg(e.i::integer ORDER BY e.i, s.name),
               -- A webhook with an SNS delivery that is not raw gets the envelope made now.
               array_agg(CASE WHEN s.sns IS NOT NULL AND NOT coalesce((s.sns ->> 'raw')::boolean, false)
                              THEN postbox._sns_envelope(s.sns, ids[e.i], published_at, subjects[e.i], bodies[e.i],
                                                         attributes[e.i], signatures[e.i], signature_version)
                              ELSE bodies[e.i] END ORDER BY e.i, s.name),
               (array_agg(format('%ssubscription %s takes webhook messages of at most 1048576 bytes, not %s',
                                 postbox._entry_prefix(e.i, n), quote_literal(s.name),
                                 postbox.message_size(bodies[e.i], attributes[e.i])) ORDER BY e.i)
                   FILTER (WHERE postbox.message_size(bodies[e.i], attributes[e.i]) > 1048576))[1]
        INTO hook_subscriptions, hook_entries, hook_bodies, problem
        FROM postbox.subscriptions s
        CROSS JOIN unnest(keys) WITH ORDINALITY AS e(k, i)
        WHERE s.topic_id = t.id AND s.webhook_url IS NOT NULL AND NOT s.suspended
              AND postbox._key_matches(s.match_kind, s.match_text, e.k)
              AND (s.filter_policy IS NULL
                   OR postbox.filter_matches(s.filter_policy, s.filter_scope, attributes[e.i], bodies[e.i]));
        IF problem IS NOT NULL THEN
            PERFORM postbox._invalid(problem);
        END IF;
        IF hook_subscriptions IS NOT NULL THEN
            INSERT INTO postbox.webhook_deliveries (subscription_id, publish_id, published_at, routing_key,
                                                    ordering_key, attributes, body, next_attempt_at)
            SELECT h.s, ids[h.i], published_at, keys[h.i], ordering_keys[h.i], attributes[h.i], h.b,
                   published_at + coalesce(delays[h.i], interval '0')
            FROM unnest(hook_subscriptions, hook_entries, hook_bodies) AS h(s, i, b);
            PERFORM postbox._signal('webhooks');
        END IF;
    END IF;

    IF tenant IS NOT NULL THEN  -- a bound role sees its queues under its own names
        done_queues := ARRAY(SELECT postbox._shown(u.q, tenant)
                             FROM unnest(done_queues) WITH ORDINALITY AS u(q, i) ORDER BY u.i);
    END IF;
    IF n = 1 AND NOT one_by_one AND plain_count = cardinality(pair_plain) THEN
        -- One entry into plain queues only: its pairs are in queue name order.
        RETURN QUERY SELECT ids[1], done_queues, done_ids, done_duplicates,
                            coalesce(cardinality(hook_entries), 0)::integer;
        RETURN;
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

-- Publishes one message; see publish_batch. A stream topic without
-- subscriptions (none to match, filter or envelope for) takes it in one
-- INSERT into its log, checked as publish_batch checks it; any other topic,
-- and a message that fails a check (for publish_batch's error), take
-- publish_batch's path.
CREATE FUNCTION postbox.publish(topic_name text, body bytea, routing_key text DEFAULT '',
                                attributes jsonb DEFAULT NULL, ordering_key text DEFAULT NULL,
                                deduplication_id text DEFAULT NULL, subject text DEFAULT NULL,
                                delay interval DEFAULT NULL)
RETURNS TABLE (publish_id uuid, queues text[], message_ids bigint[], duplicates boolean[],
               webhook_deliveries integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan  -- as publish_batch: plan each statement once per session
AS $$
DECLARE
    log_topic_id integer;
    fifo_topic boolean;
    append_tx xid8;
    new_id uuid := gen_random_uuid();
BEGIN
    topic_name := postbox._scoped_name(topic_name);  -- a bound role's own name (see _caller_tenant)
    -- The transaction id before the offset, as _append_to_stream takes them;
    -- the topic's lock (_lock_topic, shared, as publish_batch holds it) before
    -- the subscriptions are looked at, so none is made in between.
    SELECT x.id, x.name LIKE '%.fifo', pg_current_xact_id()
    INTO log_topic_id, fifo_topic, append_tx
    FROM postbox.topics x
    WHERE x.name = topic_name AND x.stream_retention IS NOT NULL;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock_shared(1886350200, log_topic_id);  -- postbox._lock_topic, inline
        INSERT INTO postbox.stream_log (slot, topic_id, tx, stream_offset, published_at, publish_id, routing_key,
                                        ordering_key, subject, attributes, body)
        SELECT (SELECT s.slot FROM postbox.stream_slots s WHERE s.state = 'current'), log_topic_id,
               append_tx, nextval('postbox.stream_offsets'), clock_timestamp(), new_id,
               coalesce(publish.routing_key, ''), publish.ordering_key, publish.subject, publish.attributes,
               publish.body
        WHERE NOT EXISTS (SELECT FROM postbox.subscriptions s WHERE s.topic_id = log_topic_id)
              AND publish.body IS NOT NULL
              AND (publish.ordering_key IS NULL
                   OR (length(publish.ordering_key) <= 128 AND publish.ordering_key ~ '^[!-~]+$'))
              AND (publish.ordering_key IS NOT NULL OR NOT fifo_topic)
              AND (publish.deduplication_id IS NULL
                   OR (length(publish.deduplication_id) <= 128 AND publish.deduplication_id ~ '^[!-~]+$'))
              AND (publish.subject IS NULL
                   OR (length(publish.subject) <= 100 AND publish.subject !~ '[[:cntrl:]]'))
              AND (coalesce(publish.routing_key, '') = '' OR postbox.routing_key_problem(publish.routing_key) IS NULL)
              AND (publish.attributes IS NULL OR postbox._attributes_problem(ARRAY[publish.attributes], 1) IS NULL)
              AND postbox.message_size(publish.body, publish.attributes) <= 1048576
              AND publish.delay IS NULL;  -- a stream topic refuses one: publish_batch says so
        IF FOUND THEN
            publish_id := new_id;
            queues := '{}';
            message_ids := '{}';
            duplicates := '{}';
            webhook_deliveries := 0;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM postbox.publish_batch(
        topic_name, ARRAY[body], ARRAY[routing_key], postbox._array_of(attributes),
        postbox._array_of(ordering_key), postbox._array_of(deduplication_id), postbox._array_of(subject),
        delays => postbox._array_of(delay));
END
$$;
