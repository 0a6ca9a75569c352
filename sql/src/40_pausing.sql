-- Stops sends and/or receives of a queue (both when neither is named): they
-- fail with PB503 until resume_queue.
CREATE FUNCTION postbox.pause_queue(queue_name text, sends boolean DEFAULT false,
                                    receives boolean DEFAULT false)
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    both_ boolean := NOT coalesce(sends, false) AND NOT coalesce(receives, false);
BEGIN
    UPDATE postbox.queues
    SET send_paused = send_paused OR sends OR both_,
        receive_paused = receive_paused OR receives OR both_,
        updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    RETURN q;
END
$$;

-- Lets sends and/or receives of a queue in again (both when neither is named).
CREATE FUNCTION postbox.resume_queue(queue_name text, sends boolean DEFAULT false,
                                     receives boolean DEFAULT false)
RETURNS postbox.queues
LANGUAGE plpgsql AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    both_ boolean := NOT coalesce(sends, false) AND NOT coalesce(receives, false);
BEGIN
    UPDATE postbox.queues
    SET send_paused = send_paused AND NOT (sends OR both_),
        receive_paused = receive_paused AND NOT (receives OR both_),
        updated_at = now()
    WHERE id = q.id
    RETURNING * INTO q;
    PERFORM postbox._notify(q);  -- streams waiting on a receive-paused queue look again
    RETURN q;
END
$$;
