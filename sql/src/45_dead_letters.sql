-- The queues whose dead-letter queue this is, in name order after after_name.
CREATE FUNCTION postbox.list_dead_letter_source_queues(queue_name text, page_size integer DEFAULT 100,
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

-- Starts moving the dead letters of a queue back: to each message's source
-- queue, or to `destination`; at most max_messages (NULL: all), at most `rate`
-- per second (NULL: as fast as the maintenance worker goes); only the dead
-- letters in message_ids when given (NULL: all), PB404 naming the first id
-- that is not one of the queue's. The servers' maintenance worker runs the
-- task (run_redrives). PB412 while one runs.
CREATE FUNCTION postbox.start_redrive(dead_letter_queue text, destination text DEFAULT NULL,
                                      max_messages bigint DEFAULT NULL, rate double precision DEFAULT NULL,
                                      message_ids bigint[] DEFAULT NULL)
RETURNS postbox.redrive_tasks
LANGUAGE plpgsql AS $$
DECLARE
    dlq postbox.queues;
    target postbox.queues;
    task postbox.redrive_tasks;
    missing bigint;
BEGIN
    PERFORM postbox._invalid('destination: ' || postbox.queue_name_problem(destination))
    WHERE destination IS NOT NULL AND postbox.queue_name_problem(destination) IS NOT NULL;
    dlq := postbox._queue(dead_letter_queue);
    IF destination IS NOT NULL THEN
        target := postbox._queue(destination);
        IF target.id = dlq.id THEN
            PERFORM postbox._invalid('the destination of a redrive must be another queue');
        ELSIF target.fifo <> dlq.fifo THEN
            PERFORM postbox._invalid('a redrive moves FIFO messages to a FIFO queue and standard ones '
                                     'to a standard queue');
        END IF;
    END IF;
    IF max_messages < 1 THEN
        PERFORM postbox._invalid(format('max_messages is %s; give at least 1, or none for all', max_messages));
    END IF;
    IF rate <= 0 OR rate > 1e6 THEN
        PERFORM postbox._invalid(format('rate is %s; it must be above 0 and at most 1000000 per second', rate));
    END IF;
    IF cardinality(message_ids) NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('message_ids names %s messages; name 1 to 1000, or none for all',
                                        cardinality(message_ids)));
    END IF;
    SELECT i INTO missing FROM unnest(message_ids) AS i
    WHERE NOT EXISTS (SELECT FROM postbox.messages m WHERE m.id = i AND m.queue_id = dlq.id)
    LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'message %s is not in queue %s: redrive only its dead letters', missing, quote_literal(dead_letter_queue));
    END IF;
    IF NOT EXISTS (SELECT FROM postbox.queues WHERE dead_letter_queue_id = dlq.id)
       AND NOT EXISTS (SELECT FROM postbox.messages WHERE queue_id = dlq.id AND source_queue_id IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'queue %s is no queue''s dead-letter queue and holds no dead letters', quote_literal(dead_letter_queue));
    END IF;
    IF EXISTS (SELECT FROM postbox.redrive_tasks WHERE dead_letter_queue_id = dlq.id AND status = 'running') THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'a redrive of %s is already running; cancel it or let it finish', quote_literal(dead_letter_queue));
    END IF;
    INSERT INTO postbox.redrive_tasks (dead_letter_queue_id, destination_queue_id, max_messages, rate, to_move,
                                       message_ids)
    SELECT dlq.id, target.id, max_messages, rate, least(count(*), max_messages), start_redrive.message_ids
    FROM postbox.messages m
    WHERE m.queue_id = dlq.id AND (m.lease IS NULL OR m.visible_at <= now())
          AND (start_redrive.message_ids IS NULL OR m.id = ANY (start_redrive.message_ids))
    RETURNING * INTO task;
    PERFORM postbox._signal('redrives');
    RETURN task;
END
$$;

-- The redrive tasks of a dead-letter queue, newest first; a page after
-- after_task, the last task of the page before.
CREATE FUNCTION postbox.list_redrive_tasks(dead_letter_queue text, page_size integer DEFAULT 10,
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

-- Stops a running redrive; what it moved stays moved. PB404 for an unknown
-- task, PB412 when it is no longer running.
CREATE FUNCTION postbox.cancel_redrive(task_id uuid) RETURNS postbox.redrive_tasks
LANGUAGE plpgsql AS $$
DECLARE
    task postbox.redrive_tasks;
BEGIN
    UPDATE postbox.redrive_tasks SET status = 'cancelled', updated_at = now()
    WHERE id = task_id AND status = 'running'
    RETURNING * INTO task;
    IF NOT FOUND THEN
        SELECT * INTO task FROM postbox.redrive_tasks WHERE id = task_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format('redrive task %s does not exist', task_id);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'redrive task %s is %s, not running', task_id, task.status);
    END IF;
    RETURN task;
END
$$;

-- One step of every running redrive: moves up to batch_size messages per task,
-- fewer when its rate says so. Tasks are claimed with SKIP LOCKED, so servers
-- running this together never move the same messages. Returns how many moved,
-- or NULL (since 0.8.0) when it found no task to step: the maintenance worker
-- then sleeps until a redrive starts.
CREATE FUNCTION postbox.run_redrives(batch_size integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    task postbox.redrive_tasks;
    dlq postbox.queues;
    target postbox.queues;
    at timestamptz := clock_timestamp();
    credit double precision;
    allowance bigint;
    picked bigint[];
    moved bigint;
    total bigint;
    stranded bigint;
BEGIN
    FOR task IN
        SELECT * FROM postbox.redrive_tasks WHERE status = 'running' ORDER BY created_at
        FOR UPDATE SKIP LOCKED
    LOOP
        total := coalesce(total, 0);
        SELECT * INTO dlq FROM postbox.queues WHERE id = task.dead_letter_queue_id;
        credit := CASE WHEN task.rate IS NULL THEN batch_size
                       ELSE least(task.credit + task.rate * extract(epoch FROM at - task.updated_at),
                                  greatest(task.rate, 1)) END;
        allowance := least(floor(credit)::bigint, batch_size,
                           coalesce(task.max_messages - task.moved, batch_size));
        moved := 0;
        IF allowance > 0 THEN
            SELECT array_agg(m.id) INTO picked
            FROM (SELECT m.id FROM postbox.messages m
                  WHERE m.queue_id = dlq.id AND (m.lease IS NULL OR m.visible_at <= now())
                        AND (task.message_ids IS NULL OR m.id = ANY (task.message_ids))
                        AND (task.destination_queue_id IS NOT NULL
                             OR m.source_queue_id IN (SELECT id FROM postbox.queues))
                  ORDER BY m.id LIMIT allowance
                  FOR UPDATE SKIP LOCKED) AS m;
            FOR target IN
                SELECT * FROM postbox.queues
                WHERE id IN (SELECT coalesce(task.destination_queue_id, m.source_queue_id)
                             FROM postbox.messages m WHERE m.id = ANY (picked))
            LOOP
                PERFORM postbox._move(
                    ARRAY(SELECT m.id FROM postbox.messages m
                          WHERE m.id = ANY (picked)
                                AND coalesce(task.destination_queue_id, m.source_queue_id) = target.id),
                    dlq, target, false);
            END LOOP;
            moved := coalesce(cardinality(picked), 0);
        END IF;
        task.moved := task.moved + moved;
        task.credit := CASE WHEN task.rate IS NULL THEN 0 ELSE credit - moved END;
        IF task.moved >= task.max_messages OR (allowance > 0 AND moved < allowance) THEN
            SELECT count(*) INTO stranded FROM postbox.messages m
            WHERE m.queue_id = dlq.id AND task.destination_queue_id IS NULL
                  AND (task.message_ids IS NULL OR m.id = ANY (task.message_ids))
                  AND m.source_queue_id IS NOT NULL AND m.source_queue_id NOT IN (SELECT id FROM postbox.queues);
            IF stranded > 0 AND NOT task.moved >= task.max_messages THEN
                task.status := 'failed';
                task.failure_reason := format(
                    '%s dead letters have no source queue any more; redrive them to a named destination',
                    stranded);
            ELSE
                task.status := 'completed';
            END IF;
        END IF;
        UPDATE postbox.redrive_tasks
        SET moved = task.moved, credit = task.credit, status = task.status,
            failure_reason = task.failure_reason, updated_at = at
        WHERE id = task.id;
        total := total + moved;
    END LOOP;
    RETURN total;
END
$$;
