-- postbox 0.8.0 -> 0.9.0.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

-- Topics and subscriptions for the SNS API (since 0.9.0): topic tags and SNS
-- attributes, FIFO topics, subscription filter policies, SNS deliveries
-- (notification JSON or raw) and suspended subscriptions, publish subjects.
ALTER TABLE postbox.topics
    ADD COLUMN tags jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN sns_attributes jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN stream_retention interval;
-- The message indexes' keys are unique (each ends in the id): deduplication
-- only cost their inserts (see postbox.messages).
ALTER INDEX postbox.messages_ready_idx SET (deduplicate_items = off);
ALTER INDEX postbox.messages_priority_idx SET (deduplicate_items = off);
ALTER INDEX postbox.messages_group_idx SET (deduplicate_items = off);
-- Whether a server listens for a queue's wake-ups, on the queue's row.
ALTER TABLE postbox.queues ADD COLUMN listened boolean NOT NULL DEFAULT false;
UPDATE postbox.queues q SET listened = true
WHERE EXISTS (SELECT FROM postbox.queue_listeners l WHERE l.queue_id = q.id);
-- Whether a message of priority above 0 has been in the queue.
ALTER TABLE postbox.queues ADD COLUMN prioritized boolean NOT NULL DEFAULT false;
UPDATE postbox.queues q SET prioritized = true
WHERE EXISTS (SELECT FROM postbox.messages m WHERE m.queue_id = q.id AND m.priority > 0);
-- Whether a message with a dedupe key has been sent to the queue.
ALTER TABLE postbox.queues ADD COLUMN keyed boolean NOT NULL DEFAULT false;
UPDATE postbox.queues q SET keyed = true
WHERE EXISTS (SELECT FROM postbox.messages m WHERE m.queue_id = q.id AND m.dedupe_key IS NOT NULL);
-- Messages with an expiry of their own, and dedupe keys, in tables of their
-- own (see postbox.message_expiries and postbox.dedupe_keys), not partial
-- indexes on messages.
CREATE TABLE postbox.message_expiries (
    message_id bigint PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX message_expiries_due_idx ON postbox.message_expiries (expires_at);
INSERT INTO postbox.message_expiries (message_id, expires_at)
SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.expires_at IS NOT NULL;
DROP INDEX postbox.messages_expiry_idx;
CREATE TABLE postbox.dedupe_keys (
    queue_id integer NOT NULL,
    dedupe_key text NOT NULL,
    message_id bigint NOT NULL,
    PRIMARY KEY (queue_id, dedupe_key)
);
INSERT INTO postbox.dedupe_keys (queue_id, dedupe_key, message_id)
SELECT m.queue_id, m.dedupe_key, m.id FROM postbox.messages m WHERE m.dedupe_key IS NOT NULL;
DROP INDEX postbox.messages_dedupe_key_idx;
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.message_expiries', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.dedupe_keys', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;
ALTER TABLE postbox.subscriptions
    ADD COLUMN filter_policy jsonb,
    ADD COLUMN filter_scope text NOT NULL DEFAULT 'attributes' CHECK (filter_scope IN ('attributes', 'body')),
    ADD COLUMN sns jsonb,
    ADD COLUMN suspended boolean NOT NULL DEFAULT false;

-- Their signatures change.
DROP FUNCTION postbox.create_topic(text);
DROP FUNCTION postbox.create_subscription(text, text, text, text, text, text, jsonb);
DROP FUNCTION postbox.update_subscription(text, text, text[], text, text, text, text, jsonb);
DROP FUNCTION postbox.publish(text, bytea, text, jsonb, text, text);
DROP FUNCTION postbox.publish_batch(text, bytea[], text[], jsonb[], text[], text[]);
DROP FUNCTION postbox.claim_webhook_deliveries(integer);

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

-- The message of a check of a topic, subscription or schedule name (`what`
-- says which), or NULL when the name is valid.
-- Topic names (since 0.9.0) are as long as SNS's, and end in ".fifo" for a
-- FIFO topic.
CREATE OR REPLACE FUNCTION postbox.name_problem(what text, name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN name IS NULL OR name = '' THEN what || ' name is required'
        WHEN what = 'topic' THEN CASE
            WHEN length(name) > 256 THEN format('topic name is %s characters long; the limit is 256', length(name))
            WHEN name !~ '^[A-Za-z0-9_-]+(\.fifo)?$' THEN
                'topic name may only contain A-Z, a-z, 0-9, "_" and "-", and end in ".fifo" for a FIFO topic'
            END
        WHEN length(name) > 80 THEN format('%s name is %s characters long; the limit is 80', what, length(name))
        WHEN name !~ '^[A-Za-z0-9_-]+$' THEN what || ' name may only contain A-Z, a-z, 0-9, "_" and "-"'
    END
$$;

-- The message of a check of a map of strings (tags, SNS attributes), or NULL
-- when it is an object of at most max_keys string values, keys of 1 to
-- max_key characters matching key_pattern, values of at most max_value.
CREATE FUNCTION postbox._string_map_problem(field text, map jsonb, max_keys integer, max_key integer,
                                            key_pattern text, max_value integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('%s must be an object of at most %s keys (1 to %s characters%s) with string values '
                  '(at most %s characters)', field, max_keys, max_key,
                  CASE WHEN key_pattern <> '.' THEN ' of ' || key_pattern ELSE '' END, max_value)
    WHERE jsonb_typeof(map) IS DISTINCT FROM 'object'
          OR (SELECT count(*) FROM jsonb_object_keys(map)) > max_keys
          OR EXISTS (SELECT FROM jsonb_each(map) e
                     WHERE length(e.key) NOT BETWEEN 1 AND max_key OR e.key !~ key_pattern
                           OR jsonb_typeof(e.value) <> 'string' OR length(e.value #>> '{}') > max_value)
$$;

-- The message of a check of a topic's tags and SNS attributes, or NULL.
CREATE FUNCTION postbox._topic_maps_problem(tags jsonb, sns_attributes jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(postbox._string_map_problem('tags', tags, 50, 128, '.', 256),
                    postbox._string_map_problem('sns_attributes', sns_attributes, 20, 256,
                                                '^[A-Za-z0-9_.:-]+$', 32768))
$$;

-- Creates a topic, with its tags and SNS attributes (see postbox.topics), and
-- a stream_retention for a stream topic. PB409 if it exists.
CREATE FUNCTION postbox.create_topic(topic_name text, tags jsonb DEFAULT '{}', sns_attributes jsonb DEFAULT '{}',
                                     stream_retention interval DEFAULT NULL)
RETURNS postbox.topics
LANGUAGE plpgsql AS $$
DECLARE
    problem text := coalesce(postbox.name_problem('topic', topic_name),
                             postbox._topic_maps_problem(coalesce(tags, '{}'), coalesce(sns_attributes, '{}')),
                             postbox._stream_retention_problem(stream_retention));
    t postbox.topics;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    INSERT INTO postbox.topics (name, tags, sns_attributes, stream_retention)
    VALUES (topic_name, coalesce(tags, '{}'), coalesce(sns_attributes, '{}'), stream_retention)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('topic %s already exists', quote_literal(topic_name));
    END IF;
    RETURN t;
END
$$;

-- Replaces the fields of a topic named in `fields`: tags, sns_attributes (a
-- NULL value empties it), stream_retention (NULL: no longer a stream topic,
-- which PB412 refuses while it has consumer groups).
CREATE FUNCTION postbox.update_topic(topic_name text, fields text[], tags jsonb DEFAULT NULL,
                                     sns_attributes jsonb DEFAULT NULL, stream_retention interval DEFAULT NULL)
RETURNS postbox.topics
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics := postbox._topic(topic_name);
    unknown text;
    problem text;
BEGIN
    SELECT string_agg(f, ', ') INTO unknown FROM unnest(fields) AS f
    WHERE NOT f = ANY ('{tags,sns_attributes,stream_retention}');
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of tags, sns_attributes, stream_retention (not %s)',
                                        coalesce(unknown, 'none')));
    END IF;
    IF 'stream_retention' = ANY (fields) THEN
        PERFORM postbox._invalid(postbox._stream_retention_problem(stream_retention))
        WHERE postbox._stream_retention_problem(stream_retention) IS NOT NULL;
        IF stream_retention IS NULL AND EXISTS (SELECT FROM postbox.consumer_groups g WHERE g.topic_id = t.id) THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'topic %s has consumer groups: delete them before it stops being a stream topic',
                quote_literal(t.name));
        END IF;
        t.stream_retention := stream_retention;
    END IF;
    IF 'tags' = ANY (fields) THEN
        t.tags := coalesce(tags, '{}');
    END IF;
    IF 'sns_attributes' = ANY (fields) THEN
        t.sns_attributes := coalesce(sns_attributes, '{}');
    END IF;
    problem := postbox._topic_maps_problem(t.tags, t.sns_attributes);
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    UPDATE postbox.topics SET tags = t.tags, sns_attributes = t.sns_attributes, stream_retention = t.stream_retention
    WHERE id = t.id RETURNING * INTO t;
    RETURN t;
END
$$;

-- The message of a check of an SNS delivery (see postbox.subscriptions), or
-- NULL when it is NULL or valid.
CREATE FUNCTION postbox._sns_problem(sns jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN sns IS NULL THEN NULL
        WHEN jsonb_typeof(sns) <> 'object'
             OR EXISTS (SELECT FROM jsonb_object_keys(sns) k
                        WHERE k NOT IN ('topic_arn', 'subscription_arn', 'unsubscribe_url', 'raw', 'attributes')) THEN
            'sns_delivery must be an object of topic_arn, subscription_arn, unsubscribe_url, raw and attributes'
        WHEN coalesce(sns ->> 'topic_arn', '') = '' OR length(sns ->> 'topic_arn') > 1024
             OR coalesce(sns ->> 'subscription_arn', '') = '' OR length(sns ->> 'subscription_arn') > 1024 THEN
            'sns_delivery needs a topic_arn and a subscription_arn of at most 1024 characters'
        WHEN length(sns ->> 'unsubscribe_url') > 2048 THEN
            'sns_delivery.unsubscribe_url is longer than 2048 characters'
        WHEN jsonb_typeof(coalesce(sns -> 'raw', 'false')) <> 'boolean' THEN 'sns_delivery.raw must be true or false'
        ELSE postbox._string_map_problem('sns_delivery.attributes', coalesce(sns -> 'attributes', '{}'), 20, 256,
                                         '^[A-Za-z0-9_.:-]+$', 32768)
    END
$$;

-- The message of a check of a subscription's filter policy and SNS delivery,
-- or NULL when they are valid.
CREATE FUNCTION postbox._delivery_problem(filter_policy jsonb, filter_scope text, sns jsonb) RETURNS text
-- plpgsql: the filter policy functions are defined after this file.
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF filter_scope IS NULL OR filter_scope NOT IN ('attributes', 'body') THEN
        RETURN 'filter scope must be attributes or body';
    END IF;
    RETURN coalesce(CASE WHEN filter_policy IS NOT NULL
                         THEN postbox.filter_policy_problem(filter_policy, filter_scope) END,
                    postbox._sns_problem(sns));
END
$$;

-- Subscribes a queue (queue_name) or a webhook (webhook_url) to a topic, for
-- the messages whose routing key matches `pattern` (see _compile_pattern).
-- A webhook's secret is "whsec_" and the base64 of 24 to 64 bytes, generated
-- (32 random bytes) when not given; webhook_settings take the keys of
-- webhook_defaults(). Since 0.9.0: a filter policy over the attributes or the
-- body (filter_scope), an SNS delivery, and suspended (see
-- postbox.subscriptions). PB409 if the topic has a subscription of that name.
CREATE FUNCTION postbox.create_subscription(
    topic_name text, subscription_name text, pattern text DEFAULT '#', queue_name text DEFAULT NULL,
    webhook_url text DEFAULT NULL, webhook_secret text DEFAULT NULL, webhook_settings jsonb DEFAULT '{}',
    filter_policy jsonb DEFAULT NULL, filter_scope text DEFAULT 'attributes', sns jsonb DEFAULT NULL,
    suspended boolean DEFAULT false)
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics;
    problem text := coalesce(postbox.name_problem('subscription', subscription_name),
                             postbox.name_problem('topic', topic_name),
                             postbox._delivery_problem(filter_policy, filter_scope, sns));
    compiled record;
    s postbox.subscriptions;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    compiled := postbox._compile_pattern(coalesce(nullif(pattern, ''), '#'));
    s.name := subscription_name;
    s.pattern := coalesce(nullif(pattern, ''), '#');
    s.match_kind := compiled.match_kind;
    s.match_text := compiled.match_text;
    IF (queue_name IS NULL) = (webhook_url IS NULL) THEN
        PERFORM postbox._invalid('a subscription sends to a queue or to a webhook URL: give exactly one');
    ELSIF queue_name IS NOT NULL THEN
        IF webhook_secret IS NOT NULL OR coalesce(webhook_settings, '{}') <> '{}' THEN
            PERFORM postbox._invalid('a webhook secret and webhook settings are for webhook subscriptions');
        END IF;
        s.queue_id := (postbox._queue(queue_name)).id;
    ELSE
        s := postbox._webhook(s, webhook_url, webhook_secret,
                              postbox.webhook_defaults() || jsonb_strip_nulls(coalesce(webhook_settings, '{}')));
    END IF;
    -- Looked up last, so that a malformed field is PB400 whether the topic exists or not.
    t := postbox._topic(topic_name);
    s.topic_id := t.id;
    INSERT INTO postbox.subscriptions (
        topic_id, name, pattern, match_kind, match_text, queue_id, webhook_url, webhook_secret,
        webhook_timeout, webhook_max_attempts, webhook_minimum_backoff, webhook_maximum_backoff,
        filter_policy, filter_scope, sns, suspended)
    VALUES (
        s.topic_id, s.name, s.pattern, s.match_kind, s.match_text, s.queue_id, s.webhook_url,
        s.webhook_secret, s.webhook_timeout, s.webhook_max_attempts, s.webhook_minimum_backoff,
        s.webhook_maximum_backoff, filter_policy, filter_scope, sns, coalesce(suspended, false))
    ON CONFLICT (topic_id, name) DO NOTHING
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format(
            'topic %s already has a subscription %s', quote_literal(topic_name), quote_literal(subscription_name));
    END IF;
    RETURN s;
END
$$;

-- Changes the fields of a subscription named in `fields`: pattern, queue
-- (queue subscriptions), webhook.url, webhook.secret, webhook.timeout,
-- webhook.max_attempts, webhook.minimum_backoff, webhook.maximum_backoff
-- (webhook subscriptions; the settings in webhook_settings, in the shape of
-- webhook_defaults()), and since 0.9.0 filter_policy, filter_policy_scope,
-- sns_delivery and suspended. A named field whose value is NULL goes back to
-- its default, and an empty secret is generated anew. A subscription keeps its
-- kind. Takes the topic's lock, as create and delete do, so no publish sees
-- half a change.
CREATE FUNCTION postbox.update_subscription(
    topic_name text, subscription_name text, fields text[], pattern text DEFAULT NULL,
    queue_name text DEFAULT NULL, webhook_url text DEFAULT NULL, webhook_secret text DEFAULT NULL,
    webhook_settings jsonb DEFAULT '{}', filter_policy jsonb DEFAULT NULL, filter_scope text DEFAULT NULL,
    sns jsonb DEFAULT NULL, suspended boolean DEFAULT NULL)
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.subscriptions;
    hooks text[] := ARRAY['webhook.url', 'webhook.secret', 'webhook.timeout', 'webhook.max_attempts',
                          'webhook.minimum_backoff', 'webhook.maximum_backoff'];
    deliveries text[] := ARRAY['filter_policy', 'filter_policy_scope', 'sns_delivery', 'suspended'];
    unknown text;
    compiled record;
    settings jsonb;
    field text;
    problem text;
BEGIN
    -- Every name is checked before anything is looked up (see _settings_name_problem).
    PERFORM postbox._invalid('queue: ' || postbox.queue_name_problem(queue_name))
    WHERE 'queue' = ANY (fields) AND queue_name IS NOT NULL AND postbox.queue_name_problem(queue_name) IS NOT NULL;
    s := postbox.get_subscription(topic_name, subscription_name);
    SELECT string_agg(f, ', ') INTO unknown FROM unnest(fields) AS f
    WHERE NOT f = ANY ('{pattern,queue}' || deliveries || hooks);
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of pattern, %s, queue, %s (not %s)',
                                        array_to_string(deliveries, ', '), array_to_string(hooks, ', '),
                                        coalesce(unknown, 'none')));
    ELSIF s.queue_id IS NOT NULL AND fields && hooks THEN
        PERFORM postbox._invalid(format('subscription %s delivers to a queue: it has no webhook to change',
                                        quote_literal(subscription_name)));
    ELSIF s.webhook_url IS NOT NULL AND 'queue' = ANY (fields) THEN
        PERFORM postbox._invalid(format('subscription %s delivers to a webhook: it has no queue to change',
                                        quote_literal(subscription_name)));
    END IF;
    PERFORM postbox._lock_topic(s.topic_id, true);
    SELECT * INTO s FROM postbox.subscriptions WHERE id = s.id FOR UPDATE;
    IF 'pattern' = ANY (fields) THEN
        compiled := postbox._compile_pattern(coalesce(nullif(pattern, ''), '#'));
        s.pattern := coalesce(nullif(pattern, ''), '#');
        s.match_kind := compiled.match_kind;
        s.match_text := compiled.match_text;
    END IF;
    IF 'filter_policy' = ANY (fields) THEN
        s.filter_policy := filter_policy;
    END IF;
    IF 'filter_policy_scope' = ANY (fields) THEN
        s.filter_scope := coalesce(filter_scope, 'attributes');
    END IF;
    IF 'sns_delivery' = ANY (fields) THEN
        s.sns := sns;
    END IF;
    IF 'suspended' = ANY (fields) THEN
        s.suspended := coalesce(suspended, false);
    END IF;
    problem := postbox._delivery_problem(s.filter_policy, s.filter_scope, s.sns);
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF 'queue' = ANY (fields) THEN
        IF queue_name IS NULL THEN
            PERFORM postbox._invalid('a queue subscription needs its queue');
        END IF;
        s.queue_id := (postbox._queue(queue_name)).id;
    END IF;
    IF s.webhook_url IS NOT NULL AND fields && hooks THEN
        settings := jsonb_build_object(
            'timeout', extract(epoch FROM s.webhook_timeout), 'max_attempts', s.webhook_max_attempts,
            'minimum_backoff', extract(epoch FROM s.webhook_minimum_backoff),
            'maximum_backoff', extract(epoch FROM s.webhook_maximum_backoff));
        FOREACH field IN ARRAY fields LOOP
            field := substr(field, length('webhook.') + 1);
            IF postbox.webhook_defaults() ? field THEN
                settings := settings || jsonb_build_object(
                    field, coalesce(webhook_settings -> field, postbox.webhook_defaults() -> field));
            END IF;
        END LOOP;
        s := postbox._webhook(
            s, CASE WHEN 'webhook.url' = ANY (fields) THEN webhook_url ELSE s.webhook_url END,
            CASE WHEN 'webhook.secret' = ANY (fields) THEN coalesce(webhook_secret, '') ELSE s.webhook_secret END,
            settings);
    END IF;
    UPDATE postbox.subscriptions
    SET pattern = s.pattern, match_kind = s.match_kind, match_text = s.match_text, queue_id = s.queue_id,
        webhook_url = s.webhook_url, webhook_secret = s.webhook_secret, webhook_timeout = s.webhook_timeout,
        webhook_max_attempts = s.webhook_max_attempts, webhook_minimum_backoff = s.webhook_minimum_backoff,
        webhook_maximum_backoff = s.webhook_maximum_backoff, filter_policy = s.filter_policy,
        filter_scope = s.filter_scope, sns = s.sns, suspended = s.suspended
    WHERE id = s.id
    RETURNING * INTO s;
    RETURN s;
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
    t postbox.topics;
    n integer := coalesce(cardinality(bodies), 0);
    published_at timestamptz := clock_timestamp();
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
BEGIN
    SELECT * INTO t FROM postbox.topics x WHERE x.name = topic_name;
    IF NOT FOUND THEN
        t := postbox._topic(topic_name);  -- raises the error
    END IF;
    IF n NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._check_batch_size(n);
    END IF;
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
          OR (e.k <> '' AND postbox.routing_key_problem(e.k) IS NOT NULL)
    ORDER BY e.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF n = 1 THEN
        ids := ARRAY[gen_random_uuid()];
        keys := ARRAY[coalesce(routing_keys[1], '')];
    ELSE
        ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, n));
        keys := ARRAY(SELECT coalesce(routing_keys[i], '') FROM generate_series(1, n) AS i);
    END IF;

    PERFORM postbox._append_to_stream(t, ids, published_at, keys, ordering_keys, subjects, attributes, bodies)
    WHERE t.stream_retention IS NOT NULL;
    PERFORM pg_advisory_xact_lock_shared(1886350200, t.id);  -- postbox._lock_topic, inline
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
                subjects, ids, published_at);
        ELSE
            -- An envelope refuses a body that is not UTF-8 by raising, in a
            -- subtransaction, then, so that queue by queue can take over.
            BEGIN
                plain_ids := postbox._publish_to_plain_queues(
                    pair_queue_ids, pair_entries, pair_envelopes, pair_plain, plain_queue_ids, bodies, attributes,
                    subjects, ids, published_at);
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
                                                                     bodies[u.p], attributes[u.p]) END ORDER BY u.o),
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
    END IF;

    IF any_webhooks THEN
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

-- Subscription filter policies in the grammar of Amazon SNS: a JSON object of
-- keys, each an array of conditions (any may match) or, in the body scope, an
-- object of nested keys; all keys must match. The scope is 'attributes' (SNS's
-- MessageAttributes, matched against _filter_document of the attributes) or
-- 'body' (MessageBody, matched against the body parsed as a JSON object).
-- Policies are data walked by these functions, never SQL.

-- A policy value shown in a message: its JSON, cut to a short prefix with its length.
CREATE FUNCTION postbox._filter_quote(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(value::text) <= 80 THEN value::text
                ELSE left(value::text, 80) || '… (' || octet_length(value::text) || ' bytes)' END
$$;

-- Whether a "$or" key's value makes it an OR, as SNS decides: an array of at
-- least two objects, none of which has an operator's name as a key. Otherwise
-- "$or" is an ordinary key.
CREATE FUNCTION postbox._filter_is_or(value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(value) = 'array' THEN
        jsonb_array_length(value) >= 2
        AND NOT EXISTS (
            SELECT FROM jsonb_array_elements(value) AS e
            WHERE jsonb_typeof(e) <> 'object'
               OR EXISTS (SELECT FROM jsonb_object_keys(e) AS k
                          WHERE k IN ('prefix', 'suffix', 'equals-ignore-case', 'anything-but', 'numeric',
                                      'exists', 'cidr', 'wildcard')))
        ELSE false END
$$;

-- The problem of a number in a policy, or NULL: SNS takes -10^9 to 10^9 with at
-- most five digits after the decimal point.
CREATE FUNCTION postbox._filter_number_problem(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN abs(value::numeric) > 1000000000 THEN
            format('number %s is out of range; numbers lie between -1000000000 and 1000000000',
                   postbox._filter_quote(value))
        WHEN scale(trim_scale(value::numeric)) > 5 THEN
            format('number %s has more than 5 digits after the decimal point', postbox._filter_quote(value))
    END
$$;

-- The problem of a "numeric" operator's array, or NULL: [op, n] with op one of
-- = < <= > >=, or a range [> or >=, low, < or <=, high] with low below high.
CREATE FUNCTION postbox._filter_numeric_problem(arg jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(arg) IS DISTINCT FROM 'array' OR jsonb_array_length(arg) NOT IN (2, 4) THEN
        RETURN format('numeric takes [operator, number] or a range [">", low, "<", high], not %s',
                      postbox._filter_quote(arg));
    END IF;
    IF jsonb_typeof(arg -> 0) <> 'string' OR arg ->> 0 NOT IN ('=', '<', '<=', '>', '>=') THEN
        RETURN format('numeric operator %s is unknown; the operators are =, <, <=, > and >=',
                      postbox._filter_quote(arg -> 0));
    END IF;
    IF jsonb_typeof(arg -> 1) <> 'number' THEN
        RETURN format('numeric %s must be followed by a number, not %s', arg ->> 0, postbox._filter_quote(arg -> 1));
    END IF;
    IF jsonb_array_length(arg) = 2 THEN
        RETURN postbox._filter_number_problem(arg -> 1);
    END IF;
    IF arg ->> 0 NOT IN ('>', '>=') OR jsonb_typeof(arg -> 2) <> 'string' OR arg ->> 2 NOT IN ('<', '<=') THEN
        RETURN format('a numeric range starts with > or >= and a lower bound and ends with < or <= and an '
                      'upper bound, not %s', postbox._filter_quote(arg));
    END IF;
    IF jsonb_typeof(arg -> 3) <> 'number' THEN
        RETURN format('numeric %s must be followed by a number, not %s', arg ->> 2, postbox._filter_quote(arg -> 3));
    END IF;
    IF (arg -> 1)::numeric >= (arg -> 3)::numeric THEN
        RETURN format('numeric range %s is empty: its lower bound must be below its upper bound',
                      postbox._filter_quote(arg));
    END IF;
    RETURN coalesce(postbox._filter_number_problem(arg -> 1), postbox._filter_number_problem(arg -> 3));
END
$$;

-- The problem of one condition of a key's array, or NULL: a string, number,
-- true, false or null to equal, or an object of one operator.
CREATE FUNCTION postbox._filter_condition_problem(condition jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    op text;
    arg jsonb;
    element jsonb;
BEGIN
    CASE jsonb_typeof(condition)
    WHEN 'string', 'boolean', 'null' THEN
        RETURN NULL;
    WHEN 'number' THEN
        RETURN postbox._filter_number_problem(condition);
    WHEN 'array' THEN
        RETURN format('a condition cannot be an array (%s); list the values in the key''s own array',
                      postbox._filter_quote(condition));
    ELSE
        NULL;
    END CASE;
    IF (SELECT count(*) FROM jsonb_object_keys(condition)) <> 1 THEN
        RETURN format('a condition object holds exactly one operator, not %s',
                      postbox._filter_quote(condition));
    END IF;
    SELECT e.key, e.value INTO op, arg FROM jsonb_each(condition) AS e;
    CASE op
    WHEN 'prefix', 'suffix', 'equals-ignore-case' THEN
        IF jsonb_typeof(arg) <> 'string' THEN
            RETURN format('%s takes a string, not %s', op, postbox._filter_quote(arg));
        END IF;
    WHEN 'exists' THEN
        IF jsonb_typeof(arg) <> 'boolean' THEN
            RETURN format('exists takes true or false, not %s', postbox._filter_quote(arg));
        END IF;
    WHEN 'numeric' THEN
        RETURN postbox._filter_numeric_problem(arg);
    WHEN 'anything-but' THEN
        CASE jsonb_typeof(arg)
        WHEN 'string' THEN
            NULL;
        WHEN 'number' THEN
            RETURN postbox._filter_number_problem(arg);
        WHEN 'array' THEN
            IF jsonb_array_length(arg) = 0 THEN
                RETURN 'anything-but needs at least one value';
            END IF;
            FOR element IN SELECT jsonb_array_elements(arg) LOOP
                IF jsonb_typeof(element) = 'number' THEN
                    IF postbox._filter_number_problem(element) IS NOT NULL THEN
                        RETURN postbox._filter_number_problem(element);
                    END IF;
                ELSIF jsonb_typeof(element) <> 'string' THEN
                    RETURN format('anything-but lists strings and numbers, not %s', postbox._filter_quote(element));
                END IF;
            END LOOP;
        WHEN 'object' THEN
            IF (SELECT count(*) FROM jsonb_object_keys(arg)) <> 1
               OR coalesce(jsonb_typeof(arg -> 'prefix'), jsonb_typeof(arg -> 'suffix')) IS DISTINCT FROM 'string' THEN
                RETURN format('anything-but takes a value, an array of values, {"prefix": "..."} or '
                              '{"suffix": "..."}, not %s', postbox._filter_quote(arg));
            END IF;
        ELSE
            RETURN format('anything-but takes a value, an array of values, {"prefix": "..."} or '
                          '{"suffix": "..."}, not %s', postbox._filter_quote(arg));
        END CASE;
    ELSE
        RETURN format('unknown operator %s; the operators are prefix, suffix, equals-ignore-case, anything-but, '
                      'numeric and exists', postbox._filter_quote(to_jsonb(op)));
    END CASE;
    RETURN NULL;
END
$$;

-- Walks a policy object (the whole policy, a nested key's object, or a "$or"
-- alternative): its first problem, or its count of keys holding conditions (a
-- "$or" counts its largest alternative) and its combinations of values (the
-- product of the arrays' lengths, each weighted by its key's nesting depth as
-- SNS counts it; a "$or" the sum of its alternatives'). depth counts enclosing
-- nested keys, level all recursion, which 150 bounds: past it no policy keeps
-- within 150 combinations, and the stack stays small.
CREATE FUNCTION postbox._filter_policy_walk(node jsonb, scope text, path text, depth integer, level integer,
                                            OUT problem text, OUT keys integer, OUT combinations numeric)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    here text;
    sub record;
    alternative jsonb;
    widest integer;
    total numeric;
    condition jsonb;
BEGIN
    keys := 0;
    combinations := 1;
    IF level > 150 THEN
        problem := format('filter policy nests more than 150 levels deep at %s; it cannot keep within 150 '
                          'combinations of values', postbox._filter_quote(to_jsonb(path)));
        RETURN;
    END IF;
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(node) AS e LOOP
        here := CASE WHEN path = '' THEN k ELSE path || '.' || k END;
        IF k = '$or' AND postbox._filter_is_or(v) THEN
            widest := 0;
            total := 0;
            FOR alternative IN SELECT jsonb_array_elements(v) LOOP
                IF alternative = '{}' THEN
                    problem := format('an alternative of %s is an empty object; give each at least one key',
                                      postbox._filter_quote(to_jsonb(here)));
                    RETURN;
                END IF;
                sub := postbox._filter_policy_walk(alternative, scope, path, depth, level + 1);
                IF sub.problem IS NOT NULL THEN
                    problem := sub.problem;
                    RETURN;
                END IF;
                widest := greatest(widest, sub.keys);
                total := total + sub.combinations;
            END LOOP;
            keys := keys + widest;
            combinations := combinations * total;
        ELSIF jsonb_typeof(v) = 'object' THEN
            IF scope = 'attributes' THEN
                problem := format('key %s holds an object, but only the body scope (MessageBody) nests keys; '
                                  'give an array of conditions', postbox._filter_quote(to_jsonb(here)));
                RETURN;
            ELSIF v = '{}' THEN
                problem := format('key %s holds an empty object; give it nested keys or an array of conditions',
                                  postbox._filter_quote(to_jsonb(here)));
                RETURN;
            END IF;
            sub := postbox._filter_policy_walk(v, scope, here, depth + 1, level + 1);
            IF sub.problem IS NOT NULL THEN
                problem := sub.problem;
                RETURN;
            END IF;
            keys := keys + sub.keys;
            combinations := combinations * sub.combinations;
        ELSIF jsonb_typeof(v) = 'array' THEN
            IF k = '$or' AND jsonb_array_length(v) = 1 AND postbox._filter_is_or(v || v) THEN
                problem := format('%s has one alternative; "$or" needs at least two',
                                  postbox._filter_quote(to_jsonb(here)));
                RETURN;
            ELSIF jsonb_array_length(v) = 0 THEN
                problem := format('key %s has an empty array; give at least one condition',
                                  postbox._filter_quote(to_jsonb(here)));
                RETURN;
            END IF;
            FOR condition IN SELECT jsonb_array_elements(v) LOOP
                problem := postbox._filter_condition_problem(condition);
                IF problem IS NOT NULL THEN
                    problem := format('key %s: %s', postbox._filter_quote(to_jsonb(here)), problem);
                    RETURN;
                END IF;
            END LOOP;
            keys := keys + 1;
            combinations := combinations * jsonb_array_length(v) * greatest(depth, 1);
        ELSE
            problem := format('key %s must hold an array of conditions%s, not %s',
                              postbox._filter_quote(to_jsonb(here)),
                              CASE WHEN scope = 'body' THEN ' or an object of nested keys' ELSE '' END,
                              postbox._filter_quote(v));
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The problem of a filter policy for a scope ('attributes' or 'body'), or NULL
-- when it is valid (a NULL policy is none, and valid). The size limit applies
-- to the policy's canonical JSON; the caller checks the text it was given.
CREATE FUNCTION postbox.filter_policy_problem(policy jsonb, scope text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    walk record;
BEGIN
    IF scope IS NULL OR scope NOT IN ('attributes', 'body') THEN
        RETURN format('filter policy scope must be "attributes" (MessageAttributes) or "body" (MessageBody), not %s',
                      coalesce(postbox._filter_quote(to_jsonb(scope)), 'null'));
    ELSIF policy IS NULL THEN
        RETURN NULL;
    ELSIF jsonb_typeof(policy) <> 'object' THEN
        RETURN format('filter policy must be a JSON object of keys, not %s', postbox._filter_quote(policy));
    ELSIF octet_length(policy::text) > 262144 THEN
        RETURN format('filter policy is %s bytes long; the limit is 256 KiB (262144 bytes)',
                      octet_length(policy::text));
    END IF;
    walk := postbox._filter_policy_walk(policy, scope, '', 0, 0);
    IF walk.problem IS NOT NULL THEN
        RETURN walk.problem;
    ELSIF walk.keys > 5 THEN
        RETURN format('filter policy has %s keys with conditions; the limit is 5%s', walk.keys,
                      CASE WHEN policy::text LIKE '%"$or"%' THEN ' (a "$or" counts its largest alternative)' ELSE '' END);
    ELSIF walk.combinations > 150 THEN
        RETURN format('filter policy has %s combinations of values; the limit is 150 (multiply the lengths of its '
                      'arrays of conditions%s; a "$or" adds up its alternatives)', walk.combinations,
                      CASE WHEN scope = 'body' THEN ', each times the nesting depth of its key' ELSE '' END);
    END IF;
    RETURN NULL;
END
$$;

-- One attribute as a filter document value, or NULL to leave it out: String
-- types a JSON string, Number types a JSON number, String.Array the array it
-- holds (a string when it holds no JSON array), Binary nothing (SNS ignores
-- binary attributes). A number too far out of numeric's range stays a string.
CREATE FUNCTION postbox._filter_attribute_value(attribute jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    data_type text := attribute ->> 'data_type';
    string_value text := attribute ->> 'string_value';
    parsed jsonb;
BEGIN
    IF data_type IS NULL OR string_value IS NULL THEN
        RETURN NULL;
    ELSIF data_type = 'String.Array' THEN
        IF ltrim(string_value, E' \t\n\r') LIKE '[%' THEN
            BEGIN
                parsed := string_value::jsonb;
            EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
                parsed := NULL;
            END;
            IF jsonb_typeof(parsed) = 'array' THEN
                RETURN parsed;
            END IF;
        END IF;
        RETURN to_jsonb(string_value);
    ELSIF data_type LIKE 'Number%' THEN
        IF length(string_value) <= 1000
           AND string_value ~ '^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?$' THEN
            RETURN to_jsonb(string_value::numeric);
        END IF;
        RETURN to_jsonb(string_value);
    ELSIF data_type LIKE 'String%' THEN
        RETURN to_jsonb(string_value);
    END IF;
    RETURN NULL;
END
$$;

-- The attributes as the document an attribute-scope policy matches: an object
-- of each attribute's _filter_attribute_value, binary ones left out.
CREATE FUNCTION postbox._filter_document(attributes jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(attributes) IS DISTINCT FROM 'object' THEN
        RETURN '{}';
    END IF;
    RETURN coalesce((
        SELECT jsonb_object_agg(e.key, v.value)
        FROM jsonb_each(attributes) AS e, postbox._filter_attribute_value(e.value) AS v(value)
        WHERE v.value IS NOT NULL), '{}');
END
$$;

-- The body as the document a body-scope policy matches, or NULL when it is not
-- a UTF-8 JSON object. Exposed so that a publish can parse a body once for all
-- of a topic's subscriptions.
CREATE FUNCTION postbox._filter_body_document(body bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    document jsonb;
BEGIN
    -- Most bodies that are no JSON object fail here, without a subtransaction.
    IF body IS NULL OR substr(ltrim(body, '\x20090a0d'::bytea), 1, 1) <> '\x7b'::bytea THEN
        RETURN NULL;
    END IF;
    BEGIN
        document := convert_from(body, 'UTF8')::jsonb;
    EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
        RETURN NULL;
    END;
    RETURN CASE WHEN jsonb_typeof(document) = 'object' THEN document END;
END
$$;

-- What a document value holds for a policy key, as a JSON array: with objects
-- false its leaf values (itself when a scalar, none when an object: conditions
-- apply to leaves only), with objects true the objects a nested key walks
-- into (itself when an object); arrays give what their elements hold.
CREATE FUNCTION postbox._filter_values(value jsonb, objects boolean) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL THEN
        RETURN '[]';
    ELSIF jsonb_typeof(value) <> 'array' THEN
        RETURN CASE WHEN (jsonb_typeof(value) = 'object') = objects THEN jsonb_build_array(value) ELSE '[]' END;
    ELSIF NOT objects AND NOT EXISTS (
            SELECT FROM jsonb_array_elements(value) AS e WHERE jsonb_typeof(e) IN ('array', 'object')) THEN
        RETURN value;
    END IF;
    RETURN coalesce((SELECT jsonb_agg(h) FROM jsonb_array_elements(value) AS e,
                                              jsonb_array_elements(postbox._filter_values(e, objects)) AS h), '[]');
END
$$;

-- _filter_values of a key across a set of document objects (a JSON array).
CREATE FUNCTION postbox._filter_gather(nodes jsonb, key text, objects boolean) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_array_length(nodes) = 1 THEN
        RETURN postbox._filter_values(nodes -> 0 -> key, objects);
    END IF;
    RETURN coalesce((SELECT jsonb_agg(h) FROM jsonb_array_elements(nodes) AS n,
                                              jsonb_array_elements(postbox._filter_values(n -> key, objects)) AS h),
                    '[]');
END
$$;

-- Whether any of a key's conditions matches any of its leaf values. Equality
-- is jsonb's (strings to strings, numbers numerically, true, false, null);
-- prefix, suffix and equals-ignore-case look at strings, numeric at numbers;
-- anything-but needs a non-null value that is none of its values; exists asks
-- for a non-null value, or none, and exists false never matches an empty
-- document (SNS: "an empty set of attributes results in the filter not
-- matching").
CREATE FUNCTION postbox._filter_conditions_match(conditions jsonb, leaves jsonb, empty boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    condition jsonb;
    op text;
    arg jsonb;
    leaf jsonb;
    hit boolean;
BEGIN
    FOR condition IN SELECT jsonb_array_elements(conditions) LOOP
        IF jsonb_typeof(condition) <> 'object' THEN
            IF leaves @> jsonb_build_array(condition) THEN
                RETURN true;
            END IF;
            CONTINUE;
        END IF;
        SELECT e.key, e.value INTO op, arg FROM jsonb_each(condition) AS e LIMIT 1;
        IF op = 'exists' THEN
            IF arg = to_jsonb(EXISTS (SELECT FROM jsonb_array_elements(leaves) AS l WHERE l <> 'null'))
               AND (arg = 'true' OR NOT empty) THEN
                RETURN true;
            END IF;
            CONTINUE;
        END IF;
        FOR leaf IN SELECT jsonb_array_elements(leaves) LOOP
            hit := CASE op
                WHEN 'prefix' THEN
                    jsonb_typeof(leaf) = 'string' AND starts_with(leaf #>> '{}', arg #>> '{}')
                WHEN 'suffix' THEN
                    jsonb_typeof(leaf) = 'string' AND right(leaf #>> '{}', length(arg #>> '{}')) = arg #>> '{}'
                WHEN 'equals-ignore-case' THEN
                    jsonb_typeof(leaf) = 'string' AND lower(leaf #>> '{}') = lower(arg #>> '{}')
                WHEN 'anything-but' THEN
                    leaf <> 'null' AND CASE jsonb_typeof(arg)
                        WHEN 'object' THEN jsonb_typeof(leaf) = 'string' AND CASE
                            WHEN arg ? 'prefix' THEN NOT starts_with(leaf #>> '{}', arg ->> 'prefix')
                            ELSE right(leaf #>> '{}', length(arg ->> 'suffix')) <> arg ->> 'suffix' END
                        WHEN 'array' THEN NOT arg @> jsonb_build_array(leaf)
                        ELSE leaf <> arg END
                WHEN 'numeric' THEN
                    jsonb_typeof(leaf) = 'number' AND postbox._filter_numeric_matches(arg, leaf::numeric)
                ELSE false
            END;
            IF hit THEN
                RETURN true;
            END IF;
        END LOOP;
    END LOOP;
    RETURN false;
END
$$;

-- Whether a number meets a "numeric" operator's comparison or range.
CREATE FUNCTION postbox._filter_numeric_matches(arg jsonb, n numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT bool_and(CASE c.op
                        WHEN '=' THEN n = c.bound
                        WHEN '<' THEN n < c.bound
                        WHEN '<=' THEN n <= c.bound
                        WHEN '>' THEN n > c.bound
                        WHEN '>=' THEN n >= c.bound
                        ELSE false END)
    FROM (SELECT arg ->> i AS op, (arg -> (i + 1))::numeric AS bound
          FROM generate_series(0, jsonb_array_length(arg) - 2, 2) AS i) AS c
$$;

-- Whether a policy object matches a set of document objects (a JSON array:
-- the document itself, or what a nested key reached, arrays flattened). Every
-- key must match; a key's leaves are gathered from all the objects, so each
-- key is matched on its own; "$or" needs one alternative to match. empty says
-- the document had no keys at all.
CREATE FUNCTION postbox._filter_policy_matches(policy jsonb, nodes jsonb, empty boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    alternative jsonb;
    matched boolean;
BEGIN
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(policy) AS e LOOP
        IF k = '$or' AND postbox._filter_is_or(v) THEN
            matched := false;
            FOR alternative IN SELECT jsonb_array_elements(v) LOOP
                IF postbox._filter_policy_matches(alternative, nodes, empty) THEN
                    matched := true;
                    EXIT;
                END IF;
            END LOOP;
            IF NOT matched THEN
                RETURN false;
            END IF;
        ELSIF jsonb_typeof(v) = 'object' THEN
            IF NOT postbox._filter_policy_matches(v, postbox._filter_gather(nodes, k, true), empty) THEN
                RETURN false;
            END IF;
        ELSIF jsonb_typeof(v) = 'array' THEN
            IF NOT postbox._filter_conditions_match(v, postbox._filter_gather(nodes, k, false), empty) THEN
                RETURN false;
            END IF;
        ELSE
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- Whether a policy matches a document already made (_filter_document of the
-- attributes, or _filter_body_document of the body, NULL when the body is no
-- JSON object): NULL policy matches everything, a NULL document nothing else.
CREATE FUNCTION postbox._filter_matches_document(policy jsonb, document jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN policy IS NULL THEN true
        WHEN document IS NULL OR jsonb_typeof(policy) <> 'object' THEN false
        ELSE postbox._filter_policy_matches(policy, jsonb_build_array(document), document = '{}')
    END
$$;

-- Whether a message passes a subscription's filter policy in a scope:
-- 'attributes' matches the message's attributes, 'body' its body, which must
-- be a UTF-8 JSON object (else false, never an error). A NULL policy passes
-- everything. Semantics as SNS's: see _filter_policy_matches and
-- _filter_conditions_match.
CREATE FUNCTION postbox.filter_matches(policy jsonb, scope text, attributes jsonb, body bytea) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF policy IS NULL THEN
        RETURN true;
    ELSIF scope = 'attributes' THEN
        RETURN postbox._filter_matches_document(policy, postbox._filter_document(attributes));
    ELSIF scope = 'body' THEN
        RETURN postbox._filter_matches_document(policy, postbox._filter_body_document(body));
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PB400',
        MESSAGE = format('filter policy scope must be "attributes" or "body", not %s',
                         coalesce(quote_literal(scope), 'NULL'));
END
$$;

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
-- (arrays in step), to the current bucket. Queues since dropped are skipped.
-- Rows are written in queue id order, so two processes flushing at once wait
-- for each other rather than deadlock.
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
        latency_max = greatest(a.latency_max, excluded.latency_max)
$$;

-- Forgets activity older than an hour, the longest window worth asking for.
-- Returns how many rows went.
CREATE FUNCTION postbox.expire_activity() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    removed bigint;
BEGIN
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
CREATE FUNCTION postbox.queue_rates(span interval DEFAULT '1 minute', only_queue text DEFAULT NULL)
RETURNS TABLE (queue_name text, sent bigint, received bigint, deleted bigint,
               sent_per_second double precision, received_per_second double precision,
               deleted_per_second double precision, receive_latency_avg_seconds double precision,
               receive_latency_max_seconds double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    since timestamptz := date_bin('10 seconds', now() - span, 'epoch') + interval '10 seconds';
    seconds double precision := extract(epoch FROM now() - since);
BEGIN
    IF span IS NULL OR span < interval '30 seconds' OR span > interval '1 hour' THEN
        RAISE EXCEPTION 'span must be from 30 seconds to 1 hour, not %', span
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'activity is kept in 10-second buckets for an hour';
    END IF;
    RETURN QUERY
    SELECT q.name, coalesce(sum(a.sent), 0)::bigint, coalesce(sum(a.received), 0)::bigint,
           coalesce(sum(a.deleted), 0)::bigint,
           coalesce(sum(a.sent), 0) / seconds, coalesce(sum(a.received), 0) / seconds,
           coalesce(sum(a.deleted), 0) / seconds,
           sum(a.latency_sum) / nullif(sum(a.latency_count), 0), max(a.latency_max)
    FROM postbox.queues q
    LEFT JOIN postbox.queue_activity a ON a.queue_id = q.id AND a.bucket >= since
    WHERE only_queue IS NULL OR q.name = only_queue
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

-- Since 0.9.0: stream topics. A topic with a stream_retention keeps every
-- message published to it in one shared, append-only log, beside its queue and
-- webhook subscriptions. Consumer groups read the log through a cursor each, so
-- a publish costs one row however many groups read it, a new group can replay
-- what the log holds, and lag is a count behind the cursor.
--
-- Order. Each row carries the id of the transaction that appended it (tx) and
-- an offset from one sequence. A group reads rows in (tx, offset) order, and
-- only rows whose transaction is older than every transaction still running
-- (tx < xmin of the current snapshot): those rows are final, and every row
-- still to come sorts after them, so a cursor never passes a row that commits
-- later. Offsets grow with publish time; two transactions that overlap may be
-- read in the other order. The price, as Kafka's last stable offset: a
-- transaction that holds a transaction id open (a write, anywhere in the
-- database) holds stream reads back until it ends. A read-only transaction,
-- however long, does not.
--
-- Rotation. The log is a table partitioned in four slots. Appends go to the
-- current slot; rotate_streams retires it once it is older than the rotation
-- period and an empty slot can take over, and TRUNCATEs a retired slot once
-- every consumer group of every topic in it has acknowledged its rows and the
-- topics' retention has passed since the slot was retired. TRUNCATE leaves no
-- dead tuples, whatever the xmin horizon; it waits for its lock at most
-- lock_wait and otherwise tries again on the next pass, so it never holds
-- writers or readers behind a long transaction.
--
-- Consumer groups. One batch of a group is out at a time, under a lease: a
-- group is one cursor, as a Kafka partition is one offset per group, so
-- ordering holds across the whole topic and acknowledging is one update.
-- Readers that want parallelism take larger batches, or more groups.

CREATE SEQUENCE postbox.stream_offsets AS bigint;

CREATE TABLE postbox.stream_log (
    slot smallint NOT NULL,
    topic_id integer NOT NULL,  -- no foreign key: a deleted topic's rows go with their slot
    tx xid8 NOT NULL,
    stream_offset bigint NOT NULL,
    published_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL
) PARTITION BY LIST (slot);
CREATE TABLE postbox.stream_log_0 PARTITION OF postbox.stream_log FOR VALUES IN (0);
CREATE TABLE postbox.stream_log_1 PARTITION OF postbox.stream_log FOR VALUES IN (1);
CREATE TABLE postbox.stream_log_2 PARTITION OF postbox.stream_log FOR VALUES IN (2);
CREATE TABLE postbox.stream_log_3 PARTITION OF postbox.stream_log FOR VALUES IN (3);
-- Reads walk it from a cursor; rotation finds a topic's last row in a slot.
CREATE INDEX stream_log_position_idx ON postbox.stream_log (topic_id, tx, stream_offset);

-- The log's slots: one current (appends go there), the others retired (since
-- `since`, waiting to be truncated) or empty.
CREATE TABLE postbox.stream_slots (
    slot smallint PRIMARY KEY CHECK (slot BETWEEN 0 AND 3),
    state text NOT NULL CHECK (state IN ('current', 'retired', 'empty')),
    since timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX stream_slots_current_idx ON postbox.stream_slots (state) WHERE state = 'current';
INSERT INTO postbox.stream_slots (slot, state) VALUES (0, 'current'), (1, 'empty'), (2, 'empty'), (3, 'empty');

-- A consumer group: a cursor into a stream topic's log, the position (tx,
-- offset) of the last row it acknowledged ((0, 0): before every row), and the
-- batch out now, if any: its lease token and deadline, its last position and
-- how many times it has gone out.
CREATE TABLE postbox.consumer_groups (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id integer NOT NULL REFERENCES postbox.topics (id) ON DELETE CASCADE,
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    cursor_tx xid8 NOT NULL,
    cursor_offset bigint NOT NULL,
    acked_at timestamptz,
    lease uuid,
    lease_expires_at timestamptz,
    lease_end_tx xid8,
    lease_end_offset bigint,
    lease_deliveries integer,
    paused boolean NOT NULL DEFAULT false,  -- reads refused until resume_consumer_group
    -- Deliveries after which a message the group fails on goes to its dead
    -- letters; NULL: never.
    max_deliveries integer CHECK (max_deliveries BETWEEN 1 AND 1000),
    read_at timestamptz,  -- when a batch last went out: stream_health finds stuck groups by it
    UNIQUE (topic_id, name)
) WITH (fillfactor = 50);  -- every read and ack updates the row: room for HOT updates

-- Messages a group's reader gave back (ack_stream's nack_offsets), to go out
-- to the group again from visible_at: a copy of the log's row, since rotation
-- may truncate the log before then. deliveries counts the times it went out
-- to the group; batch is the group's batch it is out with (NULL, or a batch
-- called back by a seek, while it waits). The rest of the group reads on past
-- it: one bad message holds no cursor back.
CREATE TABLE postbox.stream_retries (
    group_id integer NOT NULL REFERENCES postbox.consumer_groups (id) ON DELETE CASCADE,
    stream_offset bigint NOT NULL,
    published_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL,
    deliveries integer NOT NULL,
    visible_at timestamptz NOT NULL,
    batch uuid,
    PRIMARY KEY (group_id, stream_offset)
);
CREATE INDEX stream_retries_due_idx ON postbox.stream_retries (group_id, visible_at);

-- A consumer group's dead letters: messages that went out to the group
-- max_deliveries times and failed the last time too (reason: 'nacked', or
-- 'lease expired' when their batch's lease ran out). A copy of the log's row,
-- as a retry is, with the deliveries it had; kept until replayed or purged.
CREATE TABLE postbox.stream_dead_letters (
    group_id integer NOT NULL REFERENCES postbox.consumer_groups (id) ON DELETE CASCADE,
    stream_offset bigint NOT NULL,
    published_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL,
    deliveries integer NOT NULL,
    dead_at timestamptz NOT NULL DEFAULT now(),
    reason text NOT NULL CHECK (reason IN ('nacked', 'lease expired')),
    PRIMARY KEY (group_id, stream_offset)
);

-- Publish-to-first-read latency of consumer groups: per group and 10-second
-- bucket (of the read), how many of the log's messages its new batches took
-- at each latency, counted in the bins of _stream_latency_bounds. read_stream
-- adds to it once per new batch (not per message); a message going out again
-- is not counted again. Kept for an hour (expire_activity).
CREATE TABLE postbox.stream_latency (
    group_id integer NOT NULL REFERENCES postbox.consumer_groups (id) ON DELETE CASCADE,
    bucket timestamptz NOT NULL,
    counts bigint[] NOT NULL,
    PRIMARY KEY (group_id, bucket)
);

-- The upper bounds, in seconds, of stream_latency's bins, 5 ms to 30 minutes;
-- a 16th bin takes everything above.
CREATE FUNCTION postbox._stream_latency_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}'::double precision[]
$$;

-- Messages published to a stream topic with a delay (publish_delayed), held
-- here until deliver_at, when they are appended to the log (see
-- _publish_due_streams): until then no consumer group sees them, nor counts
-- them in its lag.
CREATE TABLE postbox.stream_delayed (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id integer NOT NULL REFERENCES postbox.topics (id) ON DELETE CASCADE,
    deliver_at timestamptz NOT NULL,
    publish_id uuid NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    subject text,
    attributes jsonb,
    body bytea NOT NULL
);
-- Reads find a topic's due ones, tick and the workers everybody's.
CREATE INDEX stream_delayed_topic_idx ON postbox.stream_delayed (topic_id, deliver_at);
CREATE INDEX stream_delayed_due_idx ON postbox.stream_delayed (deliver_at);

-- The slots' states are not dumped: this script makes them, and a restore that
-- starts them afresh loses nothing (a slot marked empty that holds rows is
-- truncated only once it has been current and then retired).
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_0', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_1', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_2', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_log_3', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.consumer_groups', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_retries', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_dead_letters', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_delayed', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.stream_latency', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- The message of a check of a stream retention, or NULL when it is NULL (no
-- stream) or from 1 second to 30 days.
CREATE FUNCTION postbox._stream_retention_problem(retention interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('stream_retention must be from 1 second to 30 days, not %s', retention)
    WHERE retention < interval '1 second' OR retention > interval '30 days'
$$;

-- Appends a publish's entries to the stream log (publish_batch calls it for
-- stream topics). The transaction id is taken before any offset, so that every
-- offset this transaction takes sorts after the rows of transactions that
-- finished before it.
CREATE FUNCTION postbox._append_to_stream(topic postbox.topics, publish_ids uuid[], published_at timestamptz,
                                          routing_keys text[], ordering_keys text[], subjects text[],
                                          attributes jsonb[], bodies bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    tx xid8 := pg_current_xact_id();
    problem text;
BEGIN
    SELECT format('%stopic %s is a stream topic: its messages hold at most 1048576 bytes, not %s',
                  postbox._entry_prefix(e.i::integer, cardinality(bodies)), quote_literal(topic.name),
                  postbox.message_size(e.b, e.a))
    INTO problem
    FROM unnest(bodies, attributes) WITH ORDINALITY AS e(b, a, i)
    WHERE postbox.message_size(e.b, e.a) > 1048576
    ORDER BY e.i
    LIMIT 1;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    INSERT INTO postbox.stream_log (slot, topic_id, tx, stream_offset, published_at, publish_id, routing_key,
                                    ordering_key, subject, attributes, body)
    SELECT (SELECT s.slot FROM postbox.stream_slots s WHERE s.state = 'current'), topic.id, tx,
           nextval('postbox.stream_offsets'), published_at, e.id, e.k, e.o, e.s, e.a, e.b
    FROM unnest(publish_ids, routing_keys, ordering_keys, subjects, attributes, bodies) AS e(id, k, o, s, a, b);
END
$$;

-- Publishes a message to a stream topic's log after a delay (0 to 30 days):
-- no consumer group sees it before then. It is appended to the log when it
-- is due, by the first read of one of the topic's groups, a tick or a
-- server's maintenance worker after then, and takes its offset and its
-- published_at at that time: it sorts after what was published before it
-- became due, as if published then. Messages due together go in deliver_at,
-- then publish, order. Only for stream topics without subscriptions (PB412
-- otherwise): queue and webhook subscribers would want it now. With no delay
-- it is appended at once. Returns its publish_id.
CREATE FUNCTION postbox.publish_delayed(topic_name text, body bytea, delay interval, routing_key text DEFAULT '',
                                        attributes jsonb DEFAULT NULL, ordering_key text DEFAULT NULL,
                                        subject text DEFAULT NULL) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics := postbox._stream_topic(topic_name);
    id uuid := gen_random_uuid();
    problem text;
BEGIN
    routing_key := coalesce(routing_key, '');
    problem := CASE
        WHEN delay IS NULL OR delay < interval '0' OR delay > interval '30 days' THEN
            format('delay must be from 0 seconds to 30 days, not %s', coalesce(delay::text, 'NULL'))
        WHEN body IS NULL THEN 'body must not be NULL'
        WHEN length(ordering_key) > 128 OR ordering_key !~ '^[!-~]+$' THEN
            'ordering_key must be 1 to 128 printable ASCII characters'
        WHEN length(subject) > 100 OR subject ~ '[[:cntrl:]]' THEN
            'subject must be at most 100 characters without control characters'
        WHEN routing_key <> '' THEN postbox.routing_key_problem(routing_key)
        WHEN attributes IS NOT NULL THEN postbox._attributes_problem(ARRAY[attributes], 1) END;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF EXISTS (SELECT FROM postbox.subscriptions s WHERE s.topic_id = t.id) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'topic %s has subscriptions: a delayed publish goes to the stream log only, and its queues and '
            'webhooks would not get it; publish without a delay, or send to the queues with one',
            quote_literal(topic_name));
    END IF;
    IF delay = interval '0' THEN
        PERFORM postbox._append_to_stream(t, ARRAY[id], clock_timestamp(), ARRAY[routing_key],
                                          ARRAY[ordering_key], ARRAY[subject], ARRAY[attributes], ARRAY[body]);
        RETURN id;
    END IF;
    IF postbox.message_size(body, attributes) > 1048576 THEN
        PERFORM postbox._invalid(format('topic %s is a stream topic: its messages hold at most 1048576 bytes, not %s',
                                        quote_literal(topic_name), postbox.message_size(body, attributes)));
    END IF;
    INSERT INTO postbox.stream_delayed (topic_id, deliver_at, publish_id, routing_key, ordering_key, subject,
                                        attributes, body)
    VALUES (t.id, now() + delay, id, routing_key, ordering_key, subject, attributes, body);
    RETURN id;
END
$$;

-- Appends up to max_messages delayed messages that are due to their topics'
-- logs, those of topic_id (NULL: of every topic), as one transaction's rows:
-- the transaction id first, then an offset each, in deliver_at then publish
-- order. Rows another session is appending are skipped. A topic that is no
-- stream topic any more drops its own. Returns how many it appended.
CREATE FUNCTION postbox._publish_due_streams(topic_id integer, max_messages integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    tx xid8 := pg_current_xact_id();
    appended integer;
BEGIN
    WITH due AS (
        DELETE FROM postbox.stream_delayed d
        WHERE d.id IN (SELECT x.id FROM postbox.stream_delayed x
                       WHERE x.deliver_at <= now()
                             AND (_publish_due_streams.topic_id IS NULL OR x.topic_id = _publish_due_streams.topic_id)
                       ORDER BY x.deliver_at, x.id
                       LIMIT max_messages
                       FOR UPDATE SKIP LOCKED)
        RETURNING d.*),
    appended_rows AS (
        INSERT INTO postbox.stream_log (slot, topic_id, tx, stream_offset, published_at, publish_id, routing_key,
                                        ordering_key, subject, attributes, body)
        SELECT (SELECT s.slot FROM postbox.stream_slots s WHERE s.state = 'current'), o.topic_id, tx,
               nextval('postbox.stream_offsets'), clock_timestamp(), o.publish_id, o.routing_key, o.ordering_key,
               o.subject, o.attributes, o.body
        FROM (SELECT due.* FROM due JOIN postbox.topics t ON t.id = due.topic_id
              WHERE t.stream_retention IS NOT NULL
              ORDER BY due.deliver_at, due.id) AS o
        RETURNING 1)
    SELECT count(*) INTO appended FROM appended_rows;
    RETURN appended;
END
$$;

-- Appends up to max_messages (1-10000) delayed messages that are due to
-- their topics' logs (see publish_delayed); tick and the servers'
-- maintenance workers run it. Returns how many it appended.
CREATE FUNCTION postbox.publish_due_streams(max_messages integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 10000, not %s', max_messages));
    END IF;
    RETURN postbox._publish_due_streams(NULL, max_messages);
END
$$;

-- The stream topic of that name; PB404 if there is none, PB412 if it is no
-- stream topic.
CREATE FUNCTION postbox._stream_topic(topic_name text) RETURNS postbox.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._topic(topic_name);
BEGIN
    IF t.stream_retention IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'topic %s is not a stream topic: give it a stream_retention first', quote_literal(topic_name));
    END IF;
    RETURN t;
END
$$;

-- The group name, when it keeps the grammar of names; INVALID_ARGUMENT saying
-- what is allowed otherwise. Called first, so a malformed name is refused
-- whatever else the call names (an absent topic included).
CREATE FUNCTION postbox._group_name(group_name text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
    WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
    RETURN group_name;
END
$$;

-- The consumer group of that name on a stream topic, locked for update;
-- PB404 if there is none. With skip_locked, NULL when another transaction
-- holds it (a concurrent read of the same group).
CREATE FUNCTION postbox._consumer_group(t postbox.topics, group_name text, skip_locked boolean DEFAULT false)
RETURNS postbox.consumer_groups
LANGUAGE plpgsql AS $$
DECLARE
    g postbox.consumer_groups;
BEGIN
    IF skip_locked THEN
        SELECT * INTO g FROM postbox.consumer_groups WHERE topic_id = t.id AND name = group_name
        FOR UPDATE SKIP LOCKED;
    ELSE
        SELECT * INTO g FROM postbox.consumer_groups WHERE topic_id = t.id AND name = group_name FOR UPDATE;
    END IF;
    IF NOT FOUND AND NOT EXISTS (SELECT FROM postbox.consumer_groups WHERE topic_id = t.id AND name = group_name)
    THEN
        PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
        WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(t.name));
    END IF;
    RETURN g;
END
$$;

-- Where a cursor goes to read from a point on: just before the first row (in
-- read order) of the topic with an offset of at least from_offset, or
-- published at from_time or later. Where no such row is in the log yet: the
-- end (see _stream_end). Rows of transactions that overlapped the point may
-- come again: the cursor errs towards reading twice, never towards skipping.
CREATE FUNCTION postbox._stream_position(topic_id integer, from_offset bigint, from_time timestamptz,
                                         OUT tx xid8, OUT stream_offset bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT l.tx, l.stream_offset - 1 INTO tx, stream_offset
    FROM postbox.stream_log l
    WHERE l.topic_id = _stream_position.topic_id
          AND (l.stream_offset >= from_offset OR l.published_at >= from_time)
    ORDER BY l.tx, l.stream_offset
    LIMIT 1;
    IF NOT FOUND THEN
        SELECT e.tx, e.stream_offset INTO tx, stream_offset FROM postbox._stream_end() e;
    END IF;
END
$$;

-- The end of every stream: a cursor here has read every row of a finished
-- transaction, and reads those of transactions still running.
CREATE FUNCTION postbox._stream_end(OUT tx xid8, OUT stream_offset bigint)
LANGUAGE sql STABLE AS $$
    SELECT pg_snapshot_xmin(pg_current_snapshot()), 0::bigint
$$;

-- A consumer group as get_ and list_consumer_groups show it: its cursor (the
-- offset of the last acknowledged row, 0 before any), the batch out now, its
-- lag: the rows of the log past its cursor, and how long ago the first of
-- them was published (0 with none), whether it is paused, how many
-- messages it gave back wait to go out again (retry_messages), its
-- max_deliveries and how many dead letters it holds.
CREATE FUNCTION postbox._consumer_group_view(g postbox.consumer_groups, topic_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE sql STABLE AS $$
    SELECT topic_name, g.name, g.created_at, g.cursor_offset, g.acked_at,
           CASE WHEN g.lease IS NOT NULL THEN g.lease_expires_at END,
           (SELECT count(*) FROM postbox.stream_log l
            WHERE l.topic_id = g.topic_id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)),
           coalesce((SELECT greatest(extract(epoch FROM now() - l.published_at), 0)::double precision
                     FROM postbox.stream_log l
                     WHERE l.topic_id = g.topic_id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                     ORDER BY l.tx, l.stream_offset LIMIT 1), 0),
           g.paused,
           (SELECT count(*) FROM postbox.stream_retries r WHERE r.group_id = g.id),
           g.max_deliveries,
           (SELECT count(*) FROM postbox.stream_dead_letters d WHERE d.group_id = g.id)
$$;

-- The message of a check of a group's max_deliveries, or NULL when it is
-- NULL (never) or from 1 to 1000.
CREATE FUNCTION postbox._max_deliveries_problem(max_deliveries integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('max_deliveries must be from 1 to 1000 (or none: never), not %s', max_deliveries)
    WHERE max_deliveries NOT BETWEEN 1 AND 1000
$$;

-- Creates a consumer group on a stream topic, reading from `start`: earliest
-- (everything the log holds), latest (what is published from now on) or time
-- (what was published at start_time or later; a time in the future is
-- refused), with delivery_limit as its max_deliveries (1-1000, NULL: never;
-- see stream_dead_letters).
-- PB409 if it exists.
CREATE FUNCTION postbox.create_consumer_group(topic_name text, group_name text, start text DEFAULT 'earliest',
                                              start_time timestamptz DEFAULT NULL,
                                              delivery_limit integer DEFAULT NULL)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
    start_at record;
BEGIN
    PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
    WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
    IF start IS NULL OR start NOT IN ('earliest', 'latest', 'time') THEN
        PERFORM postbox._invalid(format('start must be earliest, latest or time, not %s',
                                        coalesce(quote_literal(start), 'NULL')));
    ELSIF (start = 'time') <> (start_time IS NOT NULL) THEN
        PERFORM postbox._invalid('start_time is required with start time, and only with it');
    ELSIF start_time > now() THEN
        PERFORM postbox._invalid(format('start_time %s is in the future', start_time));
    END IF;
    PERFORM postbox._invalid(postbox._max_deliveries_problem(delivery_limit))
    WHERE postbox._max_deliveries_problem(delivery_limit) IS NOT NULL;
    IF start = 'earliest' THEN
        SELECT '0'::xid8 AS tx, 0::bigint AS stream_offset INTO start_at;
    ELSIF start = 'latest' THEN
        SELECT * INTO start_at FROM postbox._stream_end();
    ELSE
        SELECT * INTO start_at FROM postbox._stream_position(t.id, NULL, start_time);
    END IF;
    INSERT INTO postbox.consumer_groups (topic_id, name, cursor_tx, cursor_offset, max_deliveries)
    VALUES (t.id, group_name, start_at.tx, start_at.stream_offset, delivery_limit)
    ON CONFLICT ON CONSTRAINT consumer_groups_topic_id_name_key DO NOTHING
    RETURNING * INTO g;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format(
            'consumer group %s of topic %s already exists', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- A consumer group with its lag; PB404 if there is none.
CREATE FUNCTION postbox.get_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._topic(topic_name);
    g postbox.consumer_groups;
BEGIN
    SELECT * INTO g FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
        WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- A topic's consumer groups in name order after after_name, with their lag.
CREATE FUNCTION postbox.list_consumer_groups(topic_name text, page_size integer DEFAULT 100,
                                             after_name text DEFAULT '')
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._topic(topic_name);
BEGIN
    RETURN QUERY
    SELECT v.* FROM postbox.consumer_groups g, LATERAL postbox._consumer_group_view(g, t.name) v
    WHERE g.topic_id = t.id AND g.name > coalesce(after_name, '')
    ORDER BY g.name
    LIMIT page_size;
END
$$;

-- Sets whether a consumer group is paused; the group as get_consumer_group
-- shows it.
CREATE FUNCTION postbox._set_group_paused(topic_name text, group_name text, pause boolean)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
BEGIN
    UPDATE postbox.consumer_groups c SET paused = pause WHERE c.id = g.id RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- Pauses a consumer group (since 0.9.0): its reads fail with PB503 until
-- resume_consumer_group; a batch out now may still be acknowledged. The group
-- keeps its cursor, so rotation keeps the rows past it. Pausing a paused group
-- changes nothing.
CREATE FUNCTION postbox.pause_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE sql AS $$
    SELECT * FROM postbox._set_group_paused(topic_name, group_name, true)
$$;

-- Lets a paused consumer group read again, from its cursor.
CREATE FUNCTION postbox.resume_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE sql AS $$
    SELECT * FROM postbox._set_group_paused(topic_name, group_name, false)
$$;

-- Deletes a consumer group; its rows of the log no longer wait for it.
CREATE FUNCTION postbox.delete_consumer_group(topic_name text, group_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._topic(topic_name), group_name);
BEGIN
    DELETE FROM postbox.consumer_groups WHERE id = g.id;
END
$$;

-- Reads the next batch of a consumer group: up to max_messages (1-1000) rows
-- past its cursor, leased for lease_duration (1 second to 12 hours), with a
-- token (batch) that ack_stream takes. Returns no rows when the group's batch
-- is out with another consumer (its lease running, or a read of the group in
-- progress), when nothing is past the cursor, or, as batch controls, when
-- fewer than min_messages (1 to max_messages) are and the first of them has
-- waited less than max_batch_wait (NULL: no limit). A batch whose lease ran out
-- comes back whole, to the next read, with its delivery_count one higher: a
-- group gets every message at least once. Messages given back (ack_stream's
-- nack_offsets) whose delay has passed lead a new batch, in offset order,
-- whatever the batch controls say (they waited already), each with its own
-- delivery_count (batch_delivery_count is the batch's); new messages of the
-- log fill the rest of it. With max_deliveries, the messages of a batch whose
-- lease ran out that have gone out that many times become dead letters
-- ('lease expired') rather than go out again; the cursor moves past the log's.
-- A read appends its topic's delayed messages that are due to the log (see
-- _publish_due_streams): the next read can have them.
CREATE FUNCTION postbox.read_stream(topic_name text, group_name text, max_messages integer DEFAULT 100,
                                    lease_duration interval DEFAULT '30 seconds', min_messages integer DEFAULT 1,
                                    max_batch_wait interval DEFAULT NULL)
RETURNS TABLE (batch uuid, stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               batch_delivery_count integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
    horizon xid8;
    waiting integer;
    first_at timestamptz;
    end_tx xid8;
    end_offset bigint;
    due integer := 0;
    previous uuid;
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000, not %s', max_messages));
    ELSIF lease_duration IS NULL OR lease_duration < interval '1 second' OR lease_duration > interval '12 hours' THEN
        PERFORM postbox._invalid(format('lease_duration must be from 1 second to 12 hours, not %s', lease_duration));
    ELSIF min_messages IS NULL OR min_messages NOT BETWEEN 1 AND max_messages THEN
        PERFORM postbox._invalid(format('min_messages must be from 1 to max_messages (%s), not %s', max_messages,
                                        min_messages));
    ELSIF max_batch_wait < interval '0' THEN
        PERFORM postbox._invalid(format('max_batch_wait must not be negative, not %s', max_batch_wait));
    END IF;
    g := postbox._consumer_group(t, group_name, skip_locked => true);
    IF g.paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'consumer group %s of topic %s is paused; ResumeConsumerGroup lets reads in again',
            quote_literal(group_name), quote_literal(topic_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.stream_delayed d WHERE d.topic_id = t.id AND d.deliver_at <= now()) THEN
        PERFORM postbox._publish_due_streams(t.id, 1000);
    END IF;
    IF g.id IS NULL OR (g.lease IS NOT NULL AND g.lease_expires_at > now()) THEN
        RETURN;
    END IF;
    IF g.lease IS NOT NULL AND g.max_deliveries IS NOT NULL THEN
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT g.id, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, 'lease expired'
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries
        UNION ALL
        SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
               l.attributes, l.body, g.lease_deliveries, 'lease expired'
        FROM postbox.stream_log l
        WHERE g.lease_deliveries >= g.max_deliveries AND l.topic_id = t.id
              AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
              AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
        DELETE FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries;
        IF g.lease_deliveries >= g.max_deliveries THEN
            -- The batch is done with: a new one goes out, the batch's retries left
            -- under the limit are due in it.
            g.cursor_tx := g.lease_end_tx;
            g.cursor_offset := g.lease_end_offset;
            g.lease := NULL;
            UPDATE postbox.consumer_groups c
            SET cursor_tx = g.cursor_tx, cursor_offset = g.cursor_offset, acked_at = now(), lease = NULL,
                lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
            WHERE c.id = g.id;
        END IF;
    END IF;
    previous := g.lease;
    IF g.lease IS NULL THEN
        -- Given-back messages out with a batch a seek called back wait no longer.
        SELECT count(*) INTO due
        FROM (SELECT FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.visible_at <= now()
              LIMIT max_messages) AS d;
        horizon := pg_snapshot_xmin(pg_current_snapshot());
        SELECT count(*), min(r.published_at), (array_agg(r.tx ORDER BY r.tx DESC, r.stream_offset DESC))[1],
               (array_agg(r.stream_offset ORDER BY r.tx DESC, r.stream_offset DESC))[1]
        INTO waiting, first_at, g.lease_end_tx, g.lease_end_offset
        FROM (SELECT l.tx, l.stream_offset, l.published_at FROM postbox.stream_log l
              WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset) AND l.tx < horizon
              ORDER BY l.tx, l.stream_offset
              LIMIT max_messages - due) AS r;
        IF due = 0 AND (waiting = 0 OR (waiting < min_messages
                                        AND (max_batch_wait IS NULL OR first_at > now() - max_batch_wait))) THEN
            RETURN;
        ELSIF waiting = 0 THEN
            g.lease_end_tx := g.cursor_tx;  -- given-back messages alone: the ack leaves the cursor
            g.lease_end_offset := g.cursor_offset;
        END IF;
        g.lease_deliveries := 0;
    END IF;
    UPDATE postbox.consumer_groups c
    SET lease = gen_random_uuid(), lease_expires_at = now() + lease_duration, lease_end_tx = g.lease_end_tx,
        lease_end_offset = g.lease_end_offset, lease_deliveries = g.lease_deliveries + 1, read_at = now()
    WHERE c.id = g.id
    RETURNING c.lease, c.lease_deliveries INTO g.lease, g.lease_deliveries;
    IF previous IS NULL AND waiting > 0 THEN
        -- The new batch's messages of the log, first read now: their latency.
        INSERT INTO postbox.stream_latency AS s (group_id, bucket, counts)
        SELECT g.id, date_bin('10 seconds', now(), 'epoch'), array_agg(coalesce(c.n, 0) ORDER BY b.i)
        FROM generate_series(0, 15) AS b(i)
        LEFT JOIN (SELECT width_bucket(extract(epoch FROM clock_timestamp() - l.published_at)::double precision,
                                       postbox._stream_latency_bounds()) AS i, count(*) AS n
                   FROM postbox.stream_log l
                   WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                         AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
                   GROUP BY 1) AS c ON c.i = b.i
        ON CONFLICT ON CONSTRAINT stream_latency_pkey DO UPDATE
        SET counts = ARRAY(SELECT u.x + u.y FROM unnest(s.counts, excluded.counts) WITH ORDINALITY AS u(x, y, k)
                           ORDER BY u.k);
    END IF;
    -- The given-back messages go out with the batch: those that are due to a new
    -- batch, those of the batch whose lease ran out with it again.
    UPDATE postbox.stream_retries r SET batch = g.lease, deliveries = r.deliveries + 1
    WHERE r.group_id = g.id
          AND CASE WHEN previous IS NULL
                   THEN r.stream_offset IN (SELECT d.stream_offset FROM postbox.stream_retries d
                                            WHERE d.group_id = g.id AND d.visible_at <= now()
                                            ORDER BY d.stream_offset LIMIT due)
                   ELSE r.batch = previous END;
    RETURN QUERY
    SELECT b.batch, b.stream_offset, b.published_at, b.publish_id, b.routing_key, b.ordering_key, b.subject,
           b.attributes, b.body, b.delivery_count, g.lease_deliveries
    FROM (SELECT 0 AS part, '0'::xid8 AS tx, g.lease AS batch, r.stream_offset, r.published_at, r.publish_id,
                 r.routing_key, r.ordering_key, r.subject, r.attributes, r.body, r.deliveries AS delivery_count
          FROM postbox.stream_retries r
          WHERE r.group_id = g.id AND r.batch = g.lease
          UNION ALL
          SELECT 1, l.tx, g.lease, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key,
                 l.subject, l.attributes, l.body, g.lease_deliveries
          FROM postbox.stream_log l
          WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)) AS b
    ORDER BY b.part, b.tx, b.stream_offset;
END
$$;

-- Acknowledges a batch of read_stream: the group's cursor moves past it.
-- The messages of the batch whose offsets are in nack_offsets are given back
-- instead (a nack): they go out to the group again, in a later batch, once
-- nack_delay (0 to 12 hours) has passed, while the group reads on; those that
-- have gone out max_deliveries times become dead letters ('nacked'). PB412 when
-- the batch is no longer the group's: its lease ran out and it went out again,
-- it was acknowledged already, or the group was sought since. Returns the
-- group's cursor (the offset of the batch's last row of the log).
CREATE FUNCTION postbox.ack_stream(topic_name text, group_name text, batch uuid,
                                   nack_offsets bigint[] DEFAULT '{}', nack_delay interval DEFAULT '0 seconds')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    stray bigint;
BEGIN
    IF batch IS NULL THEN
        PERFORM postbox._invalid('batch is required: the token read_stream returned with the batch');
    ELSIF nack_delay IS NULL OR nack_delay < interval '0' OR nack_delay > interval '12 hours' THEN
        PERFORM postbox._invalid(format('nack_delay must be from 0 seconds to 12 hours, not %s', nack_delay));
    END IF;
    IF g.lease IS DISTINCT FROM batch THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'batch %s is not the batch out of consumer group %s: its lease ran out and it went out again, it was '
            'acknowledged already, or the group was sought since', batch, quote_literal(group_name));
    END IF;
    nack_offsets := coalesce(nack_offsets, '{}');
    SELECT o INTO stray FROM unnest(nack_offsets) AS o
    WHERE o IS NULL
          OR (NOT EXISTS (SELECT FROM postbox.stream_retries r
                          WHERE r.group_id = g.id AND r.batch = g.lease AND r.stream_offset = o)
              AND NOT EXISTS (SELECT FROM postbox.stream_log l
                              WHERE l.topic_id = g.topic_id AND l.stream_offset = o
                                    AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                                    AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)))
    LIMIT 1;
    IF FOUND THEN
        PERFORM postbox._invalid(format('nack_offsets: %s is not the offset of a message of batch %s',
                                        coalesce(stray::text, 'NULL'), batch));
    END IF;
    -- Nacked messages of the log are copied aside; nacked ones that were given
    -- back before wait again; the batch's other given-back ones are done. Then
    -- the nacked ones out of deliveries go on to the dead letters.
    INSERT INTO postbox.stream_retries AS r (group_id, stream_offset, published_at, publish_id, routing_key,
                                             ordering_key, subject, attributes, body, deliveries, visible_at)
    SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
           l.attributes, l.body, g.lease_deliveries, now() + nack_delay
    FROM postbox.stream_log l
    WHERE l.topic_id = g.topic_id AND l.stream_offset = ANY (nack_offsets)
          AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
    ON CONFLICT ON CONSTRAINT stream_retries_pkey DO UPDATE
    SET deliveries = greatest(r.deliveries, excluded.deliveries), visible_at = excluded.visible_at, batch = NULL;
    UPDATE postbox.stream_retries r SET batch = NULL, visible_at = now() + nack_delay
    WHERE r.group_id = g.id AND r.batch = g.lease AND r.stream_offset = ANY (nack_offsets);
    DELETE FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.batch = g.lease;
    IF g.max_deliveries IS NOT NULL THEN
        WITH dead AS (
            DELETE FROM postbox.stream_retries r
            WHERE r.group_id = g.id AND r.stream_offset = ANY (nack_offsets) AND r.deliveries >= g.max_deliveries
            RETURNING r.*)
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT dead.group_id, dead.stream_offset, dead.published_at, dead.publish_id, dead.routing_key,
               dead.ordering_key, dead.subject, dead.attributes, dead.body, dead.deliveries, 'nacked'
        FROM dead
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
    END IF;
    UPDATE postbox.consumer_groups
    SET cursor_tx = lease_end_tx, cursor_offset = lease_end_offset, acked_at = now(), lease = NULL,
        lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE id = g.id;
    RETURN g.lease_end_offset;
END
$$;

-- Sets a consumer group's max_deliveries to delivery_limit (1-1000; NULL:
-- never): a message
-- the group fails on after that many deliveries goes to its dead letters.
-- Returns the group as get_consumer_group.
CREATE FUNCTION postbox.set_consumer_group_max_deliveries(topic_name text, group_name text,
                                                          delivery_limit integer)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
BEGIN
    PERFORM postbox._invalid(postbox._max_deliveries_problem(delivery_limit))
    WHERE postbox._max_deliveries_problem(delivery_limit) IS NOT NULL;
    UPDATE postbox.consumer_groups c SET max_deliveries = delivery_limit WHERE c.id = g.id RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- A consumer group's dead letters in offset order after after_offset (0: from
-- the first), at most page_size (1-1001), each with the deliveries it had,
-- when and why it died. PB404 if the group does not exist.
CREATE FUNCTION postbox.list_stream_dead_letters(topic_name text, group_name text, page_size integer DEFAULT 100,
                                                 after_offset bigint DEFAULT 0)
RETURNS TABLE (stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               dead_at timestamptz, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    dead_group integer;
BEGIN
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1001 THEN
        PERFORM postbox._invalid(format('page_size must be from 1 to 1001, not %s', page_size));
    END IF;
    SELECT c.id INTO dead_group FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY
    SELECT d.stream_offset, d.published_at, d.publish_id, d.routing_key, d.ordering_key, d.subject, d.attributes,
           d.body, d.deliveries, d.dead_at, d.reason
    FROM postbox.stream_dead_letters d
    WHERE d.group_id = dead_group AND d.stream_offset > coalesce(after_offset, 0)
    ORDER BY d.stream_offset
    LIMIT page_size;
END
$$;

-- Replays a consumer group's dead letters, those with the given offsets
-- (NULL: all): each goes out to the group again in its next batch, as a
-- message given back, with max_deliveries deliveries to go. An offset that is
-- no dead letter of the group is passed over. Returns how many were replayed.
CREATE FUNCTION postbox.replay_stream_dead_letters(topic_name text, group_name text, offsets bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    replayed bigint;
BEGIN
    -- Under the group's lock (_consumer_group): no read of the group runs meanwhile.
    WITH replay AS (
        DELETE FROM postbox.stream_dead_letters d
        WHERE d.group_id = g.id AND (offsets IS NULL OR d.stream_offset = ANY (offsets))
        RETURNING d.*),
    queued AS (
        INSERT INTO postbox.stream_retries (group_id, stream_offset, published_at, publish_id, routing_key,
                                            ordering_key, subject, attributes, body, deliveries, visible_at)
        SELECT r.group_id, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key,
               r.subject, r.attributes, r.body, 0, now()
        FROM replay r
        ON CONFLICT ON CONSTRAINT stream_retries_pkey DO NOTHING  -- it is to go out again already
        RETURNING 1)
    SELECT count(*) INTO replayed FROM replay;
    RETURN replayed;
END
$$;

-- Deletes a consumer group's dead letters that died before older_than.
-- Returns how many it deleted.
CREATE FUNCTION postbox.purge_stream_dead_letters(topic_name text, group_name text, older_than timestamptz)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    g postbox.consumer_groups := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    purged bigint;
BEGIN
    IF older_than IS NULL THEN
        PERFORM postbox._invalid('older_than is required: dead letters that died before it are purged');
    END IF;
    DELETE FROM postbox.stream_dead_letters d WHERE d.group_id = g.id AND d.dead_at < older_than;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END
$$;

-- Moves a consumer group's cursor to read again, or skip, from a point on:
-- just before the message with offset to_offset (0 or more), or the first
-- published at to_time or later (one of them; see _stream_position). A batch
-- out is called back: its ack fails. Returns the group as get_consumer_group.
CREATE FUNCTION postbox.seek_consumer_group(topic_name text, group_name text, to_offset bigint DEFAULT NULL,
                                            to_time timestamptz DEFAULT NULL)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
    target record;
BEGIN
    IF (to_offset IS NULL) = (to_time IS NULL) THEN
        PERFORM postbox._invalid('give one of to_offset and to_time');
    ELSIF to_offset < 0 THEN
        PERFORM postbox._invalid(format('to_offset must be 0 or more, not %s', to_offset));
    END IF;
    SELECT * INTO target FROM postbox._stream_position(t.id, to_offset, to_time);
    UPDATE postbox.consumer_groups c
    SET cursor_tx = target.tx, cursor_offset = target.stream_offset, lease = NULL, lease_expires_at = NULL,
        lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE c.id = g.id
    RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- Whether a retired slot of the log may go: for every stream topic with rows
-- in it, the slot was retired longer ago than the topic's retention, and every
-- consumer group of the topic has acknowledged the topic's last row there.
CREATE FUNCTION postbox._stream_slot_done(slot smallint, retired_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT FROM postbox.topics t
        CROSS JOIN LATERAL (SELECT l.tx, l.stream_offset FROM postbox.stream_log l
                            WHERE l.slot = _stream_slot_done.slot AND l.topic_id = t.id
                            ORDER BY l.tx DESC, l.stream_offset DESC LIMIT 1) last
        WHERE t.stream_retention IS NOT NULL
              AND (retired_at > now() - t.stream_retention
                   OR EXISTS (SELECT FROM postbox.consumer_groups g
                              WHERE g.topic_id = t.id
                                    AND (g.cursor_tx, g.cursor_offset) < (last.tx, last.stream_offset))))
$$;

-- One pass of the log's rotation (the servers' maintenance workers run it):
-- truncates every retired slot that is done (see _stream_slot_done), then
-- retires the current slot, if it holds rows and has been current for
-- rotation_period (NULL: half the shortest stream retention, at most an hour),
-- in favour of an empty one. A slot whose lock is not free
-- within lock_wait (a reader, or a transaction that appended to it, holds it)
-- is left for the next pass: nobody waits behind a TRUNCATE for longer. Returns
-- how many slots it truncated. One pass at a time; a second returns 0 at once.
CREATE FUNCTION postbox.rotate_streams(rotation_period interval DEFAULT NULL,
                                       lock_wait interval DEFAULT '20 milliseconds') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.stream_slots;
    truncated integer := 0;
    previous_lock_timeout text := current_setting('lock_timeout');
    empty_slot smallint;
BEGIN
    IF rotation_period < interval '0' THEN
        PERFORM postbox._invalid(format('rotation_period must not be negative, not %s', rotation_period));
    ELSIF lock_wait IS NULL OR lock_wait < interval '1 millisecond' OR lock_wait > interval '10 seconds' THEN
        PERFORM postbox._invalid(format('lock_wait must be from 1 millisecond to 10 seconds, not %s', lock_wait));
    END IF;
    IF NOT pg_try_advisory_xact_lock(1886350201, 0) THEN
        RETURN 0;
    END IF;
    FOR s IN SELECT * FROM postbox.stream_slots WHERE state = 'retired' ORDER BY since LOOP
        CONTINUE WHEN NOT postbox._stream_slot_done(s.slot, s.since);
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::integer::text, true);
            EXECUTE format('LOCK TABLE postbox.stream_log_%s IN ACCESS EXCLUSIVE MODE', s.slot);
            PERFORM set_config('lock_timeout', previous_lock_timeout, true);
            -- Again under the lock: a publish that read the slot as current before
            -- it was retired may have added rows since.
            IF postbox._stream_slot_done(s.slot, s.since) THEN
                EXECUTE format('TRUNCATE postbox.stream_log_%s', s.slot);
                UPDATE postbox.stream_slots SET state = 'empty', since = now() WHERE slot = s.slot;
                truncated := truncated + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', previous_lock_timeout, true);
        END;
    END LOOP;
    rotation_period := coalesce(rotation_period, least(interval '1 hour', (SELECT min(t.stream_retention) / 2
                                                                         FROM postbox.topics t)));
    SELECT * INTO s FROM postbox.stream_slots WHERE state = 'current';
    IF s.since <= now() - rotation_period AND EXISTS (SELECT FROM postbox.stream_log l WHERE l.slot = s.slot) THEN
        SELECT e.slot INTO empty_slot FROM postbox.stream_slots e
        WHERE e.state = 'empty' ORDER BY (e.slot - s.slot + 4) % 4 LIMIT 1;
        IF FOUND THEN
            -- Retention counts from here: a publish that still appends to this slot
            -- read it as current, so it took its publish time before this commits.
            UPDATE postbox.stream_slots SET state = 'retired', since = clock_timestamp() WHERE slot = s.slot;
            UPDATE postbox.stream_slots SET state = 'current', since = now() WHERE slot = empty_slot;
        END IF;
    END IF;
    RETURN truncated;
END
$$;

-- Consumer groups' lag for the servers' metrics: up to max_groups groups, in
-- topic and group name order.
CREATE FUNCTION postbox.stream_metrics(max_groups integer DEFAULT 1000)
RETURNS TABLE (topic text, name text, lag_messages bigint, lag_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT v.topic, v.name, v.lag_messages, v.lag_seconds
    FROM postbox.consumer_groups g
    JOIN postbox.topics t ON t.id = g.topic_id
    CROSS JOIN LATERAL postbox._consumer_group_view(g, t.name) v
    ORDER BY t.name, g.name
    LIMIT max_groups
$$;

-- Publish-to-first-read latency of each consumer group that read in the last
-- `recent` (10 seconds to 1 hour, in whole 10-second buckets): how many
-- messages its new batches took, and the 50th, 95th and 99th percentiles of
-- their latency, each the upper bound of the bin it falls in (5 ms to 30
-- minutes; Infinity above), so never understated. Latency counts from the
-- publish to the read that took the message first: time waiting for the
-- group's batch, for the horizon (see Order above), or for a delay.
CREATE FUNCTION postbox.stream_latency(recent interval DEFAULT '5 minutes')
RETURNS TABLE (topic text, consumer_group text, messages bigint, p50_seconds double precision,
               p95_seconds double precision, p99_seconds double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF recent IS NULL OR recent < interval '10 seconds' OR recent > interval '1 hour' THEN
        PERFORM postbox._invalid(format('recent must be from 10 seconds to 1 hour, not %s', recent));
    END IF;
    RETURN QUERY
    WITH bins AS (
        SELECT s.group_id, b.i, sum(b.n) AS n
        FROM postbox.stream_latency s, unnest(s.counts) WITH ORDINALITY AS b(n, i)
        WHERE s.bucket > now() - recent
        GROUP BY s.group_id, b.i),
    cumulative AS (
        SELECT bins.group_id, bins.i, sum(bins.n) OVER (PARTITION BY bins.group_id ORDER BY bins.i) AS upto,
               sum(bins.n) OVER (PARTITION BY bins.group_id) AS total
        FROM bins)
    SELECT t.name, g.name, max(c.total)::bigint,
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.50 * c.total)], 'Infinity'),
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.95 * c.total)], 'Infinity'),
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.99 * c.total)], 'Infinity')
    FROM cumulative c
    JOIN postbox.consumer_groups g ON g.id = c.group_id
    JOIN postbox.topics t ON t.id = g.topic_id
    WHERE c.total > 0
    GROUP BY t.name, g.name
    ORDER BY t.name, g.name;
END
$$;

-- Each consumer group's health (the view stream_health), as queue_health is
-- each queue's: 'critical'
-- when its oldest unacknowledged message (past its cursor, or given back) is
-- older than postbox.health_critical_age (default 1 hour) or it holds
-- postbox.health_critical_dlq_depth dead letters (100); 'warning' past
-- postbox.health_warning_age (5 minutes) or postbox.health_warning_dlq_depth
-- (1), while paused, or when stuck: messages wait for it and no batch has
-- gone out to it for postbox.health_stuck_after (5 minutes). reason says
-- which. held_slots counts the log's retired slots it keeps from rotating
-- (they hold messages of its topic past its cursor); p95 and p99 are its
-- publish-to-first-read latency over the last 5 minutes (stream_latency;
-- NULL without reads). Reads the log past each cursor: seconds for a group
-- millions behind.
CREATE FUNCTION postbox.consumer_group_health()
RETURNS TABLE (topic text, consumer_group text, status text, reason text, lag_messages bigint,
               oldest_unacked_seconds double precision, retry_messages bigint, dead_letters bigint,
               paused boolean, last_read_at timestamptz, lease_expires_at timestamptz, held_slots bigint,
               latency_p95_seconds double precision, latency_p99_seconds double precision)
LANGUAGE sql STABLE AS $$
SELECT v.topic, v.name AS consumer_group,
       CASE WHEN h.critical <> '{}' THEN 'critical'
            WHEN h.warning <> '{}' THEN 'warning'
            ELSE 'ok' END AS status,
       array_to_string(h.critical || h.warning, '; ') AS reason,
       v.lag_messages, o.oldest_unacked_seconds, v.retry_messages, v.dead_letters, v.paused,
       g.read_at AS last_read_at, v.lease_expires_at, r.held_slots, lat.p95_seconds AS latency_p95_seconds,
       lat.p99_seconds AS latency_p99_seconds
FROM postbox.consumer_groups g
JOIN postbox.topics t ON t.id = g.topic_id
CROSS JOIN LATERAL postbox._consumer_group_view(g, t.name) v
CROSS JOIN LATERAL (
    SELECT greatest(v.lag_seconds,
                    (SELECT extract(epoch FROM now() - min(x.published_at))::double precision
                     FROM postbox.stream_retries x WHERE x.group_id = g.id), 0) AS oldest_unacked_seconds) o
CROSS JOIN LATERAL (
    SELECT count(*) AS held_slots FROM postbox.stream_slots s
    WHERE s.state = 'retired'
          AND EXISTS (SELECT FROM postbox.stream_log l
                      WHERE l.slot = s.slot AND l.topic_id = g.topic_id
                            AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset))) r
LEFT JOIN postbox.stream_latency('5 minutes') lat ON lat.topic = t.name AND lat.consumer_group = g.name
CROSS JOIN LATERAL (
    SELECT coalesce(nullif(current_setting('postbox.health_warning_age', true), ''), '5 minutes')::interval AS warning_age,
           coalesce(nullif(current_setting('postbox.health_critical_age', true), ''), '1 hour')::interval AS critical_age,
           coalesce(nullif(current_setting('postbox.health_warning_dlq_depth', true), ''), '1')::bigint AS warning_dlq,
           coalesce(nullif(current_setting('postbox.health_critical_dlq_depth', true), ''), '100')::bigint AS critical_dlq,
           coalesce(nullif(current_setting('postbox.health_stuck_after', true), ''), '5 minutes')::interval AS stuck_after) k
CROSS JOIN LATERAL (
    SELECT array_remove(ARRAY[
               CASE WHEN o.oldest_unacked_seconds >= extract(epoch FROM k.critical_age)
                    THEN format('oldest unacknowledged message %s s old', round(o.oldest_unacked_seconds::numeric)) END,
               CASE WHEN v.dead_letters >= k.critical_dlq THEN format('%s dead letters', v.dead_letters) END],
               NULL) AS critical,
           array_remove(ARRAY[
               CASE WHEN o.oldest_unacked_seconds >= extract(epoch FROM k.warning_age)
                         AND o.oldest_unacked_seconds < extract(epoch FROM k.critical_age)
                    THEN format('oldest unacknowledged message %s s old', round(o.oldest_unacked_seconds::numeric)) END,
               CASE WHEN v.dead_letters >= k.warning_dlq AND v.dead_letters < k.critical_dlq
                    THEN format('%s dead letters', v.dead_letters) END,
               CASE WHEN v.paused THEN 'paused' END,
               CASE WHEN NOT v.paused AND v.lag_messages + v.retry_messages > 0
                         AND coalesce(g.read_at, g.created_at) <= now() - k.stuck_after
                    THEN format('stuck: no batch taken for %s s while %s messages wait',
                                round(extract(epoch FROM now() - coalesce(g.read_at, g.created_at))),
                                v.lag_messages + v.retry_messages) END],
               NULL) AS warning) h
ORDER BY v.topic, v.name
$$;

-- consumer_group_health as a view, beside queue_health.
CREATE VIEW postbox.stream_health AS SELECT * FROM postbox.consumer_group_health();

-- The stream log's slots (see Rotation above): each one's state and since
-- when (the current slot's since is the last rotation), how many messages it
-- holds, and for a retired slot the consumer groups that keep it from being
-- truncated, as topic/group: those with messages of their topic in it past
-- their cursor. Counts each slot's rows.
CREATE VIEW postbox.stream_rotation AS
SELECT s.slot, s.state, s.since,
       (SELECT count(*) FROM postbox.stream_log l WHERE l.slot = s.slot) AS messages,
       ARRAY(SELECT t.name || '/' || g.name
             FROM postbox.consumer_groups g JOIN postbox.topics t ON t.id = g.topic_id
             WHERE s.state = 'retired'
                   AND EXISTS (SELECT FROM postbox.stream_log l
                               WHERE l.slot = s.slot AND l.topic_id = g.topic_id
                                     AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset))
             ORDER BY 1) AS held_by
FROM postbox.stream_slots s
ORDER BY s.slot;

-- queue_rates is for readers too, and so is the queue_throughput view.
-- Gives the engine's functions their privileges, and makes each public one
-- SECURITY DEFINER with a fixed search_path: a reader or writer then needs no
-- right on the tables (a writer can call send, not insert rows of its own), and
-- no schema of the caller's can shadow a function or operator the engine uses.
-- Pure (IMMUTABLE) functions and internal ones (named "_...") stay as they are:
-- they run inside a public function, whose path is fixed already, and a SET
-- clause would keep the planner from inlining them. CREATE OR REPLACE resets
-- a function's settings, so every install and upgrade script ends by calling
-- this.
CREATE OR REPLACE FUNCTION postbox._secure() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    roles boolean := (SELECT count(*) = 3 FROM pg_catalog.pg_roles
                      WHERE rolname IN ('postbox_reader', 'postbox_writer', 'postbox_admin'));
BEGIN
    FOR f IN SELECT p.oid::regprocedure AS signature, p.proname AS name, p.provolatile, p.prorettype
             FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.signature);
        IF f.provolatile <> 'i' AND f.prorettype <> 'trigger'::regtype AND left(f.name, 1) <> '_' THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp',
                           f.signature);
        END IF;
        IF roles THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_admin', f.signature);
            IF f.name IN ('queue_stats', 'queue_metrics', 'queue_rates', 'peek_messages', 'get_message',
                          'list_archived_messages', 'get_queue', 'list_queues', 'list_dead_letter_source_queues', 'list_redrive_tasks',
                          'get_topic', 'list_topics', 'get_subscription', 'list_subscriptions',
                          'list_webhook_deliveries', 'get_schedule', 'list_schedules', 'get_consumer_group',
                          'list_consumer_groups', 'stream_metrics', 'stream_position',
                          'list_stream_dead_letters', 'stream_latency', 'consumer_group_health') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader', f.signature);
            ELSIF f.name IN ('send', 'send_batch', 'publish', 'publish_batch') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_writer', f.signature);
            END IF;
        END IF;
    END LOOP;
    IF roles THEN
        GRANT USAGE ON SCHEMA postbox TO postbox_reader, postbox_writer, postbox_admin;
        GRANT ALL ON ALL TABLES IN SCHEMA postbox TO postbox_admin;
        GRANT ALL ON ALL SEQUENCES IN SCHEMA postbox TO postbox_admin;
        GRANT SELECT ON postbox.queue_health, postbox.queue_throughput, postbox.stream_health,
                        postbox.stream_rotation TO postbox_reader;
    END IF;
END
$$;

-- Issue 17: topic fan-out in one INSERT for the plain queues; a server's own sessions do not throttle their NOTIFYs.

-- The message of a routing-key check, or NULL when the key is valid: empty, or
-- up to 255 characters of words of A-Z, a-z, 0-9, "_" and "-" joined by single
-- dots. String functions, not a regular expression: this runs on every publish.
-- PL/pgSQL (since 0.9.0), so that its plan is cached: as a SQL function that
-- cannot be inlined (format is not immutable) it was parsed and planned anew in
-- every publish.
CREATE OR REPLACE FUNCTION postbox.routing_key_problem(routing_key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE
        WHEN routing_key IS NULL OR routing_key = '' THEN NULL
        WHEN length(routing_key) > 255 THEN
            format('routing key is %s characters long; the limit is 255', length(routing_key))
        WHEN ltrim(translate(routing_key, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-', ''),
                   '.') <> ''
             OR position('..' IN '.' || routing_key || '.') > 0 THEN
            format('routing key %s must be words of A-Z, a-z, 0-9, "_" and "-" joined by single dots',
                   quote_literal(routing_key))
    END;
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
-- plain_queue_ids are those pairs' queues, in id order. It runs under
-- publish_batch's plan_cache_mode.
CREATE OR REPLACE FUNCTION postbox._publish_to_plain_queues(
    queue_ids integer[], entries integer[], envelopes jsonb[], plain boolean[], plain_queue_ids integer[],
    bodies bytea[], attributes jsonb[], subjects text[], publish_ids uuid[], published_at timestamptz)
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
        SELECT p.o, q.id, q.delivery_delay, q.send_paused, q.max_message_size,
               CASE WHEN p.env IS NULL THEN bodies[p.i]
                    ELSE postbox._sns_envelope(p.env, publish_ids[p.i], published_at, subjects[p.i], bodies[p.i],
                                               attributes[p.i]) END AS b,
               -- SNS's notification JSON carries the attributes inside it.
               CASE WHEN p.env IS NULL THEN attributes[p.i] END AS a
        FROM unnest(queue_ids, entries, envelopes, plain) WITH ORDINALITY AS p(q, i, env, plain, o)
        LEFT JOIN postbox.queues q ON q.id = p.q
        WHERE p.plain
    ), inserted AS (
        INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body, priority)
        SELECT pair.id, sent_at + pair.delivery_delay, sent_at, pair.a, pair.b, 0
        FROM pair
        WHERE NOT EXISTS (SELECT FROM pair x
                          WHERE x.id IS NULL OR x.send_paused
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

-- Stream topics read by position (Spark's stream source).
-- Reads by position, for readers that keep their own positions (Spark's stream
-- source): a position is a row's (tx, offset), the order groups read in, given
-- as two bigints. read_stream_range reads without a lease or a group: up to
-- max_messages (1-1000) rows after (after_tx, after_offset) and at or before
-- (until_tx, until_offset) (NULL: no bound), in read order, and only rows whose
-- transaction is below the horizon (see Order above), so that reading a range
-- again gives the same rows, as long as rotation has not truncated them (a
-- group whose cursor stays at or before the range keeps them).
CREATE FUNCTION postbox.read_stream_range(topic_name text, after_tx bigint, after_offset bigint,
                                          until_tx bigint DEFAULT NULL, until_offset bigint DEFAULT NULL,
                                          max_messages integer DEFAULT 100)
RETURNS TABLE (tx bigint, stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._stream_topic(topic_name);
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000, not %s', max_messages));
    ELSIF after_tx IS NULL OR after_offset IS NULL OR after_tx < 0 OR after_offset < 0 THEN
        PERFORM postbox._invalid(format('after must be a position of 0 or more, not (%s, %s)', after_tx,
                                        after_offset));
    ELSIF (until_tx IS NULL) <> (until_offset IS NULL) THEN
        PERFORM postbox._invalid('give both until_tx and until_offset, or neither');
    ELSIF (until_tx, until_offset) < (after_tx, after_offset) THEN
        PERFORM postbox._invalid(format('the range ends at (%s, %s), before it starts at (%s, %s)', until_tx,
                                        until_offset, after_tx, after_offset));
    END IF;
    RETURN QUERY
    SELECT l.tx::text::bigint, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key,
           l.subject, l.attributes, l.body
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (after_tx::text::xid8, after_offset)
          AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
          AND (until_tx IS NULL OR (l.tx, l.stream_offset) <= (until_tx::text::xid8, until_offset))
    ORDER BY l.tx, l.stream_offset
    LIMIT max_messages;
END
$$;

-- Where a consumer group's cursor stands, and where the topic's log ends for
-- readers now: its last row below the horizon, or the cursor when no such row
-- is past it. PB404 if the group does not exist.
CREATE FUNCTION postbox.stream_position(topic_name text, group_name text, OUT cursor_tx bigint,
                                        OUT cursor_offset bigint, OUT end_tx bigint, OUT end_offset bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
BEGIN
    SELECT * INTO g FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    cursor_tx := g.cursor_tx::text::bigint;
    cursor_offset := g.cursor_offset;
    SELECT l.tx::text::bigint, l.stream_offset INTO end_tx, end_offset
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY l.tx DESC, l.stream_offset DESC
    LIMIT 1;
    IF NOT FOUND THEN
        end_tx := cursor_tx;
        end_offset := cursor_offset;
    END IF;
END
$$;

-- Moves a consumer group's cursor to just after a position (one that
-- read_stream_range or stream_position gave): what a reader keeping its own
-- positions commits, so that lag and rotation follow it. A batch out is called
-- back. A position past the horizon is refused: rows of transactions still
-- running could commit behind it and be skipped. Returns the group as
-- get_consumer_group.
CREATE FUNCTION postbox.set_consumer_group_cursor(topic_name text, group_name text, to_tx bigint,
                                                  to_offset bigint)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups := postbox._consumer_group(t, group_name);
    horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
BEGIN
    IF to_tx IS NULL OR to_offset IS NULL OR to_tx < 0 OR to_offset < 0 THEN
        PERFORM postbox._invalid(format('the position must be of 0 or more, not (%s, %s)', to_tx, to_offset));
    ELSIF (to_tx::text::xid8, to_offset) > (horizon, 0::bigint) THEN
        PERFORM postbox._invalid(format(
            'position (%s, %s) is past the end readers see now (%s, 0): rows still to commit could fall behind it',
            to_tx, to_offset, horizon));
    END IF;
    UPDATE postbox.consumer_groups c
    SET cursor_tx = to_tx::text::xid8, cursor_offset = to_offset, acked_at = now(), lease = NULL,
        lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE c.id = g.id
    RETURNING * INTO g;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, t.name);
END
$$;

-- Wakes receivers waiting on a queue: NOTIFY on channel "postbox" with the
-- queue name, delivered when the sending transaction commits. NOTIFY makes
-- committing transactions queue up behind one another, so only a queue that a
-- server waits on (postbox.queue_listeners) is notified; the look runs after the
-- caller's change, and listen_to's caller covers a registration that commits
-- meanwhile. And a session notifies a queue at most once per 5 ms. A
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
    IF NOT EXISTS (SELECT FROM postbox.queue_listeners l WHERE l.queue_id = q.id) THEN
        RETURN;
    END IF;
    -- A postbox server's sessions set postbox.notify_unthrottled (since 0.9.0):
    -- their server wakes its own streams after each send and skips those
    -- NOTIFYs, so every other NOTIFY of theirs must reach it.
    IF coalesce(nullif(current_setting(setting, true), ''), '0')::numeric > now_ms - 5
       AND current_setting('postbox.notify_unthrottled', true) IS DISTINCT FROM 'on' THEN
        RETURN;
    END IF;
    PERFORM set_config(setting, now_ms::text, false);
    PERFORM pg_notify('postbox', q.name);
END
$$;


-- send_batch's every case: options, FIFO order, deduplication, depth limits and
-- every error. send_batch (below) takes the plain case past it.
CREATE FUNCTION postbox._send_batch_general(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(bodies), 0);
    problem text;
    sent_at timestamptz;
    latest timestamptz;
    ids bigint[];
    resolved bigint[];
    dedup text[];
    keys text[];  -- dedupe keys; each one's last entry; the message its row named when claimed
    lasts bigint[];
    holders bigint[];
    held integer;  -- keys whose row named a message already
    with_priority boolean;
    with_keys boolean;
    filled bigint[];  -- messages that hold their key and took new content
    with_ids integer;  -- entries with a deduplication id
    claimed bigint;  -- of them, those whose id this send recorded
    adding bigint;
    depth bigint;
BEGIN
    IF q.send_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for sending; ResumeQueue lets sends in again', quote_literal(queue_name));
    END IF;
    -- A writer of the messages table from here on, before the clock is read:
    -- receive_floor stays at or before the start of every transaction that holds
    -- this lock, so a message stamped sent_at can never land behind the floor,
    -- however long the locks below keep the send waiting. (The lock is the one
    -- the insert takes anyway, and conflicts with no other writer.)
    LOCK TABLE postbox.messages IN ROW EXCLUSIVE MODE;
    sent_at := clock_timestamp();
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(attributes), cardinality(delays), cardinality(message_group_ids),
                cardinality(deduplication_ids), cardinality(dedupe_keys), cardinality(priorities),
                cardinality(deliver_ats), cardinality(ttls), cardinality(expire_ats)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    -- A message must become visible before it expires, so a delay stays below
    -- the retention (with none, below a year).
    latest := sent_at + coalesce(q.retention, interval '365 days');
    SELECT postbox._entry_prefix(c.i, n) || c.problem INTO problem
    FROM (
        SELECT e.i, CASE
            WHEN e.b IS NULL THEN 'body must not be NULL'
            WHEN q.fifo AND (e.d IS NOT NULL OR e.t IS NOT NULL) THEN
                'FIFO queues take no per-message delay; set the queue''s delivery_delay instead'
            WHEN e.d IS NOT NULL AND e.t IS NOT NULL THEN 'give a delay or a delivery time, not both'
            WHEN e.d < interval '0' THEN format('delay %s s is negative', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest AND q.retention IS NULL THEN
                format('delay %s s is beyond the longest delay, 365 days', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest THEN format(
                'delay %s s is not shorter than the queue''s retention, %s s: the message would expire before '
                'it became visible; shorten the delay or raise retention',
                trim_scale(extract(epoch FROM e.d)), trim_scale(extract(epoch FROM q.retention)))
            WHEN e.t >= latest AND q.retention IS NULL THEN
                format('delivery time %s is beyond the longest delay, 365 days from now', e.t)
            WHEN e.t >= latest THEN format(
                'delivery time %s is not before %s, when the message would expire (the queue''s retention is '
                '%s s): deliver it sooner or raise retention', e.t, latest, trim_scale(extract(epoch FROM q.retention)))
            WHEN e.l IS NOT NULL AND e.e IS NOT NULL THEN 'give a ttl or an expire_time, not both'
            WHEN e.l <= interval '0' THEN format('ttl %s s must be above 0', trim_scale(extract(epoch FROM e.l)))
            WHEN coalesce(e.e, sent_at + e.l) <= postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) THEN format(
                'the message would expire (at %s) before it became visible (at %s): expire it later or deliver it '
                'sooner', coalesce(e.e, sent_at + e.l), postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay))
            WHEN e.p NOT BETWEEN 0 AND 9 THEN format('priority %s is outside 0 to 9', e.p)
            WHEN q.fifo AND e.p > 0 THEN 'FIFO queues deliver in order; priority is for standard queues'
            WHEN q.fifo AND e.g IS NULL THEN 'FIFO queues need a message_group_id'
            -- Length and a character class, not '^[!-~]{1,128}$': the bounded repetition
            -- made the regex engine take tens of microseconds per id, more than a
            -- message's insert (the SDK's Producer gives every message an id).
            WHEN length(e.g) NOT BETWEEN 1 AND 128 OR e.g ~ '[^!-~]' THEN
                'message_group_id must be 1 to 128 printable ASCII characters'
            WHEN length(e.x) NOT BETWEEN 1 AND 128 OR e.x ~ '[^!-~]' THEN
                'deduplication_id must be 1 to 128 printable ASCII characters'
            WHEN q.fifo AND e.x IS NULL AND NOT q.content_based_deduplication THEN
                'FIFO queues need a deduplication_id unless the queue has content_based_deduplication'
            WHEN e.k IS NOT NULL AND q.fifo THEN
                'dedupe_key is for standard queues; FIFO queues deduplicate by deduplication_id'
            WHEN e.k IS NOT NULL AND e.x IS NOT NULL THEN 'give a dedupe_key or a deduplication_id, not both'
            WHEN length(e.k) NOT BETWEEN 1 AND 256 THEN 'dedupe_key must be 1 to 256 characters'
            WHEN postbox.message_size(e.b, e.a) > q.max_message_size THEN format(
                'message is %s bytes; the queue takes at most %s (body and attributes)',
                postbox.message_size(e.b, e.a), q.max_message_size)
        END AS problem
        FROM unnest(bodies, delays, deliver_ats, priorities, message_group_ids, deduplication_ids,
                    dedupe_keys, attributes, ttls, expire_ats) WITH ORDINALITY AS e(b, d, t, p, g, x, k, a, l, e, i)
    ) AS c
    WHERE c.problem IS NOT NULL
    ORDER BY c.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;

    PERFORM postbox._lock_queue(q, false);
    with_priority := EXISTS (SELECT FROM unnest(priorities) p WHERE p > 0);
    with_keys := EXISTS (SELECT FROM unnest(dedupe_keys) k WHERE k IS NOT NULL);
    IF with_priority AND NOT q.prioritized OR with_keys AND NOT q.keyed THEN
        PERFORM postbox._mark_queue(q.id, with_priority, with_keys);
    END IF;
    IF NOT q.fifo AND NOT q.content_based_deduplication AND q.max_depth IS NULL
       AND deduplication_ids IS NULL AND dedupe_keys IS NULL THEN
        -- The common case, in one statement: identity values are drawn in
        -- insertion order, so id order is input order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body, priority,
                                          message_group_id, expires_at)
            SELECT q.id, postbox._visible_at(sent_at, d, t, q.delivery_delay), sent_at,
                   a, b, coalesce(p, 0), g, coalesce(x, sent_at + l)
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, ttls, expire_ats)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, l, x, i)
            ORDER BY i
            RETURNING id, expires_at
        ), expiring AS (
            INSERT INTO postbox.message_expiries (message_id, expires_at)
            SELECT id, expires_at FROM inserted WHERE expires_at IS NOT NULL
        )
        SELECT id, false FROM inserted ORDER BY id;
        PERFORM postbox._notify(q);
        RETURN;
    END IF;

    -- FIFO groups are locked before ids are drawn, so a group's id order is the
    -- order in which its sends commit.
    IF q.fifo THEN
        PERFORM postbox._lock_groups(q.id, message_group_ids);
    END IF;
    SELECT array_agg(nextval('postbox.messages_id_seq') ORDER BY s) INTO ids FROM generate_series(1, n) AS s;
    resolved := ids;

    -- Deduplication: the first entry with an id claims it unless the queue saw it
    -- within its window (a concurrent claimer is waited for); the rest resolve to
    -- the claimer's message. An entry with a dedupe_key is never deduplicated by
    -- content: its key decides, and it may not become a message of its own id, so
    -- a recorded hash would point later sends at a message that never existed.
    dedup := ARRAY(
        SELECT CASE WHEN k IS NULL THEN
                   coalesce(x, CASE WHEN q.content_based_deduplication THEN encode(sha256(b), 'hex') END)
               END
        FROM unnest(bodies, deduplication_ids, dedupe_keys) WITH ORDINALITY AS e(b, x, k, i) ORDER BY i);
    with_ids := cardinality(array_remove(dedup, NULL));
    IF with_ids > 0 THEN
        INSERT INTO postbox.deduplication AS d (queue_id, deduplication_id, message_id, expires_at)
        SELECT DISTINCT ON (e.x) q.id, e.x, ids[e.i], sent_at + q.deduplication_window
        FROM unnest(dedup) WITH ORDINALITY AS e(x, i)
        WHERE e.x IS NOT NULL
        ORDER BY e.x, e.i
        ON CONFLICT (queue_id, deduplication_id) DO UPDATE
        SET message_id = excluded.message_id, expires_at = excluded.expires_at
        WHERE d.expires_at <= sent_at;
        GET DIAGNOSTICS claimed = ROW_COUNT;
        -- Every entry with an id claimed it (the ids were distinct, none seen within
        -- the window): each resolves to its own message, and the look-ups, one index
        -- scan per entry, are skipped (a tenth of a Producer's batch in the database).
        IF claimed < with_ids THEN
            resolved := ARRAY(
                SELECT coalesce((SELECT d.message_id FROM postbox.deduplication d
                                 WHERE d.queue_id = q.id AND d.deduplication_id = e.x), ids[e.i])
                FROM unnest(dedup) WITH ORDINALITY AS e(x, i) ORDER BY e.i);
        END IF;
    END IF;

    -- Idempotent enqueue: the last entry of a key carries the content. The
    -- key's row in dedupe_keys, locked first (in key order, so two batches
    -- never wait on each other in a circle), names the message that holds the
    -- key. While that message waits (not received, removed or expired) it takes
    -- the content; otherwise the entry becomes a message of its own, which the
    -- row then names. Receives and removals free keys without waiting for rows
    -- (see _free_keys), so a row may name a message that holds its key no more.
    IF dedupe_keys IS NOT NULL THEN
        SELECT array_agg(l.k ORDER BY l.k), array_agg(l.i ORDER BY l.k) INTO keys, lasts
        FROM (SELECT DISTINCT ON (e.k) e.k, e.i FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
              WHERE e.k IS NOT NULL ORDER BY e.k, e.i DESC) AS l;
        WITH claimed AS (
            INSERT INTO postbox.dedupe_keys AS d (queue_id, dedupe_key, message_id)
            SELECT q.id, l.k, ids[l.i] FROM unnest(keys, lasts) WITH ORDINALITY AS l(k, i, n) ORDER BY l.n
            ON CONFLICT (queue_id, dedupe_key) DO UPDATE SET message_id = d.message_id  -- locks, keeps
            RETURNING d.dedupe_key, d.message_id
        )
        SELECT array_agg(c.message_id ORDER BY l.n), count(*) FILTER (WHERE c.message_id <> ALL (ids))
        INTO holders, held
        FROM unnest(keys) WITH ORDINALITY AS l(k, n) JOIN claimed c ON c.dedupe_key = l.k;
        IF held > 0 THEN
            -- A statement of its own: its snapshot sees a holder whose send
            -- committed while the claim waited for the key's row.
            WITH filled AS (
                UPDATE postbox.messages m
                SET body = bodies[h.i], attributes = _send_batch_general.attributes[h.i],
                    priority = coalesce(priorities[h.i], 0),
                    expires_at = coalesce(expire_ats[h.i], sent_at + ttls[h.i])
                FROM unnest(keys, lasts, holders) AS h(k, i, id)
                WHERE m.id = h.id AND h.id <> ids[h.i] AND m.queue_id = q.id AND m.dedupe_key = h.k
                  AND NOT coalesce(m.enqueued_at < now() - q.retention OR m.expires_at <= now(), false)
                RETURNING m.id
            )
            SELECT array_agg(f.id) INTO filled FROM filled f;
            -- Their expiries as they are now.
            DELETE FROM postbox.message_expiries WHERE message_id = ANY (filled);
            IF ttls IS NOT NULL OR expire_ats IS NOT NULL THEN
                INSERT INTO postbox.message_expiries (message_id, expires_at)
                SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.id = ANY (filled) AND m.expires_at IS NOT NULL;
            END IF;
            IF coalesce(cardinality(filled), 0) < held THEN
                -- Keys whose message holds them no more name the message this send makes.
                UPDATE postbox.dedupe_keys d SET message_id = ids[h.i]
                FROM unnest(keys, lasts, holders) AS h(k, i, id)
                WHERE d.queue_id = q.id AND d.dedupe_key = h.k AND h.id <> ids[h.i]
                  AND h.id <> ALL (coalesce(filled, '{}'));
            END IF;
        END IF;
        -- A key's entries resolve to the message that took the content, or to the
        -- key's last entry, which the insert below makes a message.
        SELECT ARRAY(
            SELECT CASE WHEN e.k IS NULL THEN resolved[e.i]
                        WHEN h.id = ANY (filled) THEN h.id
                        ELSE ids[h.i] END
            FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
            LEFT JOIN unnest(keys, lasts, holders) AS h(k, i, id) ON h.k = e.k
            ORDER BY e.i)
        INTO resolved;
    END IF;

    IF q.max_depth IS NOT NULL THEN
        -- Bounded queues take their sends one at a time, so the count is exact.
        PERFORM pg_advisory_xact_lock(1886350199, q.id);  -- 'posu'
        SELECT count(*) FILTER (WHERE r = id) INTO adding FROM unnest(resolved, ids) AS e(r, id);
        SELECT count(*) INTO depth
        FROM (SELECT FROM postbox.messages WHERE queue_id = q.id LIMIT q.max_depth + 1) AS s;
        IF depth + adding > q.max_depth THEN
            RAISE EXCEPTION USING ERRCODE = 'PB429', MESSAGE = format(
                'queue %s holds %s messages and its max_depth is %s, so %s more do not fit; '
                'receive some or raise max_depth', quote_literal(queue_name), depth, q.max_depth, adding);
        END IF;
    END IF;

    -- Every entry that is a message of its own: no duplicate, and for a key the
    -- last entry, when the key's message did not take its content.
    INSERT INTO postbox.messages (id, queue_id, visible_at, enqueued_at, attributes, body, priority,
                                  message_group_id, deduplication_id, dedupe_key, expires_at)
    OVERRIDING SYSTEM VALUE
    SELECT ids[e.i], q.id,
           CASE WHEN q.fifo AND (row_number() OVER (PARTITION BY e.g ORDER BY e.i) > 1
                                 OR EXISTS (SELECT FROM postbox.messages x
                                            WHERE x.queue_id = q.id AND x.message_group_id = e.g))
                THEN 'infinity'
                ELSE postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) END,
           sent_at, e.a, e.b, coalesce(e.p, 0), e.g, e.x, e.k, coalesce(e.e, sent_at + e.l)
    FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedup,
                dedupe_keys, resolved, ttls, expire_ats)
         WITH ORDINALITY AS e(b, a, d, t, p, g, x, k, r, l, e, i)
    WHERE e.r = ids[e.i]
    ORDER BY e.i;
    IF ttls IS NOT NULL OR expire_ats IS NOT NULL THEN
        INSERT INTO postbox.message_expiries (message_id, expires_at)
        SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.id = ANY (ids) AND m.expires_at IS NOT NULL;
    END IF;
    PERFORM postbox._notify(q);
    RETURN QUERY SELECT e.r, e.r <> ids[e.i] FROM unnest(resolved) WITH ORDINALITY AS e(r, i) ORDER BY e.i;
END
$$;

-- Sends up to 1,000 messages in one go; returns their ids in input order, and
-- whether each was a duplicate (then nothing was enqueued and the id is the
-- original message's). Entry i of every array belongs to bodies[i]; an array may
-- be NULL or shorter (missing entries are NULL):
--   attributes       see attribute_problem
--   delays           invisible this long first (NULL: the queue's delivery_delay)
--   message_group_ids  FIFO queues: required; delivery is in order per group
--   deduplication_ids  a repeat within the queue's deduplication_window is
--                      dropped (content-based when the queue says so)
--   dedupe_keys      standard queues: replaces the body and attributes of a
--                    waiting (never received) message with the same key
--   priorities       0-9, standard queues; higher is received first
--   deliver_ats      invisible until then (instead of a delay)
-- Nothing is sent if any entry is invalid; the error names the entry by its
-- 0-based index. PB503 while sends are paused, PB429 when max_depth is reached.
--
-- Bodies alone into a queue without FIFO order, deduplication, a depth limit or
-- paused sends take a straight path of two statements: the general one's
-- checks and branches cost as much as the insert of a hundred messages. It
-- takes, in one expression (an assignment is evaluated without starting a
-- statement), its transaction id and the queue's lock by name, then looks the
-- queue up:
--   * the lock first, so the look sees a drop that committed meanwhile, and the
--     insert needs no second look;
--   * the transaction id first, so that a listing that the look misses sees
--     this transaction in progress, and waits for it (see listen_to).
-- The clock is read in the insert, which holds the table's lock by then (see
-- the general path). Only in READ COMMITTED: elsewhere the look reads the
-- transaction's snapshot, which may predate a drop, and the general path looks
-- under a row lock instead (see _lock_queue).
CREATE OR REPLACE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    -- The queue's, as scalars (see send).
    q_id integer;
    q_delay interval;
    q_max_message_size integer;
    q_listened boolean;
    locked text;
BEGIN
    IF num_nonnulls(attributes, delays, message_group_ids, deduplication_ids, dedupe_keys, priorities,
                    deliver_ats, ttls, expire_ats) = 0 AND cardinality(bodies) BETWEEN 1 AND 1000
       AND array_position(bodies, NULL) IS NULL AND current_setting('transaction_isolation') = 'read committed' THEN
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.max_message_size, x.listened
        INTO q_id, q_delay, q_max_message_size, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused);
    END IF;
    -- No body is longer than the whole array, so the bodies are looked at one by
    -- one only when the array is over the limit: that look cost 4% of a batch
    -- of 100 (valgrind). An expanded array (plpgsql expands its array arguments)
    -- is never compressed; the second test says so for certain. The look has an
    -- IF of its own: plpgsql runs a condition with a subquery as a statement,
    -- on every call (0.6% of a batch of 100).
    IF pg_column_size(bodies) > q_max_message_size OR pg_column_compression(bodies) IS NOT NULL THEN
        IF EXISTS (SELECT FROM unnest(bodies) AS b WHERE octet_length(b) > q_max_message_size) THEN
            q_id := NULL;  -- the general path says which body is too long
        END IF;
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error.
        RETURN QUERY SELECT * FROM postbox._send_batch_general(
            queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats);
        RETURN;
    END IF;
    -- unnest sits in the select list (a ProjectSet, where FROM unnest would first
    -- copy every body into a tuplestore), so the rows go to the insert in input
    -- order with no sort: ids are drawn, and returned, in input order (as the
    -- tests hold). The call's values are worked out once, in a one-row subquery
    -- that OFFSET 0 keeps from being pulled up: in the select list, they were
    -- evaluated for each row (0.3%).
    RETURN QUERY
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT c.queue_id, c.visible_at, c.sent_at, unnest(bodies), 0
    FROM (SELECT q_id AS queue_id, t AS sent_at, t + q_delay AS visible_at
          FROM clock_timestamp() AS t OFFSET 0) AS c
    RETURNING id, false;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
END
$$;

-- Sends one message; returns its id (the original's, for a duplicate). See
-- send_batch for the options and rules. A message that is nothing but a body,
-- into a queue without FIFO order, deduplication or a depth limit (the common
-- transactional send), takes a straight path: send_batch's checks and branches
-- cost as much as the insert itself when many sessions each send one.
CREATE OR REPLACE FUNCTION postbox.send(
    queue_name text, body bytea, attributes jsonb DEFAULT NULL, delay interval DEFAULT NULL,
    message_group_id text DEFAULT NULL, deduplication_id text DEFAULT NULL,
    dedupe_key text DEFAULT NULL, priority integer DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    ttl interval DEFAULT NULL, expire_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- The queue's, as scalars: a row variable's fields cost 5% of the call (valgrind).
    q_id integer;
    q_delay interval;
    q_listened boolean;
    locked text;
    sent_id bigint;
BEGIN
    IF body IS NOT NULL AND num_nonnulls(attributes, delay, message_group_id, deduplication_id, dedupe_key,
                                         priority, deliver_at, ttl, expire_at) = 0
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- As send_batch's straight path (see there).
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.listened INTO q_id, q_delay, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused OR octet_length(body) > x.max_message_size);
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error, as send_batch has it.
        RETURN (SELECT s.message_id FROM postbox._send_batch_general(
            queue_name, ARRAY[body], postbox._array_of(attributes), postbox._array_of(delay),
            postbox._array_of(message_group_id), postbox._array_of(deduplication_id),
            postbox._array_of(dedupe_key), postbox._array_of(priority), postbox._array_of(deliver_at),
            postbox._array_of(ttl), postbox._array_of(expire_at)) s);
    END IF;
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT q_id, c.sent_at + q_delay, c.sent_at, body, 0
    FROM (SELECT clock_timestamp() AS sent_at) AS c
    RETURNING messages.id INTO sent_id;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
    RETURN sent_id;
END
$$;

-- Stream topics: a range's positions without its rows (Spark's stream source plans
-- its partitions with them).
-- Positions only, for readers that plan their reads of a range (Spark's stream
-- source finds the end of a batch, and splits it into partitions, with it):
-- where read_stream_range with the same bounds would end after max_messages
-- (1-1000000) rows, without reading a row. last_tx and last_offset are the
-- position of the max_messages-th row after (after_tx, after_offset), at or
-- before (until_tx, until_offset) (NULL: no bound) and below the horizon, or of
-- the range's last row when it holds fewer, or (after_tx, after_offset) when it
-- holds none; message_count is how many rows that passes over. It walks the
-- index on (topic_id, tx, stream_offset) alone, never a body.
CREATE FUNCTION postbox.read_stream_positions(topic_name text, after_tx bigint, after_offset bigint,
                                              until_tx bigint DEFAULT NULL, until_offset bigint DEFAULT NULL,
                                              max_messages integer DEFAULT 100, OUT last_tx bigint,
                                              OUT last_offset bigint, OUT message_count bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics := postbox._stream_topic(topic_name);
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000000, not %s', max_messages));
    ELSIF after_tx IS NULL OR after_offset IS NULL OR after_tx < 0 OR after_offset < 0 THEN
        PERFORM postbox._invalid(format('after must be a position of 0 or more, not (%s, %s)', after_tx,
                                        after_offset));
    ELSIF (until_tx IS NULL) <> (until_offset IS NULL) THEN
        PERFORM postbox._invalid('give both until_tx and until_offset, or neither');
    ELSIF (until_tx, until_offset) < (after_tx, after_offset) THEN
        PERFORM postbox._invalid(format('the range ends at (%s, %s), before it starts at (%s, %s)', until_tx,
                                        until_offset, after_tx, after_offset));
    END IF;
    -- The rows in read order, numbered; the last of them is the highest number.
    SELECT r.tx::text::bigint, r.stream_offset, r.n INTO last_tx, last_offset, message_count
    FROM (SELECT l.tx, l.stream_offset, row_number() OVER (ORDER BY l.tx, l.stream_offset) AS n
          FROM postbox.stream_log l
          WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (after_tx::text::xid8, after_offset)
                AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
                AND (until_tx IS NULL OR (l.tx, l.stream_offset) <= (until_tx::text::xid8, until_offset))
          ORDER BY l.tx, l.stream_offset
          LIMIT max_messages) AS r
    ORDER BY r.n DESC
    LIMIT 1;
    IF NOT FOUND THEN
        last_tx := after_tx;
        last_offset := after_offset;
        message_count := 0;
    END IF;
END
$$;

-- _parse_receipts: each receipt checked once, not once per use of the check.
CREATE OR REPLACE FUNCTION postbox._parse_receipts(receipts text[])
RETURNS TABLE (i bigint, receipt text, message_id bigint, lease uuid)
LANGUAGE sql IMMUTABLE AS $$
    -- A pattern without counted repetitions, then lengths and the dashes'
    -- places: counted repetitions cost more than the rest of a delete together,
    -- and translate() walks the text character by character as multibyte.
    -- OFFSET 0 keeps `ok` a column of its own: the function is inlined, and a
    -- flattened subquery would check each receipt once for every use of `ok`
    -- (three in delete_batch), a tenth of a receive-and-delete's instructions.
    SELECT t.i, t.r,
           CASE WHEN t.ok THEN left(t.r, t.colon - 1)::bigint END,
           CASE WHEN t.ok THEN substr(t.r, t.colon + 1)::uuid END
    FROM (SELECT r, i, colon,
                 coalesce(colon BETWEEN 2 AND 19 AND octet_length(r) = colon + 36
                          AND r ~ '^[0-9]+:[0-9a-f-]+$'
                          AND octet_length(replace(r, '-', '')) = colon + 32
                          AND substr(r, colon + 9, 1) || substr(r, colon + 14, 1)
                              || substr(r, colon + 19, 1) || substr(r, colon + 24, 1) = '----',
                          false) AS ok
          FROM unnest(receipts) WITH ORDINALITY AS u(r, i), strpos(r, ':') AS colon
          OFFSET 0) AS t
$$;

-- Deletes received messages by receipt. One outcome per receipt, in order;
-- see _receipt_outcomes. Archives them if the queue archives. Since 0.9.0, on a
-- FIFO queue a receipt whose lease has run out is stale: the message heads its
-- group again for the next receive (SQS: "The receipt handle has expired").
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
    -- The queue's, as scalars, and no nested calls on the plain path: there the
    -- calls and the settings cost more than the delete (valgrind).
    q_id integer;
    q_plain boolean;
    q postbox.queues;
    parsed record;
    done bigint[];
    expiring boolean;  -- whether a deleted message had an expiry of its own
BEGIN
    SELECT x.id, NOT (x.archive_on_delete OR x.fifo) INTO q_id, q_plain
    FROM postbox.queues x WHERE x.name = queue_name;
    IF NOT FOUND THEN
        PERFORM postbox._queue(queue_name);  -- raises PB400 or PB404
    END IF;
    IF coalesce(cardinality(receipts), 0) NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._check_batch_size(cardinality(receipts));
    END IF;
    SELECT array_agg(p.message_id) AS ids, array_agg(p.lease) AS leases INTO parsed
    FROM postbox._parse_receipts(receipts) p WHERE p.message_id IS NOT NULL;
    IF NOT q_plain THEN
        q := postbox._queue(queue_name);
        IF q.fifo THEN
            SELECT array_agg(t.id) AS ids, array_agg(t.lease) AS leases INTO parsed
            FROM unnest(parsed.ids, parsed.leases) AS t(id, lease)
            WHERE NOT EXISTS (SELECT FROM postbox.messages m
                              WHERE m.id = t.id AND m.queue_id + 0 = q_id AND m.lease = t.lease
                                    AND m.visible_at <= clock_timestamp());
        END IF;
        done := postbox._remove(q, parsed.ids, parsed.leases, 'deleted');
    ELSE
        -- _remove's plain delete, here: the common case, where the call and its
        -- settings cost more than the delete. From the parsed arrays, not the
        -- parse itself: joined to that, a plan made while the table was small
        -- walked the whole table once it had grown.
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(parsed.ids, parsed.leases) AS t(id, lease)
            WHERE m.id = t.id AND m.queue_id + 0 = q_id AND m.lease = t.lease
            RETURNING m.id, m.expires_at
        )
        SELECT coalesce(array_agg(g.id), '{}'), bool_or(g.expires_at IS NOT NULL) INTO done, expiring FROM gone g;
        IF expiring THEN
            DELETE FROM postbox.message_expiries WHERE message_id = ANY (done);
        END IF;
    END IF;
    IF cardinality(done) = cardinality(receipts) THEN
        -- _receipt_outcomes' common case, without the call.
        RETURN QUERY SELECT g, 'ok' FROM generate_series(1::bigint, cardinality(receipts)) g;
    ELSE
        RETURN QUERY SELECT * FROM postbox._receipt_outcomes(postbox._queue(queue_name), receipts, done);
    END IF;
END
$$;

-- Receives through SQL start at their session's floor.
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
CREATE OR REPLACE FUNCTION postbox.receive_floor(queue_name text) RETURNS timestamptz
LANGUAGE plpgsql
-- The ordered walk, as in receive.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN postbox._receive_floor((postbox._queue(queue_name)).id);
END
$$;

-- receive_floor's work, for a queue's id.
CREATE FUNCTION postbox._receive_floor(queue_id integer) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
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
    SELECT min(m.visible_at) INTO earliest FROM postbox.messages m WHERE m.queue_id = _receive_floor.queue_id;
    RETURN least(now() - interval '1 second', writing_since, earliest);
END
$$;

-- Where a receive called without scan_from starts (since 0.9.0): this session's
-- floor for the queue, so that applications receiving through SQL skip the dead
-- entries as the server's receives do. A floor holds for later receives too (a
-- writer stamps its messages with the clock when it writes), so the session
-- keeps it in a setting, as _notify keeps its time, and computes it again once
-- it is a second old: the walk to the live rows, once a second, rather than on
-- every receive. It is
-- computed only in READ COMMITTED, where each statement sees the writers that
-- committed before it; an older snapshot would miss them and put the floor past
-- their messages. Elsewhere the last floor serves, or none (the front).
-- The session keeps "<floor> <computed at>", both in microseconds since the
-- epoch: exact, and read back whatever the session's DateStyle and time zone.
-- This is the kept floor while it is under a second old, else NULL: one
-- expression, which receive inlines (as a call it cost 3% of a receive of ten).
CREATE FUNCTION postbox._kept_floor(queue_id integer) RETURNS timestamptz
LANGUAGE sql AS $$
    SELECT CASE WHEN timestamptz 'epoch' + nullif(split_part(current_setting('postbox.floor_' || queue_id, true),
                                                             ' ', 2), '')::bigint * interval '1 microsecond'
                     > clock_timestamp() - interval '1 second'
                THEN timestamptz 'epoch' + split_part(current_setting('postbox.floor_' || queue_id, true),
                                                      ' ', 1)::bigint * interval '1 microsecond' END
$$;

-- The floor past _kept_floor: computed anew and kept in READ COMMITTED;
-- elsewhere the last one kept, or NULL.
CREATE FUNCTION postbox._session_floor(queue_id integer) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    setting text := 'postbox.floor_' || queue_id;
    floor timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN timestamptz 'epoch'  -- NULL when none was kept
               + nullif(split_part(current_setting(setting, true), ' ', 1), '')::bigint * interval '1 microsecond';
    END IF;
    floor := postbox._receive_floor(queue_id);
    PERFORM set_config(setting, (extract(epoch FROM floor) * 1000000)::bigint || ' '
                                || (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, false);
    RETURN floor;
END
$$;

-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>". The messages of one call share a
-- lease: a call delivers a message once, so the pair names the delivery, and a
-- strong random draw per row cost 5% of a receive of ten. Order: priority, then
-- visibility time, then id; FIFO queues hand out only group heads. On the way, expired
-- messages are removed and messages received max_receive_count times already
-- move to the dead-letter queue instead. A rate-limited queue returns fewer
-- messages when its tokens run short. PB503 while receives are paused.
-- scan_from: where to start in the ready index, from receive_floor (NULL: this
-- session's floor, see _kept_floor). max_bytes (since 0.8.0; NULL: no limit) bounds the claim by size: it
-- stops before the message that would take the sum of the claimed messages'
-- sizes (body, attributes and 256 bytes for the rest) past max_bytes, and always
-- claims one. `more` (on every row) says that deliverable messages were left for
-- the next call, so a caller that wants them all claims again at once.
CREATE OR REPLACE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
                                visibility_timeout interval DEFAULT NULL, scan_from timestamptz DEFAULT NULL,
                                max_bytes bigint DEFAULT NULL)
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
    IF q.receive_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for receiving; ResumeQueue lets receives in again', quote_literal(queue_name));
    END IF;
    scan_start := coalesce(scan_from, postbox._kept_floor(q.id), postbox._session_floor(q.id), '-infinity');
    IF q.receive_rate_limit IS NULL AND max_bytes IS NULL AND NOT q.prioritized AND NOT q.keyed THEN
        -- The common case in one statement: the candidates are claimed when none of
        -- them has expired or run out of receives; else, or with none, the rounds.
        -- Without priorities: the priority index's scan cost 3% of a receive of ten.
        -- Without dedupe keys, whose rows the rounds free.
        RETURN QUERY
        WITH c AS MATERIALIZED (
            SELECT m.id, m.visible_at, coalesce(m.enqueued_at < expired_before, false)
                                       OR coalesce(m.expires_at <= now(), false) AS gone,
                   coalesce(m.receive_count >= q.max_receive_count, false) AS dead
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
                dedupe_key = NULL
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
                       coalesce(m.receive_count >= q.max_receive_count, false) AS dead,
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
                       coalesce(m.receive_count >= q.max_receive_count, false),
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
            PERFORM postbox._move(to_bury, q, (SELECT d FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id),
                                  true);
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
                    dedupe_key = NULL
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

-- Its argument changes.
DROP FUNCTION postbox._lock_queue(integer, boolean);

-- Serialises queue deletion against sends: a send holds this lock shared, so a
-- message is never committed into a queue that a concurrent drop just removed.
-- The lock comes in 16 stripes: advisory locks (1886350224 + s, hashtext of the
-- queue's name) for s in 0-15, where 1886350198 = 'post'. A send holds the
-- stripe of its session's pid; a drop or purge holds all 16, taken in order.
-- Every send of a busy queue sharing one lock made them queue up in the lock
-- manager: 64 sessions each sending one message per transaction did about 10%
-- more without it. The key is the name (since 0.9.0; before, the queue's id,
-- under 1886350208 + s) so that a plain send can lock before it looks the queue
-- up, and that look is then the one that sees a drop. Two names of one hash
-- share a lock, and a drop of one waits for sends into the other: no more.
-- Shared, it looks again for the caller, who looked the queue up first: in
-- READ COMMITTED a statement after the lock sees a drop that committed before
-- it. A REPEATABLE READ or SERIALIZABLE transaction reads its first snapshot
-- throughout, which may predate the drop; a row lock reads the queue's latest
-- version, and raises a serialization failure (40001) when a drop committed
-- since the snapshot, rather than let the send leave its message behind.
CREATE FUNCTION postbox._lock_queue(q postbox.queues, exclusive boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF exclusive THEN
        PERFORM pg_advisory_xact_lock(1886350224 + stripe, hashtext(q.name)) FROM generate_series(0, 15) AS stripe;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(q.name));
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM FROM postbox.queues x WHERE x.id = q.id;
    ELSE
        PERFORM FROM postbox.queues x WHERE x.id = q.id FOR KEY SHARE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = 'the queue was deleted while the message was being sent';
    END IF;
END
$$;

-- Sets queues.listened of the queues to whether they have listeners (since
-- 0.9.0). The caller has locked their rows and changed their listeners since:
-- listings of a queue take turns, and each counts what those before it
-- committed, so a queue with a committed listener is never left unflagged. Only
-- a flag that changes is written: each write leaves a dead version of the
-- queue's row, which every send walks past while the xmin horizon is pinned.
CREATE FUNCTION postbox._mark_listened(queue_ids integer[]) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.queues q SET listened = f.listened
    FROM (SELECT x.id, EXISTS (SELECT FROM postbox.queue_listeners l WHERE l.queue_id = x.id) AS listened
          FROM unnest(queue_ids) AS x(id)) AS f
    WHERE q.id = f.id AND q.listened <> f.listened;
$$;

-- Lists this session (a server's LISTEN connection) as waiting on the named
-- queues, so that sends into them notify (since 0.8.0), and clears the rows of
-- sessions that are gone. A send that looked for listeners before this commits
-- does not notify: the caller takes pg_current_snapshot() once this has
-- committed, waits until every transaction in progress then has ended, and
-- looks at the queues itself (ready_queues). Senders look at queues.listened,
-- and take their transaction id before they look, so that they are among those
-- transactions. A snapshot lists only the ids below its xmax (one past the
-- newest to have ended), so the caller also draws an id right after it and
-- waits on every id from xmax up to that one (the server's wakeup.ENDED).
CREATE OR REPLACE FUNCTION postbox.listen_to(queue_names text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    queue_ids integer[];
BEGIN
    -- The queues whose listeners change, locked (see _mark_listened).
    SELECT array_agg(x.id) INTO queue_ids
    FROM (SELECT q.id FROM postbox.queues q
          WHERE q.name = ANY (queue_names)
             OR q.id IN (SELECT l.queue_id FROM postbox.queue_listeners l
                         WHERE l.listener <> pg_backend_pid()
                           AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = l.listener))
          ORDER BY q.id
          FOR NO KEY UPDATE) AS x;
    DELETE FROM postbox.queue_listeners l
    WHERE l.queue_id = ANY (queue_ids) AND l.listener <> pg_backend_pid()
      AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = l.listener);
    INSERT INTO postbox.queue_listeners (queue_id, listener)
    SELECT q.id, pg_backend_pid() FROM postbox.queues q WHERE q.id = ANY (queue_ids) AND q.name = ANY (queue_names)
    ON CONFLICT DO NOTHING;
    PERFORM postbox._mark_listened(queue_ids);
END
$$;

-- Takes this session off the named queues' listeners (since 0.8.0).
CREATE OR REPLACE FUNCTION postbox.unlisten(queue_names text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    queue_ids integer[];
BEGIN
    SELECT array_agg(x.id) INTO queue_ids
    FROM (SELECT q.id FROM postbox.queues q WHERE q.name = ANY (queue_names) ORDER BY q.id
          FOR NO KEY UPDATE) AS x;
    DELETE FROM postbox.queue_listeners l WHERE l.queue_id = ANY (queue_ids) AND l.listener = pg_backend_pid();
    PERFORM postbox._mark_listened(queue_ids);
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
    PERFORM postbox._lock_queue(q, true);
    PERFORM postbox._delete_messages(q.id);
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

-- Deletes every message of a queue; returns how many. Sends wait meanwhile, so
-- no FIFO message is parked behind a head that the purge removed.
CREATE OR REPLACE FUNCTION postbox.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    purged bigint;
BEGIN
    PERFORM postbox._lock_queue(q, true);
    purged := postbox._delete_messages(q.id);
    UPDATE postbox.queues SET purged_at = now() WHERE id = q.id;
    RETURN purged;
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

-- Deletes every message of queue queue_id, with their expiries and dedupe
-- keys; returns how many. The caller holds the queue's lock (exclusive).
CREATE FUNCTION postbox._delete_messages(queue_id integer) RETURNS bigint
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM postbox.messages m WHERE m.queue_id = _delete_messages.queue_id RETURNING m.id, m.expires_at
    ), expiries AS (
        DELETE FROM postbox.message_expiries e USING gone g WHERE e.message_id = g.id AND g.expires_at IS NOT NULL
    ), keys AS (
        DELETE FROM postbox.dedupe_keys d WHERE d.queue_id = _delete_messages.queue_id
    )
    SELECT count(*) FROM gone;
$$;

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
    expiring bigint[];
    keys text[];
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

-- Removes up to batch_size expired messages (archiving them where the queue
-- archives), claimed with SKIP LOCKED so servers running this together never
-- touch the same rows. The ready index finds most of them cheaply, since
-- visible_at >= enqueued_at; parked FIFO messages are looked up by group.
-- Receive never delivers an expired message meanwhile. Messages past their
-- own expires_at (a ttl or expire_time) come through message_expiries.
-- Returns how many.
CREATE OR REPLACE FUNCTION postbox.expire_messages(batch_size integer DEFAULT 1000) RETURNS bigint
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

-- Sets queues.prioritized or queues.keyed (since 0.9.0), as asked, in the
-- transaction that puts a message of priority above 0, or with a dedupe key,
-- into the queue. Each is written once in a queue's life: receive's straight
-- path reads them. Until that transaction ends, another one that sets one
-- waits on the row.
CREATE FUNCTION postbox._mark_queue(queue_id integer, prioritized boolean, keyed boolean) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.queues x
    SET prioritized = x.prioritized OR _mark_queue.prioritized, keyed = x.keyed OR _mark_queue.keyed
    WHERE x.id = queue_id AND (_mark_queue.prioritized AND NOT x.prioritized OR _mark_queue.keyed AND NOT x.keyed);
$$;

-- Forgets activity older than an hour, the longest window worth asking for.
-- Returns how many rows went. One session at a time (an advisory lock, since
-- 0.9.0): another, a server's worker or tick, returns 0 at once.
CREATE OR REPLACE FUNCTION postbox.expire_activity() RETURNS bigint
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

-- Maintenance from SQL alone (since 0.9.0): postbox.tick() runs, once, every
-- piece of housekeeping that needs no network, so a database with no postbox
-- server still expires, redrives, rotates and fires schedules; start() hands
-- tick to pg_cron. Cron expressions are read here as cronsim (the server's
-- library, which follows Debian cron) reads them, so tick and a server fire a
-- schedule at the same times.

-- Cron fields, by number: 1 minute, 2 hour, 3 day of month, 4 month, 5 day of
-- week. A field's name, for errors.
CREATE FUNCTION postbox._cron_field_name(field integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]
$$;

-- A cron field's lowest and highest value (day of week 7 is Sunday too).
CREATE FUNCTION postbox._cron_bounds(field integer, OUT low integer, OUT high integer)
LANGUAGE sql IMMUTABLE AS $$
    SELECT (ARRAY[0, 0, 1, 1, 0])[field], (ARRAY[59, 23, 31, 12, 7])[field]
$$;

-- One value of a cron field: digits, or a month or weekday name (JAN, MON).
CREATE FUNCTION postbox._cron_value(term text, field integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    named integer;
    value integer;
BEGIN
    IF field = 4 THEN
        named := array_position('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}'::text[], term);
    ELSIF field = 5 THEN
        named := array_position('{SUN,MON,TUE,WED,THU,FRI,SAT}'::text[], term) - 1;
    END IF;
    IF named IS NOT NULL THEN
        RETURN named;
    END IF;
    IF term !~ '^[0-9]{1,9}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad ' || postbox._cron_field_name(field);
    END IF;
    value := term::integer;
    IF value NOT BETWEEN (postbox._cron_bounds(field)).low AND (postbox._cron_bounds(field)).high THEN
        RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad ' || postbox._cron_field_name(field);
    END IF;
    RETURN value;
END
$$;

-- The values one cron field names. Special days are coded: day of month -1000
-- is L (the last day), -1001 LW (the last weekday); day of week d (0 is
-- Sunday, 7 is too) with 90 + d for "dL" (the last d of the month) and
-- 10 * n + d for "d#n" (the n-th d).
CREATE FUNCTION postbox._cron_items(term text, field integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    low integer := (postbox._cron_bounds(field)).low;
    high integer := (postbox._cron_bounds(field)).high;
    part text;
    items integer[] := '{}';
    step integer;
    first integer;
    last integer;
BEGIN
    IF term = '*' THEN
        RETURN ARRAY(SELECT generate_series(low, high));
    ELSIF strpos(term, ',') > 0 THEN
        FOREACH part IN ARRAY string_to_array(term, ',') LOOP
            items := items || postbox._cron_items(part, field);
        END LOOP;
        RETURN ARRAY(SELECT DISTINCT unnest(items) ORDER BY 1);
    ELSIF field = 5 AND strpos(term, 'L') > 0 THEN
        IF left(term, -1) !~ '^[0-9]+$' THEN
            RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad day-of-week';
        END IF;
        RETURN ARRAY[90 + postbox._cron_value(left(term, -1), field) % 7];
    ELSIF field = 5 AND strpos(term, '#') > 0 THEN
        part := substr(term, strpos(term, '#') + 1);
        IF part !~ '^[0-9]{1,9}$' OR part::integer NOT BETWEEN 1 AND 5 THEN
            RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad day-of-week';
        END IF;
        RETURN ARRAY[10 * part::integer + postbox._cron_value(split_part(term, '#', 1), field) % 7];
    ELSIF strpos(term, '/') > 0 THEN
        part := substr(term, strpos(term, '/') + 1);
        IF part !~ '^[0-9]{1,9}$' OR part::integer = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad ' || postbox._cron_field_name(field);
        END IF;
        step := part::integer;
        items := postbox._cron_items(split_part(term, '/', 1), field);
        IF items IN ('{-1000}', '{-1001}') THEN
            RETURN items;
        ELSIF cardinality(items) = 1 THEN
            RETURN ARRAY(SELECT generate_series(items[1], high, step));
        END IF;
        -- Every step-th of the values, in order.
        RETURN ARRAY(SELECT v FROM unnest(items) WITH ORDINALITY AS x(v, i) WHERE (i - 1) % step = 0 ORDER BY v);
    ELSIF strpos(term, '-') > 0 THEN
        first := postbox._cron_value(split_part(term, '-', 1), field);
        last := postbox._cron_value(substr(term, strpos(term, '-') + 1), field);
        IF last < first THEN
            RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad ' || postbox._cron_field_name(field);
        END IF;
        RETURN ARRAY(SELECT generate_series(first, last));
    ELSIF field = 3 AND term = 'LW' THEN
        RETURN '{-1001}';
    ELSIF field = 3 AND term = 'L' THEN
        RETURN '{-1000}';
    END IF;
    RETURN ARRAY[postbox._cron_value(term, field)];
END
$$;

-- Whether a day matches the day-of-month and day-of-week values: both must
-- when either field starts with "*", either may otherwise (Debian cron).
CREATE FUNCTION postbox._cron_day_matches(day date, days integer[], weekdays integer[], day_and boolean)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    dom integer := extract(day FROM day);
    -- On timestamps without a time zone: the session's zone plays no part.
    last_day date := (date_trunc('month', day::timestamp) + interval '1 month' - interval '1 day')::date;
    month_end integer := extract(day FROM last_day);
    weekday integer := extract(dow FROM day);
    last_weekday integer := month_end - CASE extract(dow FROM last_day) WHEN 0 THEN 2 WHEN 6 THEN 1 ELSE 0 END;
    by_month_day boolean;
    by_weekday boolean;
BEGIN
    by_month_day := dom = ANY (days) OR (-1000 = ANY (days) AND dom = month_end)
                    OR (-1001 = ANY (days) AND dom = last_weekday);
    by_weekday := weekday = ANY (weekdays) OR (weekday = 0 AND 7 = ANY (weekdays))
                  OR (90 + weekday = ANY (weekdays) AND dom + 7 > month_end)
                  OR (10 * ((dom + 6) / 7) + weekday = ANY (weekdays));
    RETURN CASE WHEN day_and THEN by_month_day AND by_weekday ELSE by_month_day OR by_weekday END;
END
$$;

-- The first wall-clock minute at or after `start` (a local time) that the
-- parsed fields name; NULL when none does within 50 years.
CREATE FUNCTION postbox._cron_next_local(start timestamp, minutes integer[], hours integer[], days integer[],
                                         months integer[], weekdays integer[], day_and boolean)
RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t timestamp := date_trunc('minute', start)
                   + CASE WHEN start > date_trunc('minute', start) THEN interval '1 minute' ELSE interval '0' END;
    horizon integer := extract(year FROM start)::integer + 50;
    later integer;
BEGIN
    LOOP
        IF extract(year FROM t) > horizon THEN
            RETURN NULL;
        ELSIF NOT extract(month FROM t)::integer = ANY (months) THEN
            t := date_trunc('month', t) + interval '1 month';
        ELSIF NOT postbox._cron_day_matches(t::date, days, weekdays, day_and) THEN
            t := t::date + 1;
        ELSIF NOT extract(hour FROM t)::integer = ANY (hours) THEN
            SELECT min(h) INTO later FROM unnest(hours) h WHERE h > extract(hour FROM t);
            t := CASE WHEN later IS NULL THEN t::date + 1 ELSE t::date + make_interval(hours => later) END;
        ELSIF NOT extract(minute FROM t)::integer = ANY (minutes) THEN
            SELECT min(m) INTO later FROM unnest(minutes) m WHERE m > extract(minute FROM t);
            t := CASE WHEN later IS NULL THEN date_trunc('hour', t) + interval '1 hour'
                      ELSE date_trunc('hour', t) + make_interval(mins => later) END;
        ELSE
            RETURN t;
        END IF;
    END LOOP;
END
$$;

-- How far local time in `zone` is ahead of UTC at an instant.
CREATE FUNCTION postbox._utc_offset(at timestamptz, zone text) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT (at AT TIME ZONE zone) - (at AT TIME ZONE 'UTC')
$$;

-- The first instant after `since` and no later than `until` at which the
-- offset of `zone` differs from the one at `since`; NULL when there is none.
-- Looks a day at a time (no zone changes twice in a day), then to the second.
CREATE FUNCTION postbox._next_offset_change(since timestamptz, until timestamptz, zone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    offset_then interval := postbox._utc_offset(since, zone);
    low timestamptz := since;
    high timestamptz;
    middle timestamptz;
BEGIN
    LOOP
        high := least(low + interval '1 day', until);
        EXIT WHEN postbox._utc_offset(high, zone) <> offset_then;
        IF high >= until THEN
            RETURN NULL;
        END IF;
        low := high;
    END LOOP;
    WHILE high - low > interval '1 second' LOOP
        middle := low + (high - low) / 2;
        IF postbox._utc_offset(middle, zone) = offset_then THEN
            low := middle;
        ELSE
            high := middle;
        END IF;
    END LOOP;
    RETURN date_trunc('second', high);
END
$$;

-- The first time strictly after `after` that a 5-field cron expression names
-- in an IANA time zone, as the server's cronsim computes it: NULL when it names
-- none in the next 50 years; PB400 naming the field for a malformed one.
-- Expressions at fixed times (minute and hour not starting with "*") are read
-- on the wall clock, as Debian cron does: a time a spring-forward change skips
-- fires at the first minute after the gap, and a time the clock repeats in the
-- autumn names its first occurrence. Others name real minutes: one that
-- repeats fires twice.
CREATE FUNCTION postbox.cron_next(expression text, zone text, after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    fields text[] := regexp_split_to_array(btrim(upper(expression), E' \t\n\r\f\v'), E'[ \t\n\r\f\v]+');
    minutes integer[];
    hours integer[];
    days integer[];
    months integer[];
    weekdays integer[];
    day_and boolean;
    local_time timestamp;
    candidate timestamptz;
    offset_now interval;
    cursor timestamptz;
    change timestamptz;
BEGIN
    IF cardinality(fields) <> 5 THEN
        RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = format(
            'cron expression %s has %s fields; it needs 5: minute hour day-of-month month day-of-week',
            quote_literal(left(expression, 64)), cardinality(fields));
    END IF;
    PERFORM now() AT TIME ZONE zone;  -- an unknown zone fails here, naming it
    minutes := postbox._cron_items(fields[1], 1);
    hours := postbox._cron_items(fields[2], 2);
    days := postbox._cron_items(fields[3], 3);
    months := postbox._cron_items(fields[4], 4);
    weekdays := postbox._cron_items(fields[5], 5);
    day_and := left(fields[3], 1) = '*' OR left(fields[5], 1) = '*';
    IF day_and AND (SELECT min(d) FROM unnest(days) d) > 29
       AND (SELECT min(d) FROM unnest(days) d)
           > (SELECT max((ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m]) FROM unnest(months) m) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = 'bad day-of-month';
    END IF;
    IF left(fields[1], 1) <> '*' AND left(fields[2], 1) <> '*' THEN
        -- On the wall clock, from the second after `after`.
        local_time := postbox._cron_next_local(
            date_trunc('second', after AT TIME ZONE zone) + interval '1 second',
            minutes, hours, days, months, weekdays, day_and);
        IF local_time IS NULL THEN
            RETURN NULL;
        END IF;
        WHILE ((local_time AT TIME ZONE zone) AT TIME ZONE zone) <> local_time LOOP
            local_time := local_time + interval '1 minute';  -- skipped by the clock
        END LOOP;
        -- The first instant showing that time: the offsets a day either side.
        RETURN (SELECT min(x.u)
                FROM (SELECT (local_time - postbox._utc_offset((local_time AT TIME ZONE zone) + side, zone))
                             AT TIME ZONE 'UTC' AS u
                      FROM unnest(ARRAY[interval '-1 day', interval '1 day']) side) x
                WHERE x.u AT TIME ZONE zone = local_time);
    END IF;
    -- Real minutes: within a stretch of one offset, local time is UTC shifted.
    cursor := date_trunc('second', after) + interval '1 second';
    LOOP
        offset_now := postbox._utc_offset(cursor, zone);
        local_time := postbox._cron_next_local(cursor AT TIME ZONE zone, minutes, hours, days, months, weekdays, day_and);
        IF local_time IS NULL THEN
            RETURN NULL;
        END IF;
        candidate := (local_time - offset_now) AT TIME ZONE 'UTC';
        change := postbox._next_offset_change(cursor, candidate, zone);
        IF change IS NULL THEN
            RETURN candidate;
        END IF;
        cursor := change;
    END LOOP;
END
$$;

-- When a schedule that was due at s.next_fire_at and fires at `at` fires next,
-- as the server's scheduler computes it: a cron expression's first time after
-- `at`; an interval's first time on its grid after `at` (missed times fire
-- once); NULL for a one-shot time.
CREATE FUNCTION postbox._next_fire_at(s postbox.schedules, at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    every_seconds numeric := extract(epoch FROM s.every);
BEGIN
    IF s.cron_expression IS NOT NULL THEN
        RETURN postbox.cron_next(s.cron_expression, coalesce(s.time_zone, 'UTC'), at);
    ELSIF s.every IS NOT NULL THEN
        -- In seconds: "1 day" is 24 hours here, whatever the session's time zone.
        RETURN s.next_fire_at + make_interval(secs => every_seconds * CASE
            WHEN at < s.next_fire_at THEN 1
            ELSE floor(extract(epoch FROM at - s.next_fire_at) / every_seconds) + 1 END);
    END IF;
    RETURN NULL;
END
$$;

-- Fires up to max_schedules due schedules, each with its next fire time, in
-- the caller's transaction; claimed with SKIP LOCKED, as the servers'
-- schedulers claim them, so a schedule one of them is firing is left to it.
-- Returns how many fired and how many the target refused (see fire_schedule).
CREATE FUNCTION postbox._fire_due_schedules(max_schedules integer, OUT fired integer, OUT refused integer)
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    fired := 0;
    refused := 0;
    FOR s IN SELECT * FROM postbox.claim_due_schedules(max_schedules) LOOP
        IF (SELECT f.error FROM postbox.fire_schedule(s.id, postbox._next_fire_at(s, now())) f) IS NULL THEN
            fired := fired + 1;
        ELSE
            refused := refused + 1;
        END IF;
    END LOOP;
END
$$;

-- One round of every piece of maintenance that needs no network, in one
-- transaction, up to batch_size (1-10000) rows of each kind: expiry of
-- messages, archived messages and deduplication ids, redrive steps, a
-- rotation pass of the stream log, delayed stream publishes that are due
-- (publish_delayed), due schedules, activity older than an hour
-- and failed webhook deliveries older than 7 days. The servers' workers call
-- the same functions, which take the same locks (SKIP LOCKED row claims, and
-- advisory locks for rotation and activity), so tick and servers running
-- together never do a piece twice; a piece another session holds is skipped
-- this round. Webhook delivery needs HTTP and stays with the servers. Returns
-- what it did, a count per kind; a count of batch_size says more is waiting.
CREATE FUNCTION postbox.tick(batch_size integer DEFAULT 1000) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    schedules record;
    done jsonb;
BEGIN
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 10000 THEN
        PERFORM postbox._invalid(format('batch_size must be from 1 to 10000, not %s', batch_size));
    END IF;
    done := jsonb_build_object(
        'expired_messages', postbox.expire_messages(batch_size),
        'expired_records', postbox.expire_records(batch_size),
        'redriven_messages', coalesce(postbox.run_redrives(batch_size), 0),
        'rotated_slots', postbox.rotate_streams(NULL, interval '20 milliseconds'),
        'published_delayed', postbox.publish_due_streams(batch_size));
    schedules := postbox._fire_due_schedules(batch_size);
    RETURN done || jsonb_build_object(
        'fired_schedules', schedules.fired,
        'refused_schedules', schedules.refused,
        'expired_activity', postbox.expire_activity(),
        'expired_webhook_deliveries', postbox.expire_webhook_deliveries(batch_size));
END
$$;

-- The pg_cron job of this database's tick, when pg_cron is installed here.
CREATE FUNCTION postbox._tick_job_name() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT 'postbox tick in ' || current_database()
$$;

-- Has pg_cron run `SELECT postbox.tick()` every `every` in this database:
-- 1 to 59 seconds (pg_cron 1.5 or later), or a whole number of minutes that
-- divides an hour. Replaces a job an earlier start made. Returns the job's
-- id. Without pg_cron, an error that names the alternative: call
-- postbox.tick() from any scheduler. For the schema's owner only.
CREATE FUNCTION postbox.start(every interval DEFAULT '1 minute') RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cron_version text := (SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_cron');
    seconds numeric := extract(epoch FROM every);
    schedule text;
    job bigint;
BEGIN
    IF cron_version IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = format('pg_cron is not installed in database %s', current_database()),
            HINT = 'Call SELECT postbox.tick() every few seconds from any scheduler (cron and psql, a systemd '
                   'timer, a Kubernetes CronJob), or run a postbox server, which does this work itself; or '
                   'install pg_cron (shared_preload_libraries, cron.database_name) and CREATE EXTENSION pg_cron.';
    END IF;
    IF seconds BETWEEN 1 AND 59 AND seconds = floor(seconds) THEN
        IF string_to_array(split_part(cron_version, '-', 1), '.')::integer[] < '{1,5}' THEN
            PERFORM postbox._invalid(format(
                'pg_cron %s runs jobs at most once a minute; give whole minutes, or use pg_cron 1.5 or later '
                'for %s', cron_version, every));
        END IF;
        schedule := seconds || ' seconds';
    ELSIF seconds BETWEEN 60 AND 3600 AND seconds % 60 = 0 AND 60 % (seconds / 60) = 0 THEN
        schedule := CASE WHEN seconds = 60 THEN '* * * * *'
                         WHEN seconds = 3600 THEN '0 * * * *'
                         ELSE format('*/%s * * * *', seconds / 60) END;
    ELSE
        PERFORM postbox._invalid(format(
            'every must be 1 to 59 whole seconds, or 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60 minutes, not %s',
            every));
    END IF;
    PERFORM postbox.stop();
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO job
    USING postbox._tick_job_name(), schedule, 'SELECT postbox.tick()';
    RETURN job;
END
$$;

-- Removes the pg_cron job that start made; returns how many jobs it removed
-- (0 without pg_cron). For the schema's owner only.
CREATE FUNCTION postbox.stop() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    removed integer;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RETURN 0;
    END IF;
    EXECUTE 'SELECT count(cron.unschedule(j.jobid))::integer FROM cron.job j WHERE j.jobname = $1'
    INTO removed USING postbox._tick_job_name();
    RETURN removed;
END
$$;

-- Change data capture (since 0.9.0): triggers that publish each row change
-- of a table to a topic in the transaction that makes it, so a rollback
-- publishes nothing.

-- The message of one row change: {"operation", "schema", "table", "old",
-- "new"}, rows as JSON objects, NULL where the operation has none.
CREATE FUNCTION postbox._change(operation text, schema_name name, table_name name, old_row jsonb, new_row jsonb)
RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to(jsonb_build_object('operation', operation, 'schema', schema_name, 'table', table_name,
                                         'old', old_row, 'new', new_row)::text, 'UTF8')
$$;

-- The routing key of capture's messages: "<prefix>.<operation>", or the
-- operation alone for the empty prefix.
CREATE FUNCTION postbox._change_key(prefix text, operation text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN prefix = '' THEN operation ELSE prefix || '.' || operation END
$$;

-- Capture's statement trigger for inserts and deletes: publishes the rows of
-- the statement's transition table (postbox_new or postbox_old) to the topic
-- TG_ARGV[0] with routing prefix TG_ARGV[1], a batch of 1000 at a time (a
-- row at a time costs ten times more). The ordering key is the table's oid:
-- FIFO queues keep each table's changes in order (a table's name may hold
-- characters an ordering key may not). Runs as the schema's owner, so whoever
-- may write the table publishes without rights on postbox.
CREATE FUNCTION postbox._capture_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp AS $$
DECLARE
    operation text := lower(TG_OP);
    changed jsonb[];
    bodies bytea[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        changed := ARRAY(SELECT to_jsonb(r) FROM postbox_new r);
    ELSE
        changed := ARRAY(SELECT to_jsonb(r) FROM postbox_old r);
    END IF;
    FOR from_index IN 1 .. coalesce(cardinality(changed), 0) BY 1000 LOOP
        bodies := ARRAY(SELECT postbox._change(operation, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                               CASE WHEN TG_OP = 'DELETE' THEN x.r END,
                                               CASE WHEN TG_OP = 'INSERT' THEN x.r END)
                        FROM unnest(changed[from_index:from_index + 999]) WITH ORDINALITY AS x(r, n) ORDER BY x.n);
        PERFORM postbox.publish_batch(
            TG_ARGV[0], bodies, array_fill(postbox._change_key(TG_ARGV[1], operation), ARRAY[cardinality(bodies)]),
            ordering_keys => array_fill(TG_RELID::text, ARRAY[cardinality(bodies)]));
    END LOOP;
    RETURN NULL;
END
$$;

-- Capture's row trigger for updates, which pair an old row with its new one:
-- publishes one change, as _capture_rows does.
CREATE FUNCTION postbox._capture_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp AS $$
BEGIN
    PERFORM postbox.publish(
        TG_ARGV[0], postbox._change('update', TG_TABLE_SCHEMA, TG_TABLE_NAME, to_jsonb(OLD), to_jsonb(NEW)),
        postbox._change_key(TG_ARGV[1], 'update'), ordering_key => TG_RELID::text);
    RETURN NULL;
END
$$;

-- The tables capture publishes, with their topic and routing prefix (the
-- trigger's two arguments, each ended by a zero byte in pg_trigger.tgargs).
CREATE VIEW postbox.captures AS
SELECT t.tgrelid::regclass AS captured_table,
       convert_from(substring(t.tgargs FROM 1 FOR a.ends - 1), 'UTF8') AS topic_name,
       convert_from(substring(t.tgargs FROM a.ends + 1 FOR length(t.tgargs) - a.ends - 1), 'UTF8') AS routing_prefix
FROM pg_catalog.pg_trigger t
CROSS JOIN LATERAL (SELECT position('\x00'::bytea IN t.tgargs) AS ends) a
WHERE t.tgfoid = 'postbox._capture_update()'::regprocedure;

-- Publishes every row inserted into, updated in or deleted from `source` to
-- topic_name, in the same transaction: routing key
-- "<routing_prefix>.<insert|update|delete>", or the operation alone, and a
-- body of {"operation", "schema", "table", "old", "new"}. Three triggers,
-- postbox_capture_insert, _update and _delete: inserts and deletes publish a
-- statement's rows in batches, updates one by one. TRUNCATE publishes
-- nothing. One capture per table: capturing it again replaces the first.
-- PB404 when the topic does not exist, PB400 for a bad prefix or a relation
-- that is not a table. For the schema's owner only.
CREATE FUNCTION postbox.capture(source regclass, topic_name text, routing_prefix text DEFAULT '')
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM postbox._topic(topic_name);
    IF routing_prefix IS NULL OR (routing_prefix <> '' AND postbox.routing_key_problem(routing_prefix) IS NOT NULL) THEN
        PERFORM postbox._invalid(coalesce(postbox.routing_key_problem(routing_prefix),
                                          'routing_prefix must not be NULL; give '''' for none'));
    END IF;
    IF (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = source) NOT IN ('r', 'p')
       OR (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = source) = 'postbox'::regnamespace THEN
        PERFORM postbox._invalid(format('%s is not a table outside schema postbox', source));
    END IF;
    PERFORM postbox.release(source);
    EXECUTE format('CREATE TRIGGER postbox_capture_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS postbox_new '
                   'FOR EACH STATEMENT EXECUTE FUNCTION postbox._capture_rows(%L, %L)',
                   source, topic_name, routing_prefix);
    EXECUTE format('CREATE TRIGGER postbox_capture_update AFTER UPDATE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION postbox._capture_update(%L, %L)',
                   source, topic_name, routing_prefix);
    EXECUTE format('CREATE TRIGGER postbox_capture_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS postbox_old '
                   'FOR EACH STATEMENT EXECUTE FUNCTION postbox._capture_rows(%L, %L)',
                   source, topic_name, routing_prefix);
END
$$;

-- Stops publishing the changes of `source`; false when it was not captured.
-- For the schema's owner only.
CREATE FUNCTION postbox.release(source regclass) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = source AND t.tgfoid = 'postbox._capture_update()'::regprocedure) THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture_insert ON %s', source);
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture_update ON %s', source);
    EXECUTE format('DROP TRIGGER IF EXISTS postbox_capture_delete ON %s', source);
    RETURN true;
END
$$;

-- Uninstall (since 0.9.0): removes what postbox made and nothing else.

-- The comment on the roles an install created.
CREATE FUNCTION postbox._role_mark() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'created by postbox; postbox.uninstall() drops it'::text
$$;

-- Removes postbox from this database: its pg_cron job, its capture triggers,
-- the schema with everything in it (the extension, when installed as one) and
-- postbox's roles, those an install created (their comment says so: roles
-- belong to the cluster, and one made by hand is not postbox's to drop). A
-- role still needed elsewhere (postbox in another database, privileges or
-- objects of its own) is kept and named in the result: the last uninstall in
-- the cluster drops it.
-- Returns {"cron_jobs", "captures", "dropped_roles", "kept_roles"}. For the
-- schema's owner only; the owner needs CREATEROLE to drop the roles.
CREATE FUNCTION postbox.uninstall() RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    cron_jobs integer := postbox.stop();
    captures integer := 0;
    captured regclass;
    roles text[] := ARRAY(SELECT r.rolname FROM pg_catalog.pg_roles r
                          WHERE r.rolname IN ('postbox_admin', 'postbox_reader', 'postbox_writer')
                                AND pg_catalog.shobj_description(r.oid, 'pg_authid') = postbox._role_mark()
                          ORDER BY r.rolname);
    role_name text;
    dropped text[] := '{}';
    kept text[] := '{}';
BEGIN
    FOR captured IN SELECT c.captured_table FROM postbox.captures c LOOP
        PERFORM postbox.release(captured);
        captures := captures + 1;
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'postbox') THEN
        DROP EXTENSION postbox CASCADE;
    END IF;
    DROP SCHEMA IF EXISTS postbox CASCADE;
    FOREACH role_name IN ARRAY roles LOOP
        CONTINUE WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = role_name);
        BEGIN
            EXECUTE format('DROP ROLE %I', role_name);
            dropped := dropped || role_name;
        EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN
            RAISE NOTICE 'postbox: role % is kept: %', role_name, SQLERRM;
            kept := kept || role_name;
        END;
    END LOOP;
    RETURN jsonb_build_object('cron_jobs', cron_jobs, 'captures', captures,
                              'dropped_roles', to_jsonb(dropped), 'kept_roles', to_jsonb(kept));
END
$$;

-- Roles an earlier version's install made (postbox's names, with no comment of
-- their own) are marked as an install's, for uninstall.
DO $$
DECLARE
    role_name text;
BEGIN
    FOR role_name IN SELECT r.rolname FROM pg_catalog.pg_roles r
                     WHERE r.rolname IN ('postbox_reader', 'postbox_writer', 'postbox_admin')
                           AND pg_catalog.shobj_description(r.oid, 'pg_authid') IS NULL LOOP
        EXECUTE format('COMMENT ON ROLE %I IS %L', role_name, postbox._role_mark());
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'postbox: roles were not marked as postbox''s (%); uninstall will keep them', SQLERRM;
END
$$;

-- Gives the engine's functions their privileges, and makes each public one
-- SECURITY DEFINER with a fixed search_path: a reader or writer then needs no
-- right on the tables (a writer can call send, not insert rows of its own), and
-- no schema of the caller's can shadow a function or operator the engine uses.
-- Pure (IMMUTABLE) functions and internal ones (named "_...") stay as they are:
-- they run inside a public function, whose path is fixed already, and a SET
-- clause would keep the planner from inlining them. CREATE OR REPLACE resets
-- a function's settings, so every install and upgrade script ends by calling
-- this. start, stop, uninstall, capture and release stay the owner's (since
-- 0.9.0): they schedule jobs, drop the engine and add triggers to tables.
CREATE OR REPLACE FUNCTION postbox._secure() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    roles boolean := (SELECT count(*) = 3 FROM pg_catalog.pg_roles
                      WHERE rolname IN ('postbox_reader', 'postbox_writer', 'postbox_admin'));
    owner_only oid[] := array_remove(ARRAY[
        to_regprocedure('postbox.start(interval)'), to_regprocedure('postbox.stop()'),
        to_regprocedure('postbox.uninstall()'), to_regprocedure('postbox.capture(regclass,text,text)'),
        to_regprocedure('postbox.release(regclass)')]::oid[], NULL);
BEGIN
    FOR f IN SELECT p.oid, p.oid::regprocedure AS signature, p.proname AS name, p.provolatile, p.prorettype
             FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.signature);
        IF f.provolatile <> 'i' AND f.prorettype <> 'trigger'::regtype AND left(f.name, 1) <> '_' THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp',
                           f.signature);
        END IF;
        IF roles AND f.oid <> ALL (owner_only) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_admin', f.signature);
            IF f.name IN ('queue_stats', 'queue_metrics', 'queue_rates', 'peek_messages', 'get_message',
                          'list_archived_messages', 'get_queue', 'list_queues', 'list_dead_letter_source_queues', 'list_redrive_tasks',
                          'get_topic', 'list_topics', 'get_subscription', 'list_subscriptions',
                          'list_webhook_deliveries', 'get_schedule', 'list_schedules', 'get_consumer_group',
                          'list_consumer_groups', 'stream_metrics', 'stream_position',
                          'list_stream_dead_letters', 'stream_latency', 'consumer_group_health') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader', f.signature);
            ELSIF f.name IN ('send', 'send_batch', 'publish', 'publish_batch') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_writer', f.signature);
            END IF;
        END IF;
    END LOOP;
    IF roles THEN
        GRANT USAGE ON SCHEMA postbox TO postbox_reader, postbox_writer, postbox_admin;
        GRANT ALL ON ALL TABLES IN SCHEMA postbox TO postbox_admin;
        GRANT ALL ON ALL SEQUENCES IN SCHEMA postbox TO postbox_admin;
        GRANT SELECT ON postbox.queue_health, postbox.queue_throughput, postbox.stream_health,
                        postbox.stream_rotation TO postbox_reader;
    END IF;
END
$$;

-- Jobs (since 0.9.0): a consumer names itself when it receives (consumer_id), a
-- delete may carry the job's result and a nack may end the message's tries
-- (dead_letter); a message may carry its own max_receive_count; and a queue
-- that archives keeps each message's whole life for get_message and
-- list_messages.
ALTER TABLE postbox.messages
    ADD COLUMN consumer_id text,
    ADD COLUMN received_at timestamptz,
    ADD COLUMN max_receive_count integer;
ALTER TABLE postbox.archive
    ADD COLUMN result bytea,
    ADD COLUMN consumer_id text,
    ADD COLUMN dead_lettered_at timestamptz;
DROP FUNCTION postbox._remove(postbox.queues, bigint[], uuid[], text);
DROP FUNCTION postbox.receive(text, integer, interval, timestamptz, bigint);
DROP FUNCTION postbox.delete_batch(text, text[]);
DROP FUNCTION postbox.delete(text, text);
DROP FUNCTION postbox.nack_batch(text, text[], interval[], text[]);
DROP FUNCTION postbox.nack(text, text, interval, text);
DROP FUNCTION postbox._send_batch_general(text, bytea[], jsonb[], interval[], text[], text[], text[], integer[],
                                          timestamptz[], interval[], timestamptz[]);
DROP FUNCTION postbox.send_batch(text, bytea[], jsonb[], interval[], text[], text[], text[], integer[],
                                 timestamptz[], interval[], timestamptz[]);
DROP FUNCTION postbox.send(text, bytea, jsonb, interval, text, text, text, integer, timestamptz, interval,
                           timestamptz);
DROP FUNCTION postbox.get_message(text, bigint);
DROP FUNCTION postbox.peek_messages(text, text, bigint, integer);

-- Moves messages (locked by the caller) into queue `target`: as dead letters of
-- `source` (leaving their own max_receive_count behind, since 0.9.0), or back
-- (redrive) with their deliveries uncounted. In a FIFO target
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
CREATE OR REPLACE FUNCTION postbox._remove(q postbox.queues, ids bigint[], leases uuid[], why text,
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

-- Ends the tries of messages (locked by the caller) of queue q: into its
-- dead-letter queue, or where it has none, removed as failed (archived where the
-- queue archives). Since 0.9.0.
CREATE OR REPLACE FUNCTION postbox._bury(q postbox.queues, ids bigint[]) RETURNS void
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
CREATE OR REPLACE FUNCTION postbox.consumer_id_problem(consumer_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(consumer_id) NOT BETWEEN 1 AND 128 OR consumer_id ~ '[^A-Za-z0-9_.:@/-]' THEN format(
        'consumer_id %s (%s characters) must be 1 to 128 characters of letters, digits and _ . : @ / -',
        quote_literal(left(consumer_id, 40)), length(consumer_id)) END
$$;

-- Claims up to max_messages visible messages (FOR UPDATE SKIP LOCKED, so
-- concurrent receivers never get the same message), makes them invisible for
-- the visibility timeout (the queue's when NULL), counts the delivery and gives
-- each a fresh receipt "<message id>:<lease>". The messages of one call share a
-- lease: a call delivers a message once, so the pair names the delivery, and a
-- strong random draw per row cost 5% of a receive of ten. Order: priority, then
-- visibility time, then id; FIFO queues hand out only group heads. On the way, expired
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
CREATE OR REPLACE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
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

-- PB400 unless results has at most `receipts` entries of at most 64 KiB each
-- (since 0.9.0).
CREATE OR REPLACE FUNCTION postbox._check_results(results bytea[], receipts integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text;
BEGIN
    IF cardinality(results) > receipts THEN
        PERFORM postbox._invalid(format('%s results for %s receipts: give at most one result per receipt',
                                        cardinality(results), receipts));
    END IF;
    SELECT postbox._entry_prefix(r.i, receipts) || format(
               'result is %s bytes; at most 65536 (64 KiB) are kept', octet_length(r.result))
    INTO problem
    FROM unnest(results) WITH ORDINALITY AS r(result, i)
    WHERE octet_length(r.result) > 65536
    ORDER BY r.i LIMIT 1;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
END
$$;

-- Deletes received messages by receipt. One outcome per receipt, in order;
-- see _receipt_outcomes. Archives them if the queue archives, with results[i]
-- (since 0.9.0; at most 64 KiB each) as what the job of receipts[i] returned:
-- a queue that does not archive keeps no results. Since 0.9.0, on a FIFO queue
-- a receipt whose lease has run out is stale: the message heads its group again
-- for the next receive (SQS: "The receipt handle has expired").
CREATE OR REPLACE FUNCTION postbox.delete_batch(queue_name text, receipts text[], results bytea[] DEFAULT NULL)
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
    -- The queue's, as scalars, and no nested calls on the plain path: there the
    -- calls and the settings cost more than the delete (valgrind).
    q_id integer;
    q_plain boolean;
    q postbox.queues;
    parsed record;
    done bigint[];
    expiring boolean;  -- whether a deleted message had an expiry of its own
BEGIN
    SELECT x.id, NOT (x.archive_on_delete OR x.fifo) INTO q_id, q_plain
    FROM postbox.queues x WHERE x.name = queue_name;
    IF NOT FOUND THEN
        PERFORM postbox._queue(queue_name);  -- raises PB400 or PB404
    END IF;
    IF coalesce(cardinality(receipts), 0) NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._check_batch_size(cardinality(receipts));
    END IF;
    IF results IS NULL THEN
        SELECT array_agg(p.message_id) AS ids, array_agg(p.lease) AS leases, NULL::bytea[] AS results INTO parsed
        FROM postbox._parse_receipts(receipts) p WHERE p.message_id IS NOT NULL;
    ELSE
        PERFORM postbox._check_results(results, cardinality(receipts));
        -- Each result beside its receipt's message (an archive keeps it).
        SELECT array_agg(p.message_id) AS ids, array_agg(p.lease) AS leases, array_agg(results[p.i]) AS results
        INTO parsed
        FROM postbox._parse_receipts(receipts) p WHERE p.message_id IS NOT NULL;
        q_plain := false;
    END IF;
    IF NOT q_plain THEN
        q := postbox._queue(queue_name);
        IF q.fifo THEN
            SELECT array_agg(t.id) AS ids, array_agg(t.lease) AS leases,
                   CASE WHEN parsed.results IS NOT NULL THEN array_agg(t.result) END AS results
            INTO parsed
            FROM unnest(parsed.ids, parsed.leases, parsed.results) AS t(id, lease, result)
            WHERE NOT EXISTS (SELECT FROM postbox.messages m
                              WHERE m.id = t.id AND m.queue_id + 0 = q_id AND m.lease = t.lease
                                    AND m.visible_at <= clock_timestamp());
        END IF;
        done := postbox._remove(q, parsed.ids, parsed.leases, 'deleted', parsed.results);
    ELSE
        -- _remove's plain delete, here: the common case, where the call and its
        -- settings cost more than the delete. From the parsed arrays, not the
        -- parse itself: joined to that, a plan made while the table was small
        -- walked the whole table once it had grown.
        WITH gone AS (
            DELETE FROM postbox.messages m
            USING unnest(parsed.ids, parsed.leases) AS t(id, lease)
            WHERE m.id = t.id AND m.queue_id + 0 = q_id AND m.lease = t.lease
            RETURNING m.id, m.expires_at
        )
        SELECT coalesce(array_agg(g.id), '{}'), bool_or(g.expires_at IS NOT NULL) INTO done, expiring FROM gone g;
        IF expiring THEN
            DELETE FROM postbox.message_expiries WHERE message_id = ANY (done);
        END IF;
    END IF;
    IF cardinality(done) = cardinality(receipts) THEN
        -- _receipt_outcomes' common case, without the call.
        RETURN QUERY SELECT g, 'ok' FROM generate_series(1::bigint, cardinality(receipts)) g;
    ELSE
        RETURN QUERY SELECT * FROM postbox._receipt_outcomes(postbox._queue(queue_name), receipts, done);
    END IF;
END
$$;

-- Deletes a received message, with what its job returned (since 0.9.0; see
-- delete_batch). PB412 for a stale receipt, PB404 if it is gone.
CREATE OR REPLACE FUNCTION postbox.delete(queue_name text, receipt text, result bytea DEFAULT NULL) RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.delete_batch(queue_name, ARRAY[receipt], postbox._array_of(result))
$$;

-- Gives received messages back: visible again after `delays[i]` (NULL: the
-- queue's retry backoff), recording errors[i] as the message's last error. The
-- receipt is spent. One outcome per receipt, in order; see _receipt_outcomes.
-- Where dead_letters[i] (since 0.9.0) is true the message is not retried: it
-- moves to the queue's dead-letter queue at once, or where there is none, fails
-- for good (archived as failed where the queue archives); not with a delay.
CREATE OR REPLACE FUNCTION postbox.nack_batch(queue_name text, receipts text[], delays interval[] DEFAULT NULL,
                                   errors text[] DEFAULT NULL, dead_letters boolean[] DEFAULT NULL)
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
    buried bigint[];
BEGIN
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(delays), cardinality(errors), cardinality(dead_letters)) > n THEN
        PERFORM postbox._invalid('delays, errors and dead_letters may not have more entries than receipts');
    END IF;
    SELECT postbox._entry_prefix(e.i, n) || CASE
               WHEN e.d < interval '0' OR e.d > interval '12 hours' THEN format('delay %s is outside 0 s to 12 h', e.d)
               WHEN e.d IS NOT NULL AND e.b THEN
                   'a dead-lettered message is not retried, so it takes no delay; give one or the other'
               ELSE format('error is %s characters; at most 4096 are kept', length(e.r)) END
    INTO problem
    FROM unnest(delays, errors, dead_letters) WITH ORDINALITY AS e(d, r, b, i)
    WHERE e.d < interval '0' OR e.d > interval '12 hours' OR length(e.r) > 4096 OR (e.d IS NOT NULL AND e.b)
    ORDER BY e.i LIMIT 1;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    WITH nacked AS (
        UPDATE postbox.messages m
        SET visible_at = CASE WHEN e.b THEN m.visible_at
                              ELSE clock_timestamp() + coalesce(e.d, postbox._backoff(q, m.receive_count)) END,
            lease = CASE WHEN e.b THEN m.lease END,
            last_error = coalesce(e.r, m.last_error)
        FROM postbox._parse_receipts(receipts) p
        LEFT JOIN unnest(delays, errors, dead_letters) WITH ORDINALITY AS e(d, r, b, i) ON e.i = p.i
        WHERE m.id = p.message_id AND m.queue_id + 0 = q.id AND m.lease = p.lease
        RETURNING m.id, coalesce(e.b, false) AS bury
    )
    SELECT array_agg(id), array_agg(id) FILTER (WHERE bury) INTO done, buried FROM nacked;
    IF buried IS NOT NULL THEN
        -- Locked by the update above; its error is on them already.
        PERFORM postbox._bury(q, buried);
    END IF;
    IF done IS NOT NULL THEN
        PERFORM postbox._notify(q);
    END IF;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Gives one received message back, or with dead_letter (since 0.9.0) ends its
-- tries; see nack_batch. PB412 for a stale receipt, PB404 if the message is gone.
CREATE OR REPLACE FUNCTION postbox.nack(queue_name text, receipt text, delay interval DEFAULT NULL,
                             error text DEFAULT NULL, dead_letter boolean DEFAULT false)
RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.nack_batch(queue_name, ARRAY[receipt], postbox._array_of(delay), postbox._array_of(error),
                            postbox._array_of(nullif(dead_letter, false)))
$$;

-- send_batch's every case: options, FIFO order, deduplication, depth limits and
-- every error. send_batch (below) takes the plain case past it.
CREATE OR REPLACE FUNCTION postbox._send_batch_general(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL,
    max_receive_counts integer[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(bodies), 0);
    problem text;
    sent_at timestamptz;
    latest timestamptz;
    ids bigint[];
    resolved bigint[];
    dedup text[];
    keys text[];  -- dedupe keys; each one's last entry; the message its row named when claimed
    lasts bigint[];
    holders bigint[];
    held integer;  -- keys whose row named a message already
    with_priority boolean;
    with_keys boolean;
    filled bigint[];  -- messages that hold their key and took new content
    with_ids integer;  -- entries with a deduplication id
    claimed bigint;  -- of them, those whose id this send recorded
    adding bigint;
    depth bigint;
BEGIN
    IF q.send_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for sending; ResumeQueue lets sends in again', quote_literal(queue_name));
    END IF;
    -- A writer of the messages table from here on, before the clock is read:
    -- receive_floor stays at or before the start of every transaction that holds
    -- this lock, so a message stamped sent_at can never land behind the floor,
    -- however long the locks below keep the send waiting. (The lock is the one
    -- the insert takes anyway, and conflicts with no other writer.)
    LOCK TABLE postbox.messages IN ROW EXCLUSIVE MODE;
    sent_at := clock_timestamp();
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(attributes), cardinality(delays), cardinality(message_group_ids),
                cardinality(deduplication_ids), cardinality(dedupe_keys), cardinality(priorities),
                cardinality(deliver_ats), cardinality(ttls), cardinality(expire_ats),
                cardinality(max_receive_counts)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    -- A message must become visible before it expires, so a delay stays below
    -- the retention (with none, below a year).
    latest := sent_at + coalesce(q.retention, interval '365 days');
    SELECT postbox._entry_prefix(c.i, n) || c.problem INTO problem
    FROM (
        SELECT e.i, CASE
            WHEN e.b IS NULL THEN 'body must not be NULL'
            WHEN q.fifo AND (e.d IS NOT NULL OR e.t IS NOT NULL) THEN
                'FIFO queues take no per-message delay; set the queue''s delivery_delay instead'
            WHEN e.d IS NOT NULL AND e.t IS NOT NULL THEN 'give a delay or a delivery time, not both'
            WHEN e.d < interval '0' THEN format('delay %s s is negative', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest AND q.retention IS NULL THEN
                format('delay %s s is beyond the longest delay, 365 days', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest THEN format(
                'delay %s s is not shorter than the queue''s retention, %s s: the message would expire before '
                'it became visible; shorten the delay or raise retention',
                trim_scale(extract(epoch FROM e.d)), trim_scale(extract(epoch FROM q.retention)))
            WHEN e.t >= latest AND q.retention IS NULL THEN
                format('delivery time %s is beyond the longest delay, 365 days from now', e.t)
            WHEN e.t >= latest THEN format(
                'delivery time %s is not before %s, when the message would expire (the queue''s retention is '
                '%s s): deliver it sooner or raise retention', e.t, latest, trim_scale(extract(epoch FROM q.retention)))
            WHEN e.l IS NOT NULL AND e.e IS NOT NULL THEN 'give a ttl or an expire_time, not both'
            WHEN e.l <= interval '0' THEN format('ttl %s s must be above 0', trim_scale(extract(epoch FROM e.l)))
            WHEN coalesce(e.e, sent_at + e.l) <= postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) THEN format(
                'the message would expire (at %s) before it became visible (at %s): expire it later or deliver it '
                'sooner', coalesce(e.e, sent_at + e.l), postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay))
            WHEN e.p NOT BETWEEN 0 AND 9 THEN format('priority %s is outside 0 to 9', e.p)
            WHEN q.fifo AND e.p > 0 THEN 'FIFO queues deliver in order; priority is for standard queues'
            WHEN q.fifo AND e.g IS NULL THEN 'FIFO queues need a message_group_id'
            -- Length and a character class, not '^[!-~]{1,128}$': the bounded repetition
            -- made the regex engine take tens of microseconds per id, more than a
            -- message's insert (the SDK's Producer gives every message an id).
            WHEN length(e.g) NOT BETWEEN 1 AND 128 OR e.g ~ '[^!-~]' THEN
                'message_group_id must be 1 to 128 printable ASCII characters'
            WHEN length(e.x) NOT BETWEEN 1 AND 128 OR e.x ~ '[^!-~]' THEN
                'deduplication_id must be 1 to 128 printable ASCII characters'
            WHEN q.fifo AND e.x IS NULL AND NOT q.content_based_deduplication THEN
                'FIFO queues need a deduplication_id unless the queue has content_based_deduplication'
            WHEN e.k IS NOT NULL AND q.fifo THEN
                'dedupe_key is for standard queues; FIFO queues deduplicate by deduplication_id'
            WHEN e.k IS NOT NULL AND e.x IS NOT NULL THEN 'give a dedupe_key or a deduplication_id, not both'
            WHEN length(e.k) NOT BETWEEN 1 AND 256 THEN 'dedupe_key must be 1 to 256 characters'
            WHEN postbox.message_size(e.b, e.a) > q.max_message_size THEN format(
                'message is %s bytes; the queue takes at most %s (body and attributes)',
                postbox.message_size(e.b, e.a), q.max_message_size)
            WHEN e.r NOT BETWEEN 1 AND 1000 THEN format('max_receive_count is %s; it must be 1 to 1000', e.r)
        END AS problem
        FROM unnest(bodies, delays, deliver_ats, priorities, message_group_ids, deduplication_ids,
                    dedupe_keys, attributes, ttls, expire_ats, max_receive_counts)
             WITH ORDINALITY AS e(b, d, t, p, g, x, k, a, l, e, r, i)
    ) AS c
    WHERE c.problem IS NOT NULL
    ORDER BY c.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;

    PERFORM postbox._lock_queue(q, false);
    with_priority := EXISTS (SELECT FROM unnest(priorities) p WHERE p > 0);
    with_keys := EXISTS (SELECT FROM unnest(dedupe_keys) k WHERE k IS NOT NULL);
    IF with_priority AND NOT q.prioritized OR with_keys AND NOT q.keyed THEN
        PERFORM postbox._mark_queue(q.id, with_priority, with_keys);
    END IF;
    IF NOT q.fifo AND NOT q.content_based_deduplication AND q.max_depth IS NULL
       AND deduplication_ids IS NULL AND dedupe_keys IS NULL THEN
        -- The common case, in one statement: identity values are drawn in
        -- insertion order, so id order is input order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body, priority,
                                          message_group_id, expires_at, max_receive_count)
            SELECT q.id, postbox._visible_at(sent_at, d, t, q.delivery_delay), sent_at,
                   a, b, coalesce(p, 0), g, coalesce(x, sent_at + l), r
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, ttls, expire_ats,
                        max_receive_counts)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, l, x, r, i)
            ORDER BY i
            RETURNING id, expires_at
        ), expiring AS (
            INSERT INTO postbox.message_expiries (message_id, expires_at)
            SELECT id, expires_at FROM inserted WHERE expires_at IS NOT NULL
        )
        SELECT id, false FROM inserted ORDER BY id;
        PERFORM postbox._notify(q);
        RETURN;
    END IF;

    -- FIFO groups are locked before ids are drawn, so a group's id order is the
    -- order in which its sends commit.
    IF q.fifo THEN
        PERFORM postbox._lock_groups(q.id, message_group_ids);
    END IF;
    SELECT array_agg(nextval('postbox.messages_id_seq') ORDER BY s) INTO ids FROM generate_series(1, n) AS s;
    resolved := ids;

    -- Deduplication: the first entry with an id claims it unless the queue saw it
    -- within its window (a concurrent claimer is waited for); the rest resolve to
    -- the claimer's message. An entry with a dedupe_key is never deduplicated by
    -- content: its key decides, and it may not become a message of its own id, so
    -- a recorded hash would point later sends at a message that never existed.
    dedup := ARRAY(
        SELECT CASE WHEN k IS NULL THEN
                   coalesce(x, CASE WHEN q.content_based_deduplication THEN encode(sha256(b), 'hex') END)
               END
        FROM unnest(bodies, deduplication_ids, dedupe_keys) WITH ORDINALITY AS e(b, x, k, i) ORDER BY i);
    with_ids := cardinality(array_remove(dedup, NULL));
    IF with_ids > 0 THEN
        INSERT INTO postbox.deduplication AS d (queue_id, deduplication_id, message_id, expires_at)
        SELECT DISTINCT ON (e.x) q.id, e.x, ids[e.i], sent_at + q.deduplication_window
        FROM unnest(dedup) WITH ORDINALITY AS e(x, i)
        WHERE e.x IS NOT NULL
        ORDER BY e.x, e.i
        ON CONFLICT (queue_id, deduplication_id) DO UPDATE
        SET message_id = excluded.message_id, expires_at = excluded.expires_at
        WHERE d.expires_at <= sent_at;
        GET DIAGNOSTICS claimed = ROW_COUNT;
        -- Every entry with an id claimed it (the ids were distinct, none seen within
        -- the window): each resolves to its own message, and the look-ups, one index
        -- scan per entry, are skipped (a tenth of a Producer's batch in the database).
        IF claimed < with_ids THEN
            resolved := ARRAY(
                SELECT coalesce((SELECT d.message_id FROM postbox.deduplication d
                                 WHERE d.queue_id = q.id AND d.deduplication_id = e.x), ids[e.i])
                FROM unnest(dedup) WITH ORDINALITY AS e(x, i) ORDER BY e.i);
        END IF;
    END IF;

    -- Idempotent enqueue: the last entry of a key carries the content. The
    -- key's row in dedupe_keys, locked first (in key order, so two batches
    -- never wait on each other in a circle), names the message that holds the
    -- key. While that message waits (not received, removed or expired) it takes
    -- the content; otherwise the entry becomes a message of its own, which the
    -- row then names. Receives and removals free keys without waiting for rows
    -- (see _free_keys), so a row may name a message that holds its key no more.
    IF dedupe_keys IS NOT NULL THEN
        SELECT array_agg(l.k ORDER BY l.k), array_agg(l.i ORDER BY l.k) INTO keys, lasts
        FROM (SELECT DISTINCT ON (e.k) e.k, e.i FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
              WHERE e.k IS NOT NULL ORDER BY e.k, e.i DESC) AS l;
        WITH claimed AS (
            INSERT INTO postbox.dedupe_keys AS d (queue_id, dedupe_key, message_id)
            SELECT q.id, l.k, ids[l.i] FROM unnest(keys, lasts) WITH ORDINALITY AS l(k, i, n) ORDER BY l.n
            ON CONFLICT (queue_id, dedupe_key) DO UPDATE SET message_id = d.message_id  -- locks, keeps
            RETURNING d.dedupe_key, d.message_id
        )
        SELECT array_agg(c.message_id ORDER BY l.n), count(*) FILTER (WHERE c.message_id <> ALL (ids))
        INTO holders, held
        FROM unnest(keys) WITH ORDINALITY AS l(k, n) JOIN claimed c ON c.dedupe_key = l.k;
        IF held > 0 THEN
            -- A statement of its own: its snapshot sees a holder whose send
            -- committed while the claim waited for the key's row.
            WITH filled AS (
                UPDATE postbox.messages m
                SET body = bodies[h.i], attributes = _send_batch_general.attributes[h.i],
                    priority = coalesce(priorities[h.i], 0),
                    expires_at = coalesce(expire_ats[h.i], sent_at + ttls[h.i]),
                    max_receive_count = max_receive_counts[h.i]
                FROM unnest(keys, lasts, holders) AS h(k, i, id)
                WHERE m.id = h.id AND h.id <> ids[h.i] AND m.queue_id = q.id AND m.dedupe_key = h.k
                  AND NOT coalesce(m.enqueued_at < now() - q.retention OR m.expires_at <= now(), false)
                RETURNING m.id
            )
            SELECT array_agg(f.id) INTO filled FROM filled f;
            -- Their expiries as they are now.
            DELETE FROM postbox.message_expiries WHERE message_id = ANY (filled);
            IF ttls IS NOT NULL OR expire_ats IS NOT NULL THEN
                INSERT INTO postbox.message_expiries (message_id, expires_at)
                SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.id = ANY (filled) AND m.expires_at IS NOT NULL;
            END IF;
            IF coalesce(cardinality(filled), 0) < held THEN
                -- Keys whose message holds them no more name the message this send makes.
                UPDATE postbox.dedupe_keys d SET message_id = ids[h.i]
                FROM unnest(keys, lasts, holders) AS h(k, i, id)
                WHERE d.queue_id = q.id AND d.dedupe_key = h.k AND h.id <> ids[h.i]
                  AND h.id <> ALL (coalesce(filled, '{}'));
            END IF;
        END IF;
        -- A key's entries resolve to the message that took the content, or to the
        -- key's last entry, which the insert below makes a message.
        SELECT ARRAY(
            SELECT CASE WHEN e.k IS NULL THEN resolved[e.i]
                        WHEN h.id = ANY (filled) THEN h.id
                        ELSE ids[h.i] END
            FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
            LEFT JOIN unnest(keys, lasts, holders) AS h(k, i, id) ON h.k = e.k
            ORDER BY e.i)
        INTO resolved;
    END IF;

    IF q.max_depth IS NOT NULL THEN
        -- Bounded queues take their sends one at a time, so the count is exact.
        PERFORM pg_advisory_xact_lock(1886350199, q.id);  -- 'posu'
        SELECT count(*) FILTER (WHERE r = id) INTO adding FROM unnest(resolved, ids) AS e(r, id);
        SELECT count(*) INTO depth
        FROM (SELECT FROM postbox.messages WHERE queue_id = q.id LIMIT q.max_depth + 1) AS s;
        IF depth + adding > q.max_depth THEN
            RAISE EXCEPTION USING ERRCODE = 'PB429', MESSAGE = format(
                'queue %s holds %s messages and its max_depth is %s, so %s more do not fit; '
                'receive some or raise max_depth', quote_literal(queue_name), depth, q.max_depth, adding);
        END IF;
    END IF;

    -- Every entry that is a message of its own: no duplicate, and for a key the
    -- last entry, when the key's message did not take its content.
    INSERT INTO postbox.messages (id, queue_id, visible_at, enqueued_at, attributes, body, priority,
                                  message_group_id, deduplication_id, dedupe_key, expires_at, max_receive_count)
    OVERRIDING SYSTEM VALUE
    SELECT ids[e.i], q.id,
           CASE WHEN q.fifo AND (row_number() OVER (PARTITION BY e.g ORDER BY e.i) > 1
                                 OR EXISTS (SELECT FROM postbox.messages x
                                            WHERE x.queue_id = q.id AND x.message_group_id = e.g))
                THEN 'infinity'
                ELSE postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) END,
           sent_at, e.a, e.b, coalesce(e.p, 0), e.g, e.x, e.k, coalesce(e.e, sent_at + e.l), e.c
    FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedup,
                dedupe_keys, resolved, ttls, expire_ats, max_receive_counts)
         WITH ORDINALITY AS e(b, a, d, t, p, g, x, k, r, l, e, c, i)
    WHERE e.r = ids[e.i]
    ORDER BY e.i;
    IF ttls IS NOT NULL OR expire_ats IS NOT NULL THEN
        INSERT INTO postbox.message_expiries (message_id, expires_at)
        SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.id = ANY (ids) AND m.expires_at IS NOT NULL;
    END IF;
    PERFORM postbox._notify(q);
    RETURN QUERY SELECT e.r, e.r <> ids[e.i] FROM unnest(resolved) WITH ORDINALITY AS e(r, i) ORDER BY e.i;
END
$$;

-- Sends up to 1,000 messages in one go; returns their ids in input order, and
-- whether each was a duplicate (then nothing was enqueued and the id is the
-- original message's). Entry i of every array belongs to bodies[i]; an array may
-- be NULL or shorter (missing entries are NULL):
--   attributes       see attribute_problem
--   delays           invisible this long first (NULL: the queue's delivery_delay)
--   message_group_ids  FIFO queues: required; delivery is in order per group
--   deduplication_ids  a repeat within the queue's deduplication_window is
--                      dropped (content-based when the queue says so)
--   dedupe_keys      standard queues: replaces the body and attributes of a
--                    waiting (never received) message with the same key
--   priorities       0-9, standard queues; higher is received first
--   deliver_ats      invisible until then (instead of a delay)
--   max_receive_counts  since 0.9.0: 1-1000 deliveries, the message's own
--                    limit in place of the queue's (see receive)
-- Nothing is sent if any entry is invalid; the error names the entry by its
-- 0-based index. PB503 while sends are paused, PB429 when max_depth is reached.
--
-- Bodies alone into a queue without FIFO order, deduplication, a depth limit or
-- paused sends take a straight path of two statements: the general one's
-- checks and branches cost as much as the insert of a hundred messages. It
-- takes, in one expression (an assignment is evaluated without starting a
-- statement), its transaction id and the queue's lock by name, then looks the
-- queue up:
--   * the lock first, so the look sees a drop that committed meanwhile, and the
--     insert needs no second look;
--   * the transaction id first, so that a listing that the look misses sees
--     this transaction in progress, and waits for it (see listen_to).
-- The clock is read in the insert, which holds the table's lock by then (see
-- the general path). Only in READ COMMITTED: elsewhere the look reads the
-- transaction's snapshot, which may predate a drop, and the general path looks
-- under a row lock instead (see _lock_queue).
CREATE OR REPLACE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL,
    max_receive_counts integer[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    -- The queue's, as scalars (see send).
    q_id integer;
    q_delay interval;
    q_max_message_size integer;
    q_listened boolean;
    locked text;
BEGIN
    IF num_nonnulls(attributes, delays, message_group_ids, deduplication_ids, dedupe_keys, priorities,
                    deliver_ats, ttls, expire_ats, max_receive_counts) = 0 AND cardinality(bodies) BETWEEN 1 AND 1000
       AND array_position(bodies, NULL) IS NULL AND current_setting('transaction_isolation') = 'read committed' THEN
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.max_message_size, x.listened
        INTO q_id, q_delay, q_max_message_size, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused);
    END IF;
    -- No body is longer than the whole array, so the bodies are looked at one by
    -- one only when the array is over the limit: that look cost 4% of a batch
    -- of 100 (valgrind). An expanded array (plpgsql expands its array arguments)
    -- is never compressed; the second test says so for certain. The look has an
    -- IF of its own: plpgsql runs a condition with a subquery as a statement,
    -- on every call (0.6% of a batch of 100).
    IF pg_column_size(bodies) > q_max_message_size OR pg_column_compression(bodies) IS NOT NULL THEN
        IF EXISTS (SELECT FROM unnest(bodies) AS b WHERE octet_length(b) > q_max_message_size) THEN
            q_id := NULL;  -- the general path says which body is too long
        END IF;
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error.
        RETURN QUERY SELECT * FROM postbox._send_batch_general(
            queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    -- unnest sits in the select list (a ProjectSet, where FROM unnest would first
    -- copy every body into a tuplestore), so the rows go to the insert in input
    -- order with no sort: ids are drawn, and returned, in input order (as the
    -- tests hold). The call's values are worked out once, in a one-row subquery
    -- that OFFSET 0 keeps from being pulled up: in the select list, they were
    -- evaluated for each row (0.3%).
    RETURN QUERY
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT c.queue_id, c.visible_at, c.sent_at, unnest(bodies), 0
    FROM (SELECT q_id AS queue_id, t AS sent_at, t + q_delay AS visible_at
          FROM clock_timestamp() AS t OFFSET 0) AS c
    RETURNING id, false;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
END
$$;

-- Sends one message; returns its id (the original's, for a duplicate). See
-- send_batch for the options and rules. A message that is nothing but a body,
-- into a queue without FIFO order, deduplication or a depth limit (the common
-- transactional send), takes a straight path: send_batch's checks and branches
-- cost as much as the insert itself when many sessions each send one.
CREATE OR REPLACE FUNCTION postbox.send(
    queue_name text, body bytea, attributes jsonb DEFAULT NULL, delay interval DEFAULT NULL,
    message_group_id text DEFAULT NULL, deduplication_id text DEFAULT NULL,
    dedupe_key text DEFAULT NULL, priority integer DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    ttl interval DEFAULT NULL, expire_at timestamptz DEFAULT NULL, max_receive_count integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- The queue's, as scalars: a row variable's fields cost 5% of the call (valgrind).
    q_id integer;
    q_delay interval;
    q_listened boolean;
    locked text;
    sent_id bigint;
BEGIN
    IF body IS NOT NULL AND num_nonnulls(attributes, delay, message_group_id, deduplication_id, dedupe_key,
                                         priority, deliver_at, ttl, expire_at, max_receive_count) = 0
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- As send_batch's straight path (see there).
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.listened INTO q_id, q_delay, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused OR octet_length(body) > x.max_message_size);
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error, as send_batch has it.
        RETURN (SELECT s.message_id FROM postbox._send_batch_general(
            queue_name, ARRAY[body], postbox._array_of(attributes), postbox._array_of(delay),
            postbox._array_of(message_group_id), postbox._array_of(deduplication_id),
            postbox._array_of(dedupe_key), postbox._array_of(priority), postbox._array_of(deliver_at),
            postbox._array_of(ttl), postbox._array_of(expire_at), postbox._array_of(max_receive_count)) s);
    END IF;
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT q_id, c.sent_at + q_delay, c.sent_at, body, 0
    FROM (SELECT clock_timestamp() AS sent_at) AS c
    RETURNING messages.id INTO sent_id;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
    RETURN sent_id;
END
$$;

-- Browses a queue's messages in id order without claiming them: all of them,
-- or those in one state (visible, in_flight, delayed), or the dead letters
-- ('dead', whatever their state). Expired messages are not shown. Since 0.9.0
-- with the consumer that took the latest delivery, when, and the message's own
-- max_receive_count.
CREATE OR REPLACE FUNCTION postbox.peek_messages(queue_name text, in_state text DEFAULT NULL, after_id bigint DEFAULT 0,
                                      page_size integer DEFAULT 100)
RETURNS TABLE (message_id bigint, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz,
               consumer_id text, received_at timestamptz, max_receive_count integer)
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
CREATE OR REPLACE FUNCTION postbox._message_lives(seen_from integer, in_state text, first_id bigint, last_id bigint,
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
CREATE OR REPLACE FUNCTION postbox.get_message(queue_name text, id bigint)
RETURNS TABLE (message_id bigint, queue text, body bytea, attributes jsonb, enqueued_at timestamptz,
               receive_count integer, first_received_at timestamptz, priority smallint,
               message_group_id text, deduplication_id text, dead_letter_source text, last_error text,
               state text, visible_at timestamptz, expires_at timestamptz, consumer_id text,
               received_at timestamptz, finished_at timestamptz, result bytea, max_receive_count integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    RETURN QUERY SELECT * FROM postbox._message_lives(q.id, NULL, id, id, 1);
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
CREATE OR REPLACE FUNCTION postbox.list_messages(queue_name text DEFAULT NULL, in_state text DEFAULT NULL,
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

-- In-flight messages per queue and consumer, for metrics (since 0.9.0): the
-- max_consumers (queue, consumer) pairs that hold the most, and per queue one
-- row '(other)' for the rest; deliveries taken without a consumer id count as
-- '(none)'. Neither is a valid consumer id, so neither is mistaken for one. So
-- a scrape has at most max_consumers rows plus one per queue.
CREATE OR REPLACE FUNCTION postbox.consumer_metrics(max_consumers integer DEFAULT 20)
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

-- The caller's input as an error quotes it: whole when short, else its first 80
-- characters and its length (server/errors.py quoted() writes the same).
CREATE FUNCTION postbox._quoted(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(value) <= 80 THEN quote_literal(value)
                ELSE quote_literal(left(value, 80)) || '… (' || octet_length(value) || ' bytes)' END
$$;

-- Checks a webhook endpoint and writes it into s: the URL, the secret (a new
-- one when empty) and the settings (a full set, in the shape of
-- webhook_defaults()).
CREATE OR REPLACE FUNCTION postbox._webhook(s postbox.subscriptions, webhook_url text, webhook_secret text, settings jsonb)
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    unknown text;
    number numeric;
BEGIN
    IF length(webhook_url) > 2048 OR webhook_url !~* '^https?://[^/?#[:space:]]+([/?#][^[:space:]]*)?$' THEN
        PERFORM postbox._invalid(format(
            'webhook URL %s must be an http:// or https:// URL of at most 2048 characters',
            postbox._quoted(webhook_url)));
    END IF;
    s.webhook_url := webhook_url;
    IF coalesce(webhook_secret, '') = '' THEN
        -- gen_random_uuid draws from the server's strong random source.
        s.webhook_secret := 'whsec_' || encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                                               'base64');
    ELSIF webhook_secret !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' OR (length(webhook_secret) - 6) % 4 <> 0
          OR length(decode(substr(webhook_secret, 7), 'base64')) NOT BETWEEN 24 AND 64 THEN
        PERFORM postbox._invalid('webhook secret must be "whsec_" followed by the base64 of 24 to 64 bytes; '
                                 'leave it empty to have one generated');
    ELSE
        s.webhook_secret := webhook_secret;
    END IF;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k WHERE NOT postbox.webhook_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown webhook setting(s): %s', unknown));
    END IF;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k WHERE jsonb_typeof(settings -> k) <> 'number';
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('webhook setting(s) %s must be numbers', unknown));
    END IF;
    number := (settings ->> 'timeout')::numeric;
    IF number NOT BETWEEN 1 AND 60 THEN
        PERFORM postbox._invalid(format('webhook timeout is %s s; it must be 1 to 60 s', number));
    END IF;
    s.webhook_timeout := make_interval(secs => number);
    number := (settings ->> 'max_attempts')::numeric;
    IF number <> trunc(number) OR number NOT BETWEEN 1 AND 100 THEN
        PERFORM postbox._invalid(format('webhook max_attempts is %s; it must be 1 to 100', number));
    END IF;
    s.webhook_max_attempts := number::integer;
    number := (settings ->> 'minimum_backoff')::numeric;
    IF number NOT BETWEEN 0.1 AND 3600 THEN
        PERFORM postbox._invalid(format('webhook minimum_backoff is %s s; it must be 0.1 s to 1 h', number));
    END IF;
    s.webhook_minimum_backoff := make_interval(secs => number);
    number := (settings ->> 'maximum_backoff')::numeric;
    IF number < extract(epoch FROM s.webhook_minimum_backoff) OR number > 86400 THEN
        PERFORM postbox._invalid(format(
            'webhook maximum_backoff is %s s; it must be minimum_backoff to 24 h', number));
    END IF;
    s.webhook_maximum_backoff := make_interval(secs => number);
    RETURN s;
END
$$;

-- The access policy document SQS clients set (Policy, AddPermission), kept and
-- returned, not enforced; and purge_queue forgets the deduplication ids.
ALTER TABLE postbox.queues ADD COLUMN access_policy text NOT NULL DEFAULT '';

-- Attribute defaults of a new queue; durations in seconds. A retention or
-- archive_retention of 0 keeps messages forever; a max_depth or
-- receive_rate_limit of 0 means no limit.
CREATE OR REPLACE FUNCTION postbox.queue_defaults() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"visibility_timeout": 30, "delivery_delay": 0, "retention": 345600,
             "max_message_size": 1048576, "receive_wait_time": 0,
             "content_based_deduplication": false, "deduplication_window": 300,
             "dead_letter_policy": null,
             "redrive_allow_policy": {"permission": "allow_all", "source_queues": []},
             "retry_policy": {"minimum_backoff": 1, "maximum_backoff": 600},
             "archive_on_delete": false, "archive_retention": 604800,
             "max_depth": 0, "receive_rate_limit": 0, "tags": {}, "access_policy": ""}'::jsonb
$$;

-- The attributes of a queue as settings jsonb, in the shape of queue_defaults().
CREATE OR REPLACE FUNCTION postbox.queue_settings(q postbox.queues) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'visibility_timeout', extract(epoch FROM q.visibility_timeout),
        'delivery_delay', extract(epoch FROM q.delivery_delay),
        'retention', coalesce(extract(epoch FROM q.retention), 0),
        'max_message_size', q.max_message_size,
        'receive_wait_time', extract(epoch FROM q.receive_wait_time),
        'content_based_deduplication', q.content_based_deduplication,
        'deduplication_window', extract(epoch FROM q.deduplication_window),
        'dead_letter_policy', CASE WHEN q.dead_letter_queue_id IS NOT NULL THEN jsonb_build_object(
            'dead_letter_queue', (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id),
            'max_receive_count', q.max_receive_count) END,
        'redrive_allow_policy', jsonb_build_object(
            'permission', q.redrive_permission, 'source_queues', to_jsonb(q.redrive_sources)),
        'retry_policy', jsonb_build_object(
            'minimum_backoff', extract(epoch FROM q.retry_minimum_backoff),
            'maximum_backoff', extract(epoch FROM q.retry_maximum_backoff)),
        'archive_on_delete', q.archive_on_delete,
        'archive_retention', coalesce(extract(epoch FROM q.archive_retention), 0),
        'max_depth', coalesce(q.max_depth, 0),
        'receive_rate_limit', coalesce(q.receive_rate_limit, 0),
        'tags', q.tags,
        'access_policy', q.access_policy)
$$;

-- Checks settings jsonb (a full set, in the shape of queue_defaults()) and
-- writes them into q; q.name and q.fifo must be set.
CREATE OR REPLACE FUNCTION postbox._apply_settings(q postbox.queues, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    unknown text;
    key text;
    number numeric;
    policy jsonb;
    dlq postbox.queues;
BEGIN
    PERFORM postbox._invalid(postbox._settings_name_problem(settings))
    WHERE postbox._settings_name_problem(settings) IS NOT NULL;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k
    WHERE NOT postbox.queue_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown queue setting(s): %s', unknown));
    END IF;
    FOREACH key IN ARRAY ARRAY['max_message_size', 'max_depth', 'receive_rate_limit'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid(format('queue setting %s must be a number', key));
        END IF;
    END LOOP;
    FOREACH key IN ARRAY ARRAY['content_based_deduplication', 'archive_on_delete'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'boolean' THEN
            PERFORM postbox._invalid(format('queue setting %s must be true or false', key));
        END IF;
    END LOOP;

    q.visibility_timeout := postbox._seconds_setting(settings, 'visibility_timeout', 0, 43200);
    q.retention := postbox._seconds_setting(settings, 'retention', 60, 1209600, true);
    q.delivery_delay := postbox._seconds_setting(settings, 'delivery_delay', 0, 31536000);
    -- Otherwise every message would expire before it became visible.
    IF q.delivery_delay >= q.retention THEN
        PERFORM postbox._invalid(format(
            'delivery_delay is %s s and retention %s s: delivery_delay must be shorter than retention, '
            'or messages would expire before they became visible; lower delivery_delay or raise retention',
            trim_scale(extract(epoch FROM q.delivery_delay)), trim_scale(extract(epoch FROM q.retention))));
    END IF;
    q.receive_wait_time := postbox._seconds_setting(settings, 'receive_wait_time', 0, 20);
    q.deduplication_window := postbox._seconds_setting(settings, 'deduplication_window', 1, 604800);
    q.archive_retention := postbox._seconds_setting(settings, 'archive_retention', 60, 1209600, true);

    number := (settings ->> 'max_message_size')::numeric;
    IF number <> trunc(number) OR number < 1024 OR number > 67108864 THEN
        PERFORM postbox._invalid(format(
            'max_message_size is %s; it must be a whole number of bytes from 1024 to 67108864', number));
    END IF;
    q.max_message_size := number::integer;
    number := (settings ->> 'max_depth')::numeric;
    IF number <> trunc(number) OR number < 0 OR number > 1e15 THEN
        PERFORM postbox._invalid(format('max_depth is %s; it must be a whole number, 0 for no limit', number));
    END IF;
    q.max_depth := nullif(number, 0)::bigint;
    number := (settings ->> 'receive_rate_limit')::numeric;
    IF number < 0 OR number > 1e6 THEN
        PERFORM postbox._invalid(format(
            'receive_rate_limit is %s; it must be 0 (no limit) to 1000000 messages per second', number));
    END IF;
    q.receive_rate_limit := nullif(number, 0)::double precision;
    q.content_based_deduplication := (settings ->> 'content_based_deduplication')::boolean;
    q.archive_on_delete := (settings ->> 'archive_on_delete')::boolean;

    -- Bounds left out keep their defaults.
    policy := (postbox.queue_defaults() -> 'retry_policy') || coalesce(settings -> 'retry_policy', '{}');
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('minimum_backoff', 'maximum_backoff')) THEN
        PERFORM postbox._invalid('retry_policy must be an object of minimum_backoff and maximum_backoff (seconds)');
    END IF;
    q.retry_minimum_backoff := postbox._seconds_setting(policy, 'minimum_backoff', 0, 43200);
    q.retry_maximum_backoff := postbox._seconds_setting(policy, 'maximum_backoff', 0, 43200);
    IF q.retry_minimum_backoff > q.retry_maximum_backoff THEN
        PERFORM postbox._invalid('retry_policy: minimum_backoff must not exceed maximum_backoff');
    END IF;

    policy := settings -> 'redrive_allow_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('permission', 'source_queues'))
       OR NOT coalesce(policy ->> 'permission' IN ('allow_all', 'deny_all', 'by_queue'), false)
       OR jsonb_typeof(coalesce(policy -> 'source_queues', '[]')) <> 'array'
       OR EXISTS (SELECT FROM jsonb_array_elements(coalesce(policy -> 'source_queues', '[]')) e
                  WHERE jsonb_typeof(e) <> 'string') THEN
        PERFORM postbox._invalid('redrive_allow_policy must be an object of permission (allow_all, '
                                 'deny_all or by_queue) and source_queues (queue names)');
    END IF;
    q.redrive_permission := policy ->> 'permission';
    q.redrive_sources := ARRAY(SELECT jsonb_array_elements_text(coalesce(policy -> 'source_queues', '[]')));
    IF (q.redrive_permission = 'by_queue') <> (cardinality(q.redrive_sources) > 0)
       OR cardinality(q.redrive_sources) > 10 THEN
        PERFORM postbox._invalid('redrive_allow_policy: by_queue takes 1 to 10 source_queues, '
                                 'allow_all and deny_all take none');
    END IF;

    policy := settings -> 'tags';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR (SELECT count(*) FROM jsonb_object_keys(policy)) > 50
       OR EXISTS (SELECT FROM jsonb_each(policy) e
                  WHERE length(e.key) NOT BETWEEN 1 AND 128 OR jsonb_typeof(e.value) <> 'string'
                        OR length(e.value #>> '{}') > 256) THEN
        PERFORM postbox._invalid('tags must be an object of at most 50 keys (1 to 128 characters) '
                                 'with string values (at most 256 characters)');
    END IF;
    q.tags := policy;

    -- An access policy document (SQS's Policy): kept as given, not enforced.
    policy := settings -> 'access_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'string' OR octet_length(policy #>> '{}') > 20480 THEN
        PERFORM postbox._invalid('access_policy must be a string of at most 20480 bytes');
    END IF;
    q.access_policy := policy #>> '{}';

    policy := settings -> 'dead_letter_policy';
    IF policy IS NULL OR policy = 'null' THEN
        q.dead_letter_queue_id := NULL;
        q.max_receive_count := NULL;
    ELSE
        IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
           OR EXISTS (SELECT FROM jsonb_object_keys(policy) k
                      WHERE k NOT IN ('dead_letter_queue', 'max_receive_count'))
           OR jsonb_typeof(policy -> 'dead_letter_queue') IS DISTINCT FROM 'string'
           OR jsonb_typeof(policy -> 'max_receive_count') IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid('dead_letter_policy must be an object of dead_letter_queue (a queue '
                                     'name) and max_receive_count (1 to 1000)');
        END IF;
        number := (policy ->> 'max_receive_count')::numeric;
        IF number <> trunc(number) OR number NOT BETWEEN 1 AND 1000 THEN
            PERFORM postbox._invalid(format('max_receive_count is %s; it must be 1 to 1000', number));
        END IF;
        IF policy ->> 'dead_letter_queue' = q.name THEN
            PERFORM postbox._invalid('a queue cannot be its own dead-letter queue');
        END IF;
        SELECT * INTO dlq FROM postbox.queues WHERE name = policy ->> 'dead_letter_queue';
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
                'dead-letter queue %s does not exist; create it first', quote_literal(policy ->> 'dead_letter_queue'));
        ELSIF dlq.fifo <> q.fifo THEN
            PERFORM postbox._invalid('a FIFO queue needs a FIFO dead-letter queue, and a standard queue '
                                     'a standard one');
        ELSIF dlq.redrive_permission = 'deny_all'
              OR (dlq.redrive_permission = 'by_queue' AND NOT q.name = ANY (dlq.redrive_sources)) THEN
            PERFORM postbox._invalid(format('the redrive_allow_policy of %s does not let %s use it as '
                                            'dead-letter queue', quote_literal(dlq.name), quote_literal(q.name)));
        END IF;
        q.dead_letter_queue_id := dlq.id;
        q.max_receive_count := number::integer;
    END IF;
    RETURN q;
END
$$;

-- Creates a queue; a name ending in ".fifo" makes it a FIFO queue. settings:
-- any keys of queue_defaults(), e.g. '{"visibility_timeout": 60}'. PB409 if the
-- queue exists.
CREATE OR REPLACE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q.name := queue_name;
    q.fifo := right(queue_name, 5) = '.fifo';
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (
        name, visibility_timeout, delivery_delay, retention, max_message_size, receive_wait_time,
        fifo, content_based_deduplication, deduplication_window, dead_letter_queue_id,
        max_receive_count, redrive_permission, redrive_sources, retry_minimum_backoff,
        retry_maximum_backoff, archive_on_delete, archive_retention, max_depth, receive_rate_limit,
        send_paused, receive_paused, tags, access_policy)
    VALUES (
        queue_name, q.visibility_timeout, q.delivery_delay, q.retention, q.max_message_size,
        q.receive_wait_time, q.fifo, q.content_based_deduplication, q.deduplication_window,
        q.dead_letter_queue_id, q.max_receive_count, q.redrive_permission, q.redrive_sources,
        q.retry_minimum_backoff, q.retry_maximum_backoff, q.archive_on_delete, q.archive_retention,
        q.max_depth, q.receive_rate_limit, false, false, q.tags, q.access_policy)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('queue %s already exists', quote_literal(queue_name));
    END IF;
    RETURN q;
END
$$;

-- Changes the settings named in settings; a key whose value is null goes back
-- to its default.
CREATE OR REPLACE FUNCTION postbox.update_queue(queue_name text, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues;
    changes jsonb;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox._settings_name_problem(settings))
        WHERE postbox._settings_name_problem(settings) IS NOT NULL;
        q := postbox._queue(queue_name);  -- raises PB400 or PB404
    END IF;
    SELECT coalesce(jsonb_object_agg(key, CASE WHEN value = 'null' THEN postbox.queue_defaults() -> key
                                               ELSE value END), '{}')
    INTO changes
    FROM jsonb_each(coalesce(settings, '{}'));
    q := postbox._apply_settings(q, postbox.queue_settings(q) || changes);
    UPDATE postbox.queues
    SET visibility_timeout = q.visibility_timeout, delivery_delay = q.delivery_delay,
        retention = q.retention, max_message_size = q.max_message_size,
        receive_wait_time = q.receive_wait_time,
        content_based_deduplication = q.content_based_deduplication,
        deduplication_window = q.deduplication_window, dead_letter_queue_id = q.dead_letter_queue_id,
        max_receive_count = q.max_receive_count, redrive_permission = q.redrive_permission,
        redrive_sources = q.redrive_sources, retry_minimum_backoff = q.retry_minimum_backoff,
        retry_maximum_backoff = q.retry_maximum_backoff, archive_on_delete = q.archive_on_delete,
        archive_retention = q.archive_retention, max_depth = q.max_depth,
        receive_rate_limit = q.receive_rate_limit, tags = q.tags, access_policy = q.access_policy,
        updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

-- Deletes every message of a queue; returns how many. Sends wait meanwhile, so
-- no FIFO message is parked behind a head that the purge removed. Since 0.9.0 it
-- forgets the queue's deduplication ids too, as SQS's PurgeQueue does.
CREATE OR REPLACE FUNCTION postbox.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    purged bigint;
BEGIN
    PERFORM postbox._lock_queue(q, true);
    purged := postbox._delete_messages(q.id);
    DELETE FROM postbox.deduplication WHERE queue_id = q.id;
    UPDATE postbox.queues SET purged_at = now() WHERE id = q.id;
    RETURN purged;
END
$$;

-- API keys' last use (issue 47): a table of its own, without api_keys' trigger
-- (runtime state, left out of pg_dump), and the time in postbox.api_key.
CREATE TABLE postbox.api_key_usage (
    key_name text PRIMARY KEY REFERENCES postbox.api_keys (name) ON DELETE CASCADE ON UPDATE CASCADE,
    last_used_at timestamptz NOT NULL
);

ALTER TYPE postbox.api_key ADD ATTRIBUTE last_used_at timestamptz;
-- _api_key and all_keys are replaced below, with the rate limits too.

-- Records when keys were last used: key_names[i] at used_at[i]. A time older
-- than the one stored leaves it (several servers flush out of order); keys
-- deleted meanwhile are skipped.
CREATE FUNCTION postbox.record_key_use(key_names text[], used_at timestamptz[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO postbox.api_key_usage AS u (key_name, last_used_at)
    SELECT a.name, max(x.used_at)
    FROM unnest(key_names, used_at) AS x (key_name, used_at)
    JOIN postbox.api_keys a ON a.name = x.key_name
    GROUP BY a.name
    ON CONFLICT (key_name) DO UPDATE SET last_used_at = greatest(u.last_used_at, excluded.last_used_at)
$$;

-- API keys' rate limits (issue 47): a column, and in postbox.api_key; create_key
-- and update_key take them.
ALTER TABLE postbox.api_keys ADD COLUMN rate_limits jsonb CHECK (jsonb_typeof(rate_limits) = 'object');
ALTER TYPE postbox.api_key ADD ATTRIBUTE rate_limits jsonb;
DROP FUNCTION postbox.create_key(text, bytea, text, text[], text[], timestamptz);
DROP FUNCTION postbox.update_key(text, text[], text[], boolean, timestamptz);

-- The key of that name with its grants; PB400 for a malformed name, PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox._api_key(key_name text) RETURNS postbox.api_key
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k postbox.api_key;
BEGIN
    SELECT a.name, a.secret_sha256, a.sigv4_secret, a.expires_at, a.created_at, a.updated_at,
           array(SELECT g.permission FROM postbox.api_key_grants g WHERE g.key_name = a.name ORDER BY g.permission, g.pattern),
           array(SELECT g.pattern FROM postbox.api_key_grants g WHERE g.key_name = a.name ORDER BY g.permission, g.pattern),
           (SELECT u.last_used_at FROM postbox.api_key_usage u WHERE u.key_name = a.name),
           a.rate_limits
    INTO k FROM postbox.api_keys a WHERE a.name = key_name;
    IF NOT FOUND THEN
        IF postbox.name_problem('key', key_name) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.name_problem('key', key_name));
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('key %s does not exist', quote_literal(key_name));
    END IF;
    RETURN k;
END
$$;

-- Creates a key from the SHA-256 of its secret and its derived SigV4 secret
-- (the server makes the secret and shows it once), with grants, an optional
-- expiry and optional rate limits. PB409 if a key of that name exists; PB400 for a bad name,
-- grant or an expiry in the past.
CREATE FUNCTION postbox.create_key(
    key_name text, secret_sha256 bytea, sigv4_secret text, permissions text[], patterns text[],
    expires_at timestamptz DEFAULT NULL, rate_limits jsonb DEFAULT NULL)
RETURNS postbox.api_key
LANGUAGE plpgsql AS $$
BEGIN
    IF postbox.name_problem('key', key_name) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.name_problem('key', key_name));
    END IF;
    IF postbox.grants_problem(permissions, patterns) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.grants_problem(permissions, patterns));
    END IF;
    IF expires_at <= now() THEN
        PERFORM postbox._invalid('expiry must lie in the future');
    END IF;
    INSERT INTO postbox.api_keys (name, secret_sha256, sigv4_secret, expires_at, rate_limits)
    VALUES (key_name, secret_sha256, sigv4_secret, expires_at, rate_limits)
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('key %s already exists', quote_literal(key_name));
    END IF;
    INSERT INTO postbox.api_key_grants (key_name, permission, pattern)
    SELECT DISTINCT key_name, g.permission, g.pattern FROM unnest(permissions, patterns) AS g (permission, pattern);
    RETURN postbox._api_key(key_name);
END
$$;

-- Replaces a key's grants (when `permissions` is not NULL), its expiry (when
-- set_expiry; NULL expires_at: never) and/or its rate limits (when
-- set_rate_limits; NULL: none). PB404 if there is no such key.
CREATE FUNCTION postbox.update_key(
    key_name text, permissions text[], patterns text[], set_expiry boolean, expires_at timestamptz,
    set_rate_limits boolean DEFAULT false, rate_limits jsonb DEFAULT NULL)
RETURNS postbox.api_key
LANGUAGE plpgsql AS $$
DECLARE
    k postbox.api_key;
BEGIN
    PERFORM 1 FROM postbox.api_keys a WHERE a.name = key_name FOR UPDATE;
    IF NOT FOUND THEN
        k := postbox._api_key(key_name);  -- raises PB400 or PB404
    END IF;
    IF permissions IS NOT NULL THEN
        IF postbox.grants_problem(permissions, patterns) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.grants_problem(permissions, patterns));
        END IF;
        DELETE FROM postbox.api_key_grants g WHERE g.key_name = update_key.key_name;
        INSERT INTO postbox.api_key_grants (key_name, permission, pattern)
        SELECT DISTINCT update_key.key_name, g.permission, g.pattern
        FROM unnest(permissions, patterns) AS g (permission, pattern);
    END IF;
    IF set_expiry THEN
        IF expires_at <= now() THEN
            PERFORM postbox._invalid('expiry must lie in the future');
        END IF;
        UPDATE postbox.api_keys a SET expires_at = update_key.expires_at WHERE a.name = key_name;
    END IF;
    IF set_rate_limits THEN
        UPDATE postbox.api_keys a SET rate_limits = update_key.rate_limits WHERE a.name = key_name;
    END IF;
    UPDATE postbox.api_keys a SET updated_at = now() WHERE a.name = key_name;
    RETURN postbox._api_key(key_name);
END
$$;

-- Every key with its grants: what a server process caches.
CREATE OR REPLACE FUNCTION postbox.all_keys() RETURNS SETOF postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT a.name, a.secret_sha256, a.sigv4_secret, a.expires_at, a.created_at, a.updated_at,
           coalesce(array_agg(g.permission ORDER BY g.permission, g.pattern) FILTER (WHERE g.permission IS NOT NULL), '{}'),
           coalesce(array_agg(g.pattern ORDER BY g.permission, g.pattern) FILTER (WHERE g.permission IS NOT NULL), '{}'),
           NULL::timestamptz,  -- the cache checks calls; it has no use for the last use
           a.rate_limits
    FROM postbox.api_keys a LEFT JOIN postbox.api_key_grants g ON g.key_name = a.name
    GROUP BY a.name
$$;

-- FIFO receives take several messages of a group, in order (issue 52).
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
CREATE OR REPLACE FUNCTION postbox.receive(queue_name text, max_messages integer DEFAULT 1,
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


-- Payload schemas: queues and topics keep what their bodies must be, which the
-- server checks; create_topic and update_topic take it.
ALTER TABLE postbox.queues ADD COLUMN payload_schema jsonb;
ALTER TABLE postbox.topics ADD COLUMN payload_schema jsonb;

-- The message of a check of a payload_schema setting, or NULL when it is well
-- formed or null (no schema). Limits: a JSON Schema of at most 65536 bytes, a
-- descriptor set of at most 262144 bytes, a message type of 1-512 characters.
CREATE FUNCTION postbox._payload_schema_problem(payload_schema jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN payload_schema IS NULL OR payload_schema = 'null' THEN NULL
        WHEN jsonb_typeof(payload_schema) <> 'object'
             OR (SELECT count(*) FROM jsonb_object_keys(payload_schema)) <> 1
             OR NOT (payload_schema ? 'json_schema' OR payload_schema ? 'protobuf') THEN
            'payload_schema must be an object of exactly one of json_schema (the document''s text) '
            'and protobuf ({"file_descriptor_set": base64, "message_type": a full name})'
        WHEN payload_schema ? 'json_schema' THEN
            CASE WHEN jsonb_typeof(payload_schema -> 'json_schema') <> 'string'
                      OR octet_length(payload_schema ->> 'json_schema') NOT BETWEEN 1 AND 65536 THEN
                'payload_schema.json_schema must be a string of 1 to 65536 bytes'
            END
        WHEN jsonb_typeof(payload_schema -> 'protobuf') <> 'object'
             OR EXISTS (SELECT FROM jsonb_object_keys(payload_schema -> 'protobuf') k
                        WHERE k NOT IN ('file_descriptor_set', 'message_type'))
             OR jsonb_typeof(payload_schema #> '{protobuf,file_descriptor_set}') IS DISTINCT FROM 'string'
             OR jsonb_typeof(payload_schema #> '{protobuf,message_type}') IS DISTINCT FROM 'string' THEN
            'payload_schema.protobuf must be an object of file_descriptor_set (base64) and message_type'
        WHEN NOT (payload_schema #>> '{protobuf,file_descriptor_set}') ~ '^[A-Za-z0-9+/]*={0,2}$'
             OR length(payload_schema #>> '{protobuf,file_descriptor_set}') % 4 <> 0
             OR length(payload_schema #>> '{protobuf,file_descriptor_set}') > 349528 THEN
            'payload_schema.protobuf.file_descriptor_set must be base64 of at most 262144 bytes'
        WHEN length(payload_schema #>> '{protobuf,message_type}') NOT BETWEEN 1 AND 512 THEN
            'payload_schema.protobuf.message_type must be a full message name of 1 to 512 characters'
    END
$$;

CREATE FUNCTION postbox._payload_schema_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postbox', '#payload_schema:' || TG_TABLE_NAME || ':'
                                 || CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END);
    RETURN NULL;
END
$$;

-- Creating a queue or topic notifies too: a server may have looked the name up
-- while it did not exist.
CREATE TRIGGER payload_schema_set AFTER INSERT OR DELETE ON postbox.queues
FOR EACH ROW EXECUTE FUNCTION postbox._payload_schema_changed();
CREATE TRIGGER payload_schema_changed AFTER UPDATE OF payload_schema ON postbox.queues
FOR EACH ROW WHEN (OLD.payload_schema IS DISTINCT FROM NEW.payload_schema)
EXECUTE FUNCTION postbox._payload_schema_changed();
CREATE TRIGGER payload_schema_set AFTER INSERT OR DELETE ON postbox.topics
FOR EACH ROW EXECUTE FUNCTION postbox._payload_schema_changed();
CREATE TRIGGER payload_schema_changed AFTER UPDATE OF payload_schema ON postbox.topics
FOR EACH ROW WHEN (OLD.payload_schema IS DISTINCT FROM NEW.payload_schema)
EXECUTE FUNCTION postbox._payload_schema_changed();

-- Attribute defaults of a new queue; durations in seconds. A retention or
-- archive_retention of 0 keeps messages forever; a max_depth or
-- receive_rate_limit of 0 means no limit.
CREATE OR REPLACE FUNCTION postbox.queue_defaults() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"visibility_timeout": 30, "delivery_delay": 0, "retention": 345600,
             "max_message_size": 1048576, "receive_wait_time": 0,
             "content_based_deduplication": false, "deduplication_window": 300,
             "dead_letter_policy": null,
             "redrive_allow_policy": {"permission": "allow_all", "source_queues": []},
             "retry_policy": {"minimum_backoff": 1, "maximum_backoff": 600},
             "archive_on_delete": false, "archive_retention": 604800,
             "max_depth": 0, "receive_rate_limit": 0, "tags": {}, "access_policy": "",
             "payload_schema": null}'::jsonb
$$;

-- The attributes of a queue as settings jsonb, in the shape of queue_defaults().
CREATE OR REPLACE FUNCTION postbox.queue_settings(q postbox.queues) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'visibility_timeout', extract(epoch FROM q.visibility_timeout),
        'delivery_delay', extract(epoch FROM q.delivery_delay),
        'retention', coalesce(extract(epoch FROM q.retention), 0),
        'max_message_size', q.max_message_size,
        'receive_wait_time', extract(epoch FROM q.receive_wait_time),
        'content_based_deduplication', q.content_based_deduplication,
        'deduplication_window', extract(epoch FROM q.deduplication_window),
        'dead_letter_policy', CASE WHEN q.dead_letter_queue_id IS NOT NULL THEN jsonb_build_object(
            'dead_letter_queue', (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id),
            'max_receive_count', q.max_receive_count) END,
        'redrive_allow_policy', jsonb_build_object(
            'permission', q.redrive_permission, 'source_queues', to_jsonb(q.redrive_sources)),
        'retry_policy', jsonb_build_object(
            'minimum_backoff', extract(epoch FROM q.retry_minimum_backoff),
            'maximum_backoff', extract(epoch FROM q.retry_maximum_backoff)),
        'archive_on_delete', q.archive_on_delete,
        'archive_retention', coalesce(extract(epoch FROM q.archive_retention), 0),
        'max_depth', coalesce(q.max_depth, 0),
        'receive_rate_limit', coalesce(q.receive_rate_limit, 0),
        'tags', q.tags,
        'access_policy', q.access_policy,
        'payload_schema', q.payload_schema)
$$;

-- Checks settings jsonb (a full set, in the shape of queue_defaults()) and
-- writes them into q; q.name and q.fifo must be set.
CREATE OR REPLACE FUNCTION postbox._apply_settings(q postbox.queues, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    unknown text;
    key text;
    number numeric;
    policy jsonb;
    dlq postbox.queues;
BEGIN
    PERFORM postbox._invalid(postbox._settings_name_problem(settings))
    WHERE postbox._settings_name_problem(settings) IS NOT NULL;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k
    WHERE NOT postbox.queue_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown queue setting(s): %s', unknown));
    END IF;
    FOREACH key IN ARRAY ARRAY['max_message_size', 'max_depth', 'receive_rate_limit'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid(format('queue setting %s must be a number', key));
        END IF;
    END LOOP;
    FOREACH key IN ARRAY ARRAY['content_based_deduplication', 'archive_on_delete'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'boolean' THEN
            PERFORM postbox._invalid(format('queue setting %s must be true or false', key));
        END IF;
    END LOOP;

    q.visibility_timeout := postbox._seconds_setting(settings, 'visibility_timeout', 0, 43200);
    q.retention := postbox._seconds_setting(settings, 'retention', 60, 1209600, true);
    q.delivery_delay := postbox._seconds_setting(settings, 'delivery_delay', 0, 31536000);
    -- Otherwise every message would expire before it became visible.
    IF q.delivery_delay >= q.retention THEN
        PERFORM postbox._invalid(format(
            'delivery_delay is %s s and retention %s s: delivery_delay must be shorter than retention, '
            'or messages would expire before they became visible; lower delivery_delay or raise retention',
            trim_scale(extract(epoch FROM q.delivery_delay)), trim_scale(extract(epoch FROM q.retention))));
    END IF;
    q.receive_wait_time := postbox._seconds_setting(settings, 'receive_wait_time', 0, 20);
    q.deduplication_window := postbox._seconds_setting(settings, 'deduplication_window', 1, 604800);
    q.archive_retention := postbox._seconds_setting(settings, 'archive_retention', 60, 1209600, true);

    number := (settings ->> 'max_message_size')::numeric;
    IF number <> trunc(number) OR number < 1024 OR number > 67108864 THEN
        PERFORM postbox._invalid(format(
            'max_message_size is %s; it must be a whole number of bytes from 1024 to 67108864', number));
    END IF;
    q.max_message_size := number::integer;
    number := (settings ->> 'max_depth')::numeric;
    IF number <> trunc(number) OR number < 0 OR number > 1e15 THEN
        PERFORM postbox._invalid(format('max_depth is %s; it must be a whole number, 0 for no limit', number));
    END IF;
    q.max_depth := nullif(number, 0)::bigint;
    number := (settings ->> 'receive_rate_limit')::numeric;
    IF number < 0 OR number > 1e6 THEN
        PERFORM postbox._invalid(format(
            'receive_rate_limit is %s; it must be 0 (no limit) to 1000000 messages per second', number));
    END IF;
    q.receive_rate_limit := nullif(number, 0)::double precision;
    q.content_based_deduplication := (settings ->> 'content_based_deduplication')::boolean;
    q.archive_on_delete := (settings ->> 'archive_on_delete')::boolean;

    -- Bounds left out keep their defaults.
    policy := (postbox.queue_defaults() -> 'retry_policy') || coalesce(settings -> 'retry_policy', '{}');
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('minimum_backoff', 'maximum_backoff')) THEN
        PERFORM postbox._invalid('retry_policy must be an object of minimum_backoff and maximum_backoff (seconds)');
    END IF;
    q.retry_minimum_backoff := postbox._seconds_setting(policy, 'minimum_backoff', 0, 43200);
    q.retry_maximum_backoff := postbox._seconds_setting(policy, 'maximum_backoff', 0, 43200);
    IF q.retry_minimum_backoff > q.retry_maximum_backoff THEN
        PERFORM postbox._invalid('retry_policy: minimum_backoff must not exceed maximum_backoff');
    END IF;

    policy := settings -> 'redrive_allow_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('permission', 'source_queues'))
       OR NOT coalesce(policy ->> 'permission' IN ('allow_all', 'deny_all', 'by_queue'), false)
       OR jsonb_typeof(coalesce(policy -> 'source_queues', '[]')) <> 'array'
       OR EXISTS (SELECT FROM jsonb_array_elements(coalesce(policy -> 'source_queues', '[]')) e
                  WHERE jsonb_typeof(e) <> 'string') THEN
        PERFORM postbox._invalid('redrive_allow_policy must be an object of permission (allow_all, '
                                 'deny_all or by_queue) and source_queues (queue names)');
    END IF;
    q.redrive_permission := policy ->> 'permission';
    q.redrive_sources := ARRAY(SELECT jsonb_array_elements_text(coalesce(policy -> 'source_queues', '[]')));
    IF (q.redrive_permission = 'by_queue') <> (cardinality(q.redrive_sources) > 0)
       OR cardinality(q.redrive_sources) > 10 THEN
        PERFORM postbox._invalid('redrive_allow_policy: by_queue takes 1 to 10 source_queues, '
                                 'allow_all and deny_all take none');
    END IF;

    policy := settings -> 'tags';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR (SELECT count(*) FROM jsonb_object_keys(policy)) > 50
       OR EXISTS (SELECT FROM jsonb_each(policy) e
                  WHERE length(e.key) NOT BETWEEN 1 AND 128 OR jsonb_typeof(e.value) <> 'string'
                        OR length(e.value #>> '{}') > 256) THEN
        PERFORM postbox._invalid('tags must be an object of at most 50 keys (1 to 128 characters) '
                                 'with string values (at most 256 characters)');
    END IF;
    q.tags := policy;

    -- An access policy document (SQS's Policy): kept as given, not enforced.
    policy := settings -> 'access_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'string' OR octet_length(policy #>> '{}') > 20480 THEN
        PERFORM postbox._invalid('access_policy must be a string of at most 20480 bytes');
    END IF;
    q.access_policy := policy #>> '{}';

    -- The server compiles the schema before it gets here; this keeps the shape
    -- and the size limits for callers in SQL.
    PERFORM postbox._invalid(postbox._payload_schema_problem(settings -> 'payload_schema'))
    WHERE postbox._payload_schema_problem(settings -> 'payload_schema') IS NOT NULL;
    q.payload_schema := nullif(settings -> 'payload_schema', 'null');

    policy := settings -> 'dead_letter_policy';
    IF policy IS NULL OR policy = 'null' THEN
        q.dead_letter_queue_id := NULL;
        q.max_receive_count := NULL;
    ELSE
        IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
           OR EXISTS (SELECT FROM jsonb_object_keys(policy) k
                      WHERE k NOT IN ('dead_letter_queue', 'max_receive_count'))
           OR jsonb_typeof(policy -> 'dead_letter_queue') IS DISTINCT FROM 'string'
           OR jsonb_typeof(policy -> 'max_receive_count') IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid('dead_letter_policy must be an object of dead_letter_queue (a queue '
                                     'name) and max_receive_count (1 to 1000)');
        END IF;
        number := (policy ->> 'max_receive_count')::numeric;
        IF number <> trunc(number) OR number NOT BETWEEN 1 AND 1000 THEN
            PERFORM postbox._invalid(format('max_receive_count is %s; it must be 1 to 1000', number));
        END IF;
        IF policy ->> 'dead_letter_queue' = q.name THEN
            PERFORM postbox._invalid('a queue cannot be its own dead-letter queue');
        END IF;
        SELECT * INTO dlq FROM postbox.queues WHERE name = policy ->> 'dead_letter_queue';
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
                'dead-letter queue %s does not exist; create it first', quote_literal(policy ->> 'dead_letter_queue'));
        ELSIF dlq.fifo <> q.fifo THEN
            PERFORM postbox._invalid('a FIFO queue needs a FIFO dead-letter queue, and a standard queue '
                                     'a standard one');
        ELSIF dlq.redrive_permission = 'deny_all'
              OR (dlq.redrive_permission = 'by_queue' AND NOT q.name = ANY (dlq.redrive_sources)) THEN
            PERFORM postbox._invalid(format('the redrive_allow_policy of %s does not let %s use it as '
                                            'dead-letter queue', quote_literal(dlq.name), quote_literal(q.name)));
        END IF;
        q.dead_letter_queue_id := dlq.id;
        q.max_receive_count := number::integer;
    END IF;
    RETURN q;
END
$$;

-- Creates a queue; a name ending in ".fifo" makes it a FIFO queue. settings:
-- any keys of queue_defaults(), e.g. '{"visibility_timeout": 60}'. PB409 if the
-- queue exists.
CREATE OR REPLACE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q.name := queue_name;
    q.fifo := right(queue_name, 5) = '.fifo';
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (
        name, visibility_timeout, delivery_delay, retention, max_message_size, receive_wait_time,
        fifo, content_based_deduplication, deduplication_window, dead_letter_queue_id,
        max_receive_count, redrive_permission, redrive_sources, retry_minimum_backoff,
        retry_maximum_backoff, archive_on_delete, archive_retention, max_depth, receive_rate_limit,
        send_paused, receive_paused, tags, access_policy, payload_schema)
    VALUES (
        queue_name, q.visibility_timeout, q.delivery_delay, q.retention, q.max_message_size,
        q.receive_wait_time, q.fifo, q.content_based_deduplication, q.deduplication_window,
        q.dead_letter_queue_id, q.max_receive_count, q.redrive_permission, q.redrive_sources,
        q.retry_minimum_backoff, q.retry_maximum_backoff, q.archive_on_delete, q.archive_retention,
        q.max_depth, q.receive_rate_limit, false, false, q.tags, q.access_policy, q.payload_schema)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('queue %s already exists', quote_literal(queue_name));
    END IF;
    RETURN q;
END
$$;

-- Changes the settings named in settings; a key whose value is null goes back
-- to its default.
CREATE OR REPLACE FUNCTION postbox.update_queue(queue_name text, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues;
    changes jsonb;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox._settings_name_problem(settings))
        WHERE postbox._settings_name_problem(settings) IS NOT NULL;
        q := postbox._queue(queue_name);  -- raises PB400 or PB404
    END IF;
    SELECT coalesce(jsonb_object_agg(key, CASE WHEN value = 'null' THEN postbox.queue_defaults() -> key
                                               ELSE value END), '{}')
    INTO changes
    FROM jsonb_each(coalesce(settings, '{}'));
    q := postbox._apply_settings(q, postbox.queue_settings(q) || changes);
    UPDATE postbox.queues
    SET visibility_timeout = q.visibility_timeout, delivery_delay = q.delivery_delay,
        retention = q.retention, max_message_size = q.max_message_size,
        receive_wait_time = q.receive_wait_time,
        content_based_deduplication = q.content_based_deduplication,
        deduplication_window = q.deduplication_window, dead_letter_queue_id = q.dead_letter_queue_id,
        max_receive_count = q.max_receive_count, redrive_permission = q.redrive_permission,
        redrive_sources = q.redrive_sources, retry_minimum_backoff = q.retry_minimum_backoff,
        retry_maximum_backoff = q.retry_maximum_backoff, archive_on_delete = q.archive_on_delete,
        archive_retention = q.archive_retention, max_depth = q.max_depth,
        receive_rate_limit = q.receive_rate_limit, tags = q.tags, access_policy = q.access_policy,
        payload_schema = q.payload_schema, updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

DROP FUNCTION postbox.create_topic(text, jsonb, jsonb, interval);
DROP FUNCTION postbox.update_topic(text, text[], jsonb, jsonb, interval);

-- Creates a topic, with its tags and SNS attributes (see postbox.topics), and
-- a stream_retention for a stream topic. PB409 if it exists.
CREATE FUNCTION postbox.create_topic(topic_name text, tags jsonb DEFAULT '{}', sns_attributes jsonb DEFAULT '{}',
                                     stream_retention interval DEFAULT NULL, payload_schema jsonb DEFAULT NULL)
RETURNS postbox.topics
LANGUAGE plpgsql AS $$
DECLARE
    problem text := coalesce(postbox.name_problem('topic', topic_name),
                             postbox._topic_maps_problem(coalesce(tags, '{}'), coalesce(sns_attributes, '{}')),
                             postbox._stream_retention_problem(stream_retention),
                             postbox._payload_schema_problem(payload_schema));
    t postbox.topics;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    INSERT INTO postbox.topics (name, tags, sns_attributes, stream_retention, payload_schema)
    VALUES (topic_name, coalesce(tags, '{}'), coalesce(sns_attributes, '{}'), stream_retention,
            nullif(payload_schema, 'null'))
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('topic %s already exists', quote_literal(topic_name));
    END IF;
    RETURN t;
END
$$;

-- Replaces the fields of a topic named in `fields`: tags, sns_attributes (a
-- NULL value empties it), stream_retention (NULL: no longer a stream topic,
-- which PB412 refuses while it has consumer groups), payload_schema (NULL:
-- none).
CREATE FUNCTION postbox.update_topic(topic_name text, fields text[], tags jsonb DEFAULT NULL,
                                     sns_attributes jsonb DEFAULT NULL, stream_retention interval DEFAULT NULL,
                                     payload_schema jsonb DEFAULT NULL)
RETURNS postbox.topics
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics := postbox._topic(topic_name);
    unknown text;
    problem text;
BEGIN
    SELECT string_agg(f, ', ') INTO unknown FROM unnest(fields) AS f
    WHERE NOT f = ANY ('{tags,sns_attributes,stream_retention,payload_schema}');
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of tags, sns_attributes, stream_retention, '
                                        'payload_schema (not %s)',
                                        coalesce(unknown, 'none')));
    END IF;
    IF 'stream_retention' = ANY (fields) THEN
        PERFORM postbox._invalid(postbox._stream_retention_problem(stream_retention))
        WHERE postbox._stream_retention_problem(stream_retention) IS NOT NULL;
        IF stream_retention IS NULL AND EXISTS (SELECT FROM postbox.consumer_groups g WHERE g.topic_id = t.id) THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'topic %s has consumer groups: delete them before it stops being a stream topic',
                quote_literal(t.name));
        END IF;
        t.stream_retention := stream_retention;
    END IF;
    IF 'tags' = ANY (fields) THEN
        t.tags := coalesce(tags, '{}');
    END IF;
    IF 'sns_attributes' = ANY (fields) THEN
        t.sns_attributes := coalesce(sns_attributes, '{}');
    END IF;
    IF 'payload_schema' = ANY (fields) THEN
        t.payload_schema := nullif(payload_schema, 'null');
    END IF;
    problem := coalesce(postbox._topic_maps_problem(t.tags, t.sns_attributes),
                        postbox._payload_schema_problem(t.payload_schema));
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    UPDATE postbox.topics SET tags = t.tags, sns_attributes = t.sns_attributes, stream_retention = t.stream_retention,
                              payload_schema = t.payload_schema
    WHERE id = t.id RETURNING * INTO t;
    RETURN t;
END
$$;

-- SNS signatures: the envelope takes the server's signatures, and publish_batch
-- the publish ids and time they cover.
DROP FUNCTION postbox.publish_batch(text, bytea[], text[], jsonb[], text[], text[], text[]);
DROP FUNCTION postbox._publish_to_plain_queues(integer[], integer[], jsonb[], boolean[], integer[], bytea[], jsonb[],
                                               text[], uuid[], timestamptz);
DROP FUNCTION postbox._sns_envelope(jsonb, uuid, timestamptz, text, bytea, jsonb);

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
-- plain_queue_ids are those pairs' queues, in id order. It runs under
-- publish_batch's plan_cache_mode.
CREATE FUNCTION postbox._publish_to_plain_queues(
    queue_ids integer[], entries integer[], envelopes jsonb[], plain boolean[], plain_queue_ids integer[],
    bodies bytea[], attributes jsonb[], subjects text[], publish_ids uuid[], published_at timestamptz,
    signatures jsonb[] DEFAULT NULL, signature_version text DEFAULT NULL)
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
        SELECT p.o, q.id, q.delivery_delay, q.send_paused, q.max_message_size,
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
        SELECT pair.id, sent_at + pair.delivery_delay, sent_at, pair.a, pair.b, 0
        FROM pair
        WHERE NOT EXISTS (SELECT FROM pair x
                          WHERE x.id IS NULL OR x.send_paused
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
    given_published_at timestamptz DEFAULT NULL)
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
BEGIN
    SELECT * INTO t FROM postbox.topics x WHERE x.name = topic_name;
    IF NOT FOUND THEN
        t := postbox._topic(topic_name);  -- raises the error
    END IF;
    IF n NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._check_batch_size(n);
    END IF;
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
                subjects, ids, published_at, signatures, signature_version);
        ELSE
            -- An envelope refuses a body that is not UTF-8 by raising, in a
            -- subtransaction, then, so that queue by queue can take over.
            BEGIN
                plain_ids := postbox._publish_to_plain_queues(
                    pair_queue_ids, pair_entries, pair_envelopes, pair_plain, plain_queue_ids, bodies, attributes,
                    subjects, ids, published_at, signatures, signature_version);
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
            SELECT h.s, ids[h.i], published_at, keys[h.i], ordering_keys[h.i], attributes[h.i], h.b, published_at
            FROM unnest(hook_subscriptions, hook_entries, hook_bodies) AS h(s, i, b);
            PERFORM postbox._signal('webhooks');
        END IF;
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


-- SNS subscriptions of queues that do not exist yet (postbox.subscriptions.pending_queue).
ALTER TABLE postbox.subscriptions
    ADD COLUMN pending_queue text,
    DROP CONSTRAINT subscriptions_check,
    ADD CONSTRAINT subscriptions_check CHECK (num_nonnulls(queue_id, webhook_url, pending_queue) = 1);
CREATE INDEX subscriptions_pending_queue_idx ON postbox.subscriptions (pending_queue)
    WHERE pending_queue IS NOT NULL;

-- Creates a queue; a name ending in ".fifo" makes it a FIFO queue. settings:
-- any keys of queue_defaults(), e.g. '{"visibility_timeout": 60}'. PB409 if the
-- queue exists.
CREATE OR REPLACE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q.name := queue_name;
    q.fifo := right(queue_name, 5) = '.fifo';
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (
        name, visibility_timeout, delivery_delay, retention, max_message_size, receive_wait_time,
        fifo, content_based_deduplication, deduplication_window, dead_letter_queue_id,
        max_receive_count, redrive_permission, redrive_sources, retry_minimum_backoff,
        retry_maximum_backoff, archive_on_delete, archive_retention, max_depth, receive_rate_limit,
        send_paused, receive_paused, tags, access_policy, payload_schema)
    VALUES (
        queue_name, q.visibility_timeout, q.delivery_delay, q.retention, q.max_message_size,
        q.receive_wait_time, q.fifo, q.content_based_deduplication, q.deduplication_window,
        q.dead_letter_queue_id, q.max_receive_count, q.redrive_permission, q.redrive_sources,
        q.retry_minimum_backoff, q.retry_maximum_backoff, q.archive_on_delete, q.archive_retention,
        q.max_depth, q.receive_rate_limit, false, false, q.tags, q.access_policy, q.payload_schema)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('queue %s already exists', quote_literal(queue_name));
    END IF;
    -- SNS subscriptions made before the queue existed deliver into it from now on.
    UPDATE postbox.subscriptions SET queue_id = q.id, pending_queue = NULL WHERE pending_queue = queue_name;
    RETURN q;
END
$$;


-- Subscribes a queue (queue_name) or a webhook (webhook_url) to a topic, for
-- the messages whose routing key matches `pattern` (see _compile_pattern).
-- A webhook's secret is "whsec_" and the base64 of 24 to 64 bytes, generated
-- (32 random bytes) when not given; webhook_settings take the keys of
-- webhook_defaults(). Since 0.9.0: a filter policy over the attributes or the
-- body (filter_scope), an SNS delivery, and suspended (see
-- postbox.subscriptions). PB409 if the topic has a subscription of that name.
CREATE OR REPLACE FUNCTION postbox.create_subscription(
    topic_name text, subscription_name text, pattern text DEFAULT '#', queue_name text DEFAULT NULL,
    webhook_url text DEFAULT NULL, webhook_secret text DEFAULT NULL, webhook_settings jsonb DEFAULT '{}',
    filter_policy jsonb DEFAULT NULL, filter_scope text DEFAULT 'attributes', sns jsonb DEFAULT NULL,
    suspended boolean DEFAULT false)
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics;
    problem text := coalesce(postbox.name_problem('subscription', subscription_name),
                             postbox.name_problem('topic', topic_name),
                             postbox._delivery_problem(filter_policy, filter_scope, sns));
    compiled record;
    s postbox.subscriptions;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    compiled := postbox._compile_pattern(coalesce(nullif(pattern, ''), '#'));
    s.name := subscription_name;
    s.pattern := coalesce(nullif(pattern, ''), '#');
    s.match_kind := compiled.match_kind;
    s.match_text := compiled.match_text;
    IF (queue_name IS NULL) = (webhook_url IS NULL) THEN
        PERFORM postbox._invalid('a subscription sends to a queue or to a webhook URL: give exactly one');
    ELSIF queue_name IS NOT NULL THEN
        IF webhook_secret IS NOT NULL OR coalesce(webhook_settings, '{}') <> '{}' THEN
            PERFORM postbox._invalid('a webhook secret and webhook settings are for webhook subscriptions');
        END IF;
        SELECT q.id INTO s.queue_id FROM postbox.queues q WHERE q.name = queue_name;
        IF s.queue_id IS NULL AND sns IS NOT NULL AND postbox.queue_name_problem(queue_name) IS NULL THEN
            -- SNS subscribes a queue that does not exist yet: it waits for create_queue.
            s.pending_queue := queue_name;
        ELSIF s.queue_id IS NULL THEN
            s.queue_id := (postbox._queue(queue_name)).id;  -- raises the error
        END IF;
    ELSE
        s := postbox._webhook(s, webhook_url, webhook_secret,
                              postbox.webhook_defaults() || jsonb_strip_nulls(coalesce(webhook_settings, '{}')));
    END IF;
    -- Looked up last, so that a malformed field is PB400 whether the topic exists or not.
    t := postbox._topic(topic_name);
    s.topic_id := t.id;
    INSERT INTO postbox.subscriptions (
        topic_id, name, pattern, match_kind, match_text, queue_id, webhook_url, webhook_secret,
        webhook_timeout, webhook_max_attempts, webhook_minimum_backoff, webhook_maximum_backoff,
        filter_policy, filter_scope, sns, suspended, pending_queue)
    VALUES (
        s.topic_id, s.name, s.pattern, s.match_kind, s.match_text, s.queue_id, s.webhook_url,
        s.webhook_secret, s.webhook_timeout, s.webhook_max_attempts, s.webhook_minimum_backoff,
        s.webhook_maximum_backoff, filter_policy, filter_scope, sns, coalesce(suspended, false),
        s.pending_queue)
    ON CONFLICT (topic_id, name) DO NOTHING
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format(
            'topic %s already has a subscription %s', quote_literal(topic_name), quote_literal(subscription_name));
    END IF;
    RETURN s;
END
$$;


-- Changes the fields of a subscription named in `fields`: pattern, queue
-- (queue subscriptions), webhook.url, webhook.secret, webhook.timeout,
-- webhook.max_attempts, webhook.minimum_backoff, webhook.maximum_backoff
-- (webhook subscriptions; the settings in webhook_settings, in the shape of
-- webhook_defaults()), and since 0.9.0 filter_policy, filter_policy_scope,
-- sns_delivery and suspended. A named field whose value is NULL goes back to
-- its default, and an empty secret is generated anew. A subscription keeps its
-- kind. Takes the topic's lock, as create and delete do, so no publish sees
-- half a change.
CREATE OR REPLACE FUNCTION postbox.update_subscription(
    topic_name text, subscription_name text, fields text[], pattern text DEFAULT NULL,
    queue_name text DEFAULT NULL, webhook_url text DEFAULT NULL, webhook_secret text DEFAULT NULL,
    webhook_settings jsonb DEFAULT '{}', filter_policy jsonb DEFAULT NULL, filter_scope text DEFAULT NULL,
    sns jsonb DEFAULT NULL, suspended boolean DEFAULT NULL)
RETURNS postbox.subscriptions
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.subscriptions;
    hooks text[] := ARRAY['webhook.url', 'webhook.secret', 'webhook.timeout', 'webhook.max_attempts',
                          'webhook.minimum_backoff', 'webhook.maximum_backoff'];
    deliveries text[] := ARRAY['filter_policy', 'filter_policy_scope', 'sns_delivery', 'suspended'];
    unknown text;
    compiled record;
    settings jsonb;
    field text;
    problem text;
BEGIN
    -- Every name is checked before anything is looked up (see _settings_name_problem).
    PERFORM postbox._invalid('queue: ' || postbox.queue_name_problem(queue_name))
    WHERE 'queue' = ANY (fields) AND queue_name IS NOT NULL AND postbox.queue_name_problem(queue_name) IS NOT NULL;
    s := postbox.get_subscription(topic_name, subscription_name);
    SELECT string_agg(f, ', ') INTO unknown FROM unnest(fields) AS f
    WHERE NOT f = ANY ('{pattern,queue}' || deliveries || hooks);
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of pattern, %s, queue, %s (not %s)',
                                        array_to_string(deliveries, ', '), array_to_string(hooks, ', '),
                                        coalesce(unknown, 'none')));
    ELSIF s.webhook_url IS NULL AND fields && hooks THEN
        PERFORM postbox._invalid(format('subscription %s delivers to a queue: it has no webhook to change',
                                        quote_literal(subscription_name)));
    ELSIF s.webhook_url IS NOT NULL AND 'queue' = ANY (fields) THEN
        PERFORM postbox._invalid(format('subscription %s delivers to a webhook: it has no queue to change',
                                        quote_literal(subscription_name)));
    END IF;
    PERFORM postbox._lock_topic(s.topic_id, true);
    SELECT * INTO s FROM postbox.subscriptions WHERE id = s.id FOR UPDATE;
    IF 'pattern' = ANY (fields) THEN
        compiled := postbox._compile_pattern(coalesce(nullif(pattern, ''), '#'));
        s.pattern := coalesce(nullif(pattern, ''), '#');
        s.match_kind := compiled.match_kind;
        s.match_text := compiled.match_text;
    END IF;
    IF 'filter_policy' = ANY (fields) THEN
        s.filter_policy := filter_policy;
    END IF;
    IF 'filter_policy_scope' = ANY (fields) THEN
        s.filter_scope := coalesce(filter_scope, 'attributes');
    END IF;
    IF 'sns_delivery' = ANY (fields) THEN
        s.sns := sns;
    END IF;
    IF 'suspended' = ANY (fields) THEN
        s.suspended := coalesce(suspended, false);
    END IF;
    problem := postbox._delivery_problem(s.filter_policy, s.filter_scope, s.sns);
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF 'queue' = ANY (fields) THEN
        IF queue_name IS NULL THEN
            PERFORM postbox._invalid('a queue subscription needs its queue');
        END IF;
        s.queue_id := (postbox._queue(queue_name)).id;
        s.pending_queue := NULL;
    END IF;
    IF s.webhook_url IS NOT NULL AND fields && hooks THEN
        settings := jsonb_build_object(
            'timeout', extract(epoch FROM s.webhook_timeout), 'max_attempts', s.webhook_max_attempts,
            'minimum_backoff', extract(epoch FROM s.webhook_minimum_backoff),
            'maximum_backoff', extract(epoch FROM s.webhook_maximum_backoff));
        FOREACH field IN ARRAY fields LOOP
            field := substr(field, length('webhook.') + 1);
            IF postbox.webhook_defaults() ? field THEN
                settings := settings || jsonb_build_object(
                    field, coalesce(webhook_settings -> field, postbox.webhook_defaults() -> field));
            END IF;
        END LOOP;
        s := postbox._webhook(
            s, CASE WHEN 'webhook.url' = ANY (fields) THEN webhook_url ELSE s.webhook_url END,
            CASE WHEN 'webhook.secret' = ANY (fields) THEN coalesce(webhook_secret, '') ELSE s.webhook_secret END,
            settings);
    END IF;
    UPDATE postbox.subscriptions
    SET pattern = s.pattern, match_kind = s.match_kind, match_text = s.match_text, queue_id = s.queue_id,
        webhook_url = s.webhook_url, webhook_secret = s.webhook_secret, webhook_timeout = s.webhook_timeout,
        webhook_max_attempts = s.webhook_max_attempts, webhook_minimum_backoff = s.webhook_minimum_backoff,
        webhook_maximum_backoff = s.webhook_maximum_backoff, filter_policy = s.filter_policy,
        filter_scope = s.filter_scope, sns = s.sns, suspended = s.suspended, pending_queue = s.pending_queue
    WHERE id = s.id
    RETURNING * INTO s;
    RETURN s;
END
$$;


-- Publish with a delay (issue 45): publish and publish_batch take delays, which
-- _publish_to_plain_queues passes on.
DROP FUNCTION postbox.publish(text, bytea, text, jsonb, text, text, text);
DROP FUNCTION postbox.publish_batch(text, bytea[], text[], jsonb[], text[], text[], text[], jsonb[], text, uuid[],
                                    timestamptz);
DROP FUNCTION postbox._publish_to_plain_queues(integer[], integer[], jsonb[], boolean[], integer[], bytea[], jsonb[],
                                               text[], uuid[], timestamptz, jsonb[], text);

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
BEGIN
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

-- Publishes one message; see publish_batch.
CREATE FUNCTION postbox.publish(topic_name text, body bytea, routing_key text DEFAULT '',
                                attributes jsonb DEFAULT NULL, ordering_key text DEFAULT NULL,
                                deduplication_id text DEFAULT NULL, subject text DEFAULT NULL,
                                delay interval DEFAULT NULL)
RETURNS TABLE (publish_id uuid, queues text[], message_ids bigint[], duplicates boolean[],
               webhook_deliveries integer)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM postbox.publish_batch(
        topic_name, ARRAY[body], ARRAY[routing_key], postbox._array_of(attributes),
        postbox._array_of(ordering_key), postbox._array_of(deduplication_id), postbox._array_of(subject),
        delays => postbox._array_of(delay));
END
$$;

-- Schedules in depth (issue 45): a catch-up limit, a failure threshold that
-- pauses, list filters.
ALTER TABLE postbox.schedules
    ADD COLUMN catch_up_limit integer NOT NULL DEFAULT 0,
    ADD COLUMN failure_threshold integer NOT NULL DEFAULT 0,
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0;
DROP FUNCTION postbox.create_schedule(text, timestamptz, bytea, text, text, text, jsonb, text, text, interval,
                                      timestamptz);
DROP FUNCTION postbox.update_schedule(text, text[], timestamptz, bytea, text, text, text, jsonb, text, text,
                                      interval, timestamptz);
DROP FUNCTION postbox.list_schedules(integer, text);
DROP FUNCTION postbox.fire_schedule(integer, timestamptz);

-- Checks a schedule before it is stored: PB400 for a bad field, PB404 when
-- its target does not exist.
CREATE OR REPLACE FUNCTION postbox._check_schedule(s postbox.schedules) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    problem text := postbox.name_problem('schedule', s.name);
    q postbox.queues;
BEGIN
    problem := coalesce(problem, CASE
        WHEN num_nonnulls(s.cron_expression, s.every, s.run_at) <> 1 THEN
            'give exactly one of a cron expression, an interval and a run_at time'
        WHEN length(s.cron_expression) NOT BETWEEN 1 AND 255 THEN 'a cron expression has 1 to 255 characters'
        WHEN s.cron_expression IS NOT NULL AND coalesce(s.time_zone, '') = '' THEN 'a cron schedule needs a time zone'
        WHEN s.cron_expression IS NULL AND s.time_zone IS NOT NULL THEN 'a time zone is for cron schedules'
        WHEN s.every < interval '1 second' OR s.every > interval '366 days' THEN
            format('interval %s is outside 1 s to 366 days', s.every)
        WHEN num_nonnulls(s.target_queue, s.target_topic) <> 1 THEN 'give a target queue or a target topic'
        WHEN postbox._target_problem(s.target_queue, s.target_topic) IS NOT NULL THEN
            postbox._target_problem(s.target_queue, s.target_topic)
        WHEN s.target_queue IS NOT NULL AND s.routing_key <> '' THEN 'a routing key is for topic targets'
        WHEN s.body IS NULL THEN 'body must not be NULL'
        WHEN s.catch_up_limit NOT BETWEEN 0 AND 1000 THEN
            format('catch_up_limit %s is outside 0 to 1000 (0: one fire for all missed times)', s.catch_up_limit)
        WHEN s.failure_threshold NOT BETWEEN 0 AND 1000 THEN
            format('failure_threshold %s is outside 0 to 1000 (0: never pause)', s.failure_threshold)
        WHEN NOT s.paused AND s.next_fire_at IS NULL THEN
            'next_fire_at is required: the server computes it from the timing'
        ELSE postbox.routing_key_problem(s.routing_key) END);
    IF problem IS NULL AND s.attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(ARRAY[s.attributes], 1);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF s.target_queue IS NOT NULL THEN
        q := postbox._queue(s.target_queue);
        IF postbox.message_size(s.body, s.attributes) > q.max_message_size THEN
            PERFORM postbox._invalid(format(
                'the message is %s bytes; queue %s takes at most %s (body and attributes)',
                postbox.message_size(s.body, s.attributes), quote_literal(q.name), q.max_message_size));
        END IF;
    ELSE
        PERFORM postbox._topic(s.target_topic);
    END IF;
END
$$;

-- Creates a schedule that fires `body` (with `attributes`) into target_queue
-- or target_topic (with routing_key): on cron_expression read in time_zone,
-- every `every`, or once at run_at; first at next_fire_at, which the caller
-- computes (for an interval, now() + every; for run_at, run_at). After
-- downtime it fires up to catch_up_limit missed due times, in order (0: once
-- for all of them); failure_threshold refused fires in a row pause it (0:
-- never). PB409 if a schedule of that name exists.
CREATE FUNCTION postbox.create_schedule(
    schedule_name text, next_fire_at timestamptz, body bytea, target_queue text DEFAULT NULL,
    target_topic text DEFAULT NULL, routing_key text DEFAULT '', attributes jsonb DEFAULT NULL,
    cron_expression text DEFAULT NULL, time_zone text DEFAULT NULL, every interval DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, catch_up_limit integer DEFAULT 0, failure_threshold integer DEFAULT 0)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    s.name := schedule_name;
    s.next_fire_at := next_fire_at;
    s.body := body;
    s.target_queue := target_queue;
    s.target_topic := target_topic;
    s.routing_key := coalesce(routing_key, '');
    s.attributes := attributes;
    s.cron_expression := cron_expression;
    s.time_zone := time_zone;
    s.every := every;
    s.run_at := run_at;
    s.paused := false;
    s.catch_up_limit := coalesce(catch_up_limit, 0);
    s.failure_threshold := coalesce(failure_threshold, 0);
    PERFORM postbox._check_schedule(s);
    INSERT INTO postbox.schedules (name, cron_expression, time_zone, every, run_at, target_queue, target_topic,
                                   routing_key, body, attributes, next_fire_at, catch_up_limit, failure_threshold)
    VALUES (s.name, s.cron_expression, s.time_zone, s.every, s.run_at, s.target_queue, s.target_topic,
            s.routing_key, s.body, s.attributes, s.next_fire_at, s.catch_up_limit, s.failure_threshold)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('schedule %s already exists', quote_literal(schedule_name));
    END IF;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

-- Changes the fields of a schedule named in `fields`, any of: cron (with
-- time_zone), interval, run_at (each replaces the timing, and next_fire_at
-- must come with it), target (target_queue or target_topic, with
-- routing_key), body, attributes, catch_up_limit, failure_threshold. A paused
-- schedule stays paused.
CREATE FUNCTION postbox.update_schedule(
    schedule_name text, fields text[], next_fire_at timestamptz DEFAULT NULL, body bytea DEFAULT NULL,
    target_queue text DEFAULT NULL, target_topic text DEFAULT NULL, routing_key text DEFAULT '',
    attributes jsonb DEFAULT NULL, cron_expression text DEFAULT NULL, time_zone text DEFAULT NULL,
    every interval DEFAULT NULL, run_at timestamptz DEFAULT NULL, catch_up_limit integer DEFAULT 0,
    failure_threshold integer DEFAULT 0)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
    unknown text;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox._target_problem(target_queue, target_topic))
        WHERE 'target' = ANY (fields) AND postbox._target_problem(target_queue, target_topic) IS NOT NULL;
        s := postbox._schedule(schedule_name);  -- raises PB400 or PB404
    END IF;
    SELECT string_agg(f, ', ') INTO unknown
    FROM unnest(fields) AS f
    WHERE f NOT IN ('cron', 'interval', 'run_at', 'target', 'body', 'attributes', 'catch_up_limit',
                    'failure_threshold');
    IF unknown IS NOT NULL OR coalesce(cardinality(fields), 0) = 0 THEN
        PERFORM postbox._invalid(format('fields to change: any of cron, interval, run_at, target, body, '
                                        'attributes, catch_up_limit, failure_threshold (not %s)',
                                        coalesce(unknown, 'none')));
    END IF;
    IF (SELECT count(*) FROM unnest(fields) AS f WHERE f IN ('cron', 'interval', 'run_at')) > 1 THEN
        PERFORM postbox._invalid('change the timing to one of cron, interval and run_at, not several');
    END IF;
    IF fields && ARRAY['cron', 'interval', 'run_at'] THEN
        s.cron_expression := CASE WHEN 'cron' = ANY (fields) THEN cron_expression END;
        s.time_zone := CASE WHEN 'cron' = ANY (fields) THEN time_zone END;
        s.every := CASE WHEN 'interval' = ANY (fields) THEN every END;
        s.run_at := CASE WHEN 'run_at' = ANY (fields) THEN run_at END;
        IF next_fire_at IS NULL THEN
            PERFORM postbox._invalid('a new timing needs its next_fire_at: the server computes it');
        END IF;
        s.next_fire_at := next_fire_at;
    END IF;
    IF 'target' = ANY (fields) THEN
        s.target_queue := target_queue;
        s.target_topic := target_topic;
        s.routing_key := coalesce(routing_key, '');
    END IF;
    IF 'body' = ANY (fields) THEN
        s.body := body;
    END IF;
    IF 'attributes' = ANY (fields) THEN
        s.attributes := attributes;
    END IF;
    IF 'catch_up_limit' = ANY (fields) THEN
        s.catch_up_limit := coalesce(catch_up_limit, 0);
    END IF;
    IF 'failure_threshold' = ANY (fields) THEN
        s.failure_threshold := coalesce(failure_threshold, 0);
    END IF;
    PERFORM postbox._check_schedule(s);
    UPDATE postbox.schedules
    SET cron_expression = s.cron_expression, time_zone = s.time_zone, every = s.every, run_at = s.run_at,
        target_queue = s.target_queue, target_topic = s.target_topic, routing_key = s.routing_key,
        body = s.body, attributes = s.attributes, next_fire_at = s.next_fire_at, updated_at = now(),
        catch_up_limit = s.catch_up_limit, failure_threshold = s.failure_threshold
    WHERE id = s.id
    RETURNING * INTO s;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

-- Schedules in name order after after_name; only paused (or only active)
-- ones when `paused` is not NULL, only those into queues (target_kind 'queue')
-- or topics ('topic') when it is not NULL, only names starting with
-- name_prefix.
CREATE FUNCTION postbox.list_schedules(page_size integer DEFAULT 100, after_name text DEFAULT '',
                                       paused boolean DEFAULT NULL, target_kind text DEFAULT NULL,
                                       name_prefix text DEFAULT '')
RETURNS SETOF postbox.schedules
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF target_kind NOT IN ('queue', 'topic') THEN
        PERFORM postbox._invalid(format('target_kind is %s; it must be queue or topic', postbox._quoted(target_kind)));
    END IF;
    RETURN QUERY
    SELECT * FROM postbox.schedules s
    WHERE s.name > coalesce(after_name, '')
          AND (list_schedules.paused IS NULL OR s.paused = list_schedules.paused)
          AND (target_kind IS NULL OR (target_kind = 'queue') = (s.target_queue IS NOT NULL))
          AND starts_with(s.name, coalesce(name_prefix, ''))
    ORDER BY s.name
    LIMIT page_size;
END
$$;

-- Lets a schedule fire again, next at next_fire_at (computed by the caller
-- from the row lock_schedule returned), or at its stored next_fire_at when
-- NULL. PB412 for a one-shot schedule that has fired: give it a new run_at.
CREATE OR REPLACE FUNCTION postbox.resume_schedule(schedule_name text, next_fire_at timestamptz DEFAULT NULL)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules := postbox.lock_schedule(schedule_name);
BEGIN
    IF coalesce(next_fire_at, s.next_fire_at) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'schedule %s fired at its run_at time already; update run_at to have it fire again',
            quote_literal(schedule_name));
    END IF;
    UPDATE postbox.schedules
    SET paused = false, next_fire_at = coalesce(resume_schedule.next_fire_at, s.next_fire_at), updated_at = now(),
        consecutive_failures = 0
    WHERE id = s.id
    RETURNING * INTO s;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

-- Fires a due schedule that the caller claimed: sends its message, or
-- publishes it, and sets when it fires next (next_fire_at, computed by the
-- caller; ignored for a one-shot schedule, which is paused for good), all in
-- the caller's transaction, so a fire happens exactly once. The message's
-- deduplication id is "<schedule>@<due time>", which keeps content-based
-- deduplication from eating repeats; FIFO queues get the schedule name as
-- message group. A fire that the target refuses (missing, paused, full, ...)
-- is skipped, not retried: `error` says why, and so does the schedule's
-- last_error; failure_threshold such refusals in a row pause the schedule.
-- Returns the error, how many webhook deliveries were queued, and whether the
-- schedule is paused now. A next_fire_at not after now() is a missed due time
-- to catch up: the caller fires it next.
CREATE FUNCTION postbox.fire_schedule(schedule_id integer, next_fire_at timestamptz)
RETURNS TABLE (error text, webhook_deliveries integer, paused boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    s postbox.schedules;
    deduplication_id text;
    problem text;
    state text;
    hooks integer := 0;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE id = schedule_id FOR UPDATE;
    IF NOT FOUND OR s.paused OR NOT s.next_fire_at <= now() THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format('schedule %s is not due', schedule_id);
    END IF;
    deduplication_id := s.name || '@' || to_char(s.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    BEGIN
        hooks := (postbox._fire(s, deduplication_id)).webhook_deliveries;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
        IF state NOT LIKE 'PB%' THEN
            RAISE;
        END IF;
    END;
    UPDATE postbox.schedules x
    SET next_fire_at = CASE WHEN s.run_at IS NULL THEN fire_schedule.next_fire_at END,
        paused = s.run_at IS NOT NULL
                 OR (problem IS NOT NULL AND s.failure_threshold > 0
                     AND s.consecutive_failures + 1 >= s.failure_threshold),
        last_fire_at = CASE WHEN problem IS NULL THEN now() ELSE x.last_fire_at END,
        fire_count = x.fire_count + CASE WHEN problem IS NULL THEN 1 ELSE 0 END,
        consecutive_failures = CASE WHEN problem IS NULL THEN 0 ELSE x.consecutive_failures + 1 END,
        last_error = problem
    WHERE x.id = s.id
    RETURNING x.paused INTO s.paused;
    RETURN QUERY SELECT problem, coalesce(hooks, 0), s.paused;
END
$$;

-- Fires a schedule once now, paused or not, without moving its next fire
-- time; counted as a fire. Unlike a due fire, a refusal (target missing,
-- paused or full) is the caller's error and is not kept in last_error. The
-- fire's deduplication id is "<name>@run:<now>". Returns the schedule and the
-- ids of the committed messages.
CREATE OR REPLACE FUNCTION postbox.run_schedule(schedule_name text, OUT schedule postbox.schedules,
                                     OUT message_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        s := postbox._schedule(schedule_name);  -- raises PB400 or PB404
    END IF;
    message_ids := (postbox._fire(
        s, s.name || '@run:' || to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))).message_ids;
    UPDATE postbox.schedules
    SET last_fire_at = now(), fire_count = fire_count + 1, last_error = NULL, consecutive_failures = 0
    WHERE id = s.id
    RETURNING * INTO schedule;
END
$$;

-- Fires up to max_schedules due schedules, each with its next fire time, in
-- the caller's transaction; claimed with SKIP LOCKED, as the servers'
-- schedulers claim them, so a schedule one of them is firing is left to it.
-- A schedule with a catch_up_limit fires its missed due times in order, up to
-- that many fires, as the servers' schedulers do. Returns how many fired and
-- how many the target refused (see fire_schedule).
CREATE OR REPLACE FUNCTION postbox._fire_due_schedules(max_schedules integer, OUT fired integer, OUT refused integer)
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
    following timestamptz;
    missed timestamptz;
    fires integer;
    f record;
BEGIN
    fired := 0;
    refused := 0;
    FOR s IN SELECT * FROM postbox.claim_due_schedules(max_schedules) LOOP
        fires := 0;
        LOOP
            fires := fires + 1;
            following := postbox._next_fire_at(s, now());
            IF fires < s.catch_up_limit THEN
                missed := postbox._next_fire_at(s, s.next_fire_at);
                IF missed <= now() THEN
                    following := missed;
                END IF;
            END IF;
            SELECT * INTO f FROM postbox.fire_schedule(s.id, following);
            IF f.error IS NULL THEN
                fired := fired + 1;
            ELSE
                refused := refused + 1;
            END IF;
            EXIT WHEN f.paused OR following IS NULL OR following > now();
            s.next_fire_at := following;
        END LOOP;
    END LOOP;
END
$$;

-- Stream topics without subscriptions: publish appends to the log in one
-- INSERT, publish_batch skips the subscriptions' query; read_stream walks the
-- log's index in its order (no sort of the batch) and counts latency in the
-- walk that finds the batch's end.

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
CREATE OR REPLACE FUNCTION postbox.publish_batch(
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
BEGIN
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
CREATE OR REPLACE FUNCTION postbox.publish(topic_name text, body bytea, routing_key text DEFAULT '',
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

-- Reads the next batch of a consumer group: up to max_messages (1-1000) rows
-- past its cursor, leased for lease_duration (1 second to 12 hours), with a
-- token (batch) that ack_stream takes. Returns no rows when the group's batch
-- is out with another consumer (its lease running, or a read of the group in
-- progress), when nothing is past the cursor, or, as batch controls, when
-- fewer than min_messages (1 to max_messages) are and the first of them has
-- waited less than max_batch_wait (NULL: no limit). A batch whose lease ran out
-- comes back whole, to the next read, with its delivery_count one higher: a
-- group gets every message at least once. Messages given back (ack_stream's
-- nack_offsets) whose delay has passed lead a new batch, in offset order,
-- whatever the batch controls say (they waited already), each with its own
-- delivery_count (batch_delivery_count is the batch's); new messages of the
-- log fill the rest of it. With max_deliveries, the messages of a batch whose
-- lease ran out that have gone out that many times become dead letters
-- ('lease expired') rather than go out again; the cursor moves past the log's.
-- A read appends its topic's delayed messages that are due to the log (see
-- _publish_due_streams): the next read can have them.
CREATE OR REPLACE FUNCTION postbox.read_stream(topic_name text, group_name text, max_messages integer DEFAULT 100,
                                    lease_duration interval DEFAULT '30 seconds', min_messages integer DEFAULT 1,
                                    max_batch_wait interval DEFAULT NULL)
RETURNS TABLE (batch uuid, stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               batch_delivery_count integer)
LANGUAGE plpgsql
-- Plan each statement once per session: the generic plans walk the log's
-- index in its order, where custom plans, re-made at every read, would
-- gather a batch's rows and sort them.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
    horizon xid8;
    waiting integer;
    first_at timestamptz;
    end_tx xid8;
    end_offset bigint;
    due integer := 0;
    previous uuid;
    bounds double precision[] := postbox._stream_latency_bounds();  -- once, not per message
    read_clock timestamptz := clock_timestamp();
    latency_bins integer[];
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000, not %s', max_messages));
    ELSIF lease_duration IS NULL OR lease_duration < interval '1 second' OR lease_duration > interval '12 hours' THEN
        PERFORM postbox._invalid(format('lease_duration must be from 1 second to 12 hours, not %s', lease_duration));
    ELSIF min_messages IS NULL OR min_messages NOT BETWEEN 1 AND max_messages THEN
        PERFORM postbox._invalid(format('min_messages must be from 1 to max_messages (%s), not %s', max_messages,
                                        min_messages));
    ELSIF max_batch_wait < interval '0' THEN
        PERFORM postbox._invalid(format('max_batch_wait must not be negative, not %s', max_batch_wait));
    END IF;
    g := postbox._consumer_group(t, group_name, skip_locked => true);
    IF g.paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'consumer group %s of topic %s is paused; ResumeConsumerGroup lets reads in again',
            quote_literal(group_name), quote_literal(topic_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.stream_delayed d WHERE d.topic_id = t.id AND d.deliver_at <= now()) THEN
        PERFORM postbox._publish_due_streams(t.id, 1000);
    END IF;
    IF g.id IS NULL OR (g.lease IS NOT NULL AND g.lease_expires_at > now()) THEN
        RETURN;
    END IF;
    IF g.lease IS NOT NULL AND g.max_deliveries IS NOT NULL THEN
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT g.id, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, 'lease expired'
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries
        UNION ALL
        SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
               l.attributes, l.body, g.lease_deliveries, 'lease expired'
        FROM postbox.stream_log l
        WHERE g.lease_deliveries >= g.max_deliveries AND l.topic_id = t.id
              AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
              AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
        DELETE FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries;
        IF g.lease_deliveries >= g.max_deliveries THEN
            -- The batch is done with: a new one goes out, the batch's retries left
            -- under the limit are due in it.
            g.cursor_tx := g.lease_end_tx;
            g.cursor_offset := g.lease_end_offset;
            g.lease := NULL;
            UPDATE postbox.consumer_groups c
            SET cursor_tx = g.cursor_tx, cursor_offset = g.cursor_offset, acked_at = now(), lease = NULL,
                lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
            WHERE c.id = g.id;
        END IF;
    END IF;
    previous := g.lease;
    IF g.lease IS NULL THEN
        -- Given-back messages out with a batch a seek called back wait no longer.
        SELECT count(*) INTO due
        FROM (SELECT FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.visible_at <= now()
              LIMIT max_messages) AS d;
        horizon := pg_snapshot_xmin(pg_current_snapshot());
        -- One walk of the log: what the batch would take, its end (the sorted
        -- sub-select's last row: the aggregates take the rows in its order, an
        -- ORDER BY in them would sort again) and its messages' latency bins.
        SELECT count(*), min(r.published_at), (array_agg(r.tx))[count(*)], (array_agg(r.stream_offset))[count(*)],
               array_agg(width_bucket(date_part('epoch', read_clock - r.published_at), bounds))
        INTO waiting, first_at, g.lease_end_tx, g.lease_end_offset, latency_bins
        FROM (SELECT l.tx, l.stream_offset, l.published_at FROM postbox.stream_log l
              WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset) AND l.tx < horizon
              ORDER BY l.tx, l.stream_offset
              LIMIT max_messages - due) AS r;
        IF due = 0 AND (waiting = 0 OR (waiting < min_messages
                                        AND (max_batch_wait IS NULL OR first_at > now() - max_batch_wait))) THEN
            RETURN;
        ELSIF waiting = 0 THEN
            g.lease_end_tx := g.cursor_tx;  -- given-back messages alone: the ack leaves the cursor
            g.lease_end_offset := g.cursor_offset;
        END IF;
        g.lease_deliveries := 0;
    END IF;
    UPDATE postbox.consumer_groups c
    SET lease = gen_random_uuid(), lease_expires_at = now() + lease_duration, lease_end_tx = g.lease_end_tx,
        lease_end_offset = g.lease_end_offset, lease_deliveries = g.lease_deliveries + 1, read_at = now()
    WHERE c.id = g.id
    RETURNING c.lease, c.lease_deliveries INTO g.lease, g.lease_deliveries;
    IF previous IS NULL AND waiting > 0 THEN
        -- The new batch's messages of the log, first read now: their latency.
        INSERT INTO postbox.stream_latency AS s (group_id, bucket, counts)
        SELECT g.id, date_bin('10 seconds', now(), 'epoch'), array_agg(coalesce(c.n, 0) ORDER BY b.i)
        FROM generate_series(0, 15) AS b(i)
        LEFT JOIN (SELECT u.i, count(*) AS n FROM unnest(latency_bins) AS u(i) GROUP BY u.i) AS c ON c.i = b.i
        ON CONFLICT ON CONSTRAINT stream_latency_pkey DO UPDATE
        SET counts = ARRAY(SELECT u.x + u.y FROM unnest(s.counts, excluded.counts) WITH ORDINALITY AS u(x, y, k)
                           ORDER BY u.k);
    END IF;
    -- The given-back messages go out with the batch: those that are due to a new
    -- batch, those of the batch whose lease ran out with it again.
    -- Then they go out first, in offset order, and the log's after them in its
    -- order: two statements, each in the order of its index (one over both
    -- would sort the batch, bodies and all).
    IF due > 0 OR previous IS NOT NULL THEN
        UPDATE postbox.stream_retries r SET batch = g.lease, deliveries = r.deliveries + 1
        WHERE r.group_id = g.id
              AND CASE WHEN previous IS NULL
                       THEN r.stream_offset IN (SELECT d.stream_offset FROM postbox.stream_retries d
                                                WHERE d.group_id = g.id AND d.visible_at <= now()
                                                ORDER BY d.stream_offset LIMIT due)
                       ELSE r.batch = previous END;
        RETURN QUERY
        SELECT g.lease, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, g.lease_deliveries
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease
        ORDER BY r.stream_offset;
    END IF;
    RETURN QUERY
    SELECT g.lease, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
           l.attributes, l.body, g.lease_deliveries, g.lease_deliveries
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
    ORDER BY l.tx, l.stream_offset
    LIMIT 1000;  -- a batch's most: with it, the plan walks the index rather than sort
END
$$;

-- Tenants (issue 47): a tenant is a namespace. Its queues, topics and
-- schedules are named <tenant>/<name>, so the name checks take that prefix.

-- The message of a name check, or NULL when the queue name is valid. A
-- tenant's queue (since 0.9.0) is named <tenant>/<name>: the limits hold for
-- the part after the tenant.
CREATE OR REPLACE FUNCTION postbox.queue_name_problem(name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN bare IS NULL OR bare = '' THEN 'queue name is required'
        WHEN length(bare) > 80 THEN format('queue name is %s characters long; the limit is 80', length(bare))
        WHEN bare !~ '^[A-Za-z0-9_-]+(\.fifo)?$' THEN
            'queue name may only contain A-Z, a-z, 0-9, "_" and "-", and end in ".fifo" for a FIFO queue'
    END
    FROM (SELECT regexp_replace(name, '^[a-z0-9][a-z0-9-]{0,31}/', '') AS bare) AS n
$$;


-- The message of a check of a topic, subscription or schedule name (`what`
-- says which), or NULL when the name is valid.
-- Topic names (since 0.9.0) are as long as SNS's, and end in ".fifo" for a
-- FIFO topic. A tenant's topic or schedule (since 0.9.0) is named
-- <tenant>/<name>: the limits hold for the part after the tenant.
CREATE OR REPLACE FUNCTION postbox.name_problem(what text, name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN bare IS NULL OR bare = '' THEN what || ' name is required'
        WHEN what = 'topic' THEN CASE
            WHEN length(bare) > 256 THEN format('topic name is %s characters long; the limit is 256', length(bare))
            WHEN bare !~ '^[A-Za-z0-9_-]+(\.fifo)?$' THEN
                'topic name may only contain A-Z, a-z, 0-9, "_" and "-", and end in ".fifo" for a FIFO topic'
            END
        WHEN length(bare) > 80 THEN format('%s name is %s characters long; the limit is 80', what, length(bare))
        WHEN bare !~ '^[A-Za-z0-9_-]+$' THEN what || ' name may only contain A-Z, a-z, 0-9, "_" and "-"'
    END
    FROM (SELECT CASE WHEN what IN ('topic', 'schedule')
                      THEN regexp_replace(name, '^[a-z0-9][a-z0-9-]{0,31}/', '') ELSE name END AS bare) AS n
$$;


-- Tenants (since 0.9.0). A tenant is a namespace: its queues, topics and
-- schedules are named <tenant>/<name>, and its API keys (api_keys.tenant) reach
-- only those. The default tenant has no row: its resources are the names
-- without "/", its keys have no tenant. account_id is the AWS account id the
-- SQS and SNS shim shows in the tenant's queue URLs and ARNs.
CREATE TABLE postbox.tenants (
    name text PRIMARY KEY,
    account_id text NOT NULL UNIQUE,
    description text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.tenants', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- The message of a check of a tenant's fields, or NULL when they are valid: a
-- name of 1-32 characters of a-z, 0-9 and "-", starting with a letter or digit;
-- an account id of 12 digits; a description of at most 256 characters.
CREATE FUNCTION postbox.tenant_problem(tenant_name text, account_id text DEFAULT '000000000001',
                                       description text DEFAULT '') RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN tenant_name IS NULL OR tenant_name = '' THEN 'tenant name is required'
        WHEN length(tenant_name) > 32 THEN
            format('tenant name is %s characters long; the limit is 32', length(tenant_name))
        WHEN tenant_name !~ '^[a-z0-9][a-z0-9-]*$' THEN
            'tenant name may only contain a-z, 0-9 and "-", and must start with a letter or digit'
        WHEN account_id IS NULL OR account_id !~ '^[0-9]{12}$' THEN
            'account_id must be 12 digits, as an AWS account id'
        WHEN length(coalesce(description, '')) > 256 THEN
            format('description is %s characters long; the limit is 256', length(description))
    END
$$;

-- The tenant of that name; PB400 for a malformed name, PB404 if there is none.
CREATE FUNCTION postbox._tenant(tenant_name text) RETURNS postbox.tenants
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.tenants;
BEGIN
    SELECT * INTO t FROM postbox.tenants WHERE name = tenant_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.tenant_problem(tenant_name))
        WHERE postbox.tenant_problem(tenant_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('tenant %s does not exist', quote_literal(tenant_name));
    END IF;
    RETURN t;
END
$$;

-- Creates a tenant. Without an account id it gets a random one no other
-- tenant has. PB409 if the name or the account id is taken; PB400 for bad fields.
CREATE FUNCTION postbox.create_tenant(tenant_name text, account_id text DEFAULT NULL, description text DEFAULT '')
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants;
    chosen text := nullif(account_id, '');
BEGIN
    WHILE chosen IS NULL LOOP
        chosen := lpad((floor(random() * 1e12))::bigint::text, 12, '0');
        IF chosen = '000000000000' OR EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
            chosen := NULL;
        END IF;
    END LOOP;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, chosen, description))
    WHERE postbox.tenant_problem(tenant_name, chosen, description) IS NOT NULL;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.name = tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s already exists', quote_literal(tenant_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', chosen);
    END IF;
    INSERT INTO postbox.tenants (name, account_id, description)
    VALUES (tenant_name, chosen, coalesce(description, ''))
    RETURNING * INTO t;
    RETURN t;
EXCEPTION WHEN unique_violation THEN  -- created meanwhile
    RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s or account id %s exists already',
                                                              quote_literal(tenant_name), chosen);
END
$$;

CREATE FUNCTION postbox.get_tenant(tenant_name text) RETURNS postbox.tenants
LANGUAGE sql STABLE AS $$
    SELECT postbox._tenant(tenant_name)
$$;

-- Tenants in name order after after_name, page_size of them.
CREATE FUNCTION postbox.list_tenants(page_size integer DEFAULT 100, after_name text DEFAULT '')
RETURNS SETOF postbox.tenants
LANGUAGE sql STABLE AS $$
    SELECT * FROM postbox.tenants WHERE name > coalesce(after_name, '') ORDER BY name LIMIT page_size
$$;

-- Changes a tenant's account id (when set_account_id) and/or its description
-- (when set_description). PB404 if there is none, PB409 if the account id is taken.
CREATE FUNCTION postbox.update_tenant(tenant_name text, set_account_id boolean, account_id text,
                                      set_description boolean, description text)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
BEGIN
    IF set_account_id THEN
        t.account_id := account_id;
    END IF;
    IF set_description THEN
        t.description := coalesce(description, '');
    END IF;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, t.account_id, t.description))
    WHERE postbox.tenant_problem(tenant_name, t.account_id, t.description) IS NOT NULL;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = t.account_id AND x.name <> tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', t.account_id);
    END IF;
    UPDATE postbox.tenants x SET account_id = t.account_id, description = t.description, updated_at = now()
    WHERE x.name = tenant_name
    RETURNING * INTO t;
    RETURN t;
END
$$;

-- How many queues, topics and schedules a tenant owns (those named <tenant>/...).
CREATE FUNCTION postbox.tenant_resources(tenant_name text)
RETURNS TABLE (queues bigint, topics bigint, schedules bigint)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM postbox.queues q WHERE starts_with(q.name, tenant_name || '/')),
           (SELECT count(*) FROM postbox.topics t WHERE starts_with(t.name, tenant_name || '/')),
           (SELECT count(*) FROM postbox.schedules s WHERE starts_with(s.name, tenant_name || '/'))
$$;

-- Deletes a tenant and its keys. PB412 while it owns queues, topics or
-- schedules, unless force: then they go too, with their messages.
CREATE FUNCTION postbox.delete_tenant(tenant_name text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
    owned record;
    prefix text := tenant_name || '/';
    resource text;
BEGIN
    PERFORM 1 FROM postbox.tenants x WHERE x.name = t.name FOR UPDATE;
    SELECT * INTO owned FROM postbox.tenant_resources(tenant_name);
    IF owned.queues + owned.topics + owned.schedules > 0 THEN
        IF NOT force THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'tenant %s still owns %s queues, %s topics and %s schedules; delete them first, or pass force',
                quote_literal(tenant_name), owned.queues, owned.topics, owned.schedules);
        END IF;
        FOR resource IN SELECT s.name FROM postbox.schedules s WHERE starts_with(s.name, prefix) ORDER BY s.name LOOP
            PERFORM postbox.delete_schedule(resource);
        END LOOP;
        FOR resource IN SELECT x.name FROM postbox.topics x WHERE starts_with(x.name, prefix) ORDER BY x.name LOOP
            PERFORM postbox.delete_topic(resource);
        END LOOP;
        -- Dead-letter links only join a tenant's own queues (a name never holds
        -- another tenant's), so cutting them lets every queue go.
        UPDATE postbox.queues q SET dead_letter_queue_id = NULL, max_receive_count = NULL
        WHERE starts_with(q.name, prefix) AND q.dead_letter_queue_id IS NOT NULL;
        FOR resource IN SELECT q.name FROM postbox.queues q WHERE starts_with(q.name, prefix) ORDER BY q.name LOOP
            PERFORM postbox.drop_queue(resource);
        END LOOP;
    END IF;
    DELETE FROM postbox.tenants x WHERE x.name = tenant_name;
END
$$;

-- API keys belong to a tenant.
ALTER TABLE postbox.api_keys ADD COLUMN tenant text REFERENCES postbox.tenants (name) ON DELETE CASCADE;
ALTER TYPE postbox.api_key ADD ATTRIBUTE tenant text;
-- The servers cache the tenants' account ids with the keys (the SQS shim's URLs).
CREATE TRIGGER tenants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON postbox.tenants
FOR EACH STATEMENT EXECUTE FUNCTION postbox._keys_changed();
DROP FUNCTION postbox.create_key(text, bytea, text, text[], text[], timestamptz, jsonb);
DROP FUNCTION postbox.update_key(text, text[], text[], boolean, timestamptz, boolean, jsonb);
DROP FUNCTION postbox.get_key(text);
DROP FUNCTION postbox.list_keys(integer, text);
DROP FUNCTION postbox.delete_key(text);

-- The key of that name with its grants; PB400 for a malformed name, PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox._api_key(key_name text) RETURNS postbox.api_key
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k postbox.api_key;
BEGIN
    SELECT a.name, a.secret_sha256, a.sigv4_secret, a.expires_at, a.created_at, a.updated_at,
           array(SELECT g.permission FROM postbox.api_key_grants g WHERE g.key_name = a.name ORDER BY g.permission, g.pattern),
           array(SELECT g.pattern FROM postbox.api_key_grants g WHERE g.key_name = a.name ORDER BY g.permission, g.pattern),
           (SELECT u.last_used_at FROM postbox.api_key_usage u WHERE u.key_name = a.name),
           a.rate_limits, a.tenant
    INTO k FROM postbox.api_keys a WHERE a.name = key_name;
    IF NOT FOUND THEN
        IF postbox.name_problem('key', key_name) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.name_problem('key', key_name));
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('key %s does not exist', quote_literal(key_name));
    END IF;
    RETURN k;
END
$$;


-- Every key with its grants: what a server process caches.
CREATE OR REPLACE FUNCTION postbox.all_keys() RETURNS SETOF postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT a.name, a.secret_sha256, a.sigv4_secret, a.expires_at, a.created_at, a.updated_at,
           coalesce(array_agg(g.permission ORDER BY g.permission, g.pattern) FILTER (WHERE g.permission IS NOT NULL), '{}'),
           coalesce(array_agg(g.pattern ORDER BY g.permission, g.pattern) FILTER (WHERE g.permission IS NOT NULL), '{}'),
           NULL::timestamptz,  -- the cache checks calls; it has no use for the last use
           a.rate_limits, a.tenant
    FROM postbox.api_keys a LEFT JOIN postbox.api_key_grants g ON g.key_name = a.name
    GROUP BY a.name
$$;


-- The key of that name if it belongs to key_tenant ('': the default tenant;
-- NULL: any); PB404 as for a missing key otherwise, so that a tenant cannot
-- tell another tenant's key from none.
CREATE FUNCTION postbox._tenant_key(key_name text, key_tenant text) RETURNS postbox.api_key
LANGUAGE plpgsql STABLE AS $$
DECLARE
    k postbox.api_key := postbox._api_key(key_name);
BEGIN
    IF key_tenant IS NOT NULL AND coalesce(k.tenant, '') <> key_tenant THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('key %s does not exist', quote_literal(key_name));
    END IF;
    RETURN k;
END
$$;


-- Creates a key from the SHA-256 of its secret and its derived SigV4 secret
-- (the server makes the secret and shows it once), with grants, an optional
-- expiry and optional rate limits, in a tenant ('' or NULL: the default
-- tenant). PB409 if a key of that name exists (key names are unique across
-- tenants: a SigV4 access key id is the name); PB400 for a bad name, grant or
-- an expiry in the past; PB404 if there is no such tenant.
CREATE FUNCTION postbox.create_key(
    key_name text, secret_sha256 bytea, sigv4_secret text, permissions text[], patterns text[],
    expires_at timestamptz DEFAULT NULL, rate_limits jsonb DEFAULT NULL, key_tenant text DEFAULT '')
RETURNS postbox.api_key
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(key_tenant, '') <> '' THEN
        PERFORM postbox._tenant(key_tenant);  -- raises PB400 or PB404
    END IF;
    IF postbox.name_problem('key', key_name) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.name_problem('key', key_name));
    END IF;
    IF postbox.grants_problem(permissions, patterns) IS NOT NULL THEN
        PERFORM postbox._invalid(postbox.grants_problem(permissions, patterns));
    END IF;
    IF expires_at <= now() THEN
        PERFORM postbox._invalid('expiry must lie in the future');
    END IF;
    INSERT INTO postbox.api_keys (name, secret_sha256, sigv4_secret, expires_at, rate_limits, tenant)
    VALUES (key_name, secret_sha256, sigv4_secret, expires_at, rate_limits, nullif(key_tenant, ''))
    ON CONFLICT (name) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('key %s already exists', quote_literal(key_name));
    END IF;
    INSERT INTO postbox.api_key_grants (key_name, permission, pattern)
    SELECT DISTINCT key_name, g.permission, g.pattern FROM unnest(permissions, patterns) AS g (permission, pattern);
    RETURN postbox._api_key(key_name);
END
$$;


-- Replaces a key's grants (when `permissions` is not NULL), its expiry (when
-- set_expiry; NULL expires_at: never) and/or its rate limits (when
-- set_rate_limits; NULL: none). PB404 if there is no such key in key_tenant
-- ('': the default tenant; NULL: any).
CREATE FUNCTION postbox.update_key(
    key_name text, permissions text[], patterns text[], set_expiry boolean, expires_at timestamptz,
    set_rate_limits boolean DEFAULT false, rate_limits jsonb DEFAULT NULL, key_tenant text DEFAULT NULL)
RETURNS postbox.api_key
LANGUAGE plpgsql AS $$
DECLARE
    k postbox.api_key;
BEGIN
    PERFORM 1 FROM postbox.api_keys a WHERE a.name = key_name FOR UPDATE;
    k := postbox._tenant_key(key_name, key_tenant);  -- raises PB400 or PB404
    IF permissions IS NOT NULL THEN
        IF postbox.grants_problem(permissions, patterns) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.grants_problem(permissions, patterns));
        END IF;
        DELETE FROM postbox.api_key_grants g WHERE g.key_name = update_key.key_name;
        INSERT INTO postbox.api_key_grants (key_name, permission, pattern)
        SELECT DISTINCT update_key.key_name, g.permission, g.pattern
        FROM unnest(permissions, patterns) AS g (permission, pattern);
    END IF;
    IF set_expiry THEN
        IF expires_at <= now() THEN
            PERFORM postbox._invalid('expiry must lie in the future');
        END IF;
        UPDATE postbox.api_keys a SET expires_at = update_key.expires_at WHERE a.name = key_name;
    END IF;
    IF set_rate_limits THEN
        UPDATE postbox.api_keys a SET rate_limits = update_key.rate_limits WHERE a.name = key_name;
    END IF;
    UPDATE postbox.api_keys a SET updated_at = now() WHERE a.name = key_name;
    RETURN postbox._api_key(key_name);
END
$$;


-- The key of that name in key_tenant ('': the default tenant; NULL: any);
-- PB404 if there is none.
CREATE FUNCTION postbox.get_key(key_name text, key_tenant text DEFAULT NULL) RETURNS postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT postbox._tenant_key(key_name, key_tenant)
$$;


-- Keys of key_tenant ('': the default tenant; NULL: all) in name order after
-- after_name, page_size of them.
CREATE FUNCTION postbox.list_keys(page_size integer DEFAULT 100, after_name text DEFAULT '',
                                  key_tenant text DEFAULT NULL)
RETURNS SETOF postbox.api_key
LANGUAGE sql STABLE AS $$
    SELECT (postbox._api_key(a.name)).*
    FROM postbox.api_keys a
    WHERE a.name > coalesce(after_name, '')
      AND (key_tenant IS NULL OR coalesce(a.tenant, '') = key_tenant)
    ORDER BY a.name LIMIT page_size
$$;


-- Revokes a key: deleted, it stops working on every server within a second.
-- PB404 if there is no such key in key_tenant ('': the default tenant; NULL: any).
CREATE FUNCTION postbox.delete_key(key_name text, key_tenant text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM postbox._tenant_key(key_name, key_tenant);  -- raises PB400 or PB404
    DELETE FROM postbox.api_keys a WHERE a.name = key_name;
END
$$;


-- fire_schedule takes the server's refusal (a body that breaks the target's payload schema).
DROP FUNCTION postbox.fire_schedule(integer, timestamptz);
-- Fires a due schedule that the caller claimed: sends its message, or
-- publishes it, and sets when it fires next (next_fire_at, computed by the
-- caller; ignored for a one-shot schedule, which is paused for good), all in
-- the caller's transaction, so a fire happens exactly once. The message's
-- deduplication id is "<schedule>@<due time>", which keeps content-based
-- deduplication from eating repeats; FIFO queues get the schedule name as
-- message group. A fire that the target refuses (missing, paused, full, ...)
-- is skipped, not retried: `error` says why, and so does the schedule's
-- last_error; failure_threshold such refusals in a row pause the schedule.
-- Returns the error, how many webhook deliveries were queued, and whether the
-- schedule is paused now. A next_fire_at not after now() is a missed due time
-- to catch up: the caller fires it next. A `refusal` is the caller's reason not
-- to send at all (the body breaks the target's payload schema, which only the
-- server can check): the fire fails with it, as if the target had refused.
CREATE FUNCTION postbox.fire_schedule(schedule_id integer, next_fire_at timestamptz,
                                      refusal text DEFAULT NULL)
RETURNS TABLE (error text, webhook_deliveries integer, paused boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    s postbox.schedules;
    deduplication_id text;
    problem text;
    state text;
    hooks integer := 0;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE id = schedule_id FOR UPDATE;
    IF NOT FOUND OR s.paused OR NOT s.next_fire_at <= now() THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format('schedule %s is not due', schedule_id);
    END IF;
    deduplication_id := s.name || '@' || to_char(s.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    problem := refusal;
    IF problem IS NULL THEN
        BEGIN
            hooks := (postbox._fire(s, deduplication_id)).webhook_deliveries;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
            IF state NOT LIKE 'PB%' THEN
                RAISE;
            END IF;
        END;
    END IF;
    UPDATE postbox.schedules x
    SET next_fire_at = CASE WHEN s.run_at IS NULL THEN fire_schedule.next_fire_at END,
        paused = s.run_at IS NOT NULL
                 OR (problem IS NOT NULL AND s.failure_threshold > 0
                     AND s.consecutive_failures + 1 >= s.failure_threshold),
        last_fire_at = CASE WHEN problem IS NULL THEN now() ELSE x.last_fire_at END,
        fire_count = x.fire_count + CASE WHEN problem IS NULL THEN 1 ELSE 0 END,
        consecutive_failures = CASE WHEN problem IS NULL THEN 0 ELSE x.consecutive_failures + 1 END,
        last_error = problem
    WHERE x.id = s.id
    RETURNING x.paused INTO s.paused;
    RETURN QUERY SELECT problem, coalesce(hooks, 0), s.paused;
END
$$;

-- Tenants' quotas (issue 47, since 0.9.0).
ALTER TABLE postbox.tenants ADD COLUMN max_queues bigint, ADD COLUMN max_topics bigint,
    ADD COLUMN max_messages bigint, ADD COLUMN max_bytes bigint;

DROP FUNCTION postbox.create_tenant(text, text, text);
DROP FUNCTION postbox.update_tenant(text, boolean, text, boolean, text);

-- The message of a check of a tenant's quota, or NULL when it is valid: a
-- JSON object of any of max_queues and max_topics (0 to 1,000,000),
-- max_messages (0 to 10^12) and max_bytes (0 to 2^50, a pebibyte), each a
-- whole number; 0: no limit.
CREATE FUNCTION postbox.tenant_quota_problem(quota jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    field text;
    value jsonb;
    ceiling numeric;
BEGIN
    IF quota IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(quota) <> 'object' THEN
        RETURN 'quota must be an object of max_queues, max_topics, max_messages and max_bytes';
    END IF;
    FOR field, value IN SELECT * FROM jsonb_each(quota) LOOP
        ceiling := CASE field WHEN 'max_queues' THEN 1000000 WHEN 'max_topics' THEN 1000000
                              WHEN 'max_messages' THEN 1000000000000 WHEN 'max_bytes' THEN 1125899906842624 END;
        IF ceiling IS NULL THEN
            RETURN format('quota has no field %s: give any of max_queues, max_topics, max_messages and max_bytes',
                          postbox._quoted(field));
        END IF;
        IF jsonb_typeof(value) <> 'number' OR value::text::numeric <> trunc(value::text::numeric)
           OR value::text::numeric NOT BETWEEN 0 AND ceiling THEN
            RETURN format('quota.%s is %s; give a whole number from 0 (no limit) to %s',
                          field, postbox._quoted(value::text), ceiling);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- The tenant with the quota fields present in `quota` set (0: no limit);
-- PB400 for a bad quota.
CREATE FUNCTION postbox._with_quota(t postbox.tenants, quota jsonb) RETURNS postbox.tenants
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM postbox._invalid(postbox.tenant_quota_problem(quota))
    WHERE postbox.tenant_quota_problem(quota) IS NOT NULL;
    IF quota ? 'max_queues' THEN
        t.max_queues := nullif((quota ->> 'max_queues')::bigint, 0);
    END IF;
    IF quota ? 'max_topics' THEN
        t.max_topics := nullif((quota ->> 'max_topics')::bigint, 0);
    END IF;
    IF quota ? 'max_messages' THEN
        t.max_messages := nullif((quota ->> 'max_messages')::bigint, 0);
    END IF;
    IF quota ? 'max_bytes' THEN
        t.max_bytes := nullif((quota ->> 'max_bytes')::bigint, 0);
    END IF;
    RETURN t;
END
$$;

-- Creates a tenant. Without an account id it gets a random one no other
-- tenant has. quota: see tenant_quota_problem (since 0.9.0). PB409 if the
-- name or the account id is taken; PB400 for bad fields.
CREATE FUNCTION postbox.create_tenant(tenant_name text, account_id text DEFAULT NULL, description text DEFAULT '',
                                      quota jsonb DEFAULT NULL)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._with_quota(NULL, quota);
    chosen text := nullif(account_id, '');
BEGIN
    WHILE chosen IS NULL LOOP
        chosen := lpad((floor(random() * 1e12))::bigint::text, 12, '0');
        IF chosen = '000000000000' OR EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
            chosen := NULL;
        END IF;
    END LOOP;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, chosen, description))
    WHERE postbox.tenant_problem(tenant_name, chosen, description) IS NOT NULL;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.name = tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s already exists', quote_literal(tenant_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', chosen);
    END IF;
    INSERT INTO postbox.tenants (name, account_id, description, max_queues, max_topics, max_messages, max_bytes)
    VALUES (tenant_name, chosen, coalesce(description, ''), t.max_queues, t.max_topics, t.max_messages, t.max_bytes)
    RETURNING * INTO t;
    RETURN t;
EXCEPTION WHEN unique_violation THEN  -- created meanwhile
    RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s or account id %s exists already',
                                                              quote_literal(tenant_name), chosen);
END
$$;

-- Changes a tenant's account id (when set_account_id) and/or its description
-- (when set_description), and the quota fields present in quota (since 0.9.0).
-- PB404 if there is none, PB409 if the account id is taken.
CREATE FUNCTION postbox.update_tenant(tenant_name text, set_account_id boolean, account_id text,
                                      set_description boolean, description text, quota jsonb DEFAULT NULL)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
BEGIN
    IF set_account_id THEN
        t.account_id := account_id;
    END IF;
    IF set_description THEN
        t.description := coalesce(description, '');
    END IF;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, t.account_id, t.description))
    WHERE postbox.tenant_problem(tenant_name, t.account_id, t.description) IS NOT NULL;
    t := postbox._with_quota(t, quota);
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = t.account_id AND x.name <> tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', t.account_id);
    END IF;
    UPDATE postbox.tenants x SET account_id = t.account_id, description = t.description, updated_at = now(),
                                 max_queues = t.max_queues, max_topics = t.max_topics,
                                 max_messages = t.max_messages, max_bytes = t.max_bytes
    WHERE x.name = tenant_name
    RETURNING * INTO t;
    RETURN t;
END
$$;

-- PB429 when the queue or topic (kind) just created as resource_name puts its
-- tenant over its max_queues or max_topics; the error undoes the create. Locks
-- the tenant's row first, so that one tenant's creates count one after another.
-- The default tenant's names (no "/") have no quota.
CREATE FUNCTION postbox._check_resource_quota(kind text, resource_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    tenant_name text := split_part(resource_name, '/', 1);
    quota bigint;
    owned bigint;
BEGIN
    IF strpos(resource_name, '/') = 0 THEN
        RETURN;
    END IF;
    SELECT CASE kind WHEN 'queue' THEN t.max_queues ELSE t.max_topics END INTO quota
    FROM postbox.tenants t WHERE t.name = tenant_name FOR NO KEY UPDATE;
    IF quota IS NULL THEN
        RETURN;
    END IF;
    IF kind = 'queue' THEN
        SELECT count(*) INTO owned FROM postbox.queues q WHERE starts_with(q.name, tenant_name || '/');
    ELSE
        SELECT count(*) INTO owned FROM postbox.topics x WHERE starts_with(x.name, tenant_name || '/');
    END IF;
    IF owned > quota THEN
        RAISE EXCEPTION USING ERRCODE = 'PB429', MESSAGE = format(
            'tenant %s is at its quota of %s %ss (max_%ss); delete one or raise the quota',
            quote_literal(tenant_name), quota, kind, kind);
    END IF;
END
$$;

-- What each tenant held at the last count (see tenant_usage): every server's
-- snapshot comes from here, so the tenants' messages are counted once per
-- interval, not once per server. Runtime state, not in pg_dump.
CREATE TABLE postbox.tenant_usage_counts (
    tenant_name text PRIMARY KEY,
    queues bigint NOT NULL,
    topics bigint NOT NULL,
    messages bigint NOT NULL,
    bytes bigint NOT NULL,
    counted_at timestamptz NOT NULL
);

-- Each tenant's quotas and what it holds: its queues and topics, and the
-- messages in its queues (visible, in flight, delayed, dead letters) with the
-- bytes of their bodies. The figures are those of the last count; one older
-- than max_age is counted again first, in one pass over the tenants' queues'
-- messages (not the default tenant's), by one session at a time (an advisory
-- lock: another returns the last count at once). Every server calls it every
-- --quota-refresh-interval seconds and checks each send against what it got.
CREATE FUNCTION postbox.tenant_usage(max_age interval DEFAULT '0 seconds')
RETURNS TABLE (tenant_name text, max_queues bigint, max_topics bigint, max_messages bigint, max_bytes bigint,
               queues bigint, topics bigint, messages bigint, bytes bigint, counted_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce((SELECT max(c.counted_at) FROM postbox.tenant_usage_counts c) <= now() - max_age, true)
       AND pg_try_advisory_xact_lock(1886350201, 2) THEN
        DELETE FROM postbox.tenant_usage_counts;
        INSERT INTO postbox.tenant_usage_counts (tenant_name, queues, topics, messages, bytes, counted_at)
        WITH owned AS (
            SELECT split_part(q.name, '/', 1) AS tenant_name, q.id
            FROM postbox.queues q WHERE strpos(q.name, '/') > 0
        ), queue_counts AS (
            SELECT o.tenant_name, count(*) AS queues FROM owned o GROUP BY o.tenant_name
        ), topic_counts AS (
            SELECT split_part(x.name, '/', 1) AS tenant_name, count(*) AS topics
            FROM postbox.topics x WHERE strpos(x.name, '/') > 0 GROUP BY 1
        ), stored AS (
            SELECT o.tenant_name, count(*) AS messages, sum(octet_length(m.body)) AS bytes
            FROM owned o JOIN postbox.messages m ON m.queue_id = o.id GROUP BY o.tenant_name
        )
        SELECT t.name, coalesce(qc.queues, 0), coalesce(tc.topics, 0), coalesce(s.messages, 0),
               coalesce(s.bytes, 0)::bigint, now()
        FROM postbox.tenants t
        LEFT JOIN queue_counts qc ON qc.tenant_name = t.name
        LEFT JOIN topic_counts tc ON tc.tenant_name = t.name
        LEFT JOIN stored s ON s.tenant_name = t.name;
    END IF;
    RETURN QUERY
    SELECT t.name, t.max_queues, t.max_topics, t.max_messages, t.max_bytes,
           coalesce(c.queues, 0), coalesce(c.topics, 0), coalesce(c.messages, 0), coalesce(c.bytes, 0),
           c.counted_at
    FROM postbox.tenants t LEFT JOIN postbox.tenant_usage_counts c ON c.tenant_name = t.name
    ORDER BY t.name;
END
$$;

-- Creates a queue; a name ending in ".fifo" makes it a FIFO queue. settings:
-- any keys of queue_defaults(), e.g. '{"visibility_timeout": 60}'. PB409 if the
-- queue exists, PB429 if its tenant owns max_queues already (since 0.9.0).
CREATE OR REPLACE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q.name := queue_name;
    q.fifo := right(queue_name, 5) = '.fifo';
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (
        name, visibility_timeout, delivery_delay, retention, max_message_size, receive_wait_time,
        fifo, content_based_deduplication, deduplication_window, dead_letter_queue_id,
        max_receive_count, redrive_permission, redrive_sources, retry_minimum_backoff,
        retry_maximum_backoff, archive_on_delete, archive_retention, max_depth, receive_rate_limit,
        send_paused, receive_paused, tags, access_policy, payload_schema)
    VALUES (
        queue_name, q.visibility_timeout, q.delivery_delay, q.retention, q.max_message_size,
        q.receive_wait_time, q.fifo, q.content_based_deduplication, q.deduplication_window,
        q.dead_letter_queue_id, q.max_receive_count, q.redrive_permission, q.redrive_sources,
        q.retry_minimum_backoff, q.retry_maximum_backoff, q.archive_on_delete, q.archive_retention,
        q.max_depth, q.receive_rate_limit, false, false, q.tags, q.access_policy, q.payload_schema)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('queue %s already exists', quote_literal(queue_name));
    END IF;
    PERFORM postbox._check_resource_quota('queue', queue_name);  -- since 0.9.0
    -- SNS subscriptions made before the queue existed deliver into it from now on.
    UPDATE postbox.subscriptions SET queue_id = q.id, pending_queue = NULL WHERE pending_queue = queue_name;
    RETURN q;
END
$$;

-- Creates a topic, with its tags and SNS attributes (see postbox.topics), and
-- a stream_retention for a stream topic. PB409 if it exists, PB429 if its
-- tenant owns max_topics already (since 0.9.0).
CREATE OR REPLACE FUNCTION postbox.create_topic(topic_name text, tags jsonb DEFAULT '{}', sns_attributes jsonb DEFAULT '{}',
                                     stream_retention interval DEFAULT NULL, payload_schema jsonb DEFAULT NULL)
RETURNS postbox.topics
LANGUAGE plpgsql AS $$
DECLARE
    problem text := coalesce(postbox.name_problem('topic', topic_name),
                             postbox._topic_maps_problem(coalesce(tags, '{}'), coalesce(sns_attributes, '{}')),
                             postbox._stream_retention_problem(stream_retention),
                             postbox._payload_schema_problem(payload_schema));
    t postbox.topics;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    INSERT INTO postbox.topics (name, tags, sns_attributes, stream_retention, payload_schema)
    VALUES (topic_name, coalesce(tags, '{}'), coalesce(sns_attributes, '{}'), stream_retention,
            nullif(payload_schema, 'null'))
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('topic %s already exists', quote_literal(topic_name));
    END IF;
    PERFORM postbox._check_resource_quota('topic', topic_name);  -- since 0.9.0
    RETURN t;
END
$$;

-- REST queue metrics (newest_msg_age_sec, total_messages): the newest message's age
-- in queue_stats, and lifetime sends counted by the activity flushes.
ALTER TABLE postbox.queue_counters ADD COLUMN sent bigint NOT NULL DEFAULT 0;

-- Adds one server process's counts since its last flush, an entry per queue
-- (arrays in step), to the current bucket, and its sends to the queues'
-- lifetime counts (queue_counters.sent, since 0.9.0). Queues since dropped are
-- skipped. Rows are written in queue id order, activity then counters, so two
-- processes flushing at once wait for each other rather than deadlock.
CREATE OR REPLACE FUNCTION postbox.record_activity(queue_names text[], sent bigint[], received bigint[], deleted bigint[],
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

DROP FUNCTION postbox.queue_stats(text);
-- Live counts of a queue's messages. Parked FIFO messages count as visible
-- (waiting for their turn); expired ones do not count. The ages of the oldest
-- and newest message (0 when empty), and the messages sent through a server
-- since the queue was made (queue_counters.sent; newest_age and sent_total
-- since 0.9.0).
CREATE FUNCTION postbox.queue_stats(queue_name text)
RETURNS TABLE (visible bigint, in_flight bigint, delayed bigint, oldest_age interval,
               newest_age interval, sent_total bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    RETURN QUERY
    SELECT count(*) FILTER (WHERE m.visible_at <= now() OR m.visible_at = 'infinity'),
           count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NOT NULL),
           count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NULL),
           coalesce(now() - min(m.enqueued_at), interval '0'),
           greatest(coalesce(now() - max(m.enqueued_at), interval '0'), interval '0'),
           coalesce((SELECT c.sent FROM postbox.queue_counters c WHERE c.queue_id = q.id), 0)
    FROM postbox.messages m
    WHERE m.queue_id = q.id AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention);
END
$$;


-- Fired messages carry a _schedule attribute (beyond-queue's headers._schedule),
-- and a one-shot schedule that fired is deleted; those that fired before this
-- are deleted too.
DROP FUNCTION postbox._fire(postbox.schedules, text);
-- The `_schedule` attribute of a fired message, as beyond-queue's
-- headers._schedule: JSON text (data_type String.json) of the schedule's name,
-- the due time it fired for, and whether it fired out of band (a manual run).
CREATE FUNCTION postbox._schedule_attribute(schedule_name text, scheduled_for timestamptz, out_of_band boolean)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('_schedule', jsonb_build_object(
        'data_type', 'String.json',
        'string_value', jsonb_build_object(
            'name', schedule_name,
            'scheduled_for', to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'out_of_band', out_of_band)::text))
$$;

-- Sends a schedule's message into its target with the given deduplication id
-- and its _schedule attribute (see _schedule_attribute): the ids of the
-- committed messages (one per queue the message reached) and how many webhook
-- deliveries it queued. Errors reach the caller.
CREATE FUNCTION postbox._fire(s postbox.schedules, deduplication_id text, scheduled_for timestamptz,
                              out_of_band boolean, OUT message_ids bigint[], OUT webhook_deliveries integer)
LANGUAGE plpgsql AS $$
DECLARE
    fifo boolean;
    attributes jsonb := coalesce(s.attributes, '{}') || postbox._schedule_attribute(s.name, scheduled_for, out_of_band);
BEGIN
    webhook_deliveries := 0;
    IF s.target_queue IS NOT NULL THEN
        SELECT q.fifo INTO fifo FROM postbox.queues q WHERE q.name = s.target_queue;
        message_ids := ARRAY(
            SELECT b.message_id FROM postbox.send_batch(
                s.target_queue, ARRAY[s.body], ARRAY[attributes],
                message_group_ids => CASE WHEN fifo THEN ARRAY[s.name] END,
                deduplication_ids => ARRAY[deduplication_id]) b);
    ELSE
        SELECT p.message_ids, p.webhook_deliveries INTO message_ids, webhook_deliveries
        FROM postbox.publish(s.target_topic, s.body, s.routing_key, attributes,
                             deduplication_id => deduplication_id) p;
    END IF;
END
$$;

-- Checks a schedule before it is stored: PB400 for a bad field, PB404 when
-- its target does not exist.
CREATE OR REPLACE FUNCTION postbox._check_schedule(s postbox.schedules) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    problem text := postbox.name_problem('schedule', s.name);
    q postbox.queues;
    size bigint;
BEGIN
    problem := coalesce(problem, CASE
        WHEN num_nonnulls(s.cron_expression, s.every, s.run_at) <> 1 THEN
            'give exactly one of a cron expression, an interval and a run_at time'
        WHEN length(s.cron_expression) NOT BETWEEN 1 AND 255 THEN 'a cron expression has 1 to 255 characters'
        WHEN s.cron_expression IS NOT NULL AND coalesce(s.time_zone, '') = '' THEN 'a cron schedule needs a time zone'
        WHEN s.cron_expression IS NULL AND s.time_zone IS NOT NULL THEN 'a time zone is for cron schedules'
        WHEN s.every < interval '1 second' OR s.every > interval '366 days' THEN
            format('interval %s is outside 1 s to 366 days', s.every)
        WHEN num_nonnulls(s.target_queue, s.target_topic) <> 1 THEN 'give a target queue or a target topic'
        WHEN postbox._target_problem(s.target_queue, s.target_topic) IS NOT NULL THEN
            postbox._target_problem(s.target_queue, s.target_topic)
        WHEN s.target_queue IS NOT NULL AND s.routing_key <> '' THEN 'a routing key is for topic targets'
        WHEN s.body IS NULL THEN 'body must not be NULL'
        WHEN s.catch_up_limit NOT BETWEEN 0 AND 1000 THEN
            format('catch_up_limit %s is outside 0 to 1000 (0: one fire for all missed times)', s.catch_up_limit)
        WHEN s.failure_threshold NOT BETWEEN 0 AND 1000 THEN
            format('failure_threshold %s is outside 0 to 1000 (0: never pause)', s.failure_threshold)
        WHEN NOT s.paused AND s.next_fire_at IS NULL THEN
            'next_fire_at is required: the server computes it from the timing'
        ELSE postbox.routing_key_problem(s.routing_key) END);
    IF problem IS NULL AND s.attributes IS NOT NULL THEN
        problem := coalesce(postbox._attributes_problem(ARRAY[s.attributes], 1), CASE
            WHEN s.attributes ? '_schedule' THEN
                'attribute name ''_schedule'' is the server''s: it adds it to every fired message'
            WHEN (SELECT count(*) FROM jsonb_object_keys(s.attributes)) > 9 THEN
                format('%s attributes; a schedule''s message may have at most 9 (the server adds _schedule)',
                       (SELECT count(*) FROM jsonb_object_keys(s.attributes)))
            END);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF s.target_queue IS NOT NULL THEN
        q := postbox._queue(s.target_queue);
        -- Sized as fired: with its _schedule attribute, at its longest.
        size := postbox.message_size(s.body, coalesce(s.attributes, '{}')
                                             || postbox._schedule_attribute(s.name, now(), false));
        IF size > q.max_message_size THEN
            PERFORM postbox._invalid(format(
                'the message is %s bytes; queue %s takes at most %s (body and attributes, with _schedule)',
                size, quote_literal(q.name), q.max_message_size));
        END IF;
    ELSE
        PERFORM postbox._topic(s.target_topic);
    END IF;
END
$$;

-- Fires a due schedule that the caller claimed: sends its message, or
-- publishes it, and sets when it fires next (next_fire_at, computed by the
-- caller), all in the caller's transaction, so a fire happens exactly once. A
-- one-shot schedule that fired is deleted, as beyond-queue deletes it; one whose
-- fire was refused stays, paused for good, its last_error saying why. The message's
-- deduplication id is "<schedule>@<due time>", which keeps content-based
-- deduplication from eating repeats; FIFO queues get the schedule name as
-- message group. A fire that the target refuses (missing, paused, full, ...)
-- is skipped, not retried: `error` says why, and so does the schedule's
-- last_error; failure_threshold such refusals in a row pause the schedule.
-- Returns the error, how many webhook deliveries were queued, and whether the
-- schedule is paused (or deleted) now. A next_fire_at not after now() is a missed due time
-- to catch up: the caller fires it next. A `refusal` is the caller's reason not
-- to send at all (the body breaks the target's payload schema, which only the
-- server can check): the fire fails with it, as if the target had refused.
CREATE OR REPLACE FUNCTION postbox.fire_schedule(schedule_id integer, next_fire_at timestamptz,
                                      refusal text DEFAULT NULL)
RETURNS TABLE (error text, webhook_deliveries integer, paused boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    s postbox.schedules;
    deduplication_id text;
    problem text;
    state text;
    hooks integer := 0;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE id = schedule_id FOR UPDATE;
    IF NOT FOUND OR s.paused OR NOT s.next_fire_at <= now() THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format('schedule %s is not due', schedule_id);
    END IF;
    deduplication_id := s.name || '@' || to_char(s.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    problem := refusal;
    IF problem IS NULL THEN
        BEGIN
            hooks := (postbox._fire(s, deduplication_id, s.next_fire_at, false)).webhook_deliveries;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
            IF state NOT LIKE 'PB%' THEN
                RAISE;
            END IF;
        END;
    END IF;
    IF s.run_at IS NOT NULL AND problem IS NULL THEN
        DELETE FROM postbox.schedules WHERE id = s.id;
        RETURN QUERY SELECT problem, coalesce(hooks, 0), true;
        RETURN;
    END IF;
    UPDATE postbox.schedules x
    SET next_fire_at = CASE WHEN s.run_at IS NULL THEN fire_schedule.next_fire_at END,
        paused = s.run_at IS NOT NULL
                 OR (problem IS NOT NULL AND s.failure_threshold > 0
                     AND s.consecutive_failures + 1 >= s.failure_threshold),
        last_fire_at = CASE WHEN problem IS NULL THEN now() ELSE x.last_fire_at END,
        fire_count = x.fire_count + CASE WHEN problem IS NULL THEN 1 ELSE 0 END,
        consecutive_failures = CASE WHEN problem IS NULL THEN 0 ELSE x.consecutive_failures + 1 END,
        last_error = problem
    WHERE x.id = s.id
    RETURNING x.paused INTO s.paused;
    RETURN QUERY SELECT problem, coalesce(hooks, 0), s.paused;
END
$$;

-- Fires a schedule once now, paused or not, without moving its next fire
-- time; counted as a fire. Unlike a due fire, a refusal (target missing,
-- paused or full) is the caller's error and is not kept in last_error. The
-- fire's deduplication id is "<name>@run:<now>", and its _schedule attribute
-- says out_of_band, scheduled for now. Returns the schedule and the ids of the
-- committed messages.
CREATE OR REPLACE FUNCTION postbox.run_schedule(schedule_name text, OUT schedule postbox.schedules,
                                     OUT message_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
    ran_at timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        s := postbox._schedule(schedule_name);  -- raises PB400 or PB404
    END IF;
    message_ids := (postbox._fire(
        s, s.name || '@run:' || to_char(ran_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), ran_at, true)).message_ids;
    UPDATE postbox.schedules
    SET last_fire_at = now(), fire_count = fire_count + 1, last_error = NULL, consecutive_failures = 0
    WHERE id = s.id
    RETURNING * INTO schedule;
END
$$;

-- Lets a schedule fire again, next at next_fire_at (computed by the caller
-- from the row lock_schedule returned), or at its stored next_fire_at when
-- NULL. PB412 for a one-shot schedule whose fire was refused: give it a new
-- run_at.
CREATE OR REPLACE FUNCTION postbox.resume_schedule(schedule_name text, next_fire_at timestamptz DEFAULT NULL)
RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules := postbox.lock_schedule(schedule_name);
BEGIN
    IF coalesce(next_fire_at, s.next_fire_at) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'schedule %s was refused at its run_at time (see last_error); update run_at to have it fire again',
            quote_literal(schedule_name));
    END IF;
    UPDATE postbox.schedules
    SET paused = false, next_fire_at = coalesce(resume_schedule.next_fire_at, s.next_fire_at), updated_at = now(),
        consecutive_failures = 0
    WHERE id = s.id
    RETURNING * INTO s;
    PERFORM postbox._signal('schedules');
    RETURN s;
END
$$;

DELETE FROM postbox.schedules WHERE run_at IS NOT NULL AND next_fire_at IS NULL AND last_error IS NULL;


-- Tenants' rate limits (issue 47, since 0.9.0).
ALTER TABLE postbox.tenants ADD COLUMN rate_limits jsonb CHECK (jsonb_typeof(rate_limits) = 'object');

DROP FUNCTION postbox.create_tenant(text, text, text, jsonb);
DROP FUNCTION postbox.update_tenant(text, boolean, text, boolean, text, jsonb);

-- Creates a tenant. Without an account id it gets a random one no other
-- tenant has. quota: see tenant_quota_problem; rate_limits: shared by its
-- keys, NULL for none (both since 0.9.0). PB409 if the name or the account id
-- is taken; PB400 for bad fields.
CREATE FUNCTION postbox.create_tenant(tenant_name text, account_id text DEFAULT NULL, description text DEFAULT '',
                                      quota jsonb DEFAULT NULL, rate_limits jsonb DEFAULT NULL)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._with_quota(NULL, quota);
    chosen text := nullif(account_id, '');
BEGIN
    WHILE chosen IS NULL LOOP
        chosen := lpad((floor(random() * 1e12))::bigint::text, 12, '0');
        IF chosen = '000000000000' OR EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
            chosen := NULL;
        END IF;
    END LOOP;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, chosen, description))
    WHERE postbox.tenant_problem(tenant_name, chosen, description) IS NOT NULL;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.name = tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s already exists', quote_literal(tenant_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = chosen) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', chosen);
    END IF;
    INSERT INTO postbox.tenants (name, account_id, description, max_queues, max_topics, max_messages, max_bytes,
                                 rate_limits)
    VALUES (tenant_name, chosen, coalesce(description, ''), t.max_queues, t.max_topics, t.max_messages, t.max_bytes,
            create_tenant.rate_limits)
    RETURNING * INTO t;
    RETURN t;
EXCEPTION WHEN unique_violation THEN  -- created meanwhile
    RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('tenant %s or account id %s exists already',
                                                              quote_literal(tenant_name), chosen);
END
$$;

-- Changes a tenant's account id (when set_account_id) and/or its description
-- (when set_description), the quota fields present in quota and its rate
-- limits (when set_rate_limits; NULL: none) (both since 0.9.0). PB404 if
-- there is none, PB409 if the account id is taken.
CREATE FUNCTION postbox.update_tenant(tenant_name text, set_account_id boolean, account_id text,
                                      set_description boolean, description text, quota jsonb DEFAULT NULL,
                                      set_rate_limits boolean DEFAULT false, rate_limits jsonb DEFAULT NULL)
RETURNS postbox.tenants
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
BEGIN
    IF set_account_id THEN
        t.account_id := account_id;
    END IF;
    IF set_description THEN
        t.description := coalesce(description, '');
    END IF;
    IF set_rate_limits THEN
        t.rate_limits := update_tenant.rate_limits;
    END IF;
    PERFORM postbox._invalid(postbox.tenant_problem(tenant_name, t.account_id, t.description))
    WHERE postbox.tenant_problem(tenant_name, t.account_id, t.description) IS NOT NULL;
    t := postbox._with_quota(t, quota);
    IF EXISTS (SELECT FROM postbox.tenants x WHERE x.account_id = t.account_id AND x.name <> tenant_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409', MESSAGE = format('account id %s belongs to another tenant', t.account_id);
    END IF;
    UPDATE postbox.tenants x SET account_id = t.account_id, description = t.description, updated_at = now(),
                                 max_queues = t.max_queues, max_topics = t.max_topics,
                                 max_messages = t.max_messages, max_bytes = t.max_bytes,
                                 rate_limits = t.rate_limits
    WHERE x.name = tenant_name
    RETURNING * INTO t;
    RETURN t;
END
$$;

-- The tenants with rate limits and those limits (since 0.9.0): the servers cache
-- them with the keys (a change to a tenant notifies postbox_keys too), and
-- every call of a tenant's key counts against them as well as the key's.
CREATE FUNCTION postbox.tenant_rate_limits() RETURNS TABLE (tenant_name text, rate_limits jsonb)
LANGUAGE sql STABLE AS $$
    SELECT t.name, t.rate_limits FROM postbox.tenants t WHERE t.rate_limits IS NOT NULL
$$;


-- Stream reads and acks cheaper (issue 44): a well-formed group name skips
-- name_problem, ack_stream finds its group in one statement and runs the
-- nack statements only for nacks, the log's position index carries
-- published_at, and read_stream bins latencies by publish time, counting
-- messages only in a bin that holds some of a batch but not all.
DROP INDEX postbox.stream_log_position_idx;
CREATE INDEX stream_log_position_idx ON postbox.stream_log (topic_id, tx, stream_offset) INCLUDE (published_at);

-- The group name, when it keeps the grammar of names; INVALID_ARGUMENT saying
-- what is allowed otherwise. Called first, so a malformed name is refused
-- whatever else the call names (an absent topic included). A well-formed name
-- passes one cached regular expression: name_problem, a SQL function, is
-- parsed and planned at every call (a tenth of a read and ack of 1,000).
CREATE OR REPLACE FUNCTION postbox._group_name(group_name text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF length(group_name) <= 80 AND group_name ~ '^[A-Za-z0-9_-]+$' THEN
        RETURN group_name;
    END IF;
    PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
    WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
    RETURN group_name;
END
$$;

-- Acknowledges a batch of read_stream: the group's cursor moves past it.
-- The messages of the batch whose offsets are in nack_offsets are given back
-- instead (a nack): they go out to the group again, in a later batch, once
-- nack_delay (0 to 12 hours) has passed, while the group reads on; those that
-- have gone out max_deliveries times become dead letters ('nacked'). PB412 when
-- the batch is no longer the group's: its lease ran out and it went out again,
-- it was acknowledged already, or the group was sought since. Returns the
-- group's cursor (the offset of the batch's last row of the log).
CREATE OR REPLACE FUNCTION postbox.ack_stream(topic_name text, group_name text, batch uuid,
                                   nack_offsets bigint[] DEFAULT '{}', nack_delay interval DEFAULT '0 seconds')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    g postbox.consumer_groups;
BEGIN
    -- A well-formed group of a stream topic is found and locked in one
    -- statement; anything else takes the checks one by one, for their errors.
    SELECT c.* INTO g
    FROM postbox.consumer_groups c JOIN postbox.topics t ON t.id = c.topic_id
    WHERE t.name = topic_name AND t.stream_retention IS NOT NULL AND c.name = group_name
          AND length(group_name) <= 80 AND group_name ~ '^[A-Za-z0-9_-]+$'
    FOR UPDATE OF c;
    IF NOT FOUND THEN
        PERFORM postbox._group_name(group_name);  -- before any lookup
        g := postbox._consumer_group(postbox._stream_topic(topic_name), group_name);
    END IF;
    IF batch IS NULL THEN
        PERFORM postbox._invalid('batch is required: the token read_stream returned with the batch');
    ELSIF nack_delay IS NULL OR nack_delay < interval '0' OR nack_delay > interval '12 hours' THEN
        PERFORM postbox._invalid(format('nack_delay must be from 0 seconds to 12 hours, not %s', nack_delay));
    END IF;
    IF g.lease IS DISTINCT FROM batch THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'batch %s is not the batch out of consumer group %s: its lease ran out and it went out again, it was '
            'acknowledged already, or the group was sought since', batch, quote_literal(group_name));
    END IF;
    IF cardinality(nack_offsets) > 0 THEN
        PERFORM postbox._nack_stream(g, batch, nack_offsets, nack_delay);
    END IF;
    -- The batch's given-back messages are done.
    DELETE FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.batch = g.lease;
    UPDATE postbox.consumer_groups
    SET cursor_tx = lease_end_tx, cursor_offset = lease_end_offset, acked_at = now(), lease = NULL,
        lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
    WHERE id = g.id;
    RETURN g.lease_end_offset;
END
$$;

-- ack_stream's nacks, when it has any: checks that each offset is one of the
-- batch's, copies nacked messages of the log aside to go out again after
-- nack_delay, lets nacked ones that were given back before wait again, and
-- moves those out of deliveries to the dead letters. The rest of the batch's
-- given-back messages are left to ack_stream to delete.
CREATE FUNCTION postbox._nack_stream(g postbox.consumer_groups, batch uuid, nack_offsets bigint[],
                                     nack_delay interval) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    stray bigint;
BEGIN
    SELECT o INTO stray FROM unnest(nack_offsets) AS o
    WHERE o IS NULL
          OR (NOT EXISTS (SELECT FROM postbox.stream_retries r
                          WHERE r.group_id = g.id AND r.batch = g.lease AND r.stream_offset = o)
              AND NOT EXISTS (SELECT FROM postbox.stream_log l
                              WHERE l.topic_id = g.topic_id AND l.stream_offset = o
                                    AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
                                    AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)))
    LIMIT 1;
    IF FOUND THEN
        PERFORM postbox._invalid(format('nack_offsets: %s is not the offset of a message of batch %s',
                                        coalesce(stray::text, 'NULL'), batch));
    END IF;
    -- Nacked messages of the log are copied aside; nacked ones that were given
    -- back before wait again. Then the nacked ones out of deliveries go on to
    -- the dead letters.
    INSERT INTO postbox.stream_retries AS r (group_id, stream_offset, published_at, publish_id, routing_key,
                                             ordering_key, subject, attributes, body, deliveries, visible_at)
    SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
           l.attributes, l.body, g.lease_deliveries, now() + nack_delay
    FROM postbox.stream_log l
    WHERE l.topic_id = g.topic_id AND l.stream_offset = ANY (nack_offsets)
          AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
    ON CONFLICT ON CONSTRAINT stream_retries_pkey DO UPDATE
    SET deliveries = greatest(r.deliveries, excluded.deliveries), visible_at = excluded.visible_at, batch = NULL;
    UPDATE postbox.stream_retries r SET batch = NULL, visible_at = now() + nack_delay
    WHERE r.group_id = g.id AND r.batch = g.lease AND r.stream_offset = ANY (nack_offsets);
    IF g.max_deliveries IS NOT NULL THEN
        WITH dead AS (
            DELETE FROM postbox.stream_retries r
            WHERE r.group_id = g.id AND r.stream_offset = ANY (nack_offsets) AND r.deliveries >= g.max_deliveries
            RETURNING r.*)
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT dead.group_id, dead.stream_offset, dead.published_at, dead.publish_id, dead.routing_key,
               dead.ordering_key, dead.subject, dead.attributes, dead.body, dead.deliveries, 'nacked'
        FROM dead
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
    END IF;
END
$$;


-- Reads the next batch of a consumer group: up to max_messages (1-1000) rows
-- past its cursor, leased for lease_duration (1 second to 12 hours), with a
-- token (batch) that ack_stream takes. Returns no rows when the group's batch
-- is out with another consumer (its lease running, or a read of the group in
-- progress), when nothing is past the cursor, or, as batch controls, when
-- fewer than min_messages (1 to max_messages) are and the first of them has
-- waited less than max_batch_wait (NULL: no limit). A batch whose lease ran out
-- comes back whole, to the next read, with its delivery_count one higher: a
-- group gets every message at least once. Messages given back (ack_stream's
-- nack_offsets) whose delay has passed lead a new batch, in offset order,
-- whatever the batch controls say (they waited already), each with its own
-- delivery_count (batch_delivery_count is the batch's); new messages of the
-- log fill the rest of it. With max_deliveries, the messages of a batch whose
-- lease ran out that have gone out that many times become dead letters
-- ('lease expired') rather than go out again; the cursor moves past the log's.
-- A read appends its topic's delayed messages that are due to the log (see
-- _publish_due_streams): the next read can have them.
CREATE OR REPLACE FUNCTION postbox.read_stream(topic_name text, group_name text, max_messages integer DEFAULT 100,
                                    lease_duration interval DEFAULT '30 seconds', min_messages integer DEFAULT 1,
                                    max_batch_wait interval DEFAULT NULL)
RETURNS TABLE (batch uuid, stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               batch_delivery_count integer)
LANGUAGE plpgsql
-- Plan each statement once per session: the generic plans walk the log's
-- index in its order, where custom plans, re-made at every read, would
-- gather a batch's rows and sort them.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(topic_name);
    g postbox.consumer_groups;
    horizon xid8;
    waiting integer;
    first_at timestamptz;
    end_tx xid8;
    end_offset bigint;
    due integer := 0;
    previous uuid;
    read_clock timestamptz := clock_timestamp();
    -- The bins' bounds as publish times, oldest first, between -infinity and
    -- infinity: bin i (0 to 15) holds the messages published from
    -- edges[16 - i] to before edges[17 - i].
    edges timestamptz[] := '{-infinity}'::timestamptz[]
                           || ARRAY(SELECT read_clock - b * interval '1 second'
                                    FROM unnest(postbox._stream_latency_bounds()) AS b ORDER BY b DESC)
                           || '{infinity}'::timestamptz[];
    publish_times timestamptz[];
    last_at timestamptz;
BEGIN
    IF max_messages IS NULL OR max_messages NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('max_messages must be from 1 to 1000, not %s', max_messages));
    ELSIF lease_duration IS NULL OR lease_duration < interval '1 second' OR lease_duration > interval '12 hours' THEN
        PERFORM postbox._invalid(format('lease_duration must be from 1 second to 12 hours, not %s', lease_duration));
    ELSIF min_messages IS NULL OR min_messages NOT BETWEEN 1 AND max_messages THEN
        PERFORM postbox._invalid(format('min_messages must be from 1 to max_messages (%s), not %s', max_messages,
                                        min_messages));
    ELSIF max_batch_wait < interval '0' THEN
        PERFORM postbox._invalid(format('max_batch_wait must not be negative, not %s', max_batch_wait));
    END IF;
    g := postbox._consumer_group(t, group_name, skip_locked => true);
    IF g.paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'consumer group %s of topic %s is paused; ResumeConsumerGroup lets reads in again',
            quote_literal(group_name), quote_literal(topic_name));
    END IF;
    IF EXISTS (SELECT FROM postbox.stream_delayed d WHERE d.topic_id = t.id AND d.deliver_at <= now()) THEN
        PERFORM postbox._publish_due_streams(t.id, 1000);
    END IF;
    IF g.id IS NULL OR (g.lease IS NOT NULL AND g.lease_expires_at > now()) THEN
        RETURN;
    END IF;
    IF g.lease IS NOT NULL AND g.max_deliveries IS NOT NULL THEN
        INSERT INTO postbox.stream_dead_letters AS d (group_id, stream_offset, published_at, publish_id,
                                                      routing_key, ordering_key, subject, attributes, body,
                                                      deliveries, reason)
        SELECT g.id, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, 'lease expired'
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries
        UNION ALL
        SELECT g.id, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
               l.attributes, l.body, g.lease_deliveries, 'lease expired'
        FROM postbox.stream_log l
        WHERE g.lease_deliveries >= g.max_deliveries AND l.topic_id = t.id
              AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
              AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
        ON CONFLICT ON CONSTRAINT stream_dead_letters_pkey DO UPDATE
        SET deliveries = excluded.deliveries, dead_at = excluded.dead_at, reason = excluded.reason;
        DELETE FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease AND r.deliveries >= g.max_deliveries;
        IF g.lease_deliveries >= g.max_deliveries THEN
            -- The batch is done with: a new one goes out, the batch's retries left
            -- under the limit are due in it.
            g.cursor_tx := g.lease_end_tx;
            g.cursor_offset := g.lease_end_offset;
            g.lease := NULL;
            UPDATE postbox.consumer_groups c
            SET cursor_tx = g.cursor_tx, cursor_offset = g.cursor_offset, acked_at = now(), lease = NULL,
                lease_expires_at = NULL, lease_end_tx = NULL, lease_end_offset = NULL, lease_deliveries = NULL
            WHERE c.id = g.id;
        END IF;
    END IF;
    previous := g.lease;
    IF g.lease IS NULL THEN
        -- Given-back messages out with a batch a seek called back wait no longer.
        SELECT count(*) INTO due
        FROM (SELECT FROM postbox.stream_retries r WHERE r.group_id = g.id AND r.visible_at <= now()
              LIMIT max_messages) AS d;
        horizon := pg_snapshot_xmin(pg_current_snapshot());
        -- One walk of the log: what the batch would take, its end (the sorted
        -- sub-select's last row: the aggregates take the rows in its order, an
        -- ORDER BY in them would sort again) and its messages' publish times.
        SELECT count(*), min(r.published_at), max(r.published_at), (array_agg(r.tx))[count(*)],
               (array_agg(r.stream_offset))[count(*)], array_agg(r.published_at)
        INTO waiting, first_at, last_at, g.lease_end_tx, g.lease_end_offset, publish_times
        FROM (SELECT l.tx, l.stream_offset, l.published_at FROM postbox.stream_log l
              WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset) AND l.tx < horizon
              ORDER BY l.tx, l.stream_offset
              LIMIT max_messages - due) AS r;
        IF due = 0 AND (waiting = 0 OR (waiting < min_messages
                                        AND (max_batch_wait IS NULL OR first_at > now() - max_batch_wait))) THEN
            RETURN;
        ELSIF waiting = 0 THEN
            g.lease_end_tx := g.cursor_tx;  -- given-back messages alone: the ack leaves the cursor
            g.lease_end_offset := g.cursor_offset;
        END IF;
        g.lease_deliveries := 0;
    END IF;
    UPDATE postbox.consumer_groups c
    SET lease = gen_random_uuid(), lease_expires_at = now() + lease_duration, lease_end_tx = g.lease_end_tx,
        lease_end_offset = g.lease_end_offset, lease_deliveries = g.lease_deliveries + 1, read_at = now()
    WHERE c.id = g.id
    RETURNING c.lease, c.lease_deliveries INTO g.lease, g.lease_deliveries;
    IF previous IS NULL AND waiting > 0 THEN
        -- The new batch's messages of the log, first read now: their latency.
        -- The oldest and newest message bound the bins that hold any: a bin
        -- that holds both holds the whole batch, one outside them nothing, and
        -- only the others (a batch mostly spans one or two bins) count their
        -- messages.
        INSERT INTO postbox.stream_latency AS s (group_id, bucket, counts)
        SELECT g.id, date_bin('10 seconds', now(), 'epoch'),
               ARRAY(SELECT CASE WHEN first_at >= edges[16 - b.i] AND last_at < edges[17 - b.i] THEN waiting
                                 WHEN first_at >= edges[17 - b.i] OR last_at < edges[16 - b.i] THEN 0
                                 ELSE (SELECT count(*) FROM unnest(publish_times) AS p
                                       WHERE p >= edges[16 - b.i] AND p < edges[17 - b.i]) END
                     FROM generate_series(0, 15) AS b(i) ORDER BY b.i)
        ON CONFLICT ON CONSTRAINT stream_latency_pkey DO UPDATE
        SET counts = ARRAY(SELECT u.x + u.y FROM unnest(s.counts, excluded.counts) WITH ORDINALITY AS u(x, y, k)
                           ORDER BY u.k);
    END IF;
    -- The given-back messages go out with the batch: those that are due to a new
    -- batch, those of the batch whose lease ran out with it again.
    -- Then they go out first, in offset order, and the log's after them in its
    -- order: two statements, each in the order of its index (one over both
    -- would sort the batch, bodies and all).
    IF due > 0 OR previous IS NOT NULL THEN
        UPDATE postbox.stream_retries r SET batch = g.lease, deliveries = r.deliveries + 1
        WHERE r.group_id = g.id
              AND CASE WHEN previous IS NULL
                       THEN r.stream_offset IN (SELECT d.stream_offset FROM postbox.stream_retries d
                                                WHERE d.group_id = g.id AND d.visible_at <= now()
                                                ORDER BY d.stream_offset LIMIT due)
                       ELSE r.batch = previous END;
        RETURN QUERY
        SELECT g.lease, r.stream_offset, r.published_at, r.publish_id, r.routing_key, r.ordering_key, r.subject,
               r.attributes, r.body, r.deliveries, g.lease_deliveries
        FROM postbox.stream_retries r
        WHERE r.group_id = g.id AND r.batch = g.lease
        ORDER BY r.stream_offset;
    END IF;
    RETURN QUERY
    SELECT g.lease, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key, l.subject,
           l.attributes, l.body, g.lease_deliveries, g.lease_deliveries
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND (l.tx, l.stream_offset) <= (g.lease_end_tx, g.lease_end_offset)
    ORDER BY l.tx, l.stream_offset
    LIMIT 1000;  -- a batch's most: with it, the plan walks the index rather than sort
END
$$;

-- Issue 48: SendBatch's request_id, one row per batch where a deduplication id costs one per message.

-- SendBatch request ids (since 0.9.0) seen within each queue's deduplication
-- window, with the message ids their batch answered: a repeat of the request
-- stores nothing and answers them again. One row per batch, where a
-- deduplication id costs one per message. Kept after the messages are gone,
-- as deduplication ids are.
CREATE TABLE postbox.batch_requests (
    queue_id integer NOT NULL,
    request_id text NOT NULL,
    message_ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, request_id)
);
CREATE INDEX batch_requests_expiry_idx ON postbox.batch_requests (expires_at);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.batch_requests', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

DROP FUNCTION postbox.send_batch(text, bytea[], jsonb[], interval[], text[], text[], text[], integer[],
                                 timestamptz[], interval[], timestamptz[], integer[]);

-- Sends up to 1,000 messages in one go; returns their ids in input order, and
-- whether each was a duplicate (then nothing was enqueued and the id is the
-- original message's). Entry i of every array belongs to bodies[i]; an array may
-- be NULL or shorter (missing entries are NULL):
--   attributes       see attribute_problem
--   delays           invisible this long first (NULL: the queue's delivery_delay)
--   message_group_ids  FIFO queues: required; delivery is in order per group
--   deduplication_ids  a repeat within the queue's deduplication_window is
--                      dropped (content-based when the queue says so)
--   dedupe_keys      standard queues: replaces the body and attributes of a
--                    waiting (never received) message with the same key
--   priorities       0-9, standard queues; higher is received first
--   deliver_ats      invisible until then (instead of a delay)
--   max_receive_counts  since 0.9.0: 1-1000 deliveries, the message's own
--                    limit in place of the queue's (see receive)
-- request_id (since 0.9.0), 1-128 printable ASCII characters, names the whole
-- batch: a repeat within the queue's deduplication_window sends nothing and
-- answers the first batch's ids, all duplicates (see _send_batch_once).
-- Nothing is sent if any entry is invalid; the error names the entry by its
-- 0-based index. PB503 while sends are paused, PB429 when max_depth is reached.
--
-- Bodies alone into a queue without FIFO order, deduplication, a depth limit or
-- paused sends take a straight path of two statements: the general one's
-- checks and branches cost as much as the insert of a hundred messages. It
-- takes, in one expression (an assignment is evaluated without starting a
-- statement), its transaction id and the queue's lock by name, then looks the
-- queue up:
--   * the lock first, so the look sees a drop that committed meanwhile, and the
--     insert needs no second look;
--   * the transaction id first, so that a listing that the look misses sees
--     this transaction in progress, and waits for it (see listen_to).
-- The clock is read in the insert, which holds the table's lock by then (see
-- the general path). Only in READ COMMITTED: elsewhere the look reads the
-- transaction's snapshot, which may predate a drop, and the general path looks
-- under a row lock instead (see _lock_queue).
CREATE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL,
    max_receive_counts integer[] DEFAULT NULL, request_id text DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    -- The queue's, as scalars (see send).
    q_id integer;
    q_delay interval;
    q_max_message_size integer;
    q_listened boolean;
    locked text;
BEGIN
    IF request_id IS NOT NULL THEN
        RETURN QUERY SELECT * FROM postbox._send_batch_once(
            queue_name, request_id, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    IF num_nonnulls(attributes, delays, message_group_ids, deduplication_ids, dedupe_keys, priorities,
                    deliver_ats, ttls, expire_ats, max_receive_counts) = 0 AND cardinality(bodies) BETWEEN 1 AND 1000
       AND array_position(bodies, NULL) IS NULL AND current_setting('transaction_isolation') = 'read committed' THEN
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.max_message_size, x.listened
        INTO q_id, q_delay, q_max_message_size, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused);
    END IF;
    -- No body is longer than the whole array, so the bodies are looked at one by
    -- one only when the array is over the limit: that look cost 4% of a batch
    -- of 100 (valgrind). An expanded array (plpgsql expands its array arguments)
    -- is never compressed; the second test says so for certain. The look has an
    -- IF of its own: plpgsql runs a condition with a subquery as a statement,
    -- on every call (0.6% of a batch of 100).
    IF pg_column_size(bodies) > q_max_message_size OR pg_column_compression(bodies) IS NOT NULL THEN
        IF EXISTS (SELECT FROM unnest(bodies) AS b WHERE octet_length(b) > q_max_message_size) THEN
            q_id := NULL;  -- the general path says which body is too long
        END IF;
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error.
        RETURN QUERY SELECT * FROM postbox._send_batch_general(
            queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    -- unnest sits in the select list (a ProjectSet, where FROM unnest would first
    -- copy every body into a tuplestore), so the rows go to the insert in input
    -- order with no sort: ids are drawn, and returned, in input order (as the
    -- tests hold). The call's values are worked out once, in a one-row subquery
    -- that OFFSET 0 keeps from being pulled up: in the select list, they were
    -- evaluated for each row (0.3%).
    RETURN QUERY
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT c.queue_id, c.visible_at, c.sent_at, unnest(bodies), 0
    FROM (SELECT q_id AS queue_id, t AS sent_at, t + q_delay AS visible_at
          FROM clock_timestamp() AS t OFFSET 0) AS c
    RETURNING id, false;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
END
$$;

-- send_batch of a batch named by a request id. The id's row, written in the
-- batch's transaction, claims it: a committed batch and its row are one. A
-- repeat within the queue's deduplication window finds the row, sends nothing
-- and answers the first batch's ids, all duplicates; a repeat while the first
-- is still uncommitted waits on the row (ON CONFLICT) and then does the same,
-- or, if the first rolled back, is the first itself. The entries are not
-- compared (the id is a retry token, as a deduplication id is), but their
-- number is: the answer is parallel to them, so a repeat with another number
-- is PB412, a new batch that reused an id. The row is written empty and
-- filled once the batch is in: the batch draws its ids as it inserts.
CREATE FUNCTION postbox._send_batch_once(
    queue_name text, request_id text, bodies bytea[], attributes jsonb[], delays interval[],
    message_group_ids text[], deduplication_ids text[], dedupe_keys text[], priorities integer[],
    deliver_ats timestamptz[], ttls interval[], expire_ats timestamptz[], max_receive_counts integer[])
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    claimed_at timestamptz := clock_timestamp();
    stored bigint[];
    sent_ids bigint[];
    sent_duplicates boolean[];
BEGIN
    IF length(_send_batch_once.request_id) NOT BETWEEN 1 AND 128 OR _send_batch_once.request_id ~ '[^!-~]' THEN
        PERFORM postbox._invalid(format('request_id %s is not 1 to 128 printable ASCII characters',
                                        postbox._quoted(_send_batch_once.request_id)));
    END IF;
    PERFORM postbox._check_batch_size(cardinality(bodies));
    INSERT INTO postbox.batch_requests AS r (queue_id, request_id, message_ids, expires_at)
    VALUES (q.id, _send_batch_once.request_id, '{}', claimed_at + q.deduplication_window)
    ON CONFLICT ON CONSTRAINT batch_requests_pkey DO UPDATE
    SET message_ids = excluded.message_ids, expires_at = excluded.expires_at
    WHERE r.expires_at <= claimed_at;
    IF NOT FOUND THEN
        -- Committed within the window: a statement of its own sees it.
        SELECT r.message_ids INTO stored FROM postbox.batch_requests r
        WHERE r.queue_id = q.id AND r.request_id = _send_batch_once.request_id;
        IF cardinality(stored) <> cardinality(bodies) THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'request_id %s named a batch of %s entries within the queue''s deduplication window; this one '
                'has %s: a retry repeats its batch, a new batch takes a new request_id',
                postbox._quoted(_send_batch_once.request_id), cardinality(stored), cardinality(bodies));
        END IF;
        RETURN QUERY SELECT s.id, true FROM unnest(stored) WITH ORDINALITY AS s(id, i) ORDER BY s.i;
        RETURN;
    END IF;
    SELECT array_agg(s.message_id ORDER BY s.n), array_agg(s.duplicate ORDER BY s.n)
    INTO sent_ids, sent_duplicates
    FROM postbox.send_batch(queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids,
                            dedupe_keys, priorities, deliver_ats, ttls, expire_ats, max_receive_counts)
         WITH ORDINALITY AS s(message_id, duplicate, n);
    UPDATE postbox.batch_requests r SET message_ids = sent_ids
    WHERE r.queue_id = q.id AND r.request_id = _send_batch_once.request_id;
    RETURN QUERY SELECT s.id, s.duplicate FROM unnest(sent_ids, sent_duplicates) WITH ORDINALITY AS s(id, duplicate, i)
                 ORDER BY s.i;
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
    PERFORM postbox._lock_queue(q, true);
    PERFORM postbox._delete_messages(q.id);
    DELETE FROM postbox.deduplication WHERE queue_id = q.id;
    DELETE FROM postbox.batch_requests WHERE queue_id = q.id;
    DELETE FROM postbox.archive WHERE queue_id = q.id;
    DELETE FROM postbox.receive_tokens WHERE queue_id = q.id;
    DELETE FROM postbox.redrive_tasks WHERE dead_letter_queue_id = q.id;
    UPDATE postbox.redrive_tasks
    SET status = 'failed', failure_reason = 'the destination queue was deleted', updated_at = now()
    WHERE destination_queue_id = q.id AND status = 'running';
    DELETE FROM postbox.queues WHERE id = q.id;
END
$$;

-- Deletes every message of a queue; returns how many. Sends wait meanwhile, so
-- no FIFO message is parked behind a head that the purge removed. Since 0.9.0 it
-- forgets the queue's deduplication and request ids too, as SQS's PurgeQueue
-- does its deduplication ids.
CREATE OR REPLACE FUNCTION postbox.purge_queue(queue_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    purged bigint;
BEGIN
    PERFORM postbox._lock_queue(q, true);
    purged := postbox._delete_messages(q.id);
    DELETE FROM postbox.deduplication WHERE queue_id = q.id;
    DELETE FROM postbox.batch_requests WHERE queue_id = q.id;
    UPDATE postbox.queues SET purged_at = now() WHERE id = q.id;
    RETURN purged;
END
$$;

-- Forgets up to batch_size archived messages past their queue's
-- archive_retention, deduplication ids and (since 0.9.0) SendBatch request ids
-- past their window. Returns how many.
CREATE OR REPLACE FUNCTION postbox.expire_records(batch_size integer DEFAULT 1000) RETURNS bigint
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


-- Receipts for deliveries named by (message id, receive count modulo 4096), as
-- the REST API's numeric delivery ids name them (since 0.9.0): the message's
-- receipt while that delivery holds it, else one with the nil lease, which no
-- delivery holds, so the receipt operations answer it stale or gone.
CREATE FUNCTION postbox.delivery_receipts(queue_name text, message_ids bigint[], receive_counts integer[])
RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(t.id || ':' || coalesce(m.lease, '00000000-0000-0000-0000-000000000000')
                              ORDER BY t.i), '{}')
    FROM unnest(message_ids, receive_counts) WITH ORDINALITY AS t(id, n, i)
    LEFT JOIN postbox.messages m
        ON m.id = t.id AND m.receive_count % 4096 = t.n
           AND m.queue_id = (SELECT q.id FROM postbox.queues q WHERE q.name = queue_name)
$$;

-- SQL roles bound to tenants: the binding, and the reader and writer functions scoped to a
-- bound role's tenant (see 05_tenant_scope.sql).
-- SQL roles bound to tenants (since 0.9.0). A direct SQL user whose role is
-- bound to a tenant (bind_tenant_role), itself or through a role it belongs
-- to, sees through the reader and writer functions only that tenant's queues,
-- topics and schedules, under their own names: `orders` is the tenant's
-- `acme/orders`, lists show the tenant's resources without the prefix, and
-- another tenant's resource answers as a missing one. An unbound role sees
-- every tenant, as before. Bindings name roles (a role's name survives
-- pg_dump to another cluster, its oid does not): a binding outlives its role,
-- and a new role of that name is bound.
CREATE TABLE IF NOT EXISTS postbox.tenant_roles (
    role_name name PRIMARY KEY,
    tenant_name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.tenant_roles', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;

-- The tenant the caller acts for, NULL when it is bound to none. Inside a
-- SECURITY DEFINER function current_user is the engine's owner, so the caller
-- is session_user and, after SET ROLE, the role set (current_setting('role')),
-- each with every role it belongs to, directly or not (pg_has_role's MEMBER,
-- which counts a membership without INHERIT too). A superuser is a member of
-- every role, so it counts only through a role it sets. A login role may only
-- SET ROLE to roles it belongs to, so it cannot shed its binding that way; a
-- superuser that sets a bound role acts for that role's tenant. 42501 when the
-- caller is bound to two tenants, or is bound and belongs to postbox_admin,
-- whose functions and table rights cross tenants. The owner (the servers'
-- role: it cannot be bound) and everyone while no role is bound pay no query
-- of the roles.
CREATE OR REPLACE FUNCTION postbox._caller_tenant() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    bound text[];
    admin boolean;
BEGIN
    IF (session_user = current_user AND current_setting('role') = 'none')
       OR NOT EXISTS (SELECT FROM postbox.tenant_roles) THEN
        RETURN NULL;
    END IF;
    -- One statement: each one a plpgsql function runs costs as much as a
    -- send's insert. Bound roles are looked up with to_regrole (NULL for a
    -- dropped role, which then matches nothing).
    SELECT array_agg(DISTINCT b.tenant_name ORDER BY b.tenant_name),
           bool_or(pg_catalog.pg_has_role(c.oid, to_regrole('postbox_admin'), 'MEMBER'))
    INTO bound, admin
    FROM pg_catalog.pg_roles c
    JOIN postbox.tenant_roles b ON pg_catalog.pg_has_role(c.oid, to_regrole(quote_ident(b.role_name)), 'MEMBER')
    WHERE (c.rolname = session_user OR c.rolname = nullif(current_setting('role'), 'none')) AND NOT c.rolsuper;
    IF bound IS NULL THEN
        RETURN NULL;
    ELSIF cardinality(bound) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
            'role %s is bound to tenants %s (itself or through its roles); a role acts for one tenant: '
            'unbind all but one (postbox.unbind_tenant_role)',
            quote_ident(coalesce(nullif(current_setting('role'), 'none'), session_user)),
            array_to_string(bound, ', '));
    ELSIF admin THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
            'role %s is bound to tenant %s and is a member of postbox_admin, whose rights cross tenants: '
            'revoke postbox_admin from it or unbind it',
            quote_ident(coalesce(nullif(current_setting('role'), 'none'), session_user)), bound[1]);
    END IF;
    RETURN bound[1];
END
$$;

-- The tenant the calling role acts for (see _caller_tenant): NULL when it is
-- bound to none and sees every tenant. For readers and writers too.
CREATE OR REPLACE FUNCTION postbox.caller_tenant() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT postbox._caller_tenant()
$$;

-- The resource a caller of tenant `tenant` means by resource_name: its own
-- name `orders` is `tenant/orders`, and `tenant/orders` is taken as it is (the
-- engine's functions pass full names to one another). Any other name with "/"
-- is PB400, whether or not it exists, so it tells nothing of other tenants.
-- Unbound (tenant NULL) and NULL names: the name itself.
CREATE OR REPLACE FUNCTION postbox._in_tenant(resource_name text, tenant text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF tenant IS NULL OR resource_name IS NULL OR starts_with(resource_name, tenant || '/') THEN
        RETURN resource_name;
    ELSIF strpos(resource_name, '/') > 0 THEN
        PERFORM postbox._invalid(format(
            'name %s has a "/": a role bound to a tenant names its resources without the tenant',
            postbox._quoted(resource_name)));
    END IF;
    RETURN tenant || '/' || resource_name;
END
$$;

-- resource_name as the caller means it (see _in_tenant).
CREATE OR REPLACE FUNCTION postbox._scoped_name(resource_name text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT postbox._in_tenant(resource_name, postbox._caller_tenant())
$$;

-- A name as a caller of tenant `tenant` sees it: without the tenant's prefix.
CREATE OR REPLACE FUNCTION postbox._shown(resource_name text, tenant text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN tenant IS NOT NULL AND starts_with(resource_name, tenant || '/')
                THEN substr(resource_name, length(tenant) + 2) ELSE resource_name END
$$;

-- The first characters of the names a caller of tenant `tenant` may see:
-- 'tenant/', or '' when unbound. Lists compare names with this || the caller's
-- bounds, so the name index still serves them.
CREATE OR REPLACE FUNCTION postbox._tenant_prefix(tenant text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(tenant || '/', '')
$$;

-- A queue as a caller of tenant `tenant` sees it: its name and its redrive
-- sources' without the tenant (see _shown).
CREATE OR REPLACE FUNCTION postbox._shown_queue(q postbox.queues, tenant text) RETURNS postbox.queues
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF tenant IS NOT NULL THEN
        q.name := postbox._shown(q.name, tenant);
        q.redrive_sources := ARRAY(SELECT postbox._shown(x, tenant) FROM unnest(q.redrive_sources) AS x);
    END IF;
    RETURN q;
END
$$;

-- The queue of that name (the caller's tenant's, for a bound role: see
-- _caller_tenant); PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox.get_queue(queue_name text) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    RETURN postbox._shown_queue(postbox._queue(postbox._in_tenant(queue_name, tenant)), tenant);
END
$$;

-- Queues in name order after after_name, whose names start with name_prefix;
-- a bound role's tenant's only, named as it names them.
CREATE OR REPLACE FUNCTION postbox.list_queues(page_size integer DEFAULT 100, after_name text DEFAULT '',
                                    name_prefix text DEFAULT '')
RETURNS SETOF postbox.queues
LANGUAGE sql STABLE AS $$
    -- The tenant as a subquery: evaluated once, and the name index still serves.
    SELECT s.* FROM postbox.queues q
    CROSS JOIN LATERAL postbox._shown_queue(q, (SELECT postbox._caller_tenant())) AS s
    WHERE q.name > postbox._tenant_prefix((SELECT postbox._caller_tenant())) || coalesce(after_name, '')
          AND starts_with(q.name, postbox._tenant_prefix((SELECT postbox._caller_tenant()))
                                  || coalesce(name_prefix, ''))
    ORDER BY q.name
    LIMIT page_size
$$;

-- Live counts of a queue's messages. Parked FIFO messages count as visible
-- (waiting for their turn); expired ones do not count. The ages of the oldest
-- and newest message (0 when empty), and the messages sent through a server
-- since the queue was made (queue_counters.sent; newest_age and sent_total
-- since 0.9.0).
CREATE OR REPLACE FUNCTION postbox.queue_stats(queue_name text)
RETURNS TABLE (visible bigint, in_flight bigint, delayed bigint, oldest_age interval,
               newest_age interval, sent_total bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(postbox._scoped_name(queue_name));
BEGIN
    RETURN QUERY
    SELECT count(*) FILTER (WHERE m.visible_at <= now() OR m.visible_at = 'infinity'),
           count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NOT NULL),
           count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity' AND m.lease IS NULL),
           coalesce(now() - min(m.enqueued_at), interval '0'),
           greatest(coalesce(now() - max(m.enqueued_at), interval '0'), interval '0'),
           coalesce((SELECT c.sent FROM postbox.queue_counters c WHERE c.queue_id = q.id), 0)
    FROM postbox.messages m
    WHERE m.queue_id = q.id AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention);
END
$$;

-- Live figures of the first max_queues queues in name order, for a metrics
-- scrape: the counts of queue_stats, the oldest message's age in seconds, the
-- depth of the queue's dead-letter queue (NULL without one), its pause flags
-- and its counters (expired and dead-lettered messages, since 0.8.0).
-- One pass over the messages of those queues and their dead-letter queues, not
-- a call per queue. A bound role's tenant's queues only, named as it names them.
CREATE OR REPLACE FUNCTION postbox.queue_metrics(max_queues integer DEFAULT 1000)
RETURNS TABLE (queue_name text, visible bigint, in_flight bigint, delayed bigint,
               oldest_age_seconds double precision, dead_letter_depth bigint,
               send_paused boolean, receive_paused boolean,
               expired_total bigint, dead_lettered_total bigint)
LANGUAGE sql STABLE AS $$
    WITH me AS MATERIALIZED (
        SELECT postbox._caller_tenant() AS tenant
    ), shown AS (
        SELECT q.id, postbox._shown(q.name, me.tenant) AS name, q.dead_letter_queue_id, q.send_paused,
               q.receive_paused
        FROM postbox.queues q, me
        WHERE starts_with(q.name, postbox._tenant_prefix(me.tenant))
        ORDER BY q.name LIMIT max_queues
    ), depth AS (
        SELECT m.queue_id,
               count(*) FILTER (WHERE m.visible_at <= now() OR m.visible_at = 'infinity') AS visible,
               count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity'
                                      AND m.lease IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE m.visible_at > now() AND m.visible_at <> 'infinity'
                                      AND m.lease IS NULL) AS delayed,
               min(m.enqueued_at) AS oldest
        FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id
        WHERE m.queue_id IN (SELECT id FROM shown UNION SELECT dead_letter_queue_id FROM shown)
          AND (q.retention IS NULL OR m.enqueued_at >= now() - q.retention)
        GROUP BY m.queue_id
    )
    SELECT s.name, coalesce(d.visible, 0), coalesce(d.in_flight, 0), coalesce(d.delayed, 0),
           greatest(coalesce(extract(epoch FROM now() - d.oldest), 0), 0)::double precision,
           CASE WHEN s.dead_letter_queue_id IS NOT NULL
                THEN coalesce(dl.visible + dl.in_flight + dl.delayed, 0) END,
           s.send_paused, s.receive_paused,
           coalesce(c.expired, 0), coalesce(c.dead_lettered, 0)
    FROM shown s
    LEFT JOIN depth d ON d.queue_id = s.id
    LEFT JOIN depth dl ON dl.queue_id = s.dead_letter_queue_id
    LEFT JOIN postbox.queue_counters c ON c.queue_id = s.id
    ORDER BY s.name
$$;

-- Each queue's counts and rates over the last `span` (30 seconds to an hour), or
-- one queue's (only_queue): the buckets that began in the span, divided by the
-- seconds from the first of them to now, so the current, partial bucket counts
-- and the rate is neither diluted nor inflated. Figures lag by up to the
-- servers' flush period (5 s by default). Receive latency is enqueue to first
-- delivery (a delay counts), NULL when nothing was delivered for the first time.
-- A bound role's tenant's queues only, named as it names them.
CREATE OR REPLACE FUNCTION postbox.queue_rates(span interval DEFAULT '1 minute', only_queue text DEFAULT NULL)
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

-- Browses a queue's messages in id order without claiming them: all of them,
-- or those in one state (visible, in_flight, delayed), or the dead letters
-- ('dead', whatever their state). Expired messages are not shown. Since 0.9.0
-- with the consumer that took the latest delivery, when, and the message's own
-- max_receive_count.
CREATE OR REPLACE FUNCTION postbox.peek_messages(queue_name text, in_state text DEFAULT NULL, after_id bigint DEFAULT 0,
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

-- One message's life as seen from a queue (see _message_lives): waiting, in
-- flight, or (since 0.9.0) dead-lettered, expired, and where the queue archives
-- succeeded with its result, failed or cancelled. PB404 if the queue never
-- held it, or forgot it.
CREATE OR REPLACE FUNCTION postbox.get_message(queue_name text, id bigint)
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

-- A queue's archived messages in id order after after_id.
CREATE OR REPLACE FUNCTION postbox.list_archived_messages(queue_name text, after_id bigint DEFAULT 0,
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

-- The queues whose dead-letter queue this is, in name order after after_name.
CREATE OR REPLACE FUNCTION postbox.list_dead_letter_source_queues(queue_name text, page_size integer DEFAULT 100,
                                                       after_name text DEFAULT '')
RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    -- Looked up first: in the query's filter it would run only if some queue
    -- were scanned, and an absent queue must be PB404 on an empty database too.
    tenant text := postbox._caller_tenant();
    dlq postbox.queues := postbox._queue(postbox._in_tenant(queue_name, tenant));
BEGIN
    RETURN QUERY
    SELECT postbox._shown(s.name, tenant) FROM postbox.queues s
    WHERE s.dead_letter_queue_id = dlq.id AND s.name > postbox._tenant_prefix(tenant) || coalesce(after_name, '')
    ORDER BY s.name
    LIMIT page_size;
END
$$;

-- The redrive tasks of a dead-letter queue, newest first; a page after
-- after_task, the last task of the page before.
CREATE OR REPLACE FUNCTION postbox.list_redrive_tasks(dead_letter_queue text, page_size integer DEFAULT 10,
                                           after_task uuid DEFAULT NULL)
RETURNS SETOF postbox.redrive_tasks
LANGUAGE plpgsql STABLE AS $$
DECLARE
    dlq postbox.queues := postbox._queue(postbox._scoped_name(dead_letter_queue));  -- PB404 even when no task exists
    after postbox.redrive_tasks;
BEGIN
    SELECT * INTO after FROM postbox.redrive_tasks WHERE id = after_task;
    RETURN QUERY
    SELECT * FROM postbox.redrive_tasks t
    WHERE t.dead_letter_queue_id = dlq.id
      -- After it in (created_at DESC, id) order: older, or as old with a greater id.
      AND (after_task IS NULL OR (t.created_at, after.id) < (after.created_at, t.id))
    ORDER BY t.created_at DESC, t.id
    LIMIT page_size;
END
$$;

-- A topic as a caller of tenant `tenant` sees it: named without the tenant.
CREATE OR REPLACE FUNCTION postbox._shown_topic(t postbox.topics, tenant text) RETURNS postbox.topics
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    t.name := postbox._shown(t.name, tenant);
    RETURN t;
END
$$;

-- The topic of that name (the caller's tenant's, for a bound role); PB404 if
-- there is none.
CREATE OR REPLACE FUNCTION postbox.get_topic(topic_name text) RETURNS postbox.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    RETURN postbox._shown_topic(postbox._topic(postbox._in_tenant(topic_name, tenant)), tenant);
END
$$;

-- Topics in name order after after_name; a bound role's tenant's only, named
-- as it names them (see list_queues).
CREATE OR REPLACE FUNCTION postbox.list_topics(page_size integer DEFAULT 100, after_name text DEFAULT '')
RETURNS SETOF postbox.topics
LANGUAGE sql STABLE AS $$
    SELECT s.* FROM postbox.topics t
    CROSS JOIN LATERAL postbox._shown_topic(t, (SELECT postbox._caller_tenant())) AS s
    WHERE t.name > postbox._tenant_prefix((SELECT postbox._caller_tenant())) || coalesce(after_name, '')
          AND starts_with(t.name, postbox._tenant_prefix((SELECT postbox._caller_tenant())))
    ORDER BY t.name
    LIMIT page_size
$$;

-- A subscription as a caller of tenant `tenant` sees it: its pending queue
-- named without the tenant.
CREATE OR REPLACE FUNCTION postbox._shown_subscription(s postbox.subscriptions, tenant text) RETURNS postbox.subscriptions
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    s.pending_queue := postbox._shown(s.pending_queue, tenant);
    RETURN s;
END
$$;

-- The subscription of a topic (the caller's tenant's, for a bound role);
-- PB400 if either name is malformed, PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox.get_subscription(topic_name text, subscription_name text)
RETURNS postbox.subscriptions
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics;
    s postbox.subscriptions;
BEGIN
    PERFORM postbox._invalid(postbox.name_problem('subscription', subscription_name))
    WHERE postbox.name_problem('subscription', subscription_name) IS NOT NULL;
    t := postbox._topic(postbox._scoped_name(topic_name));
    SELECT * INTO s FROM postbox.subscriptions WHERE topic_id = t.id AND name = subscription_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'topic %s has no subscription %s', quote_literal(topic_name), quote_literal(subscription_name));
    END IF;
    RETURN postbox._shown_subscription(s, postbox._caller_tenant());
END
$$;

-- A topic's subscriptions in name order after after_name.
CREATE OR REPLACE FUNCTION postbox.list_subscriptions(topic_name text, page_size integer DEFAULT 100,
                                           after_name text DEFAULT '')
RETURNS SETOF postbox.subscriptions
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
    t postbox.topics := postbox._topic(postbox._in_tenant(topic_name, tenant));
BEGIN
    RETURN QUERY
    SELECT x.* FROM postbox.subscriptions s CROSS JOIN LATERAL postbox._shown_subscription(s, tenant) AS x
    WHERE s.topic_id = t.id AND s.name > coalesce(after_name, '')
    ORDER BY s.name
    LIMIT page_size;
END
$$;

-- A schedule as a caller of tenant `tenant` sees it: its name and target
-- without the tenant.
CREATE OR REPLACE FUNCTION postbox._shown_schedule(s postbox.schedules, tenant text) RETURNS postbox.schedules
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    s.name := postbox._shown(s.name, tenant);
    s.target_queue := postbox._shown(s.target_queue, tenant);
    s.target_topic := postbox._shown(s.target_topic, tenant);
    RETURN s;
END
$$;

-- The schedule of that name (the caller's tenant's, for a bound role); PB404
-- if there is none.
CREATE OR REPLACE FUNCTION postbox.get_schedule(schedule_name text) RETURNS postbox.schedules
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    RETURN postbox._shown_schedule(postbox._schedule(postbox._in_tenant(schedule_name, tenant)), tenant);
END
$$;

-- Schedules in name order after after_name; only paused (or only active)
-- ones when `paused` is not NULL, only those into queues (target_kind 'queue')
-- or topics ('topic') when it is not NULL, only names starting with
-- name_prefix. A bound role's tenant's only, named as it names them.
CREATE OR REPLACE FUNCTION postbox.list_schedules(page_size integer DEFAULT 100, after_name text DEFAULT '',
                                       paused boolean DEFAULT NULL, target_kind text DEFAULT NULL,
                                       name_prefix text DEFAULT '')
RETURNS SETOF postbox.schedules
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    IF target_kind NOT IN ('queue', 'topic') THEN
        PERFORM postbox._invalid(format('target_kind is %s; it must be queue or topic', postbox._quoted(target_kind)));
    END IF;
    RETURN QUERY
    SELECT x.* FROM postbox.schedules s CROSS JOIN LATERAL postbox._shown_schedule(s, tenant) AS x
    WHERE s.name > postbox._tenant_prefix(tenant) || coalesce(after_name, '')
          AND (list_schedules.paused IS NULL OR s.paused = list_schedules.paused)
          AND (target_kind IS NULL OR (target_kind = 'queue') = (s.target_queue IS NOT NULL))
          AND starts_with(s.name, postbox._tenant_prefix(tenant) || coalesce(name_prefix, ''))
    ORDER BY s.name
    LIMIT page_size;
END
$$;

-- A consumer group with its lag; PB404 if there is none.
CREATE OR REPLACE FUNCTION postbox.get_consumer_group(topic_name text, group_name text)
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    tenant text := postbox._caller_tenant();
    t postbox.topics := postbox._topic(postbox._in_tenant(topic_name, tenant));
    g postbox.consumer_groups;
BEGIN
    SELECT * INTO g FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.name_problem('consumer group', group_name))
        WHERE postbox.name_problem('consumer group', group_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY SELECT * FROM postbox._consumer_group_view(g, postbox._shown(t.name, tenant));
END
$$;

-- A topic's consumer groups in name order after after_name, with their lag.
CREATE OR REPLACE FUNCTION postbox.list_consumer_groups(topic_name text, page_size integer DEFAULT 100,
                                             after_name text DEFAULT '')
RETURNS TABLE (topic text, name text, created_at timestamptz, cursor_offset bigint, acked_at timestamptz,
               lease_expires_at timestamptz, lag_messages bigint, lag_seconds double precision,
               paused boolean, retry_messages bigint, max_deliveries integer, dead_letters bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
    t postbox.topics := postbox._topic(postbox._in_tenant(topic_name, tenant));
BEGIN
    RETURN QUERY
    SELECT v.* FROM postbox.consumer_groups g, LATERAL postbox._consumer_group_view(g, postbox._shown(t.name, tenant)) v
    WHERE g.topic_id = t.id AND g.name > coalesce(after_name, '')
    ORDER BY g.name
    LIMIT page_size;
END
$$;

-- A consumer group's dead letters in offset order after after_offset (0: from
-- the first), at most page_size (1-1001), each with the deliveries it had,
-- when and why it died. PB404 if the group does not exist.
CREATE OR REPLACE FUNCTION postbox.list_stream_dead_letters(topic_name text, group_name text, page_size integer DEFAULT 100,
                                                 after_offset bigint DEFAULT 0)
RETURNS TABLE (stream_offset bigint, published_at timestamptz, publish_id uuid, routing_key text,
               ordering_key text, subject text, attributes jsonb, body bytea, delivery_count integer,
               dead_at timestamptz, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(postbox._scoped_name(topic_name));
    dead_group integer;
BEGIN
    IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1001 THEN
        PERFORM postbox._invalid(format('page_size must be from 1 to 1001, not %s', page_size));
    END IF;
    SELECT c.id INTO dead_group FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    RETURN QUERY
    SELECT d.stream_offset, d.published_at, d.publish_id, d.routing_key, d.ordering_key, d.subject, d.attributes,
           d.body, d.deliveries, d.dead_at, d.reason
    FROM postbox.stream_dead_letters d
    WHERE d.group_id = dead_group AND d.stream_offset > coalesce(after_offset, 0)
    ORDER BY d.stream_offset
    LIMIT page_size;
END
$$;

-- Where a consumer group's cursor stands, and where the topic's log ends for
-- readers now: its last row below the horizon, or the cursor when no such row
-- is past it. PB404 if the group does not exist.
CREATE OR REPLACE FUNCTION postbox.stream_position(topic_name text, group_name text, OUT cursor_tx bigint,
                                        OUT cursor_offset bigint, OUT end_tx bigint, OUT end_offset bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    checked_name text := postbox._group_name(group_name);  -- before any lookup
    t postbox.topics := postbox._stream_topic(postbox._scoped_name(topic_name));
    g postbox.consumer_groups;
BEGIN
    SELECT * INTO g FROM postbox.consumer_groups c WHERE c.topic_id = t.id AND c.name = group_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'consumer group %s of topic %s does not exist', quote_literal(group_name), quote_literal(topic_name));
    END IF;
    cursor_tx := g.cursor_tx::text::bigint;
    cursor_offset := g.cursor_offset;
    SELECT l.tx::text::bigint, l.stream_offset INTO end_tx, end_offset
    FROM postbox.stream_log l
    WHERE l.topic_id = t.id AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset)
          AND l.tx < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY l.tx DESC, l.stream_offset DESC
    LIMIT 1;
    IF NOT FOUND THEN
        end_tx := cursor_tx;
        end_offset := cursor_offset;
    END IF;
END
$$;

-- Consumer groups' lag for the servers' metrics: up to max_groups groups, in
-- topic and group name order; a bound role's tenant's only, its topics named
-- as it names them.
CREATE OR REPLACE FUNCTION postbox.stream_metrics(max_groups integer DEFAULT 1000)
RETURNS TABLE (topic text, name text, lag_messages bigint, lag_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT v.topic, v.name, v.lag_messages, v.lag_seconds
    FROM postbox.consumer_groups g
    JOIN postbox.topics t ON t.id = g.topic_id
    CROSS JOIN LATERAL postbox._consumer_group_view(g, postbox._shown(t.name, (SELECT postbox._caller_tenant()))) v
    WHERE starts_with(t.name, postbox._tenant_prefix((SELECT postbox._caller_tenant())))
    ORDER BY t.name, g.name
    LIMIT max_groups
$$;

-- Publish-to-first-read latency of each consumer group that read in the last
-- `recent` (10 seconds to 1 hour, in whole 10-second buckets): how many
-- messages its new batches took, and the 50th, 95th and 99th percentiles of
-- their latency, each the upper bound of the bin it falls in (5 ms to 30
-- minutes; Infinity above), so never understated. Latency counts from the
-- publish to the read that took the message first: time waiting for the
-- group's batch, for the horizon (see Order above), or for a delay. A bound
-- role's tenant's groups only, its topics named as it names them.
CREATE OR REPLACE FUNCTION postbox.stream_latency(recent interval DEFAULT '5 minutes')
RETURNS TABLE (topic text, consumer_group text, messages bigint, p50_seconds double precision,
               p95_seconds double precision, p99_seconds double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    IF recent IS NULL OR recent < interval '10 seconds' OR recent > interval '1 hour' THEN
        PERFORM postbox._invalid(format('recent must be from 10 seconds to 1 hour, not %s', recent));
    END IF;
    RETURN QUERY
    WITH bins AS (
        SELECT s.group_id, b.i, sum(b.n) AS n
        FROM postbox.stream_latency s, unnest(s.counts) WITH ORDINALITY AS b(n, i)
        WHERE s.bucket > now() - recent
        GROUP BY s.group_id, b.i),
    cumulative AS (
        SELECT bins.group_id, bins.i, sum(bins.n) OVER (PARTITION BY bins.group_id ORDER BY bins.i) AS upto,
               sum(bins.n) OVER (PARTITION BY bins.group_id) AS total
        FROM bins)
    SELECT postbox._shown(t.name, tenant), g.name, max(c.total)::bigint,
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.50 * c.total)], 'Infinity'),
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.95 * c.total)], 'Infinity'),
           coalesce((postbox._stream_latency_bounds())[min(c.i) FILTER (WHERE c.upto >= 0.99 * c.total)], 'Infinity')
    FROM cumulative c
    JOIN postbox.consumer_groups g ON g.id = c.group_id
    JOIN postbox.topics t ON t.id = g.topic_id
    WHERE c.total > 0 AND starts_with(t.name, postbox._tenant_prefix(tenant))
    GROUP BY t.name, g.name
    ORDER BY t.name, g.name;
END
$$;

-- Each consumer group's health (the view stream_health), as queue_health is
-- each queue's: 'critical'
-- when its oldest unacknowledged message (past its cursor, or given back) is
-- older than postbox.health_critical_age (default 1 hour) or it holds
-- postbox.health_critical_dlq_depth dead letters (100); 'warning' past
-- postbox.health_warning_age (5 minutes) or postbox.health_warning_dlq_depth
-- (1), while paused, or when stuck: messages wait for it and no batch has
-- gone out to it for postbox.health_stuck_after (5 minutes). reason says
-- which. held_slots counts the log's retired slots it keeps from rotating
-- (they hold messages of its topic past its cursor); p95 and p99 are its
-- publish-to-first-read latency over the last 5 minutes (stream_latency;
-- NULL without reads). Reads the log past each cursor: seconds for a group
-- millions behind. A bound role's tenant's groups only, its topics named as it
-- names them.
CREATE OR REPLACE FUNCTION postbox.consumer_group_health()
RETURNS TABLE (topic text, consumer_group text, status text, reason text, lag_messages bigint,
               oldest_unacked_seconds double precision, retry_messages bigint, dead_letters bigint,
               paused boolean, last_read_at timestamptz, lease_expires_at timestamptz, held_slots bigint,
               latency_p95_seconds double precision, latency_p99_seconds double precision)
LANGUAGE sql STABLE AS $$
SELECT v.topic, v.name AS consumer_group,
       CASE WHEN h.critical <> '{}' THEN 'critical'
            WHEN h.warning <> '{}' THEN 'warning'
            ELSE 'ok' END AS status,
       array_to_string(h.critical || h.warning, '; ') AS reason,
       v.lag_messages, o.oldest_unacked_seconds, v.retry_messages, v.dead_letters, v.paused,
       g.read_at AS last_read_at, v.lease_expires_at, r.held_slots, lat.p95_seconds AS latency_p95_seconds,
       lat.p99_seconds AS latency_p99_seconds
FROM (SELECT postbox._caller_tenant() AS tenant) AS me
JOIN postbox.topics t ON starts_with(t.name, postbox._tenant_prefix(me.tenant))
JOIN postbox.consumer_groups g ON g.topic_id = t.id
CROSS JOIN LATERAL postbox._consumer_group_view(g, postbox._shown(t.name, me.tenant)) v
CROSS JOIN LATERAL (
    SELECT greatest(v.lag_seconds,
                    (SELECT extract(epoch FROM now() - min(x.published_at))::double precision
                     FROM postbox.stream_retries x WHERE x.group_id = g.id), 0) AS oldest_unacked_seconds) o
CROSS JOIN LATERAL (
    SELECT count(*) AS held_slots FROM postbox.stream_slots s
    WHERE s.state = 'retired'
          AND EXISTS (SELECT FROM postbox.stream_log l
                      WHERE l.slot = s.slot AND l.topic_id = g.topic_id
                            AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset))) r
LEFT JOIN postbox.stream_latency('5 minutes') lat ON lat.topic = v.topic AND lat.consumer_group = g.name
CROSS JOIN LATERAL (
    SELECT coalesce(nullif(current_setting('postbox.health_warning_age', true), ''), '5 minutes')::interval AS warning_age,
           coalesce(nullif(current_setting('postbox.health_critical_age', true), ''), '1 hour')::interval AS critical_age,
           coalesce(nullif(current_setting('postbox.health_warning_dlq_depth', true), ''), '1')::bigint AS warning_dlq,
           coalesce(nullif(current_setting('postbox.health_critical_dlq_depth', true), ''), '100')::bigint AS critical_dlq,
           coalesce(nullif(current_setting('postbox.health_stuck_after', true), ''), '5 minutes')::interval AS stuck_after) k
CROSS JOIN LATERAL (
    SELECT array_remove(ARRAY[
               CASE WHEN o.oldest_unacked_seconds >= extract(epoch FROM k.critical_age)
                    THEN format('oldest unacknowledged message %s s old', round(o.oldest_unacked_seconds::numeric)) END,
               CASE WHEN v.dead_letters >= k.critical_dlq THEN format('%s dead letters', v.dead_letters) END],
               NULL) AS critical,
           array_remove(ARRAY[
               CASE WHEN o.oldest_unacked_seconds >= extract(epoch FROM k.warning_age)
                         AND o.oldest_unacked_seconds < extract(epoch FROM k.critical_age)
                    THEN format('oldest unacknowledged message %s s old', round(o.oldest_unacked_seconds::numeric)) END,
               CASE WHEN v.dead_letters >= k.warning_dlq AND v.dead_letters < k.critical_dlq
                    THEN format('%s dead letters', v.dead_letters) END,
               CASE WHEN v.paused THEN 'paused' END,
               CASE WHEN NOT v.paused AND v.lag_messages + v.retry_messages > 0
                         AND coalesce(g.read_at, g.created_at) <= now() - k.stuck_after
                    THEN format('stuck: no batch taken for %s s while %s messages wait',
                                round(extract(epoch FROM now() - coalesce(g.read_at, g.created_at))),
                                v.lag_messages + v.retry_messages) END],
               NULL) AS warning) h
ORDER BY v.topic, v.name
$$;

-- Sends one message; returns its id (the original's, for a duplicate). See
-- send_batch for the options and rules. A message that is nothing but a body,
-- into a queue without FIFO order, deduplication or a depth limit (the common
-- transactional send), takes a straight path: send_batch's checks and branches
-- cost as much as the insert itself when many sessions each send one.
CREATE OR REPLACE FUNCTION postbox.send(
    queue_name text, body bytea, attributes jsonb DEFAULT NULL, delay interval DEFAULT NULL,
    message_group_id text DEFAULT NULL, deduplication_id text DEFAULT NULL,
    dedupe_key text DEFAULT NULL, priority integer DEFAULT NULL, deliver_at timestamptz DEFAULT NULL,
    ttl interval DEFAULT NULL, expire_at timestamptz DEFAULT NULL, max_receive_count integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- The queue's, as scalars: a row variable's fields cost 5% of the call (valgrind).
    q_id integer;
    q_delay interval;
    q_listened boolean;
    locked text;
    sent_id bigint;
BEGIN
    queue_name := postbox._scoped_name(queue_name);  -- a bound role's own name (see _caller_tenant)
    IF body IS NOT NULL AND num_nonnulls(attributes, delay, message_group_id, deduplication_id, dedupe_key,
                                         priority, deliver_at, ttl, expire_at, max_receive_count) = 0
       AND current_setting('transaction_isolation') = 'read committed' THEN
        -- As send_batch's straight path (see there).
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.listened INTO q_id, q_delay, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused OR octet_length(body) > x.max_message_size);
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error, as send_batch has it.
        RETURN (SELECT s.message_id FROM postbox._send_batch_general(
            queue_name, ARRAY[body], postbox._array_of(attributes), postbox._array_of(delay),
            postbox._array_of(message_group_id), postbox._array_of(deduplication_id),
            postbox._array_of(dedupe_key), postbox._array_of(priority), postbox._array_of(deliver_at),
            postbox._array_of(ttl), postbox._array_of(expire_at), postbox._array_of(max_receive_count)) s);
    END IF;
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT q_id, c.sent_at + q_delay, c.sent_at, body, 0
    FROM (SELECT clock_timestamp() AS sent_at) AS c
    RETURNING messages.id INTO sent_id;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
    RETURN sent_id;
END
$$;

-- Sends up to 1,000 messages in one go; returns their ids in input order, and
-- whether each was a duplicate (then nothing was enqueued and the id is the
-- original message's). Entry i of every array belongs to bodies[i]; an array may
-- be NULL or shorter (missing entries are NULL):
--   attributes       see attribute_problem
--   delays           invisible this long first (NULL: the queue's delivery_delay)
--   message_group_ids  FIFO queues: required; delivery is in order per group
--   deduplication_ids  a repeat within the queue's deduplication_window is
--                      dropped (content-based when the queue says so)
--   dedupe_keys      standard queues: replaces the body and attributes of a
--                    waiting (never received) message with the same key
--   priorities       0-9, standard queues; higher is received first
--   deliver_ats      invisible until then (instead of a delay)
--   max_receive_counts  since 0.9.0: 1-1000 deliveries, the message's own
--                    limit in place of the queue's (see receive)
-- request_id (since 0.9.0), 1-128 printable ASCII characters, names the whole
-- batch: a repeat within the queue's deduplication_window sends nothing and
-- answers the first batch's ids, all duplicates (see _send_batch_once).
-- Nothing is sent if any entry is invalid; the error names the entry by its
-- 0-based index. PB503 while sends are paused, PB429 when max_depth is reached.
--
-- Bodies alone into a queue without FIFO order, deduplication, a depth limit or
-- paused sends take a straight path of two statements: the general one's
-- checks and branches cost as much as the insert of a hundred messages. It
-- takes, in one expression (an assignment is evaluated without starting a
-- statement), its transaction id and the queue's lock by name, then looks the
-- queue up:
--   * the lock first, so the look sees a drop that committed meanwhile, and the
--     insert needs no second look;
--   * the transaction id first, so that a listing that the look misses sees
--     this transaction in progress, and waits for it (see listen_to).
-- The clock is read in the insert, which holds the table's lock by then (see
-- the general path). Only in READ COMMITTED: elsewhere the look reads the
-- transaction's snapshot, which may predate a drop, and the general path looks
-- under a row lock instead (see _lock_queue).
CREATE OR REPLACE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL,
    max_receive_counts integer[] DEFAULT NULL, request_id text DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    -- The queue's, as scalars (see send).
    q_id integer;
    q_delay interval;
    q_max_message_size integer;
    q_listened boolean;
    locked text;
BEGIN
    queue_name := postbox._scoped_name(queue_name);  -- a bound role's own name (see _caller_tenant)
    IF request_id IS NOT NULL THEN
        RETURN QUERY SELECT * FROM postbox._send_batch_once(
            queue_name, request_id, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    IF num_nonnulls(attributes, delays, message_group_ids, deduplication_ids, dedupe_keys, priorities,
                    deliver_ats, ttls, expire_ats, max_receive_counts) = 0 AND cardinality(bodies) BETWEEN 1 AND 1000
       AND array_position(bodies, NULL) IS NULL AND current_setting('transaction_isolation') = 'read committed' THEN
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.max_message_size, x.listened
        INTO q_id, q_delay, q_max_message_size, q_listened
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused);
    END IF;
    -- No body is longer than the whole array, so the bodies are looked at one by
    -- one only when the array is over the limit: that look cost 4% of a batch
    -- of 100 (valgrind). An expanded array (plpgsql expands its array arguments)
    -- is never compressed; the second test says so for certain. The look has an
    -- IF of its own: plpgsql runs a condition with a subquery as a statement,
    -- on every call (0.6% of a batch of 100).
    IF pg_column_size(bodies) > q_max_message_size OR pg_column_compression(bodies) IS NOT NULL THEN
        IF EXISTS (SELECT FROM unnest(bodies) AS b WHERE octet_length(b) > q_max_message_size) THEN
            q_id := NULL;  -- the general path says which body is too long
        END IF;
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error.
        RETURN QUERY SELECT * FROM postbox._send_batch_general(
            queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    -- unnest sits in the select list (a ProjectSet, where FROM unnest would first
    -- copy every body into a tuplestore), so the rows go to the insert in input
    -- order with no sort: ids are drawn, and returned, in input order (as the
    -- tests hold). The call's values are worked out once, in a one-row subquery
    -- that OFFSET 0 keeps from being pulled up: in the select list, they were
    -- evaluated for each row (0.3%).
    RETURN QUERY
    INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
    SELECT c.queue_id, c.visible_at, c.sent_at, unnest(bodies), 0
    FROM (SELECT q_id AS queue_id, t AS sent_at, t + q_delay AS visible_at
          FROM clock_timestamp() AS t OFFSET 0) AS c
    RETURNING id, false;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
END
$$;

-- Publishes one message; see publish_batch. A stream topic without
-- subscriptions (none to match, filter or envelope for) takes it in one
-- INSERT into its log, checked as publish_batch checks it; any other topic,
-- and a message that fails a check (for publish_batch's error), take
-- publish_batch's path.
CREATE OR REPLACE FUNCTION postbox.publish(topic_name text, body bytea, routing_key text DEFAULT '',
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
CREATE OR REPLACE FUNCTION postbox.publish_batch(
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

-- Deletes a tenant and its keys. PB412 while it owns queues, topics or
-- schedules, unless force: then they go too, with their messages. PB412 while
-- SQL roles are bound to it (since 0.9.0), force or not: unbound, a role would
-- see every tenant.
CREATE OR REPLACE FUNCTION postbox.delete_tenant(tenant_name text, force boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
    owned record;
    prefix text := tenant_name || '/';
    resource text;
    roles text;
BEGIN
    PERFORM 1 FROM postbox.tenants x WHERE x.name = t.name FOR UPDATE;
    SELECT string_agg(quote_ident(b.role_name), ', ' ORDER BY b.role_name) INTO roles
    FROM postbox.tenant_roles b WHERE b.tenant_name = delete_tenant.tenant_name;
    IF roles IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'tenant %s has SQL roles bound to it (%s); unbind them first (postbox.unbind_tenant_role) or '
            'drop them: an unbound role sees every tenant', quote_literal(tenant_name), roles);
    END IF;
    SELECT * INTO owned FROM postbox.tenant_resources(tenant_name);
    IF owned.queues + owned.topics + owned.schedules > 0 THEN
        IF NOT force THEN
            RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
                'tenant %s still owns %s queues, %s topics and %s schedules; delete them first, or pass force',
                quote_literal(tenant_name), owned.queues, owned.topics, owned.schedules);
        END IF;
        FOR resource IN SELECT s.name FROM postbox.schedules s WHERE starts_with(s.name, prefix) ORDER BY s.name LOOP
            PERFORM postbox.delete_schedule(resource);
        END LOOP;
        FOR resource IN SELECT x.name FROM postbox.topics x WHERE starts_with(x.name, prefix) ORDER BY x.name LOOP
            PERFORM postbox.delete_topic(resource);
        END LOOP;
        -- Dead-letter links only join a tenant's own queues (a name never holds
        -- another tenant's), so cutting them lets every queue go.
        UPDATE postbox.queues q SET dead_letter_queue_id = NULL, max_receive_count = NULL
        WHERE starts_with(q.name, prefix) AND q.dead_letter_queue_id IS NOT NULL;
        FOR resource IN SELECT q.name FROM postbox.queues q WHERE starts_with(q.name, prefix) ORDER BY q.name LOOP
            PERFORM postbox.drop_queue(resource);
        END LOOP;
    END IF;
    DELETE FROM postbox.tenants x WHERE x.name = tenant_name;
END
$$;

-- Binds a PostgreSQL role to a tenant (since 0.9.0): the role, and every role
-- that belongs to it, then sees through the reader and writer functions only
-- that tenant's resources, under their own names (see _caller_tenant). A role
-- holds one binding; binding it again moves it. PB404 for an unknown tenant or
-- role; PB400 for a superuser, a role that bypasses row security, the owner of
-- schema postbox, or a member of postbox_admin: none of them can be confined.
CREATE OR REPLACE FUNCTION postbox.bind_tenant_role(role_name name, tenant_name text) RETURNS postbox.tenant_roles
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.tenants := postbox._tenant(tenant_name);
    r pg_catalog.pg_roles;
    b postbox.tenant_roles;
BEGIN
    SELECT * INTO r FROM pg_catalog.pg_roles x WHERE x.rolname = role_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('role %s does not exist', postbox._quoted(role_name));
    ELSIF r.rolsuper OR r.rolbypassrls THEN
        PERFORM postbox._invalid(format('role %s is a superuser or bypasses row security: it cannot be confined '
                                        'to a tenant', quote_ident(role_name)));
    ELSIF r.oid = (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'postbox') THEN
        PERFORM postbox._invalid(format('role %s owns schema postbox (the servers connect as it): it cannot be '
                                        'confined to a tenant', quote_ident(role_name)));
    ELSIF EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.rolname = 'postbox_admin'
                  AND pg_catalog.pg_has_role(r.oid, a.oid, 'MEMBER')) THEN
        PERFORM postbox._invalid(format('role %s is a member of postbox_admin, whose rights cross tenants: '
                                        'grant it postbox_reader or postbox_writer instead', quote_ident(role_name)));
    END IF;
    INSERT INTO postbox.tenant_roles AS x (role_name, tenant_name) VALUES (role_name, t.name)
    ON CONFLICT ON CONSTRAINT tenant_roles_pkey DO UPDATE SET tenant_name = excluded.tenant_name, created_at = now()
    RETURNING * INTO b;
    RETURN b;
END
$$;

-- Unbinds a role from its tenant: it sees every tenant again. Returns whether
-- it was bound.
CREATE OR REPLACE FUNCTION postbox.unbind_tenant_role(role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM postbox.tenant_roles b WHERE b.role_name = unbind_tenant_role.role_name;
    RETURN FOUND;
END
$$;

-- The roles bound to tenants, of one tenant or (NULL) all, in role name order.
CREATE OR REPLACE FUNCTION postbox.list_tenant_roles(tenant_name text DEFAULT NULL) RETURNS SETOF postbox.tenant_roles
LANGUAGE sql STABLE AS $$
    SELECT * FROM postbox.tenant_roles b
    WHERE list_tenant_roles.tenant_name IS NULL OR b.tenant_name = list_tenant_roles.tenant_name
    ORDER BY b.role_name
$$;

-- Gives the engine's functions their privileges, and makes each public one
-- SECURITY DEFINER with a fixed search_path: a reader or writer then needs no
-- right on the tables (a writer can call send, not insert rows of its own), and
-- no schema of the caller's can shadow a function or operator the engine uses.
-- Pure (IMMUTABLE) functions and internal ones (named "_...") stay as they are:
-- they run inside a public function, whose path is fixed already, and a SET
-- clause would keep the planner from inlining them. CREATE OR REPLACE resets
-- a function's settings, so every install and upgrade script ends by calling
-- this. start, stop, uninstall, capture and release stay the owner's (since
-- 0.9.0): they schedule jobs, drop the engine and add triggers to tables.
CREATE OR REPLACE FUNCTION postbox._secure() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f record;
    roles boolean := (SELECT count(*) = 3 FROM pg_catalog.pg_roles
                      WHERE rolname IN ('postbox_reader', 'postbox_writer', 'postbox_admin'));
    owner_only oid[] := array_remove(ARRAY[
        to_regprocedure('postbox.start(interval)'), to_regprocedure('postbox.stop()'),
        to_regprocedure('postbox.uninstall()'), to_regprocedure('postbox.capture(regclass,text,text)'),
        to_regprocedure('postbox.release(regclass)')]::oid[], NULL);
BEGIN
    FOR f IN SELECT p.oid, p.oid::regprocedure AS signature, p.proname AS name, p.provolatile, p.prorettype
             FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.signature);
        IF f.provolatile <> 'i' AND f.prorettype <> 'trigger'::regtype AND left(f.name, 1) <> '_' THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, postbox, pg_temp',
                           f.signature);
        END IF;
        IF roles AND f.oid <> ALL (owner_only) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_admin', f.signature);
            IF f.name IN ('queue_stats', 'queue_metrics', 'queue_rates', 'peek_messages', 'get_message',
                          'list_archived_messages', 'get_queue', 'list_queues', 'list_dead_letter_source_queues', 'list_redrive_tasks',
                          'get_topic', 'list_topics', 'get_subscription', 'list_subscriptions',
                          'list_webhook_deliveries', 'get_schedule', 'list_schedules', 'get_consumer_group',
                          'list_consumer_groups', 'stream_metrics', 'stream_position',
                          'list_stream_dead_letters', 'stream_latency', 'consumer_group_health') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader', f.signature);
            ELSIF f.name IN ('send', 'send_batch', 'publish', 'publish_batch') THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_writer', f.signature);
            ELSIF f.name = 'caller_tenant' THEN  -- since 0.9.0: which tenant a bound role acts for
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO postbox_reader, postbox_writer', f.signature);
            END IF;
        END IF;
    END LOOP;
    IF roles THEN
        GRANT USAGE ON SCHEMA postbox TO postbox_reader, postbox_writer, postbox_admin;
        GRANT ALL ON ALL TABLES IN SCHEMA postbox TO postbox_admin;
        GRANT ALL ON ALL SEQUENCES IN SCHEMA postbox TO postbox_admin;
        GRANT SELECT ON postbox.queue_health, postbox.queue_throughput, postbox.stream_health,
                        postbox.stream_rotation TO postbox_reader;
    END IF;
END
$$;

-- The stream log's slots (see Rotation above): each one's state and since
-- when (the current slot's since is the last rotation), how many messages it
-- holds, and for a retired slot the consumer groups that keep it from being
-- truncated, as topic/group: those with messages of their topic in it past
-- their cursor. Counts each slot's rows. A role bound to a tenant sees only
-- its tenant's groups in held_by, its topics named as it names them (the
-- slots and their counts are the whole log's, shared by the tenants).
CREATE OR REPLACE VIEW postbox.stream_rotation AS
SELECT s.slot, s.state, s.since,
       (SELECT count(*) FROM postbox.stream_log l WHERE l.slot = s.slot) AS messages,
       -- A view calls functions as its user, so only caller_tenant, not the
       -- internal _shown and _tenant_prefix, whose work is written out here.
       ARRAY(SELECT substr(t.name, coalesce(length(me.tenant) + 2, 1)) || '/' || g.name
             FROM (SELECT postbox.caller_tenant() AS tenant) AS me
             JOIN postbox.topics t ON starts_with(t.name, coalesce(me.tenant || '/', ''))
             JOIN postbox.consumer_groups g ON t.id = g.topic_id
             WHERE s.state = 'retired'
                   AND EXISTS (SELECT FROM postbox.stream_log l
                               WHERE l.slot = s.slot AND l.topic_id = g.topic_id
                                     AND (l.tx, l.stream_offset) > (g.cursor_tx, g.cursor_offset))
             ORDER BY 1) AS held_by
FROM postbox.stream_slots s
ORDER BY s.slot;

-- Filter policies: numbers compared to five digits after the point (more are taken,
-- not refused); a String.Array attribute holding a JSON scalar matches as that scalar.
-- The problem of a number in a policy, or NULL: SNS takes -10^9 to 10^9. More
-- digits after the decimal point than SNS's five are taken, and ignored (see
-- _filter_fixed).
CREATE OR REPLACE FUNCTION postbox._filter_number_problem(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN abs(value::numeric) > 1000000000 THEN
            format('number %s is out of range; numbers lie between -1000000000 and 1000000000',
                   postbox._filter_quote(value))
    END
$$;

-- A number as filter policies compare it: cut to the five digits after the
-- decimal point SNS matches with ("five digits of accuracy"), towards minus
-- infinity, as SNS's rule engine cuts its fixed-point form.
CREATE OR REPLACE FUNCTION postbox._filter_fixed(n numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT floor(n * 100000) / 100000
$$;

-- Whether a policy value equals a document value: numbers by _filter_fixed,
-- the rest as jsonb.
CREATE OR REPLACE FUNCTION postbox._filter_same(a jsonb, b jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(a) = 'number' AND jsonb_typeof(b) = 'number'
                THEN postbox._filter_fixed(a::numeric) = postbox._filter_fixed(b::numeric)
                ELSE a = b END
$$;

-- One attribute as a filter document value, or NULL to leave it out: String
-- types a JSON string, Number types a JSON number, String.Array the JSON
-- array or number it holds ("100" is the number 100, as SNS matches it), else
-- a string, Binary nothing (SNS ignores
-- binary attributes). A number too far out of numeric's range stays a string.
CREATE OR REPLACE FUNCTION postbox._filter_attribute_value(attribute jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    data_type text := attribute ->> 'data_type';
    string_value text := attribute ->> 'string_value';
    parsed jsonb;
BEGIN
    IF data_type IS NULL OR string_value IS NULL THEN
        RETURN NULL;
    ELSIF data_type = 'String.Array' THEN
        -- Only what may be a JSON array or number is parsed, in a subtransaction.
        IF ltrim(string_value, E' \t\n\r') ~ '^(\[|[0-9-])' THEN
            BEGIN
                parsed := string_value::jsonb;
            EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
                parsed := NULL;
            END;
            IF jsonb_typeof(parsed) IN ('array', 'number') THEN
                RETURN parsed;
            END IF;
        END IF;
        RETURN to_jsonb(string_value);
    ELSIF data_type LIKE 'Number%' THEN
        IF length(string_value) <= 1000
           AND string_value ~ '^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?$' THEN
            RETURN to_jsonb(string_value::numeric);
        END IF;
        RETURN to_jsonb(string_value);
    ELSIF data_type LIKE 'String%' THEN
        RETURN to_jsonb(string_value);
    END IF;
    RETURN NULL;
END
$$;

-- Whether any of a key's conditions matches any of its leaf values. Equality
-- is jsonb's (strings to strings, numbers numerically, true, false, null);
-- prefix, suffix and equals-ignore-case look at strings, numeric at numbers;
-- anything-but needs a non-null value that is none of its values; exists asks
-- for a non-null value, or none, and exists false never matches an empty
-- document (SNS: "an empty set of attributes results in the filter not
-- matching").
CREATE OR REPLACE FUNCTION postbox._filter_conditions_match(conditions jsonb, leaves jsonb, empty boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    condition jsonb;
    op text;
    arg jsonb;
    leaf jsonb;
    hit boolean;
BEGIN
    FOR condition IN SELECT jsonb_array_elements(conditions) LOOP
        IF jsonb_typeof(condition) = 'number' THEN
            IF EXISTS (SELECT FROM jsonb_array_elements(leaves) AS l WHERE postbox._filter_same(condition, l)) THEN
                RETURN true;
            END IF;
            CONTINUE;
        ELSIF jsonb_typeof(condition) <> 'object' THEN
            IF leaves @> jsonb_build_array(condition) THEN
                RETURN true;
            END IF;
            CONTINUE;
        END IF;
        SELECT e.key, e.value INTO op, arg FROM jsonb_each(condition) AS e LIMIT 1;
        IF op = 'exists' THEN
            IF arg = to_jsonb(EXISTS (SELECT FROM jsonb_array_elements(leaves) AS l WHERE l <> 'null'))
               AND (arg = 'true' OR NOT empty) THEN
                RETURN true;
            END IF;
            CONTINUE;
        END IF;
        FOR leaf IN SELECT jsonb_array_elements(leaves) LOOP
            hit := CASE op
                WHEN 'prefix' THEN
                    jsonb_typeof(leaf) = 'string' AND starts_with(leaf #>> '{}', arg #>> '{}')
                WHEN 'suffix' THEN
                    jsonb_typeof(leaf) = 'string' AND right(leaf #>> '{}', length(arg #>> '{}')) = arg #>> '{}'
                WHEN 'equals-ignore-case' THEN
                    jsonb_typeof(leaf) = 'string' AND lower(leaf #>> '{}') = lower(arg #>> '{}')
                WHEN 'anything-but' THEN
                    leaf <> 'null' AND CASE jsonb_typeof(arg)
                        WHEN 'object' THEN jsonb_typeof(leaf) = 'string' AND CASE
                            WHEN arg ? 'prefix' THEN NOT starts_with(leaf #>> '{}', arg ->> 'prefix')
                            ELSE right(leaf #>> '{}', length(arg ->> 'suffix')) <> arg ->> 'suffix' END
                        WHEN 'array' THEN NOT EXISTS (SELECT FROM jsonb_array_elements(arg) AS a
                                                      WHERE postbox._filter_same(a, leaf))
                        ELSE NOT postbox._filter_same(arg, leaf) END
                WHEN 'numeric' THEN
                    jsonb_typeof(leaf) = 'number' AND postbox._filter_numeric_matches(arg, leaf::numeric)
                ELSE false
            END;
            IF hit THEN
                RETURN true;
            END IF;
        END LOOP;
    END LOOP;
    RETURN false;
END
$$;

-- Whether a number meets a "numeric" operator's comparison or range, both
-- sides cut to five digits after the point (_filter_fixed).
CREATE OR REPLACE FUNCTION postbox._filter_numeric_matches(arg jsonb, n numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT bool_and(CASE c.op
                        WHEN '=' THEN postbox._filter_fixed(n) = c.bound
                        WHEN '<' THEN postbox._filter_fixed(n) < c.bound
                        WHEN '<=' THEN postbox._filter_fixed(n) <= c.bound
                        WHEN '>' THEN postbox._filter_fixed(n) > c.bound
                        WHEN '>=' THEN postbox._filter_fixed(n) >= c.bound
                        ELSE false END)
    FROM (SELECT arg ->> i AS op, postbox._filter_fixed((arg -> (i + 1))::numeric) AS bound
          FROM generate_series(0, jsonb_array_length(arg) - 2, 2) AS i) AS c
$$;

-- Issue 48: a request id's batch takes send_batch's straight path, its row written once.

CREATE OR REPLACE FUNCTION postbox._check_request_id(request_id text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(request_id) NOT BETWEEN 1 AND 128 OR request_id ~ '[^!-~]' THEN
        PERFORM postbox._invalid(format('request_id %s is not 1 to 128 printable ASCII characters',
                                        postbox._quoted(request_id)));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION postbox._repeated_batch(queue_id integer, request_id text, n integer)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    stored bigint[];
BEGIN
    SELECT r.message_ids INTO stored FROM postbox.batch_requests r
    WHERE r.queue_id = _repeated_batch.queue_id AND r.request_id = _repeated_batch.request_id;
    IF cardinality(stored) <> n THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'request_id %s named a batch of %s entries within the queue''s deduplication window; this one '
            'has %s: a retry repeats its batch, a new batch takes a new request_id',
            postbox._quoted(_repeated_batch.request_id), cardinality(stored), n);
    END IF;
    RETURN QUERY SELECT s.id, true FROM unnest(stored) WITH ORDINALITY AS s(id, i) ORDER BY s.i;
END
$$;

CREATE OR REPLACE FUNCTION postbox.send_batch(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL,
    max_receive_counts integer[] DEFAULT NULL, request_id text DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    -- The queue's, as scalars (see send).
    q_id integer;
    q_delay interval;
    q_max_message_size integer;
    q_listened boolean;
    q_window interval;
    locked text;
    claimed_at timestamptz;
    claimed_ids bigint[];
BEGIN
    queue_name := postbox._scoped_name(queue_name);  -- a bound role's own name (see _caller_tenant)
    IF num_nonnulls(attributes, delays, message_group_ids, deduplication_ids, dedupe_keys, priorities,
                    deliver_ats, ttls, expire_ats, max_receive_counts) = 0 AND cardinality(bodies) BETWEEN 1 AND 1000
       AND array_position(bodies, NULL) IS NULL AND current_setting('transaction_isolation') = 'read committed' THEN
        locked := concat(pg_current_xact_id(),
                         pg_advisory_xact_lock_shared(1886350224 + pg_backend_pid() % 16, hashtext(queue_name)));
        SELECT x.id, x.delivery_delay, x.max_message_size, x.listened, x.deduplication_window
        INTO q_id, q_delay, q_max_message_size, q_listened, q_window
        FROM postbox.queues x
        WHERE x.name = queue_name AND NOT (x.fifo OR x.content_based_deduplication OR x.max_depth IS NOT NULL
                                           OR x.send_paused);
    END IF;
    -- No body is longer than the whole array, so the bodies are looked at one by
    -- one only when the array is over the limit: that look cost 4% of a batch
    -- of 100 (valgrind). An expanded array (plpgsql expands its array arguments)
    -- is never compressed; the second test says so for certain. The look has an
    -- IF of its own: plpgsql runs a condition with a subquery as a statement,
    -- on every call (0.6% of a batch of 100).
    IF pg_column_size(bodies) > q_max_message_size OR pg_column_compression(bodies) IS NOT NULL THEN
        IF EXISTS (SELECT FROM unnest(bodies) AS b WHERE octet_length(b) > q_max_message_size) THEN
            q_id := NULL;  -- the general path says which body is too long
        END IF;
    END IF;
    IF q_id IS NULL AND request_id IS NOT NULL THEN
        RETURN QUERY SELECT * FROM postbox._send_batch_once(
            queue_name, request_id, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    IF q_id IS NULL THEN
        -- Everything else, and every error.
        RETURN QUERY SELECT * FROM postbox._send_batch_general(
            queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids, dedupe_keys,
            priorities, deliver_ats, ttls, expire_ats, max_receive_counts);
        RETURN;
    END IF;
    -- unnest sits in the select list (a ProjectSet, where FROM unnest would first
    -- copy every body into a tuplestore), so the rows go to the insert in input
    -- order with no sort: ids are drawn, and returned, in input order (as the
    -- tests hold). The call's values are worked out once, in a one-row subquery
    -- that OFFSET 0 keeps from being pulled up: in the select list, they were
    -- evaluated for each row (0.3%).
    IF request_id IS NULL THEN
        RETURN QUERY
        INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, body, priority)
        SELECT c.queue_id, c.visible_at, c.sent_at, unnest(bodies), 0
        FROM (SELECT q_id AS queue_id, t AS sent_at, t + q_delay AS visible_at
              FROM clock_timestamp() AS t OFFSET 0) AS c
        RETURNING id, false;
    ELSE
        -- As _send_batch_once, the row claiming the batch written once, with its ids.
        PERFORM postbox._check_request_id(request_id);
        claimed_at := clock_timestamp();
        SELECT array_agg(nextval('postbox.messages_id_seq') ORDER BY s) INTO claimed_ids
        FROM generate_series(1, cardinality(bodies)) AS s;
        INSERT INTO postbox.batch_requests AS r (queue_id, request_id, message_ids, expires_at)
        VALUES (q_id, send_batch.request_id, claimed_ids, claimed_at + q_window)
        ON CONFLICT ON CONSTRAINT batch_requests_pkey DO UPDATE
        SET message_ids = excluded.message_ids, expires_at = excluded.expires_at
        WHERE r.expires_at <= claimed_at;
        IF NOT FOUND THEN
            RETURN QUERY SELECT * FROM postbox._repeated_batch(q_id, request_id, cardinality(bodies));
            RETURN;
        END IF;
        -- Two arrays in the select list go side by side: id i with body i.
        RETURN QUERY
        INSERT INTO postbox.messages (id, queue_id, visible_at, enqueued_at, body, priority)
        OVERRIDING SYSTEM VALUE
        SELECT unnest(claimed_ids), c.queue_id, c.visible_at, c.sent_at, unnest(bodies), 0
        FROM (SELECT q_id AS queue_id, t AS sent_at, t + q_delay AS visible_at
              FROM clock_timestamp() AS t OFFSET 0) AS c
        RETURNING id, false;
    END IF;
    IF q_listened THEN
        -- Which looks again: a call saved when nobody listens.
        PERFORM postbox._notify(x) FROM postbox.queues x WHERE x.id = q_id;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION postbox._send_batch_once(
    queue_name text, request_id text, bodies bytea[], attributes jsonb[], delays interval[],
    message_group_ids text[], deduplication_ids text[], dedupe_keys text[], priorities integer[],
    deliver_ats timestamptz[], ttls interval[], expire_ats timestamptz[], max_receive_counts integer[])
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    claimed_at timestamptz := clock_timestamp();
    sent_ids bigint[];
    sent_duplicates boolean[];
BEGIN
    PERFORM postbox._check_request_id(_send_batch_once.request_id);
    PERFORM postbox._check_batch_size(cardinality(bodies));
    INSERT INTO postbox.batch_requests AS r (queue_id, request_id, message_ids, expires_at)
    VALUES (q.id, _send_batch_once.request_id, '{}', claimed_at + q.deduplication_window)
    ON CONFLICT ON CONSTRAINT batch_requests_pkey DO UPDATE
    SET message_ids = excluded.message_ids, expires_at = excluded.expires_at
    WHERE r.expires_at <= claimed_at;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM postbox._repeated_batch(q.id, _send_batch_once.request_id, cardinality(bodies));
        RETURN;
    END IF;
    SELECT array_agg(s.message_id ORDER BY s.n), array_agg(s.duplicate ORDER BY s.n)
    INTO sent_ids, sent_duplicates
    FROM postbox.send_batch(queue_name, bodies, attributes, delays, message_group_ids, deduplication_ids,
                            dedupe_keys, priorities, deliver_ats, ttls, expire_ats, max_receive_counts)
         WITH ORDINALITY AS s(message_id, duplicate, n);
    UPDATE postbox.batch_requests r SET message_ids = sent_ids
    WHERE r.queue_id = q.id AND r.request_id = _send_batch_once.request_id;
    RETURN QUERY SELECT s.id, s.duplicate FROM unnest(sent_ids, sent_duplicates) WITH ORDINALITY AS s(id, duplicate, i)
                 ORDER BY s.i;
END
$$;

-- SQS's high-throughput FIFO settings: DeduplicationScope (an id unique per
-- message group) and FifoThroughputLimit (kept and returned).
ALTER TABLE postbox.queues ADD COLUMN deduplication_scope text NOT NULL DEFAULT 'queue';
ALTER TABLE postbox.queues ADD COLUMN fifo_throughput_limit text NOT NULL DEFAULT 'per_queue';

-- Attribute defaults of a new queue; durations in seconds. A retention or
-- archive_retention of 0 keeps messages forever; a max_depth or
-- receive_rate_limit of 0 means no limit.
CREATE OR REPLACE FUNCTION postbox.queue_defaults() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"visibility_timeout": 30, "delivery_delay": 0, "retention": 345600,
             "max_message_size": 1048576, "receive_wait_time": 0,
             "content_based_deduplication": false, "deduplication_window": 300,
             "dead_letter_policy": null,
             "redrive_allow_policy": {"permission": "allow_all", "source_queues": []},
             "retry_policy": {"minimum_backoff": 1, "maximum_backoff": 600},
             "archive_on_delete": false, "archive_retention": 604800,
             "max_depth": 0, "receive_rate_limit": 0, "tags": {}, "access_policy": "",
             "payload_schema": null, "deduplication_scope": "queue",
             "fifo_throughput_limit": "per_queue"}'::jsonb
$$;

-- The attributes of a queue as settings jsonb, in the shape of queue_defaults().
CREATE OR REPLACE FUNCTION postbox.queue_settings(q postbox.queues) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'visibility_timeout', extract(epoch FROM q.visibility_timeout),
        'delivery_delay', extract(epoch FROM q.delivery_delay),
        'retention', coalesce(extract(epoch FROM q.retention), 0),
        'max_message_size', q.max_message_size,
        'receive_wait_time', extract(epoch FROM q.receive_wait_time),
        'content_based_deduplication', q.content_based_deduplication,
        'deduplication_window', extract(epoch FROM q.deduplication_window),
        'dead_letter_policy', CASE WHEN q.dead_letter_queue_id IS NOT NULL THEN jsonb_build_object(
            'dead_letter_queue', (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id),
            'max_receive_count', q.max_receive_count) END,
        'redrive_allow_policy', jsonb_build_object(
            'permission', q.redrive_permission, 'source_queues', to_jsonb(q.redrive_sources)),
        'retry_policy', jsonb_build_object(
            'minimum_backoff', extract(epoch FROM q.retry_minimum_backoff),
            'maximum_backoff', extract(epoch FROM q.retry_maximum_backoff)),
        'archive_on_delete', q.archive_on_delete,
        'archive_retention', coalesce(extract(epoch FROM q.archive_retention), 0),
        'max_depth', coalesce(q.max_depth, 0),
        'receive_rate_limit', coalesce(q.receive_rate_limit, 0),
        'tags', q.tags,
        'access_policy', q.access_policy,
        'payload_schema', q.payload_schema,
        'deduplication_scope', q.deduplication_scope,
        'fifo_throughput_limit', q.fifo_throughput_limit)
$$;

-- Checks settings jsonb (a full set, in the shape of queue_defaults()) and
-- writes them into q; q.name and q.fifo must be set.
CREATE OR REPLACE FUNCTION postbox._apply_settings(q postbox.queues, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    unknown text;
    key text;
    number numeric;
    policy jsonb;
    dlq postbox.queues;
BEGIN
    PERFORM postbox._invalid(postbox._settings_name_problem(settings))
    WHERE postbox._settings_name_problem(settings) IS NOT NULL;
    SELECT string_agg(k, ', ') INTO unknown
    FROM jsonb_object_keys(settings) AS k
    WHERE NOT postbox.queue_defaults() ? k;
    IF unknown IS NOT NULL THEN
        PERFORM postbox._invalid(format('unknown queue setting(s): %s', unknown));
    END IF;
    FOREACH key IN ARRAY ARRAY['max_message_size', 'max_depth', 'receive_rate_limit'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid(format('queue setting %s must be a number', key));
        END IF;
    END LOOP;
    FOREACH key IN ARRAY ARRAY['content_based_deduplication', 'archive_on_delete'] LOOP
        IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'boolean' THEN
            PERFORM postbox._invalid(format('queue setting %s must be true or false', key));
        END IF;
    END LOOP;

    q.visibility_timeout := postbox._seconds_setting(settings, 'visibility_timeout', 0, 43200);
    q.retention := postbox._seconds_setting(settings, 'retention', 60, 1209600, true);
    q.delivery_delay := postbox._seconds_setting(settings, 'delivery_delay', 0, 31536000);
    -- Otherwise every message would expire before it became visible.
    IF q.delivery_delay >= q.retention THEN
        PERFORM postbox._invalid(format(
            'delivery_delay is %s s and retention %s s: delivery_delay must be shorter than retention, '
            'or messages would expire before they became visible; lower delivery_delay or raise retention',
            trim_scale(extract(epoch FROM q.delivery_delay)), trim_scale(extract(epoch FROM q.retention))));
    END IF;
    q.receive_wait_time := postbox._seconds_setting(settings, 'receive_wait_time', 0, 20);
    q.deduplication_window := postbox._seconds_setting(settings, 'deduplication_window', 1, 604800);
    q.archive_retention := postbox._seconds_setting(settings, 'archive_retention', 60, 1209600, true);

    number := (settings ->> 'max_message_size')::numeric;
    IF number <> trunc(number) OR number < 1024 OR number > 67108864 THEN
        PERFORM postbox._invalid(format(
            'max_message_size is %s; it must be a whole number of bytes from 1024 to 67108864', number));
    END IF;
    q.max_message_size := number::integer;
    number := (settings ->> 'max_depth')::numeric;
    IF number <> trunc(number) OR number < 0 OR number > 1e15 THEN
        PERFORM postbox._invalid(format('max_depth is %s; it must be a whole number, 0 for no limit', number));
    END IF;
    q.max_depth := nullif(number, 0)::bigint;
    number := (settings ->> 'receive_rate_limit')::numeric;
    IF number < 0 OR number > 1e6 THEN
        PERFORM postbox._invalid(format(
            'receive_rate_limit is %s; it must be 0 (no limit) to 1000000 messages per second', number));
    END IF;
    q.receive_rate_limit := nullif(number, 0)::double precision;
    q.content_based_deduplication := (settings ->> 'content_based_deduplication')::boolean;
    q.archive_on_delete := (settings ->> 'archive_on_delete')::boolean;

    -- Bounds left out keep their defaults.
    policy := (postbox.queue_defaults() -> 'retry_policy') || coalesce(settings -> 'retry_policy', '{}');
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('minimum_backoff', 'maximum_backoff')) THEN
        PERFORM postbox._invalid('retry_policy must be an object of minimum_backoff and maximum_backoff (seconds)');
    END IF;
    q.retry_minimum_backoff := postbox._seconds_setting(policy, 'minimum_backoff', 0, 43200);
    q.retry_maximum_backoff := postbox._seconds_setting(policy, 'maximum_backoff', 0, 43200);
    IF q.retry_minimum_backoff > q.retry_maximum_backoff THEN
        PERFORM postbox._invalid('retry_policy: minimum_backoff must not exceed maximum_backoff');
    END IF;

    policy := settings -> 'redrive_allow_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR EXISTS (SELECT FROM jsonb_object_keys(policy) k WHERE k NOT IN ('permission', 'source_queues'))
       OR NOT coalesce(policy ->> 'permission' IN ('allow_all', 'deny_all', 'by_queue'), false)
       OR jsonb_typeof(coalesce(policy -> 'source_queues', '[]')) <> 'array'
       OR EXISTS (SELECT FROM jsonb_array_elements(coalesce(policy -> 'source_queues', '[]')) e
                  WHERE jsonb_typeof(e) <> 'string') THEN
        PERFORM postbox._invalid('redrive_allow_policy must be an object of permission (allow_all, '
                                 'deny_all or by_queue) and source_queues (queue names)');
    END IF;
    q.redrive_permission := policy ->> 'permission';
    q.redrive_sources := ARRAY(SELECT jsonb_array_elements_text(coalesce(policy -> 'source_queues', '[]')));
    IF (q.redrive_permission = 'by_queue') <> (cardinality(q.redrive_sources) > 0)
       OR cardinality(q.redrive_sources) > 10 THEN
        PERFORM postbox._invalid('redrive_allow_policy: by_queue takes 1 to 10 source_queues, '
                                 'allow_all and deny_all take none');
    END IF;

    policy := settings -> 'tags';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
       OR (SELECT count(*) FROM jsonb_object_keys(policy)) > 50
       OR EXISTS (SELECT FROM jsonb_each(policy) e
                  WHERE length(e.key) NOT BETWEEN 1 AND 128 OR jsonb_typeof(e.value) <> 'string'
                        OR length(e.value #>> '{}') > 256) THEN
        PERFORM postbox._invalid('tags must be an object of at most 50 keys (1 to 128 characters) '
                                 'with string values (at most 256 characters)');
    END IF;
    q.tags := policy;

    -- An access policy document (SQS's Policy): kept as given, not enforced.
    policy := settings -> 'access_policy';
    IF jsonb_typeof(policy) IS DISTINCT FROM 'string' OR octet_length(policy #>> '{}') > 20480 THEN
        PERFORM postbox._invalid('access_policy must be a string of at most 20480 bytes');
    END IF;
    q.access_policy := policy #>> '{}';

    -- SQS's high-throughput FIFO settings; a standard queue has no message groups.
    q.deduplication_scope := settings ->> 'deduplication_scope';
    IF jsonb_typeof(settings -> 'deduplication_scope') IS DISTINCT FROM 'string'
       OR q.deduplication_scope NOT IN ('queue', 'message_group') THEN
        PERFORM postbox._invalid('deduplication_scope must be queue or message_group');
    END IF;
    q.fifo_throughput_limit := settings ->> 'fifo_throughput_limit';
    IF jsonb_typeof(settings -> 'fifo_throughput_limit') IS DISTINCT FROM 'string'
       OR q.fifo_throughput_limit NOT IN ('per_queue', 'per_message_group_id') THEN
        PERFORM postbox._invalid('fifo_throughput_limit must be per_queue or per_message_group_id');
    END IF;
    IF NOT q.fifo AND q.deduplication_scope <> 'queue' THEN
        PERFORM postbox._invalid('deduplication_scope message_group is for FIFO queues: a standard '
                                 'queue has no message groups');
    END IF;
    IF NOT q.fifo AND q.fifo_throughput_limit <> 'per_queue' THEN
        PERFORM postbox._invalid('fifo_throughput_limit is for FIFO queues');
    END IF;
    -- As in SQS: the per-group limit goes with per-group deduplication.
    IF q.fifo_throughput_limit = 'per_message_group_id' AND q.deduplication_scope <> 'message_group' THEN
        PERFORM postbox._invalid('fifo_throughput_limit per_message_group_id needs deduplication_scope '
                                 'message_group');
    END IF;

    -- The server compiles the schema before it gets here; this keeps the shape
    -- and the size limits for callers in SQL.
    PERFORM postbox._invalid(postbox._payload_schema_problem(settings -> 'payload_schema'))
    WHERE postbox._payload_schema_problem(settings -> 'payload_schema') IS NOT NULL;
    q.payload_schema := nullif(settings -> 'payload_schema', 'null');

    policy := settings -> 'dead_letter_policy';
    IF policy IS NULL OR policy = 'null' THEN
        q.dead_letter_queue_id := NULL;
        q.max_receive_count := NULL;
    ELSE
        IF jsonb_typeof(policy) IS DISTINCT FROM 'object'
           OR EXISTS (SELECT FROM jsonb_object_keys(policy) k
                      WHERE k NOT IN ('dead_letter_queue', 'max_receive_count'))
           OR jsonb_typeof(policy -> 'dead_letter_queue') IS DISTINCT FROM 'string'
           OR jsonb_typeof(policy -> 'max_receive_count') IS DISTINCT FROM 'number' THEN
            PERFORM postbox._invalid('dead_letter_policy must be an object of dead_letter_queue (a queue '
                                     'name) and max_receive_count (1 to 1000)');
        END IF;
        number := (policy ->> 'max_receive_count')::numeric;
        IF number <> trunc(number) OR number NOT BETWEEN 1 AND 1000 THEN
            PERFORM postbox._invalid(format('max_receive_count is %s; it must be 1 to 1000', number));
        END IF;
        IF policy ->> 'dead_letter_queue' = q.name THEN
            PERFORM postbox._invalid('a queue cannot be its own dead-letter queue');
        END IF;
        SELECT * INTO dlq FROM postbox.queues WHERE name = policy ->> 'dead_letter_queue';
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
                'dead-letter queue %s does not exist; create it first', quote_literal(policy ->> 'dead_letter_queue'));
        ELSIF dlq.fifo <> q.fifo THEN
            PERFORM postbox._invalid('a FIFO queue needs a FIFO dead-letter queue, and a standard queue '
                                     'a standard one');
        ELSIF dlq.redrive_permission = 'deny_all'
              OR (dlq.redrive_permission = 'by_queue' AND NOT q.name = ANY (dlq.redrive_sources)) THEN
            PERFORM postbox._invalid(format('the redrive_allow_policy of %s does not let %s use it as '
                                            'dead-letter queue', quote_literal(dlq.name), quote_literal(q.name)));
        END IF;
        q.dead_letter_queue_id := dlq.id;
        q.max_receive_count := number::integer;
    END IF;
    RETURN q;
END
$$;

-- Creates a queue; a name ending in ".fifo" makes it a FIFO queue. settings:
-- any keys of queue_defaults(), e.g. '{"visibility_timeout": 60}'. PB409 if the
-- queue exists, PB429 if its tenant owns max_queues already (since 0.9.0).
CREATE OR REPLACE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    problem text := postbox.queue_name_problem(queue_name);
    q postbox.queues;
BEGIN
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    q.name := queue_name;
    q.fifo := right(queue_name, 5) = '.fifo';
    q := postbox._apply_settings(q, postbox.queue_defaults() || jsonb_strip_nulls(coalesce(settings, '{}')));
    INSERT INTO postbox.queues (
        name, visibility_timeout, delivery_delay, retention, max_message_size, receive_wait_time,
        fifo, content_based_deduplication, deduplication_window, dead_letter_queue_id,
        max_receive_count, redrive_permission, redrive_sources, retry_minimum_backoff,
        retry_maximum_backoff, archive_on_delete, archive_retention, max_depth, receive_rate_limit,
        send_paused, receive_paused, tags, access_policy, payload_schema, deduplication_scope,
        fifo_throughput_limit)
    VALUES (
        queue_name, q.visibility_timeout, q.delivery_delay, q.retention, q.max_message_size,
        q.receive_wait_time, q.fifo, q.content_based_deduplication, q.deduplication_window,
        q.dead_letter_queue_id, q.max_receive_count, q.redrive_permission, q.redrive_sources,
        q.retry_minimum_backoff, q.retry_maximum_backoff, q.archive_on_delete, q.archive_retention,
        q.max_depth, q.receive_rate_limit, false, false, q.tags, q.access_policy, q.payload_schema,
        q.deduplication_scope, q.fifo_throughput_limit)
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO q;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB409',
            MESSAGE = format('queue %s already exists', quote_literal(queue_name));
    END IF;
    PERFORM postbox._check_resource_quota('queue', queue_name);  -- since 0.9.0
    -- SNS subscriptions made before the queue existed deliver into it from now on.
    UPDATE postbox.subscriptions SET queue_id = q.id, pending_queue = NULL WHERE pending_queue = queue_name;
    RETURN q;
END
$$;

-- Changes the settings named in settings; a key whose value is null goes back
-- to its default.
CREATE OR REPLACE FUNCTION postbox.update_queue(queue_name text, settings jsonb) RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues;
    changes jsonb;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox._settings_name_problem(settings))
        WHERE postbox._settings_name_problem(settings) IS NOT NULL;
        q := postbox._queue(queue_name);  -- raises PB400 or PB404
    END IF;
    SELECT coalesce(jsonb_object_agg(key, CASE WHEN value = 'null' THEN postbox.queue_defaults() -> key
                                               ELSE value END), '{}')
    INTO changes
    FROM jsonb_each(coalesce(settings, '{}'));
    q := postbox._apply_settings(q, postbox.queue_settings(q) || changes);
    UPDATE postbox.queues
    SET visibility_timeout = q.visibility_timeout, delivery_delay = q.delivery_delay,
        retention = q.retention, max_message_size = q.max_message_size,
        receive_wait_time = q.receive_wait_time,
        content_based_deduplication = q.content_based_deduplication,
        deduplication_window = q.deduplication_window, dead_letter_queue_id = q.dead_letter_queue_id,
        max_receive_count = q.max_receive_count, redrive_permission = q.redrive_permission,
        redrive_sources = q.redrive_sources, retry_minimum_backoff = q.retry_minimum_backoff,
        retry_maximum_backoff = q.retry_maximum_backoff, archive_on_delete = q.archive_on_delete,
        archive_retention = q.archive_retention, max_depth = q.max_depth,
        receive_rate_limit = q.receive_rate_limit, tags = q.tags, access_policy = q.access_policy,
        payload_schema = q.payload_schema, deduplication_scope = q.deduplication_scope,
        fifo_throughput_limit = q.fifo_throughput_limit, updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

-- send_batch's every case: options, FIFO order, deduplication, depth limits and
-- every error. send_batch (below) takes the plain case past it.
CREATE OR REPLACE FUNCTION postbox._send_batch_general(
    queue_name text, bodies bytea[], attributes jsonb[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    message_group_ids text[] DEFAULT NULL, deduplication_ids text[] DEFAULT NULL,
    dedupe_keys text[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    deliver_ats timestamptz[] DEFAULT NULL, ttls interval[] DEFAULT NULL, expire_ats timestamptz[] DEFAULT NULL,
    max_receive_counts integer[] DEFAULT NULL)
RETURNS TABLE (message_id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    n integer := coalesce(cardinality(bodies), 0);
    problem text;
    sent_at timestamptz;
    latest timestamptz;
    ids bigint[];
    resolved bigint[];
    dedup text[];
    scoped text[];  -- dedup as postbox.deduplication keys it (deduplication_scope)
    keys text[];  -- dedupe keys; each one's last entry; the message its row named when claimed
    lasts bigint[];
    holders bigint[];
    held integer;  -- keys whose row named a message already
    with_priority boolean;
    with_keys boolean;
    filled bigint[];  -- messages that hold their key and took new content
    with_ids integer;  -- entries with a deduplication id
    claimed bigint;  -- of them, those whose id this send recorded
    adding bigint;
    depth bigint;
BEGIN
    IF q.send_paused THEN
        RAISE EXCEPTION USING ERRCODE = 'PB503', MESSAGE = format(
            'queue %s is paused for sending; ResumeQueue lets sends in again', quote_literal(queue_name));
    END IF;
    -- A writer of the messages table from here on, before the clock is read:
    -- receive_floor stays at or before the start of every transaction that holds
    -- this lock, so a message stamped sent_at can never land behind the floor,
    -- however long the locks below keep the send waiting. (The lock is the one
    -- the insert takes anyway, and conflicts with no other writer.)
    LOCK TABLE postbox.messages IN ROW EXCLUSIVE MODE;
    sent_at := clock_timestamp();
    PERFORM postbox._check_batch_size(n);
    IF greatest(cardinality(attributes), cardinality(delays), cardinality(message_group_ids),
                cardinality(deduplication_ids), cardinality(dedupe_keys), cardinality(priorities),
                cardinality(deliver_ats), cardinality(ttls), cardinality(expire_ats),
                cardinality(max_receive_counts)) > n THEN
        PERFORM postbox._invalid('per-entry arrays may not have more entries than bodies');
    END IF;
    -- A message must become visible before it expires, so a delay stays below
    -- the retention (with none, below a year).
    latest := sent_at + coalesce(q.retention, interval '365 days');
    SELECT postbox._entry_prefix(c.i, n) || c.problem INTO problem
    FROM (
        SELECT e.i, CASE
            WHEN e.b IS NULL THEN 'body must not be NULL'
            WHEN q.fifo AND (e.d IS NOT NULL OR e.t IS NOT NULL) THEN
                'FIFO queues take no per-message delay; set the queue''s delivery_delay instead'
            WHEN e.d IS NOT NULL AND e.t IS NOT NULL THEN 'give a delay or a delivery time, not both'
            WHEN e.d < interval '0' THEN format('delay %s s is negative', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest AND q.retention IS NULL THEN
                format('delay %s s is beyond the longest delay, 365 days', trim_scale(extract(epoch FROM e.d)))
            WHEN sent_at + e.d >= latest THEN format(
                'delay %s s is not shorter than the queue''s retention, %s s: the message would expire before '
                'it became visible; shorten the delay or raise retention',
                trim_scale(extract(epoch FROM e.d)), trim_scale(extract(epoch FROM q.retention)))
            WHEN e.t >= latest AND q.retention IS NULL THEN
                format('delivery time %s is beyond the longest delay, 365 days from now', e.t)
            WHEN e.t >= latest THEN format(
                'delivery time %s is not before %s, when the message would expire (the queue''s retention is '
                '%s s): deliver it sooner or raise retention', e.t, latest, trim_scale(extract(epoch FROM q.retention)))
            WHEN e.l IS NOT NULL AND e.e IS NOT NULL THEN 'give a ttl or an expire_time, not both'
            WHEN e.l <= interval '0' THEN format('ttl %s s must be above 0', trim_scale(extract(epoch FROM e.l)))
            WHEN coalesce(e.e, sent_at + e.l) <= postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) THEN format(
                'the message would expire (at %s) before it became visible (at %s): expire it later or deliver it '
                'sooner', coalesce(e.e, sent_at + e.l), postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay))
            WHEN e.p NOT BETWEEN 0 AND 9 THEN format('priority %s is outside 0 to 9', e.p)
            WHEN q.fifo AND e.p > 0 THEN 'FIFO queues deliver in order; priority is for standard queues'
            WHEN q.fifo AND e.g IS NULL THEN 'FIFO queues need a message_group_id'
            -- Length and a character class, not '^[!-~]{1,128}$': the bounded repetition
            -- made the regex engine take tens of microseconds per id, more than a
            -- message's insert (the SDK's Producer gives every message an id).
            WHEN length(e.g) NOT BETWEEN 1 AND 128 OR e.g ~ '[^!-~]' THEN
                'message_group_id must be 1 to 128 printable ASCII characters'
            WHEN length(e.x) NOT BETWEEN 1 AND 128 OR e.x ~ '[^!-~]' THEN
                'deduplication_id must be 1 to 128 printable ASCII characters'
            WHEN q.fifo AND e.x IS NULL AND NOT q.content_based_deduplication THEN
                'FIFO queues need a deduplication_id unless the queue has content_based_deduplication'
            WHEN e.k IS NOT NULL AND q.fifo THEN
                'dedupe_key is for standard queues; FIFO queues deduplicate by deduplication_id'
            WHEN e.k IS NOT NULL AND e.x IS NOT NULL THEN 'give a dedupe_key or a deduplication_id, not both'
            WHEN length(e.k) NOT BETWEEN 1 AND 256 THEN 'dedupe_key must be 1 to 256 characters'
            WHEN postbox.message_size(e.b, e.a) > q.max_message_size THEN format(
                'message is %s bytes; the queue takes at most %s (body and attributes)',
                postbox.message_size(e.b, e.a), q.max_message_size)
            WHEN e.r NOT BETWEEN 1 AND 1000 THEN format('max_receive_count is %s; it must be 1 to 1000', e.r)
        END AS problem
        FROM unnest(bodies, delays, deliver_ats, priorities, message_group_ids, deduplication_ids,
                    dedupe_keys, attributes, ttls, expire_ats, max_receive_counts)
             WITH ORDINALITY AS e(b, d, t, p, g, x, k, a, l, e, r, i)
    ) AS c
    WHERE c.problem IS NOT NULL
    ORDER BY c.i
    LIMIT 1;
    IF problem IS NULL AND attributes IS NOT NULL THEN
        problem := postbox._attributes_problem(attributes, n);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;

    PERFORM postbox._lock_queue(q, false);
    with_priority := EXISTS (SELECT FROM unnest(priorities) p WHERE p > 0);
    with_keys := EXISTS (SELECT FROM unnest(dedupe_keys) k WHERE k IS NOT NULL);
    IF with_priority AND NOT q.prioritized OR with_keys AND NOT q.keyed THEN
        PERFORM postbox._mark_queue(q.id, with_priority, with_keys);
    END IF;
    IF NOT q.fifo AND NOT q.content_based_deduplication AND q.max_depth IS NULL
       AND deduplication_ids IS NULL AND dedupe_keys IS NULL THEN
        -- The common case, in one statement: identity values are drawn in
        -- insertion order, so id order is input order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO postbox.messages (queue_id, visible_at, enqueued_at, attributes, body, priority,
                                          message_group_id, expires_at, max_receive_count)
            SELECT q.id, postbox._visible_at(sent_at, d, t, q.delivery_delay), sent_at,
                   a, b, coalesce(p, 0), g, coalesce(x, sent_at + l), r
            FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, ttls, expire_ats,
                        max_receive_counts)
                 WITH ORDINALITY AS e(b, a, d, t, p, g, l, x, r, i)
            ORDER BY i
            RETURNING id, expires_at
        ), expiring AS (
            INSERT INTO postbox.message_expiries (message_id, expires_at)
            SELECT id, expires_at FROM inserted WHERE expires_at IS NOT NULL
        )
        SELECT id, false FROM inserted ORDER BY id;
        PERFORM postbox._notify(q);
        RETURN;
    END IF;

    -- FIFO groups are locked before ids are drawn, so a group's id order is the
    -- order in which its sends commit.
    IF q.fifo THEN
        PERFORM postbox._lock_groups(q.id, message_group_ids);
    END IF;
    SELECT array_agg(nextval('postbox.messages_id_seq') ORDER BY s) INTO ids FROM generate_series(1, n) AS s;
    resolved := ids;

    -- Deduplication: the first entry with an id claims it unless the queue saw it
    -- within its window (a concurrent claimer is waited for); the rest resolve to
    -- the claimer's message. An entry with a dedupe_key is never deduplicated by
    -- content: its key decides, and it may not become a message of its own id, so
    -- a recorded hash would point later sends at a message that never existed.
    dedup := ARRAY(
        SELECT CASE WHEN k IS NULL THEN
                   coalesce(x, CASE WHEN q.content_based_deduplication THEN encode(sha256(b), 'hex') END)
               END
        FROM unnest(bodies, deduplication_ids, dedupe_keys) WITH ORDINALITY AS e(b, x, k, i) ORDER BY i);
    with_ids := cardinality(array_remove(dedup, NULL));
    IF with_ids > 0 THEN
        -- With deduplication_scope message_group (FIFO: every entry has a group) an
        -- id is unique within its group: the group and a newline, which neither
        -- may hold, go before it in postbox.deduplication.
        scoped := CASE WHEN q.deduplication_scope = 'message_group' THEN
            ARRAY(SELECT g || E'\n' || x FROM unnest(dedup, message_group_ids) WITH ORDINALITY AS e(x, g, i)
                  ORDER BY i)
        ELSE dedup END;
        INSERT INTO postbox.deduplication AS d (queue_id, deduplication_id, message_id, expires_at)
        SELECT DISTINCT ON (e.x) q.id, e.x, ids[e.i], sent_at + q.deduplication_window
        FROM unnest(scoped) WITH ORDINALITY AS e(x, i)
        WHERE e.x IS NOT NULL
        ORDER BY e.x, e.i
        ON CONFLICT (queue_id, deduplication_id) DO UPDATE
        SET message_id = excluded.message_id, expires_at = excluded.expires_at
        WHERE d.expires_at <= sent_at;
        GET DIAGNOSTICS claimed = ROW_COUNT;
        -- Every entry with an id claimed it (the ids were distinct, none seen within
        -- the window): each resolves to its own message, and the look-ups, one index
        -- scan per entry, are skipped (a tenth of a Producer's batch in the database).
        IF claimed < with_ids THEN
            resolved := ARRAY(
                SELECT coalesce((SELECT d.message_id FROM postbox.deduplication d
                                 WHERE d.queue_id = q.id AND d.deduplication_id = e.x), ids[e.i])
                FROM unnest(scoped) WITH ORDINALITY AS e(x, i) ORDER BY e.i);
        END IF;
    END IF;

    -- Idempotent enqueue: the last entry of a key carries the content. The
    -- key's row in dedupe_keys, locked first (in key order, so two batches
    -- never wait on each other in a circle), names the message that holds the
    -- key. While that message waits (not received, removed or expired) it takes
    -- the content; otherwise the entry becomes a message of its own, which the
    -- row then names. Receives and removals free keys without waiting for rows
    -- (see _free_keys), so a row may name a message that holds its key no more.
    IF dedupe_keys IS NOT NULL THEN
        SELECT array_agg(l.k ORDER BY l.k), array_agg(l.i ORDER BY l.k) INTO keys, lasts
        FROM (SELECT DISTINCT ON (e.k) e.k, e.i FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
              WHERE e.k IS NOT NULL ORDER BY e.k, e.i DESC) AS l;
        WITH claimed AS (
            INSERT INTO postbox.dedupe_keys AS d (queue_id, dedupe_key, message_id)
            SELECT q.id, l.k, ids[l.i] FROM unnest(keys, lasts) WITH ORDINALITY AS l(k, i, n) ORDER BY l.n
            ON CONFLICT (queue_id, dedupe_key) DO UPDATE SET message_id = d.message_id  -- locks, keeps
            RETURNING d.dedupe_key, d.message_id
        )
        SELECT array_agg(c.message_id ORDER BY l.n), count(*) FILTER (WHERE c.message_id <> ALL (ids))
        INTO holders, held
        FROM unnest(keys) WITH ORDINALITY AS l(k, n) JOIN claimed c ON c.dedupe_key = l.k;
        IF held > 0 THEN
            -- A statement of its own: its snapshot sees a holder whose send
            -- committed while the claim waited for the key's row.
            WITH filled AS (
                UPDATE postbox.messages m
                SET body = bodies[h.i], attributes = _send_batch_general.attributes[h.i],
                    priority = coalesce(priorities[h.i], 0),
                    expires_at = coalesce(expire_ats[h.i], sent_at + ttls[h.i]),
                    max_receive_count = max_receive_counts[h.i]
                FROM unnest(keys, lasts, holders) AS h(k, i, id)
                WHERE m.id = h.id AND h.id <> ids[h.i] AND m.queue_id = q.id AND m.dedupe_key = h.k
                  AND NOT coalesce(m.enqueued_at < now() - q.retention OR m.expires_at <= now(), false)
                RETURNING m.id
            )
            SELECT array_agg(f.id) INTO filled FROM filled f;
            -- Their expiries as they are now.
            DELETE FROM postbox.message_expiries WHERE message_id = ANY (filled);
            IF ttls IS NOT NULL OR expire_ats IS NOT NULL THEN
                INSERT INTO postbox.message_expiries (message_id, expires_at)
                SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.id = ANY (filled) AND m.expires_at IS NOT NULL;
            END IF;
            IF coalesce(cardinality(filled), 0) < held THEN
                -- Keys whose message holds them no more name the message this send makes.
                UPDATE postbox.dedupe_keys d SET message_id = ids[h.i]
                FROM unnest(keys, lasts, holders) AS h(k, i, id)
                WHERE d.queue_id = q.id AND d.dedupe_key = h.k AND h.id <> ids[h.i]
                  AND h.id <> ALL (coalesce(filled, '{}'));
            END IF;
        END IF;
        -- A key's entries resolve to the message that took the content, or to the
        -- key's last entry, which the insert below makes a message.
        SELECT ARRAY(
            SELECT CASE WHEN e.k IS NULL THEN resolved[e.i]
                        WHEN h.id = ANY (filled) THEN h.id
                        ELSE ids[h.i] END
            FROM unnest(dedupe_keys) WITH ORDINALITY AS e(k, i)
            LEFT JOIN unnest(keys, lasts, holders) AS h(k, i, id) ON h.k = e.k
            ORDER BY e.i)
        INTO resolved;
    END IF;

    IF q.max_depth IS NOT NULL THEN
        -- Bounded queues take their sends one at a time, so the count is exact.
        PERFORM pg_advisory_xact_lock(1886350199, q.id);  -- 'posu'
        SELECT count(*) FILTER (WHERE r = id) INTO adding FROM unnest(resolved, ids) AS e(r, id);
        SELECT count(*) INTO depth
        FROM (SELECT FROM postbox.messages WHERE queue_id = q.id LIMIT q.max_depth + 1) AS s;
        IF depth + adding > q.max_depth THEN
            RAISE EXCEPTION USING ERRCODE = 'PB429', MESSAGE = format(
                'queue %s holds %s messages and its max_depth is %s, so %s more do not fit; '
                'receive some or raise max_depth', quote_literal(queue_name), depth, q.max_depth, adding);
        END IF;
    END IF;

    -- Every entry that is a message of its own: no duplicate, and for a key the
    -- last entry, when the key's message did not take its content.
    INSERT INTO postbox.messages (id, queue_id, visible_at, enqueued_at, attributes, body, priority,
                                  message_group_id, deduplication_id, dedupe_key, expires_at, max_receive_count)
    OVERRIDING SYSTEM VALUE
    SELECT ids[e.i], q.id,
           CASE WHEN q.fifo AND (row_number() OVER (PARTITION BY e.g ORDER BY e.i) > 1
                                 OR EXISTS (SELECT FROM postbox.messages x
                                            WHERE x.queue_id = q.id AND x.message_group_id = e.g))
                THEN 'infinity'
                ELSE postbox._visible_at(sent_at, e.d, e.t, q.delivery_delay) END,
           sent_at, e.a, e.b, coalesce(e.p, 0), e.g, e.x, e.k, coalesce(e.e, sent_at + e.l), e.c
    FROM unnest(bodies, attributes, delays, deliver_ats, priorities, message_group_ids, dedup,
                dedupe_keys, resolved, ttls, expire_ats, max_receive_counts)
         WITH ORDINALITY AS e(b, a, d, t, p, g, x, k, r, l, e, c, i)
    WHERE e.r = ids[e.i]
    ORDER BY e.i;
    IF ttls IS NOT NULL OR expire_ats IS NOT NULL THEN
        INSERT INTO postbox.message_expiries (message_id, expires_at)
        SELECT m.id, m.expires_at FROM postbox.messages m WHERE m.id = ANY (ids) AND m.expires_at IS NOT NULL;
    END IF;
    PERFORM postbox._notify(q);
    RETURN QUERY SELECT e.r, e.r <> ids[e.i] FROM unnest(resolved) WITH ORDINALITY AS e(r, i) ORDER BY e.i;
END
$$;

-- A message may have up to 100 attributes (was 10): Pub/Sub's limit, and room for
-- beyond-queue's free-form headers.
-- The first problem of a batch's per-entry attributes (see attribute_problem),
-- named by entry as _entry_prefix does for a batch of n; NULL when all are
-- valid.
CREATE OR REPLACE FUNCTION postbox._attributes_problem(attributes jsonb[], n integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text;
BEGIN
    SELECT postbox._entry_prefix(i, n) || coalesce(
               CASE WHEN jsonb_typeof(a) <> 'object'
                    THEN 'attributes must be a JSON object keyed by attribute name'
                    WHEN (SELECT count(*) FROM jsonb_object_keys(a)) > 100
                    THEN format('%s attributes; a message may have at most 100',
                                (SELECT count(*) FROM jsonb_object_keys(a)))
               END,
               (SELECT postbox.attribute_problem(e.key, e.value)
                FROM jsonb_each(a) AS e
                WHERE postbox.attribute_problem(e.key, e.value) IS NOT NULL
                LIMIT 1))
    INTO problem
    FROM unnest(attributes) WITH ORDINALITY AS t(a, i)
    WHERE a IS NOT NULL AND (
        jsonb_typeof(a) <> 'object'
        OR (SELECT count(*) FROM jsonb_object_keys(a)) > 100
        OR EXISTS (SELECT FROM jsonb_each(a) AS e WHERE postbox.attribute_problem(e.key, e.value) IS NOT NULL))
    LIMIT 1;
    RETURN problem;
END
$$;

-- Checks a schedule before it is stored: PB400 for a bad field, PB404 when
-- its target does not exist.
CREATE OR REPLACE FUNCTION postbox._check_schedule(s postbox.schedules) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    problem text := postbox.name_problem('schedule', s.name);
    q postbox.queues;
    size bigint;
BEGIN
    problem := coalesce(problem, CASE
        WHEN num_nonnulls(s.cron_expression, s.every, s.run_at) <> 1 THEN
            'give exactly one of a cron expression, an interval and a run_at time'
        WHEN length(s.cron_expression) NOT BETWEEN 1 AND 255 THEN 'a cron expression has 1 to 255 characters'
        WHEN s.cron_expression IS NOT NULL AND coalesce(s.time_zone, '') = '' THEN 'a cron schedule needs a time zone'
        WHEN s.cron_expression IS NULL AND s.time_zone IS NOT NULL THEN 'a time zone is for cron schedules'
        WHEN s.every < interval '1 second' OR s.every > interval '366 days' THEN
            format('interval %s is outside 1 s to 366 days', s.every)
        WHEN num_nonnulls(s.target_queue, s.target_topic) <> 1 THEN 'give a target queue or a target topic'
        WHEN postbox._target_problem(s.target_queue, s.target_topic) IS NOT NULL THEN
            postbox._target_problem(s.target_queue, s.target_topic)
        WHEN s.target_queue IS NOT NULL AND s.routing_key <> '' THEN 'a routing key is for topic targets'
        WHEN s.body IS NULL THEN 'body must not be NULL'
        WHEN s.catch_up_limit NOT BETWEEN 0 AND 1000 THEN
            format('catch_up_limit %s is outside 0 to 1000 (0: one fire for all missed times)', s.catch_up_limit)
        WHEN s.failure_threshold NOT BETWEEN 0 AND 1000 THEN
            format('failure_threshold %s is outside 0 to 1000 (0: never pause)', s.failure_threshold)
        WHEN NOT s.paused AND s.next_fire_at IS NULL THEN
            'next_fire_at is required: the server computes it from the timing'
        ELSE postbox.routing_key_problem(s.routing_key) END);
    IF problem IS NULL AND s.attributes IS NOT NULL THEN
        problem := coalesce(postbox._attributes_problem(ARRAY[s.attributes], 1), CASE
            WHEN s.attributes ? '_schedule' THEN
                'attribute name ''_schedule'' is the server''s: it adds it to every fired message'
            WHEN (SELECT count(*) FROM jsonb_object_keys(s.attributes)) > 99 THEN
                format('%s attributes; a schedule''s message may have at most 99 (the server adds _schedule)',
                       (SELECT count(*) FROM jsonb_object_keys(s.attributes)))
            END);
    END IF;
    IF problem IS NOT NULL THEN
        PERFORM postbox._invalid(problem);
    END IF;
    IF s.target_queue IS NOT NULL THEN
        q := postbox._queue(s.target_queue);
        -- Sized as fired: with its _schedule attribute, at its longest.
        size := postbox.message_size(s.body, coalesce(s.attributes, '{}')
                                             || postbox._schedule_attribute(s.name, now(), false));
        IF size > q.max_message_size THEN
            PERFORM postbox._invalid(format(
                'the message is %s bytes; queue %s takes at most %s (body and attributes, with _schedule)',
                size, quote_literal(q.name), q.max_message_size));
        END IF;
    ELSE
        PERFORM postbox._topic(s.target_topic);
    END IF;
END
$$;

SELECT postbox._secure();

INSERT INTO postbox.schema_version (version) VALUES ('0.9.0');
