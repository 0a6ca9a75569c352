-- PB400 unless a batch of n entries holds 1 to 1,000.
CREATE FUNCTION postbox._check_batch_size(n integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(n, 0) NOT BETWEEN 1 AND 1000 THEN
        PERFORM postbox._invalid(format('a batch holds 1 to 1000 entries, not %s', coalesce(n, 0)));
    END IF;
END
$$;

-- How an error names the i-th (1-based) of n batch entries: by 0-based index,
-- or not at all when there is only one.
CREATE FUNCTION postbox._entry_prefix(i bigint, n integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN n > 1 THEN format('entry %s: ', i - 1) ELSE '' END
$$;

-- A one-element array of x, or NULL when x is NULL: single sends pass their
-- options this way, so that absent options stay absent for send_batch.
CREATE FUNCTION postbox._array_of(x anyelement) RETURNS anyarray
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN x IS NOT NULL THEN ARRAY[x] END
$$;

-- Takes the advisory locks of FIFO message groups, in one global order so that
-- two callers never wait on each other in a circle.
CREATE FUNCTION postbox._lock_groups(queue_id integer, groups text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    lock_key bigint;
BEGIN
    FOR lock_key IN
        SELECT DISTINCT hashtextextended(g, queue_id) FROM unnest(groups) AS g WHERE g IS NOT NULL ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(lock_key);
    END LOOP;
END
$$;

-- Makes the oldest message of each group visible when it is parked: the group's
-- head is gone. Callers hold the groups' locks. The clock, not the
-- transaction's start: see receive_floor.
CREATE FUNCTION postbox._promote(q postbox.queues, groups text[]) RETURNS void
LANGUAGE sql AS $$
    UPDATE postbox.messages m
    SET visible_at = greatest(clock_timestamp(), m.enqueued_at + q.delivery_delay)
    FROM (SELECT (SELECT x.id FROM postbox.messages x
                  WHERE x.queue_id = q.id AND x.message_group_id = g
                  ORDER BY x.id LIMIT 1) AS id
          FROM (SELECT DISTINCT g FROM unnest(groups) AS g) AS s) AS head
    WHERE m.id = head.id AND m.visible_at = 'infinity'
$$;

-- When a message sent at sent_at becomes visible: at deliver_at (a past time
-- meaning now), else after its delay, else after the queue's default delay.
-- STABLE, as timestamptz + interval is (days follow the time zone): declared
-- IMMUTABLE it was not inlined, and ran as a function call per message.
CREATE FUNCTION postbox._visible_at(sent_at timestamptz, delay interval, deliver_at timestamptz,
                                    default_delay interval)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN deliver_at IS NOT NULL THEN greatest(deliver_at, sent_at)
                ELSE sent_at + coalesce(delay, default_delay) END
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

-- send_batch's every case: options, FIFO order, deduplication, depth limits and
-- every error. send_batch (below) takes the plain case past it.
CREATE FUNCTION postbox._send_batch_general(
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

-- PB400 unless a batch's request_id is 1 to 128 printable ASCII characters.
CREATE FUNCTION postbox._check_request_id(request_id text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(request_id) NOT BETWEEN 1 AND 128 OR request_id ~ '[^!-~]' THEN
        PERFORM postbox._invalid(format('request_id %s is not 1 to 128 printable ASCII characters',
                                        postbox._quoted(request_id)));
    END IF;
END
$$;

-- The answer to a repeat of the batch of n entries that request_id named in the
-- queue, its row claimed and committed within the window (a statement of its
-- own sees it): the first batch's ids, all duplicates; PB412 for another n.
CREATE FUNCTION postbox._repeated_batch(queue_id integer, request_id text, n integer)
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
-- under a row lock instead (see _lock_queue). A request id takes the straight
-- path too: the batch's ids are drawn first, so that its row is written once,
-- with them, before the insert (the general path's went through
-- _send_batch_once, which looked the queue up again, wrote the row empty and
-- filled it: a seventh of a batch of 64).
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

-- send_batch of a batch named by a request id. The id's row, written in the
-- batch's transaction, claims it: a committed batch and its row are one. A
-- repeat within the queue's deduplication window finds the row, sends nothing
-- and answers the first batch's ids, all duplicates; a repeat while the first
-- is still uncommitted waits on the row (ON CONFLICT) and then does the same,
-- or, if the first rolled back, is the first itself. The entries are not
-- compared (the id is a retry token, as a deduplication id is), but their
-- number is: the answer is parallel to them, so a repeat with another number
-- is PB412, a new batch that reused an id. The row is written empty and
-- filled once the batch is in: the general path draws its ids as it inserts
-- (send_batch's straight path writes it once, see there).
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

-- Sends one message; returns its id (the original's, for a duplicate). See
-- send_batch for the options and rules. A message that is nothing but a body,
-- into a queue without FIFO order, deduplication or a depth limit (the common
-- transactional send), takes a straight path: send_batch's checks and branches
-- cost as much as the insert itself when many sessions each send one.
CREATE FUNCTION postbox.send(
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
