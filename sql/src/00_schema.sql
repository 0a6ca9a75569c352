-- postbox @VERSION@: queues and messages, with retries and dead letters, delays,
-- retention and archive, FIFO groups, deduplication, priority and flow control;
-- topics with queue and webhook subscriptions; cron, interval and one-shot
-- schedules.
--
-- Install from psql with `psql -1 -f postbox--@VERSION@.sql` (one transaction), with
-- `CREATE EXTENSION postbox` where the files sit in the server's extension
-- directory, or let `postbox serve` / `postbox migrate` do it. Plain SQL and
-- PL/pgSQL only, so it runs on managed PostgreSQL 14-18.
--
-- Errors carry SQLSTATEs of class PB that the server maps to gRPC codes:
--   PB400 invalid argument, PB404 not found, PB409 already exists,
--   PB412 failed precondition (stale receipt, queue in use), PB429 resource
--   exhausted (queue full), PB503 unavailable (queue paused).
-- Their messages are written for the caller: they say what was wrong.

CREATE SCHEMA IF NOT EXISTS postbox;

-- Installed versions, one row per install or upgrade script applied.
CREATE TABLE postbox.schema_version (
    version text PRIMARY KEY,
    installed_at timestamptz NOT NULL DEFAULT now()
);

-- The queue catalogue.
CREATE TABLE postbox.queues (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    visibility_timeout interval NOT NULL,
    delivery_delay interval NOT NULL,
    retention interval,  -- NULL: messages never expire
    max_message_size integer NOT NULL,
    receive_wait_time interval NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Since 0.2.0. Values come from queue_defaults() through create_queue.
    fifo boolean NOT NULL,
    content_based_deduplication boolean NOT NULL,
    deduplication_window interval NOT NULL,
    dead_letter_queue_id integer REFERENCES postbox.queues (id),
    max_receive_count integer,
    redrive_permission text NOT NULL,  -- allow_all, deny_all or by_queue
    redrive_sources text[] NOT NULL,   -- queue names, for by_queue
    retry_minimum_backoff interval NOT NULL,
    retry_maximum_backoff interval NOT NULL,
    archive_on_delete boolean NOT NULL,
    archive_retention interval,  -- NULL: archived messages are kept forever
    max_depth bigint,  -- NULL: no limit
    receive_rate_limit double precision,  -- messages per second; NULL: no limit
    send_paused boolean NOT NULL,
    receive_paused boolean NOT NULL,
    tags jsonb NOT NULL,
    -- Since 0.7.0: the last purge, which SQS clients may not repeat within 60 s.
    purged_at timestamptz,
    -- Since 0.9.0: whether the queue has rows in queue_listeners, kept by
    -- listen_to and unlisten, so that a send finds out with the queue's row
    -- instead of looking in a second table (a tenth of a plain send's cost).
    -- It may stay true for a while after the last listener's session is gone.
    listened boolean NOT NULL DEFAULT false,
    -- Since 0.9.0: whether a message of priority above 0 has ever been in the
    -- queue (a send or a move sets it, nothing clears it). Until then receive
    -- leaves the priority index out of its straight path.
    prioritized boolean NOT NULL DEFAULT false,
    -- Since 0.9.0: whether a message with a dedupe key has ever been sent to the
    -- queue (nothing clears it). From then on receives take the rounds, which
    -- free the keys of what they deliver (see postbox.dedupe_keys).
    keyed boolean NOT NULL DEFAULT false,
    -- Since 0.9.0: the access policy document SQS clients set (Policy,
    -- AddPermission), kept and returned; postbox does not enforce it. '': none.
    access_policy text NOT NULL DEFAULT '',
    -- Since 0.9.0: what message bodies must be (postbox._payload_schema_problem
    -- gives the shape), checked by the server on every send; NULL: any body.
    payload_schema jsonb,
    -- Since 0.9.0: what a deduplication id (or a body's hash) is unique within:
    -- 'queue', or 'message_group' (FIFO queues; SQS's DeduplicationScope).
    deduplication_scope text NOT NULL DEFAULT 'queue',
    -- Since 0.9.0: SQS's FifoThroughputLimit as a client set it, 'per_queue' or
    -- 'per_message_group_id': kept and returned, as postbox limits neither.
    fifo_throughput_limit text NOT NULL DEFAULT 'per_queue'
);

-- Every queue's messages live in this one table, keyed by queue_id, rather than
-- in a table per queue (as PGMQ does). Why:
--   * no dynamic SQL anywhere: a queue name is only ever a bound value, so no
--     name can change a statement, and every function's plan is cached;
--   * moving a message between queues (dead letters, redrive) and fanning a
--     publish out to many queues are single statements;
--   * creating a queue is an INSERT, not DDL, so it takes no lock that blocks
--     traffic on other queues.
-- The price is one heap shared by all queues; vacuum settings below keep it lean.
--
-- visible_at orders delivery and is the visibility deadline: a message can be
-- claimed when visible_at <= now(). lease is the token of the current delivery
-- (NULL before the first one): receipts carry it, so a receipt goes stale the
-- moment the message is delivered again. visible_at >= enqueued_at always holds,
-- which lets expiry use the ready index (see expire_messages).
--
-- FIFO queues keep one invariant: in each message group only the oldest message
-- (the head) has a finite visible_at; the others wait "parked" at 'infinity'.
-- Receive therefore only ever sees heads, a group is blocked while its head is
-- in flight, and removing a head promotes the next message (postbox._promote).
-- Whatever adds to or removes from a group takes the group's advisory lock
-- (postbox._lock_groups), after any row locks, so no parked message is orphaned.
CREATE TABLE postbox.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id integer NOT NULL,
    receive_count integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL,
    enqueued_at timestamptz NOT NULL,
    first_received_at timestamptz,
    lease uuid,
    attributes jsonb,
    body bytea NOT NULL,
    -- Since 0.2.0.
    priority smallint NOT NULL DEFAULT 0,  -- 0-9, higher first; standard queues only
    message_group_id text,
    deduplication_id text,
    dedupe_key text,  -- idempotent enqueue: cleared when the message is first received
    source_queue_id integer,  -- dead letters: the queue the message came from
    dead_lettered_at timestamptz,
    last_error text,  -- from the latest nack
    expires_at timestamptz,  -- since 0.8.0: the message's own expiry (ttl or expire_time); NULL: none
    -- Since 0.9.0: who took the latest delivery (receive's consumer_id; NULL:
    -- unnamed) and when it began, and the message's own max_receive_count
    -- (NULL: the queue's).
    consumer_id text,
    received_at timestamptz,
    max_receive_count integer
) WITH (
    -- A queue table turns over constantly: vacuum early and without throttling,
    -- so dead tuples do not pile up in front of the receive index scan.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- Receive scans this index from the oldest visible_at of a queue: in-flight and
-- delayed messages sort after now() and are never visited.
--
-- Every key of the three indexes below ends in the message's id, so no two
-- entries are equal and deduplication never merges any: left on, it would walk
-- each full leaf page in vain before splitting it, 1.7% of an insert of 100
-- (valgrind). Old row versions are still cleared before a split, by bottom-up
-- deletion, which does not depend on it.
CREATE INDEX messages_ready_idx ON postbox.messages (queue_id, visible_at, id)
    WITH (deduplicate_items = off);

-- The partial indexes below hold only the rows that use a feature, so a plain
-- message pays nothing for them.
-- Receive takes messages of priority > 0 first, through this index.
CREATE INDEX messages_priority_idx ON postbox.messages (queue_id, priority DESC, visible_at, id)
    WITH (deduplicate_items = off) WHERE priority > 0;
-- The messages of a group in order: FIFO promotion and appends.
CREATE INDEX messages_group_idx ON postbox.messages (queue_id, message_group_id, id)
    WITH (deduplicate_items = off) WHERE message_group_id IS NOT NULL;

-- Two features' look-ups live in tables of their own (since 0.9.0; partial
-- indexes on messages before). An index costs every insert into its table,
-- whether or not the row enters it: each partial index on messages cost a
-- one-message send 6k instructions (valgrind), a twentieth of its insert.
-- Here only the messages that use the feature pay.

-- The messages with an expiry of their own (messages.expires_at), where
-- maintenance finds the due ones. What gives a message an expiry, changes it
-- or removes the message writes its row here in the same transaction
-- (_send_batch_general, _remove, delete_batch, _delete_messages).
CREATE TABLE postbox.message_expiries (
    message_id bigint PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX message_expiries_due_idx ON postbox.message_expiries (expires_at);

-- Idempotent enqueue: the message that holds each dedupe key of a queue (one
-- waiting message per key). A send locks the key's row before it looks at
-- the message; a receive or removal deletes the row when it can do so without
-- waiting (_free_keys), so a row may name a message that was received,
-- removed or has expired since: the next send of the key finds that out and
-- names its own message instead (see _send_batch_general).
CREATE TABLE postbox.dedupe_keys (
    queue_id integer NOT NULL,
    dedupe_key text NOT NULL,
    message_id bigint NOT NULL,
    PRIMARY KEY (queue_id, dedupe_key)
);

-- Deduplication ids seen within each queue's deduplication window. Kept after
-- the message itself is deleted: a duplicate must stay a duplicate.
CREATE TABLE postbox.deduplication (
    queue_id integer NOT NULL,
    deduplication_id text NOT NULL,
    message_id bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, deduplication_id)
);
CREATE INDEX deduplication_expiry_idx ON postbox.deduplication (expires_at);

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

-- The finished messages of queues with archive_on_delete (their history):
-- deleted, expired, cancelled, or failed for good.
CREATE TABLE postbox.archive (
    id bigint PRIMARY KEY,
    queue_id integer NOT NULL,
    receive_count integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    first_received_at timestamptz,
    archived_at timestamptz NOT NULL,
    reason text NOT NULL,  -- deleted, expired, cancelled or (since 0.9.0) failed
    priority smallint NOT NULL,
    message_group_id text,
    deduplication_id text,
    source_queue_id integer,
    last_error text,
    attributes jsonb,
    body bytea NOT NULL,
    -- Since 0.9.0: what the consumer that deleted the message returned (at most
    -- 64 KiB), that consumer, and when the message became a dead letter.
    result bytea,
    consumer_id text,
    dead_lettered_at timestamptz
);
CREATE INDEX archive_queue_idx ON postbox.archive (queue_id, id);
CREATE INDEX archive_expiry_idx ON postbox.archive (queue_id, archived_at);

-- What happened to each queue's messages that no message keeps a trace of: counts
-- since the queue was made (since 0.8.0). Written when messages expire or become
-- dead letters, and by the servers' activity flushes (record_activity, every few
-- seconds), never on a send, receive or delete.
CREATE TABLE postbox.queue_counters (
    queue_id integer PRIMARY KEY REFERENCES postbox.queues (id) ON DELETE CASCADE,
    expired bigint NOT NULL DEFAULT 0,        -- past their retention or their own expiry
    dead_lettered bigint NOT NULL DEFAULT 0,  -- moved to the queue's dead-letter queue
    sent bigint NOT NULL DEFAULT 0            -- sent through a server (since 0.9.0)
);

-- Queues that a server has streams waiting on, by the backend pid of that
-- server's LISTEN connection (since 0.8.0). A send NOTIFYs only a queue listed
-- here: NOTIFY makes committing transactions queue up behind one another, and a
-- send into a queue nobody waits on should not pay for it. Runtime state, so not
-- in pg_dump; rows of a session that is gone are cleared by the next listen_to.
CREATE TABLE postbox.queue_listeners (
    queue_id integer NOT NULL REFERENCES postbox.queues (id) ON DELETE CASCADE,
    listener integer NOT NULL,
    PRIMARY KEY (queue_id, listener)
);

-- Token buckets of queues with a receive_rate_limit, shared by every server.
CREATE TABLE postbox.receive_tokens (
    queue_id integer PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);

-- Moves of dead letters back to a queue, run by the servers' maintenance worker.
CREATE TABLE postbox.redrive_tasks (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    dead_letter_queue_id integer NOT NULL,
    destination_queue_id integer,  -- NULL: each message's source queue
    max_messages bigint,  -- NULL: all
    rate double precision,  -- messages per second; NULL: as fast as possible
    status text NOT NULL DEFAULT 'running',  -- running, completed, cancelled, failed
    moved bigint NOT NULL DEFAULT 0,
    to_move bigint NOT NULL,
    credit double precision NOT NULL DEFAULT 0,  -- moves the rate allows but not yet made
    failure_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    message_ids bigint[]  -- since 0.8.0: the dead letters to move; NULL: all
);
-- One running redrive per dead-letter queue.
CREATE UNIQUE INDEX redrive_tasks_running_idx ON postbox.redrive_tasks (dead_letter_queue_id)
    WHERE status = 'running';

-- Since 0.3.0: topics, their subscriptions, webhook deliveries and schedules.

-- Named fan-out points (see publish_batch).
CREATE TABLE postbox.topics (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,  -- ending in .fifo (since 0.9.0): publishes need an ordering key
    created_at timestamptz NOT NULL DEFAULT now(),
    tags jsonb NOT NULL DEFAULT '{}',  -- since 0.9.0
    sns_attributes jsonb NOT NULL DEFAULT '{}',  -- since 0.9.0: kept for the SNS API, not acted on
    -- Since 0.9.0: a stream topic keeps its messages in the stream log at least
    -- this long, for consumer groups (see 66_streams.sql); NULL: no log.
    stream_retention interval,
    -- Since 0.9.0: what published bodies must be, as queues.payload_schema.
    payload_schema jsonb
);

-- A subscription sends a topic's messages whose routing key matches its
-- pattern to a queue, or to a webhook. The pattern is compiled when the
-- subscription is made (see _compile_pattern): most patterns match by plain
-- comparison (match_kind all, exact, prefix or suffix, with match_text the
-- literal words), the rest by a regular expression over the key (regex). A
-- queue's subscriptions go with the queue, as AMQP bindings do.
CREATE TABLE postbox.subscriptions (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id integer NOT NULL REFERENCES postbox.topics (id) ON DELETE CASCADE,
    name text NOT NULL,
    pattern text NOT NULL,
    match_kind text NOT NULL,
    match_text text,
    queue_id integer REFERENCES postbox.queues (id) ON DELETE CASCADE,
    webhook_url text,
    webhook_secret text,  -- whsec_<base64>: returned by create_subscription only
    webhook_timeout interval,
    webhook_max_attempts integer,
    webhook_minimum_backoff interval,
    webhook_maximum_backoff interval,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Since 0.9.0: an SNS filter policy over the attributes or the body (see
    -- filter_matches); SNS's delivery (see _sns_envelope): {topic_arn,
    -- subscription_arn, unsubscribe_url, raw, attributes}; and whether
    -- publishes pass the subscription by.
    filter_policy jsonb,
    filter_scope text NOT NULL DEFAULT 'attributes' CHECK (filter_scope IN ('attributes', 'body')),
    sns jsonb,
    suspended boolean NOT NULL DEFAULT false,
    -- Since 0.9.0: the queue of an SNS subscription whose queue does not exist (SNS
    -- accepts such an endpoint): nothing is delivered to it until create_queue makes
    -- the queue, which then takes the subscription's messages.
    pending_queue text,
    UNIQUE (topic_id, name),
    CHECK (num_nonnulls(queue_id, webhook_url, pending_queue) = 1)
);
-- create_queue finds the subscriptions waiting for the queue through this index.
CREATE INDEX subscriptions_pending_queue_idx ON postbox.subscriptions (pending_queue)
    WHERE pending_queue IS NOT NULL;
-- Deleting a queue finds its subscriptions through this index.
CREATE INDEX subscriptions_queue_idx ON postbox.subscriptions (queue_id) WHERE queue_id IS NOT NULL;

-- Messages on their way to webhook subscriptions, one row per (publish,
-- subscription). The servers' webhook workers claim due rows with SKIP LOCKED
-- and lease them like received messages: `lease` is the token of the current
-- attempt and next_attempt_at its deadline, so a worker that dies mid-POST only
-- delays the delivery. A delivered row is deleted; one that used up its
-- attempts stays, state 'failed', with its last status and error, for
-- list_webhook_deliveries until expire_webhook_deliveries removes it.
-- No foreign key on subscription_id: it would lock the subscription row on
-- every publish. Publishes and subscription deletes serialise on the topic
-- lock instead (see _lock_topic).
CREATE TABLE postbox.webhook_deliveries (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription_id integer NOT NULL,
    publish_id uuid NOT NULL,
    published_at timestamptz NOT NULL,
    routing_key text NOT NULL,
    ordering_key text,
    attributes jsonb,
    body bytea NOT NULL,
    state text NOT NULL DEFAULT 'pending',  -- pending or failed
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,  -- pending: when it is due (again); failed: NULL
    lease uuid,
    last_attempt_at timestamptz,
    last_status integer,  -- HTTP status of the latest attempt; NULL when none came back
    last_error text
) WITH (
    -- Turns over like the messages table.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
-- Workers walk this index from the earliest due delivery.
CREATE INDEX webhook_deliveries_due_idx ON postbox.webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX webhook_deliveries_subscription_idx ON postbox.webhook_deliveries (subscription_id, id);
CREATE INDEX webhook_deliveries_failed_idx ON postbox.webhook_deliveries (last_attempt_at)
    WHERE state = 'failed';

-- Messages fired on a cron schedule (cron_expression in time_zone), every
-- `every` (a fixed interval), or once at run_at, into a queue or a topic named
-- by target_queue or target_topic (names, so a target may be deleted and made
-- again; a fire into a missing target fails and is recorded in last_error).
-- The server computes next_fire_at (cron needs a library), and its scheduler
-- workers claim due rows with SKIP LOCKED and fire them with fire_schedule,
-- which sends and moves next_fire_at in one transaction. A paused schedule
-- keeps next_fire_at (an interval's phase) but is not due; a one-shot schedule
-- that fired is deleted, and one whose fire was refused is paused with
-- next_fire_at NULL.
CREATE TABLE postbox.schedules (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    cron_expression text,
    time_zone text,
    every interval,
    run_at timestamptz,
    target_queue text,
    target_topic text,
    routing_key text NOT NULL,
    body bytea NOT NULL,
    attributes jsonb,
    paused boolean NOT NULL DEFAULT false,
    next_fire_at timestamptz,
    last_fire_at timestamptz,
    last_error text,  -- why the latest fire failed; NULL once one succeeds
    fire_count bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Since 0.9.0. Missed due times fired after downtime, in order (0: once for all).
    catch_up_limit integer NOT NULL DEFAULT 0,
    -- Refused fires in a row that pause the schedule (0: never).
    failure_threshold integer NOT NULL DEFAULT 0,
    consecutive_failures integer NOT NULL DEFAULT 0,
    CHECK (num_nonnulls(cron_expression, every, run_at) = 1),
    CHECK ((target_queue IS NULL) <> (target_topic IS NULL))
);
CREATE INDEX schedules_due_idx ON postbox.schedules (next_fire_at) WHERE NOT paused;

-- pg_dump keeps the data of extension tables only when told to.
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('postbox.schema_version', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.queues', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.messages', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.deduplication', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.batch_requests', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.message_expiries', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.dedupe_keys', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.archive', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.redrive_tasks', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.topics', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.subscriptions', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.webhook_deliveries', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.schedules', '');
    PERFORM pg_catalog.pg_extension_config_dump('postbox.queue_counters', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL;  -- installed from a plain script, not by CREATE EXTENSION
END
$$;
