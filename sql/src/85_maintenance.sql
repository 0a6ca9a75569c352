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
-- A schedule with a catch_up_limit fires its missed due times in order, up to
-- that many fires, as the servers' schedulers do. Returns how many fired and
-- how many the target refused (see fire_schedule).
CREATE FUNCTION postbox._fire_due_schedules(max_schedules integer, OUT fired integer, OUT refused integer)
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
