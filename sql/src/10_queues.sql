-- Raises a PB400 error with the given message.
CREATE FUNCTION postbox._invalid(message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PB400', MESSAGE = message;
END
$$;

-- The caller's input as an error quotes it: whole when short, else its first 80
-- characters and its length (server/errors.py quoted() writes the same).
CREATE FUNCTION postbox._quoted(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(value) <= 80 THEN quote_literal(value)
                ELSE quote_literal(left(value, 80)) || '… (' || octet_length(value) || ' bytes)' END
$$;

-- The message of a name check, or NULL when the queue name is valid. A
-- tenant's queue (since 0.9.0) is named <tenant>/<name>: the limits hold for
-- the part after the tenant.
CREATE FUNCTION postbox.queue_name_problem(name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN bare IS NULL OR bare = '' THEN 'queue name is required'
        WHEN length(bare) > 80 THEN format('queue name is %s characters long; the limit is 80', length(bare))
        WHEN bare !~ '^[A-Za-z0-9_-]+(\.fifo)?$' THEN
            'queue name may only contain A-Z, a-z, 0-9, "_" and "-", and end in ".fifo" for a FIFO queue'
    END
    FROM (SELECT regexp_replace(name, '^[a-z0-9][a-z0-9-]{0,31}/', '') AS bare) AS n
$$;

-- The queue of that name; PB400 if the name is malformed (no queue can have
-- it), PB404 if there is none.
CREATE FUNCTION postbox._queue(queue_name text) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues;
BEGIN
    SELECT * INTO q FROM postbox.queues WHERE name = queue_name;
    IF NOT FOUND THEN
        -- Checked only on a miss: create_queue refuses malformed names, so the
        -- lookup of an existing queue pays nothing for the check.
        IF postbox.queue_name_problem(queue_name) IS NOT NULL THEN
            PERFORM postbox._invalid(postbox.queue_name_problem(queue_name));
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('queue %s does not exist', quote_literal(queue_name));
    END IF;
    RETURN q;
END
$$;

-- Attribute defaults of a new queue; durations in seconds. A retention or
-- archive_retention of 0 keeps messages forever; a max_depth or
-- receive_rate_limit of 0 means no limit.
CREATE FUNCTION postbox.queue_defaults() RETURNS jsonb
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
CREATE FUNCTION postbox.queue_settings(q postbox.queues) RETURNS jsonb
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

-- The seconds of a setting as an interval: PB400 unless it lies in [low, high],
-- or is 0 where 0 is allowed (it then means "no limit": NULL).
CREATE FUNCTION postbox._seconds_setting(settings jsonb, key text, low numeric, high numeric,
                                         zero_means_none boolean DEFAULT false)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    seconds numeric;
BEGIN
    IF jsonb_typeof(settings -> key) IS DISTINCT FROM 'number' THEN
        PERFORM postbox._invalid(format('queue setting %s must be a number of seconds', key));
    END IF;
    seconds := (settings ->> key)::numeric;
    IF zero_means_none AND seconds = 0 THEN
        RETURN NULL;
    END IF;
    IF seconds < low OR seconds > high THEN
        PERFORM postbox._invalid(format('%s is %s s; it must be %s to %s s%s', key, seconds, low, high,
                                        CASE WHEN zero_means_none THEN ', or 0 for no limit' ELSE '' END));
    END IF;
    RETURN make_interval(secs => seconds);
END
$$;

-- The message of a check of the queue names in queue settings (the
-- dead-letter queue and the redrive sources), or NULL when each is well formed
-- or absent. Callers check names before they look anything up, so that a
-- malformed name is PB400 whether the queues exist or not.
CREATE FUNCTION postbox._settings_name_problem(settings jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT field || ': ' || postbox.queue_name_problem(name)
    FROM (SELECT 'dead_letter_queue' AS field, settings #>> '{dead_letter_policy,dead_letter_queue}' AS name
          WHERE jsonb_typeof(settings #> '{dead_letter_policy,dead_letter_queue}') = 'string'
          UNION ALL
          SELECT 'source_queues', e #>> '{}'
          FROM jsonb_array_elements(CASE WHEN jsonb_typeof(settings #> '{redrive_allow_policy,source_queues}') = 'array'
                                         THEN settings #> '{redrive_allow_policy,source_queues}' END) e
          WHERE jsonb_typeof(e) = 'string') names
    WHERE postbox.queue_name_problem(name) IS NOT NULL
    LIMIT 1
$$;

-- Checks settings jsonb (a full set, in the shape of queue_defaults()) and
-- writes them into q; q.name and q.fifo must be set.
CREATE FUNCTION postbox._apply_settings(q postbox.queues, settings jsonb) RETURNS postbox.queues
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
CREATE FUNCTION postbox.create_queue(queue_name text, settings jsonb DEFAULT '{}')
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
CREATE FUNCTION postbox.update_queue(queue_name text, settings jsonb) RETURNS postbox.queues
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

-- A queue as a caller of tenant `tenant` sees it: its name and its redrive
-- sources' without the tenant (see _shown).
CREATE FUNCTION postbox._shown_queue(q postbox.queues, tenant text) RETURNS postbox.queues
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
CREATE FUNCTION postbox.get_queue(queue_name text) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    RETURN postbox._shown_queue(postbox._queue(postbox._in_tenant(queue_name, tenant)), tenant);
END
$$;

-- Queues in name order after after_name, whose names start with name_prefix;
-- a bound role's tenant's only, named as it names them.
CREATE FUNCTION postbox.list_queues(page_size integer DEFAULT 100, after_name text DEFAULT '',
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

-- Deletes a queue and all its messages. PB412 while it is another queue's
-- dead-letter queue.
CREATE FUNCTION postbox.drop_queue(queue_name text) RETURNS void
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
CREATE FUNCTION postbox.purge_queue(queue_name text) RETURNS bigint
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
CREATE FUNCTION postbox.queue_metrics(max_queues integer DEFAULT 1000)
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

-- Each queue's health, for people who live in psql: 'critical' when its oldest
-- message is older than postbox.health_critical_age (default 1 hour) or its
-- dead-letter queue holds postbox.health_critical_dlq_depth messages (default
-- 100); 'warning' past postbox.health_warning_age (5 minutes) or
-- postbox.health_warning_dlq_depth (1), or while paused; else 'ok'. reason says
-- which. Thresholds are settings, per database or role, e.g.
-- ALTER DATABASE app SET postbox.health_warning_age = '10 min'.
CREATE VIEW postbox.queue_health AS
SELECT m.queue_name,
       CASE WHEN h.critical <> '{}' THEN 'critical'
            WHEN h.warning <> '{}' THEN 'warning'
            ELSE 'ok' END AS status,
       array_to_string(h.critical || h.warning, '; ') AS reason,
       m.visible, m.in_flight, m.delayed, m.oldest_age_seconds, m.dead_letter_depth,
       m.send_paused, m.receive_paused
FROM postbox.queue_metrics(2147483647) m,
     LATERAL (SELECT coalesce(nullif(current_setting('postbox.health_warning_age', true), ''), '5 minutes')::interval AS warning_age,
                     coalesce(nullif(current_setting('postbox.health_critical_age', true), ''), '1 hour')::interval AS critical_age,
                     coalesce(nullif(current_setting('postbox.health_warning_dlq_depth', true), ''), '1')::bigint AS warning_dlq,
                     coalesce(nullif(current_setting('postbox.health_critical_dlq_depth', true), ''), '100')::bigint AS critical_dlq) t,
     LATERAL (SELECT array_remove(ARRAY[
                         CASE WHEN m.visible + m.in_flight + m.delayed > 0
                                   AND m.oldest_age_seconds >= extract(epoch FROM t.critical_age)
                              THEN format('oldest message %s s old', round(m.oldest_age_seconds)) END,
                         CASE WHEN m.dead_letter_depth >= t.critical_dlq
                              THEN format('%s dead letters', m.dead_letter_depth) END], NULL) AS critical,
                     array_remove(ARRAY[
                         CASE WHEN m.visible + m.in_flight + m.delayed > 0
                                   AND m.oldest_age_seconds >= extract(epoch FROM t.warning_age)
                                   AND m.oldest_age_seconds < extract(epoch FROM t.critical_age)
                              THEN format('oldest message %s s old', round(m.oldest_age_seconds)) END,
                         CASE WHEN m.dead_letter_depth >= t.warning_dlq AND m.dead_letter_depth < t.critical_dlq
                              THEN format('%s dead letters', m.dead_letter_depth) END,
                         CASE WHEN m.send_paused OR m.receive_paused THEN 'paused' END], NULL) AS warning) h;
