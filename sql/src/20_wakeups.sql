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
CREATE FUNCTION postbox._notify(q postbox.queues) RETURNS void
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

-- Tells the servers' workers that work of a kind arrived (since 0.8.0):
-- 'webhooks' (deliveries due now), 'schedules' (a due time changed) or
-- 'redrives' (a task started). A NOTIFY on the queues' channel with a payload no
-- queue name can have; PostgreSQL sends one per transaction however many
-- statements signal, and only at commit. Idle workers sleep until their next
-- due time, so work made elsewhere (another server, psql) would otherwise wait
-- for their slow fallback poll.
CREATE FUNCTION postbox._signal(kind text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('postbox', '#' || kind)
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
CREATE FUNCTION postbox.listen_to(queue_names text[]) RETURNS void
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
CREATE FUNCTION postbox.unlisten(queue_names text[]) RETURNS void
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

-- The queues among `names` that hold a message a receive could claim now
-- (since 0.8.0): the servers' safety net for wake-ups lost in a reconnect, one
-- statement for every queue that has streams waiting.
CREATE FUNCTION postbox.ready_queues(names text[]) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT q.name FROM postbox.queues q
    WHERE q.name = ANY (names) AND NOT q.receive_paused
      AND EXISTS (SELECT FROM postbox.messages m WHERE m.queue_id = q.id AND m.visible_at <= now())
$$;
