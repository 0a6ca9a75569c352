-- Splits receipts into (position, message id, lease); malformed ones get NULLs.
CREATE FUNCTION postbox._parse_receipts(receipts text[])
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

-- Outcome per receipt of an operation that matched `done` of them:
-- 'ok', 'invalid' (malformed), 'stale' (delivered again since) or 'not_found'.
CREATE FUNCTION postbox._receipt_outcomes(q postbox.queues, receipts text[], done bigint[])
RETURNS TABLE (i bigint, outcome text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF cardinality(done) = cardinality(receipts) THEN
        -- Done ids are distinct, each matched by a receipt of its own: all are ok,
        -- and the receipts need no second parse (the common case).
        RETURN QUERY SELECT g, 'ok' FROM generate_series(1::bigint, cardinality(receipts)) g;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT p.i, CASE
        WHEN p.message_id IS NULL THEN 'invalid'
        WHEN p.message_id = ANY (done) THEN 'ok'
        WHEN EXISTS (SELECT FROM postbox.messages m WHERE m.id = p.message_id AND m.queue_id + 0 = q.id)
            THEN 'stale'
        ELSE 'not_found'
    END
    FROM postbox._parse_receipts(receipts) p
    ORDER BY p.i;
END
$$;

-- Deletes received messages by receipt. One outcome per receipt, in order;
-- see _receipt_outcomes. Archives them if the queue archives, with results[i]
-- (since 0.9.0; at most 64 KiB each) as what the job of receipts[i] returned:
-- a queue that does not archive keeps no results. Since 0.9.0, on a FIFO queue
-- a receipt whose lease has run out is stale: the message heads its group again
-- for the next receive (SQS: "The receipt handle has expired").
CREATE FUNCTION postbox.delete_batch(queue_name text, receipts text[], results bytea[] DEFAULT NULL)
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

-- Makes received messages visible again after `timeout` from now (0: at once).
-- One outcome per receipt, in order; see _receipt_outcomes.
CREATE FUNCTION postbox.change_visibility_batch(queue_name text, receipts text[], timeouts interval[])
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
    done bigint[];
    bad interval;
BEGIN
    PERFORM postbox._check_batch_size(cardinality(receipts));
    IF cardinality(timeouts) IS DISTINCT FROM cardinality(receipts) THEN
        PERFORM postbox._invalid('receipts and timeouts must have the same number of entries');
    END IF;
    SELECT t INTO bad FROM unnest(timeouts) t WHERE t IS NULL OR t < interval '0' OR t > interval '12 hours' LIMIT 1;
    IF FOUND THEN
        PERFORM postbox._invalid(format('visibility timeout %s is outside 0 s to 12 h', coalesce(bad::text, 'NULL')));
    END IF;
    WITH changed AS (
        UPDATE postbox.messages m
        SET visible_at = clock_timestamp() + t.timeout
        FROM postbox._parse_receipts(receipts) p
        JOIN unnest(timeouts) WITH ORDINALITY AS t(timeout, i) ON t.i = p.i
        WHERE m.id = p.message_id AND m.queue_id + 0 = q.id AND m.lease = p.lease
        RETURNING m.id
    )
    SELECT array_agg(id) INTO done FROM changed;
    RETURN QUERY SELECT * FROM postbox._receipt_outcomes(q, receipts, done);
END
$$;

-- Raises the error of a single-receipt operation's outcome.
CREATE FUNCTION postbox._raise_receipt_outcome(outcome text, receipt text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    CASE outcome
    WHEN 'ok' THEN
        RETURN;
    WHEN 'invalid' THEN
        PERFORM postbox._invalid(format('receipt %s is malformed; pass a receipt returned by receive',
                                        quote_literal(receipt)));
    WHEN 'stale' THEN
        RAISE EXCEPTION USING ERRCODE = 'PB412', MESSAGE = format(
            'receipt %s is stale: the message was delivered again since; use the newest receipt',
            quote_literal(receipt));
    ELSE
        RAISE EXCEPTION USING ERRCODE = 'PB404', MESSAGE = format(
            'the message of receipt %s is gone (deleted or expired)', quote_literal(receipt));
    END CASE;
END
$$;

-- PB400 unless results has at most `receipts` entries of at most 64 KiB each
-- (since 0.9.0).
CREATE FUNCTION postbox._check_results(results bytea[], receipts integer) RETURNS void
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

-- Deletes a received message, with what its job returned (since 0.9.0; see
-- delete_batch). PB412 for a stale receipt, PB404 if it is gone.
CREATE FUNCTION postbox.delete(queue_name text, receipt text, result bytea DEFAULT NULL) RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.delete_batch(queue_name, ARRAY[receipt], postbox._array_of(result))
$$;

-- Sets when a received message becomes visible again, `timeout` from now.
-- PB412 for a stale receipt, PB404 if it is gone.
CREATE FUNCTION postbox.change_visibility(queue_name text, receipt text, timeout interval) RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.change_visibility_batch(queue_name, ARRAY[receipt], ARRAY[timeout])
$$;

-- The backoff of a nack without delay: exponential in the number of
-- deliveries, between the queue's minimum and maximum, with equal jitter.
CREATE FUNCTION postbox._backoff(q postbox.queues, deliveries integer) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT least(q.retry_maximum_backoff,
                 q.retry_minimum_backoff * power(2, least(greatest(deliveries - 1, 0), 30)))
           * (0.5 + random() / 2)
$$;

-- Gives received messages back: visible again after `delays[i]` (NULL: the
-- queue's retry backoff), recording errors[i] as the message's last error. The
-- receipt is spent. One outcome per receipt, in order; see _receipt_outcomes.
-- Where dead_letters[i] (since 0.9.0) is true the message is not retried: it
-- moves to the queue's dead-letter queue at once, or where there is none, fails
-- for good (archived as failed where the queue archives); not with a delay.
CREATE FUNCTION postbox.nack_batch(queue_name text, receipts text[], delays interval[] DEFAULT NULL,
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
CREATE FUNCTION postbox.nack(queue_name text, receipt text, delay interval DEFAULT NULL,
                             error text DEFAULT NULL, dead_letter boolean DEFAULT false)
RETURNS void
LANGUAGE sql AS $$
    SELECT postbox._raise_receipt_outcome(outcome, receipt)
    FROM postbox.nack_batch(queue_name, ARRAY[receipt], postbox._array_of(delay), postbox._array_of(error),
                            postbox._array_of(nullif(dead_letter, false)))
$$;

-- Gives back claimed messages that never reached a consumer (the server calls
-- it when a client goes away mid-delivery): visible at once, the delivery
-- uncounted, the receipt void. Receipts that are stale already are skipped.
CREATE FUNCTION postbox.release(queue_name text, receipts text[]) RETURNS bigint
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
    released bigint;
BEGIN
    UPDATE postbox.messages m
    SET visible_at = clock_timestamp(),
        receive_count = m.receive_count - 1,
        first_received_at = CASE WHEN m.receive_count > 1 THEN m.first_received_at END,
        lease = NULL
    FROM postbox._parse_receipts(receipts) p
    WHERE m.id = p.message_id AND m.queue_id + 0 = q.id AND m.lease = p.lease;
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        PERFORM postbox._notify(q);
    END IF;
    RETURN released;
END
$$;

-- The earliest time a message of the queue may be received: when the first
-- message becomes visible, or later when the queue's rate limit allows. NULL
-- when nothing is waiting or receives are paused. Waiting servers set a timer.
CREATE FUNCTION postbox.next_visible_at(queue_name text, scan_from timestamptz DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
-- An ordered walk of the ready index, whatever the statistics say (see receive).
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
    at timestamptz;
BEGIN
    IF q.receive_paused THEN
        RETURN NULL;
    END IF;
    SELECT nullif(min(m.visible_at), 'infinity') INTO at FROM postbox.messages m
    WHERE m.queue_id = q.id AND m.visible_at >= coalesce(scan_from, '-infinity');
    IF at IS NOT NULL AND q.receive_rate_limit IS NOT NULL THEN
        SELECT greatest(at, t.refilled_at + make_interval(secs => greatest(0, 1 - t.tokens) / q.receive_rate_limit))
        INTO at
        FROM postbox.receive_tokens t WHERE t.queue_id = q.id;
    END IF;
    RETURN at;
END
$$;

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
CREATE FUNCTION postbox.receive_floor(queue_name text) RETURNS timestamptz
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

-- How many of these receipts still hold their message in flight (not deleted,
-- not given back, not delivered again, lease not run out). A continuous stream
-- asks this when its consumer may have settled messages through another server.
CREATE FUNCTION postbox.receipts_in_flight(receipts text[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*)
    FROM postbox._parse_receipts(receipts) p
    JOIN postbox.messages m ON m.id = p.message_id AND m.lease = p.lease
    WHERE m.visible_at > now() AND m.visible_at <> 'infinity'
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
