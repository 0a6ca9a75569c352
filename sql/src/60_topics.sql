-- The message of a check of a topic, subscription or schedule name (`what`
-- says which), or NULL when the name is valid.
-- Topic names (since 0.9.0) are as long as SNS's, and end in ".fifo" for a
-- FIFO topic. A tenant's topic or schedule (since 0.9.0) is named
-- <tenant>/<name>: the limits hold for the part after the tenant.
CREATE FUNCTION postbox.name_problem(what text, name text) RETURNS text
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

-- The message of a routing-key check, or NULL when the key is valid: empty, or
-- up to 255 characters of words of A-Z, a-z, 0-9, "_" and "-" joined by single
-- dots. String functions, not a regular expression: this runs on every publish.
-- PL/pgSQL (since 0.9.0), so that its plan is cached: as a SQL function that
-- cannot be inlined (format is not immutable) it was parsed and planned anew in
-- every publish.
CREATE FUNCTION postbox.routing_key_problem(routing_key text) RETURNS text
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

-- The topic of that name; PB400 if the name is malformed (no topic can have
-- it), PB404 if there is none.
CREATE FUNCTION postbox._topic(topic_name text) RETURNS postbox.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t postbox.topics;
BEGIN
    SELECT * INTO t FROM postbox.topics WHERE name = topic_name;
    IF NOT FOUND THEN
        -- Checked only on a miss, as in _queue: publish pays nothing for it.
        PERFORM postbox._invalid(postbox.name_problem('topic', topic_name))
        WHERE postbox.name_problem('topic', topic_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('topic %s does not exist', quote_literal(topic_name));
    END IF;
    RETURN t;
END
$$;

-- Serialises changes to a topic's subscriptions against its publishes: a
-- publish holds this lock shared, so no webhook delivery is queued for a
-- subscription that a concurrent delete just removed.
CREATE FUNCTION postbox._lock_topic(topic_id integer, exclusive boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF exclusive THEN
        PERFORM pg_advisory_xact_lock(1886350200, topic_id);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1886350200, topic_id);
    END IF;
END
$$;

-- Creates a topic, with its tags and SNS attributes (see postbox.topics), and
-- a stream_retention for a stream topic. PB409 if it exists, PB429 if its
-- tenant owns max_topics already (since 0.9.0).
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
    PERFORM postbox._check_resource_quota('topic', topic_name);  -- since 0.9.0
    RETURN t;
END
$$;

-- A topic as a caller of tenant `tenant` sees it: named without the tenant.
CREATE FUNCTION postbox._shown_topic(t postbox.topics, tenant text) RETURNS postbox.topics
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    t.name := postbox._shown(t.name, tenant);
    RETURN t;
END
$$;

-- The topic of that name (the caller's tenant's, for a bound role); PB404 if
-- there is none.
CREATE FUNCTION postbox.get_topic(topic_name text) RETURNS postbox.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    RETURN postbox._shown_topic(postbox._topic(postbox._in_tenant(topic_name, tenant)), tenant);
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

-- Topics in name order after after_name; a bound role's tenant's only, named
-- as it names them (see list_queues).
CREATE FUNCTION postbox.list_topics(page_size integer DEFAULT 100, after_name text DEFAULT '')
RETURNS SETOF postbox.topics
LANGUAGE sql STABLE AS $$
    SELECT s.* FROM postbox.topics t
    CROSS JOIN LATERAL postbox._shown_topic(t, (SELECT postbox._caller_tenant())) AS s
    WHERE t.name > postbox._tenant_prefix((SELECT postbox._caller_tenant())) || coalesce(after_name, '')
          AND starts_with(t.name, postbox._tenant_prefix((SELECT postbox._caller_tenant())))
    ORDER BY t.name
    LIMIT page_size
$$;

-- Deletes a topic, its subscriptions and their pending and failed webhook
-- deliveries. Queues subscribed to it stay, with the messages they have.
CREATE FUNCTION postbox.delete_topic(topic_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t postbox.topics := postbox._topic(topic_name);
BEGIN
    PERFORM postbox._lock_topic(t.id, true);
    DELETE FROM postbox.webhook_deliveries
    WHERE subscription_id IN (SELECT id FROM postbox.subscriptions WHERE topic_id = t.id);
    DELETE FROM postbox.topics WHERE id = t.id;
END
$$;

-- Checks a subscription pattern and compiles it to (match_kind, match_text);
-- see postbox.subscriptions and _key_matches. Pattern words are literal words
-- (as in routing keys), "*" (exactly one word) or "#" (zero or more words);
-- "#.#" is "#". A regular expression runs on the key with a dot before every
-- word ('' for the empty key), so each pattern word is one piece of it: a
-- literal word w '\.w', "*" '\.[^.]+', "#" '(\.[^.]+)*'.
CREATE FUNCTION postbox._compile_pattern(pattern text, OUT match_kind text, OUT match_text text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    word text;
    words text[] := '{}';
    regex text := '';
BEGIN
    IF length(pattern) > 255 THEN
        PERFORM postbox._invalid(format('pattern is %s characters long; the limit is 255', length(pattern)));
    END IF;
    FOREACH word IN ARRAY string_to_array(pattern, '.') LOOP
        IF word = '' THEN
            PERFORM postbox._invalid(format(
                'pattern %s has an empty word: words are joined by single dots', quote_literal(pattern)));
        ELSIF word NOT IN ('*', '#')
              AND translate(word, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-', '') <> '' THEN
            PERFORM postbox._invalid(format(
                'pattern %s: %s is neither a word of A-Z, a-z, 0-9, "_" and "-", nor "*" (one word), nor "#" '
                '(zero or more words)', quote_literal(pattern), quote_literal(word)));
        END IF;
        IF word <> '#' OR words[cardinality(words)] IS DISTINCT FROM '#' THEN
            words := words || word;
        END IF;
    END LOOP;
    IF words = ARRAY['#'] THEN
        match_kind := 'all';
    ELSIF NOT words && ARRAY['*', '#'] THEN
        match_kind := 'exact';
        match_text := array_to_string(words, '.');
    ELSIF words[cardinality(words)] = '#' AND NOT words[1:cardinality(words) - 1] && ARRAY['*', '#'] THEN
        match_kind := 'prefix';
        match_text := array_to_string(words[1:cardinality(words) - 1], '.');
    ELSIF words[1] = '#' AND NOT words[2:] && ARRAY['*', '#'] THEN
        match_kind := 'suffix';
        match_text := array_to_string(words[2:], '.');
    ELSE
        FOREACH word IN ARRAY words LOOP
            regex := regex || CASE word WHEN '#' THEN '(\.[^.]+)*' WHEN '*' THEN '\.[^.]+' ELSE '\.' || word END;
        END LOOP;
        match_kind := 'regex';
        match_text := '^' || regex || '$';
    END IF;
END
$$;

-- Whether a routing key ('' for none) matches a compiled pattern (see
-- _compile_pattern). Plain comparisons for every kind but regex. A plain
-- expression, which the planner inlines as long as the arguments are plain
-- columns (an argument used twice must be cheap, or the function is called,
-- and parsed anew, for every publish).
CREATE FUNCTION postbox._key_matches(match_kind text, match_text text, routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE match_kind
        WHEN 'all' THEN true
        WHEN 'exact' THEN routing_key = match_text
        WHEN 'prefix' THEN routing_key = match_text OR starts_with(routing_key, match_text || '.')
        WHEN 'suffix' THEN routing_key = match_text OR right(routing_key, length(match_text) + 1) = '.' || match_text
        ELSE CASE WHEN routing_key = '' THEN '' ELSE '.' || routing_key END ~ match_text
    END
$$;

-- Settings of a new webhook subscription; durations in seconds. A failed
-- attempt is retried after minimum_backoff·2^(attempts−1), at most
-- maximum_backoff, times a random 0.5-1; after max_attempts the delivery fails.
CREATE FUNCTION postbox.webhook_defaults() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"timeout": 10, "max_attempts": 20, "minimum_backoff": 1, "maximum_backoff": 600}'::jsonb
$$;

-- Checks a webhook endpoint and writes it into s: the URL, the secret (a new
-- one when empty) and the settings (a full set, in the shape of
-- webhook_defaults()).
CREATE FUNCTION postbox._webhook(s postbox.subscriptions, webhook_url text, webhook_secret text, settings jsonb)
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

-- A subscription as a caller of tenant `tenant` sees it: its pending queue
-- named without the tenant.
CREATE FUNCTION postbox._shown_subscription(s postbox.subscriptions, tenant text) RETURNS postbox.subscriptions
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    s.pending_queue := postbox._shown(s.pending_queue, tenant);
    RETURN s;
END
$$;

-- The subscription of a topic (the caller's tenant's, for a bound role);
-- PB400 if either name is malformed, PB404 if there is none.
CREATE FUNCTION postbox.get_subscription(topic_name text, subscription_name text)
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

-- A topic's subscriptions in name order after after_name.
CREATE FUNCTION postbox.list_subscriptions(topic_name text, page_size integer DEFAULT 100,
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

-- Deletes a subscription and its pending and failed webhook deliveries.
CREATE FUNCTION postbox.delete_subscription(topic_name text, subscription_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.subscriptions := postbox.get_subscription(topic_name, subscription_name);
BEGIN
    PERFORM postbox._lock_topic(s.topic_id, true);
    DELETE FROM postbox.webhook_deliveries WHERE subscription_id = s.id;
    DELETE FROM postbox.subscriptions WHERE id = s.id;
END
$$;
