-- A message in Amazon SNS's notification JSON, for subscriptions with an SNS
-- delivery that is not raw: Message is the body as text (so it must be
-- UTF-8), MessageId the publish id, and the attributes go inside. The keys
-- come in SNS's order. No Signature: postbox holds no AWS signing key.
CREATE FUNCTION postbox._sns_envelope(sns jsonb, publish_id uuid, published_at timestamptz, subject text,
                                      body bytea, attributes jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    message text;
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
        'UnsubscribeURL', sns ->> 'unsubscribe_url',
        'MessageAttributes', (SELECT json_object_agg(a.key, json_build_object(
                                  'Type', a.value ->> 'data_type',
                                  'Value', coalesce(a.value ->> 'string_value', a.value ->> 'binary_value')))
                              FROM jsonb_each(attributes) a)))::text, 'UTF8');
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
-- A FIFO topic (its name ends in .fifo) needs an ordering key on every entry.
-- Suspended subscriptions, and those whose filter policy the entry does not
-- match, take nothing. A subscription with an SNS delivery that is not raw
-- takes the entry wrapped in SNS's notification JSON (see _sns_envelope).
-- Each matching queue gets each message once, however many of its
-- subscriptions match (as the first of them by name delivers it), through
-- send_batch, so the queue's rules apply (size,
-- pause, max_depth, FIFO, deduplication). Each matching webhook subscription
-- gets a delivery row (messages for webhooks hold at most 1 MiB). It is all or
-- nothing: when a queue refuses, the error names the entry and the
-- subscription, and nothing is published. Returns one row per entry, in
-- order: its publish id, the queues (in name order) with the message id each
-- took and whether it was a duplicate there, and how many webhook deliveries
-- were queued.
CREATE FUNCTION postbox.publish_batch(
    topic_name text, bodies bytea[], routing_keys text[] DEFAULT NULL, attributes jsonb[] DEFAULT NULL,
    ordering_keys text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL, subjects text[] DEFAULT NULL)
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
    hook_bodies bytea[];
    refusing text;
    refusing_queue text;
    refusing_entries integer[];
    state text;
    entry_of text[];
    dest_bodies bytea[];
    dest_attributes jsonb[];
BEGIN
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(routing_keys), cardinality(attributes), cardinality(ordering_keys),
                cardinality(deduplication_ids), cardinality(subjects)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
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

    PERFORM postbox._append_to_stream(t, ids, published_at, keys, ordering_keys, subjects, attributes, bodies)
    WHERE t.stream_retention IS NOT NULL;
    PERFORM postbox._lock_topic(t.id, false);
    -- One send_batch per queue, in queue name order (so concurrent publishes
    -- take the queues' locks in one order). One subtransaction for all of them,
    -- to say which subscription refused.
    BEGIN
        FOR dest IN
            SELECT q.name AS queue, q.fifo, q.content_based_deduplication, min(m.subscription) AS subscription,
                   array_agg(m.i ORDER BY m.i) AS entries,
                   -- Per entry, the envelope it goes in (NULL: none); NULL when no entry has one.
                   CASE WHEN bool_or(m.envelope IS NOT NULL) THEN array_agg(m.envelope ORDER BY m.i) END AS envelopes
            FROM (SELECT DISTINCT ON (s.queue_id, e.i) s.queue_id, s.name AS subscription, e.i::integer AS i,
                         CASE WHEN NOT coalesce((s.sns ->> 'raw')::boolean, false) THEN s.sns END AS envelope
                  FROM postbox.subscriptions s
                  CROSS JOIN unnest(keys) WITH ORDINALITY AS e(k, i)
                  WHERE s.topic_id = t.id AND s.queue_id IS NOT NULL AND NOT s.suspended
                        AND postbox._key_matches(s.match_kind, s.match_text, e.k)
                        AND (s.filter_policy IS NULL
                             OR postbox.filter_matches(s.filter_policy, s.filter_scope, attributes[e.i], bodies[e.i]))
                  ORDER BY s.queue_id, e.i, s.name) AS m
            JOIN postbox.queues q ON q.id = m.queue_id
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
            IF dest.envelopes IS NOT NULL THEN
                -- SNS's notification JSON carries the attributes inside it.
                SELECT array_agg(CASE WHEN u.env IS NULL THEN bodies[u.p]
                                      ELSE postbox._sns_envelope(u.env, ids[u.p], published_at, subjects[u.p],
                                                                 bodies[u.p], attributes[u.p]) END ORDER BY u.o),
                       array_agg(CASE WHEN u.env IS NULL THEN attributes[u.p] END ORDER BY u.o)
                INTO dest_bodies, dest_attributes
                FROM unnest(dest.entries, dest.envelopes) WITH ORDINALITY AS u(p, env, o);
            ELSIF subset THEN
                dest_bodies := ARRAY(SELECT bodies[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o) ORDER BY o);
                dest_attributes := CASE WHEN attributes IS NOT NULL THEN
                    ARRAY(SELECT attributes[p] FROM unnest(dest.entries) WITH ORDINALITY AS u(p, o) ORDER BY o) END;
            ELSE
                dest_bodies := bodies;
                dest_attributes := attributes;
            END IF;
            SELECT array_agg(r.message_id ORDER BY r.o), array_agg(r.duplicate ORDER BY r.o)
            INTO sent_ids, sent_duplicates
            FROM postbox.send_batch(
                dest.queue,
                dest_bodies,
                dest_attributes,
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
           -- A webhook with an SNS delivery that is not raw gets the envelope made now.
           array_agg(CASE WHEN s.sns IS NOT NULL AND NOT coalesce((s.sns ->> 'raw')::boolean, false)
                          THEN postbox._sns_envelope(s.sns, ids[e.i], published_at, subjects[e.i], bodies[e.i],
                                                     attributes[e.i])
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
        SELECT h.s, ids[h.i], published_at, keys[h.i], ordering_keys[h.i], attributes[h.i], h.b, published_at
        FROM unnest(hook_subscriptions, hook_entries, hook_bodies) AS h(s, i, b);
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
                                deduplication_id text DEFAULT NULL, subject text DEFAULT NULL)
RETURNS TABLE (publish_id uuid, queues text[], message_ids bigint[], duplicates boolean[],
               webhook_deliveries integer)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM postbox.publish_batch(
        topic_name, ARRAY[body], ARRAY[routing_key], postbox._array_of(attributes),
        postbox._array_of(ordering_key), postbox._array_of(deduplication_id), postbox._array_of(subject));
END
$$;
