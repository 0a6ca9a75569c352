-- The schedule of that name; PB400 if the name is malformed, PB404 if there
-- is none.
CREATE FUNCTION postbox._schedule(schedule_name text) RETURNS postbox.schedules
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s postbox.schedules;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name;
    IF NOT FOUND THEN
        PERFORM postbox._invalid(postbox.name_problem('schedule', schedule_name))
        WHERE postbox.name_problem('schedule', schedule_name) IS NOT NULL;
        RAISE EXCEPTION USING ERRCODE = 'PB404',
            MESSAGE = format('schedule %s does not exist', quote_literal(schedule_name));
    END IF;
    RETURN s;
END
$$;

-- The message of a check of a schedule's target names, or NULL when they are
-- well formed.
CREATE FUNCTION postbox._target_problem(target_queue text, target_topic text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce('target: ' || CASE WHEN target_queue IS NOT NULL THEN postbox.queue_name_problem(target_queue) END,
                    'target: ' || CASE WHEN target_topic IS NOT NULL THEN postbox.name_problem('topic', target_topic) END)
$$;

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

-- Checks a schedule before it is stored: PB400 for a bad field, PB404 when
-- its target does not exist.
CREATE FUNCTION postbox._check_schedule(s postbox.schedules) RETURNS void
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

-- A schedule as a caller of tenant `tenant` sees it: its name and target
-- without the tenant.
CREATE FUNCTION postbox._shown_schedule(s postbox.schedules, tenant text) RETURNS postbox.schedules
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
CREATE FUNCTION postbox.get_schedule(schedule_name text) RETURNS postbox.schedules
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tenant text := postbox._caller_tenant();
BEGIN
    RETURN postbox._shown_schedule(postbox._schedule(postbox._in_tenant(schedule_name, tenant)), tenant);
END
$$;

-- The schedule of that name, locked until the transaction ends (so a resume
-- computes its next fire time from a row nobody changes meanwhile); PB404.
CREATE FUNCTION postbox.lock_schedule(schedule_name text) RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    SELECT * INTO s FROM postbox.schedules WHERE name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        s := postbox._schedule(schedule_name);  -- raises PB404
    END IF;
    RETURN s;
END
$$;

-- Schedules in name order after after_name; only paused (or only active)
-- ones when `paused` is not NULL, only those into queues (target_kind 'queue')
-- or topics ('topic') when it is not NULL, only names starting with
-- name_prefix. A bound role's tenant's only, named as it names them.
CREATE FUNCTION postbox.list_schedules(page_size integer DEFAULT 100, after_name text DEFAULT '',
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

-- Deletes a schedule.
CREATE FUNCTION postbox.delete_schedule(schedule_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM postbox.schedules WHERE name = schedule_name;
    IF NOT FOUND THEN
        PERFORM postbox._schedule(schedule_name);  -- raises PB404
    END IF;
END
$$;

-- Stops a schedule from firing until resume_schedule.
CREATE FUNCTION postbox.pause_schedule(schedule_name text) RETURNS postbox.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s postbox.schedules;
BEGIN
    UPDATE postbox.schedules SET paused = true, updated_at = now() WHERE name = schedule_name RETURNING * INTO s;
    IF NOT FOUND THEN
        s := postbox._schedule(schedule_name);  -- raises PB404
    END IF;
    RETURN s;
END
$$;

-- Lets a schedule fire again, next at next_fire_at (computed by the caller
-- from the row lock_schedule returned), or at its stored next_fire_at when
-- NULL. PB412 for a one-shot schedule whose fire was refused: give it a new
-- run_at.
CREATE FUNCTION postbox.resume_schedule(schedule_name text, next_fire_at timestamptz DEFAULT NULL)
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

-- Claims up to max_schedules due schedules, locked (FOR UPDATE SKIP LOCKED,
-- so concurrent schedulers never get the same one) until the transaction
-- ends; fire each with fire_schedule in the same transaction.
CREATE FUNCTION postbox.claim_due_schedules(max_schedules integer DEFAULT 10) RETURNS SETOF postbox.schedules
LANGUAGE plpgsql
-- An ordered walk of the due index, whatever the statistics say (see receive).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM postbox.schedules s
    WHERE NOT s.paused AND s.next_fire_at <= now()
    ORDER BY s.next_fire_at
    LIMIT max_schedules
    FOR UPDATE SKIP LOCKED;
END
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
CREATE FUNCTION postbox.run_schedule(schedule_name text, OUT schedule postbox.schedules,
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

-- When the next schedule is due; NULL when none is. Idle schedulers sleep
-- until then.
CREATE FUNCTION postbox.next_schedule_fire_at() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(next_fire_at) FROM postbox.schedules WHERE NOT paused
$$;
