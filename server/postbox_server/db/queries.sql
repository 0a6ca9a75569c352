-- Statements the server sends. Each calls one function of the SQL engine
-- (sql/postbox--*.sql), where the rules live; the server only binds values.

-- name: ping
SELECT 1

-- A write that needs two new blocks of a file of its own (five rows of 1,500 bytes
-- fill a page; rows under 2 kB are stored as they are), dropped as it commits: it
-- fails with disk_full while the database's disk has no room (db/disk_space.py).
-- name: disk_probe
CREATE TEMPORARY TABLE postbox_disk_probe ON COMMIT DROP AS
    SELECT repeat('x', 1500) AS filler FROM generate_series(1, 10)

-- name: replication_settings
SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')

-- Queue rows come with the name of their dead-letter queue.

-- name: create_queue
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue
FROM postbox.create_queue($1, $2::jsonb) q

-- name: get_queue
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue
FROM postbox.get_queue($1) q

-- name: get_queue_with_stats
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue,
       s.*, coalesce(r.sent_per_second, 0) AS sent_per_second,
       coalesce(r.received_per_second, 0) AS received_per_second
FROM postbox.get_queue($1) q CROSS JOIN postbox.queue_stats($1) s
-- Outer: queue_rates has no row for a missing queue, and must not spare get_queue its error.
LEFT JOIN postbox.queue_rates('1 minute', $1) r ON true

-- name: list_queues
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue
FROM postbox.list_queues($1, $2, $3) q

-- name: list_queues_with_stats
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue,
       s.*, coalesce(r.sent_per_second, 0) AS sent_per_second,
       coalesce(r.received_per_second, 0) AS received_per_second
FROM postbox.list_queues($1, $2, $3) q
CROSS JOIN LATERAL postbox.queue_stats(q.name) s
LEFT JOIN LATERAL postbox.queue_rates('1 minute', q.name) r ON true

-- name: update_queue
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue
FROM postbox.update_queue($1, $2::jsonb) q

-- name: pause_queue
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue
FROM postbox.pause_queue($1, $2, $3) q

-- name: resume_queue
SELECT q.*, (SELECT d.name FROM postbox.queues d WHERE d.id = q.dead_letter_queue_id) AS dead_letter_queue
FROM postbox.resume_queue($1, $2, $3) q

-- name: drop_queue
SELECT postbox.drop_queue($1)

-- name: purge_queue
SELECT postbox.purge_queue($1)

-- name: list_dead_letter_source_queues
SELECT name FROM postbox.list_dead_letter_source_queues($1, $2, $3) AS name

-- Redrive task rows come with their queue names.

-- name: start_redrive
SELECT t.*, (SELECT name FROM postbox.queues WHERE id = t.dead_letter_queue_id) AS dead_letter_queue,
       (SELECT name FROM postbox.queues WHERE id = t.destination_queue_id) AS destination
FROM postbox.start_redrive($1, $2, $3, $4, $5) t

-- name: list_redrive_tasks
SELECT t.*, (SELECT name FROM postbox.queues WHERE id = t.dead_letter_queue_id) AS dead_letter_queue,
       (SELECT name FROM postbox.queues WHERE id = t.destination_queue_id) AS destination
FROM postbox.list_redrive_tasks($1, $2, $3) t

-- name: cancel_redrive
SELECT t.*, (SELECT name FROM postbox.queues WHERE id = t.dead_letter_queue_id) AS dead_letter_queue,
       (SELECT name FROM postbox.queues WHERE id = t.destination_queue_id) AS destination
FROM postbox.cancel_redrive($1) t

-- name: send_batch
-- Two arrays, not a row per message: decoding 1,000 records and formatting their
-- ids in Python cost more than the rest of the server's part of a SendBatch.
SELECT coalesce(array_agg(s.message_id::text ORDER BY s.n), '{}'),
       coalesce(array_agg(s.duplicate ORDER BY s.n), '{}')
FROM postbox.send_batch($1, $2, $3::jsonb[], $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
     WITH ORDINALITY AS s(message_id, duplicate, n)

-- name: send_batch_relaxed
-- send_batch whose transaction commits with synchronous_commit off (relaxed_durability):
-- set_config(..., true) holds to the end of the transaction, the statement's own
-- outside a transaction block, so it costs no BEGIN and COMMIT round trips. In the
-- queue argument, so that it is set before send_batch runs.
SELECT coalesce(array_agg(s.message_id::text ORDER BY s.n), '{}'),
       coalesce(array_agg(s.duplicate ORDER BY s.n), '{}')
FROM postbox.send_batch((SELECT $1::text FROM set_config('synchronous_commit', 'off', true)),
                        $2, $3::jsonb[], $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
     WITH ORDINALITY AS s(message_id, duplicate, n)

-- name: receive
SELECT * FROM postbox.receive($1, $2, $3, $4, $5, $6)

-- name: next_visible_at
SELECT postbox.next_visible_at($1, $2)

-- name: receive_floor
SELECT postbox.receive_floor($1)

-- name: release
SELECT postbox.release($1, $2)

-- name: delete
SELECT postbox.delete($1, $2, $3)

-- name: delete_batch
SELECT outcome FROM postbox.delete_batch($1, $2, $3) ORDER BY i

-- name: delete_and_receive
-- A stream's settled batch deleted and its next batch claimed in one statement:
-- one round trip and one commit where two calls took two of each. The left join
-- runs the deletes first; the claim's row columns are null when it found nothing.
SELECT d.outcomes, r.*
FROM (SELECT array_agg(outcome ORDER BY i) AS outcomes FROM postbox.delete_batch($1, $2)) d
LEFT JOIN LATERAL postbox.receive($1, $3, $4, $5, $6, $7) r ON true

-- name: change_visibility
SELECT postbox.change_visibility($1, $2, $3)

-- name: delivery_receipts
SELECT postbox.delivery_receipts($1, $2, $3)

-- name: change_visibility_batch
SELECT outcome FROM postbox.change_visibility_batch($1, $2, $3) ORDER BY i

-- name: receipts_in_flight
SELECT postbox.receipts_in_flight($1)

-- name: nack
SELECT postbox.nack($1, $2, $3, $4, $5)

-- name: nack_batch
SELECT outcome FROM postbox.nack_batch($1, $2) ORDER BY i

-- name: peek_messages
SELECT * FROM postbox.peek_messages($1, $2, $3, $4)

-- name: get_message
SELECT * FROM postbox.get_message($1, $2)

-- name: list_messages
SELECT * FROM postbox.list_messages($1, $2, $3, $4)

-- name: cancel_message
SELECT postbox.cancel_message($1, $2)

-- name: list_archived_messages
SELECT * FROM postbox.list_archived_messages($1, $2, $3)

-- Maintenance jobs: each claims its rows with SKIP LOCKED.

-- name: run_redrives
SELECT postbox.run_redrives($1)

-- name: expire_messages
SELECT postbox.expire_messages($1)

-- name: expire_records
SELECT postbox.expire_records($1)

-- name: expire_activity
SELECT postbox.expire_activity()

-- name: record_activity
SELECT postbox.record_activity($1, $2, $3, $4, $5, $6, $7)

-- Payload schemas: what a server's schema cache looks up (services/payload_schemas.py).

-- name: queue_payload_schema
SELECT payload_schema FROM postbox.queues WHERE name = $1

-- Topics.

-- name: create_topic
SELECT * FROM postbox.create_topic($1, $2::jsonb, $3::jsonb, $4, $5::jsonb)

-- name: update_topic
SELECT * FROM postbox.update_topic($1, $2, $3::jsonb, $4::jsonb, $5, $6::jsonb)

-- name: topic_payload_schema
SELECT payload_schema FROM postbox.topics WHERE name = $1

-- name: get_topic
SELECT * FROM postbox.get_topic($1)

-- name: list_topics
SELECT * FROM postbox.list_topics($1, $2)

-- name: delete_topic
SELECT postbox.delete_topic($1)

-- Subscription rows come with their topic and queue names.

-- name: create_subscription
SELECT s.*, (SELECT t.name FROM postbox.topics t WHERE t.id = s.topic_id) AS topic,
       (SELECT q.name FROM postbox.queues q WHERE q.id = s.queue_id) AS queue
FROM postbox.create_subscription($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9, $10::jsonb, $11) s

-- name: get_subscription
SELECT s.*, (SELECT t.name FROM postbox.topics t WHERE t.id = s.topic_id) AS topic,
       (SELECT q.name FROM postbox.queues q WHERE q.id = s.queue_id) AS queue
FROM postbox.get_subscription($1, $2) s

-- name: list_subscriptions
SELECT s.*, (SELECT t.name FROM postbox.topics t WHERE t.id = s.topic_id) AS topic,
       (SELECT q.name FROM postbox.queues q WHERE q.id = s.queue_id) AS queue
FROM postbox.list_subscriptions($1, $2, $3) s

-- name: update_subscription
SELECT s.*, (SELECT t.name FROM postbox.topics t WHERE t.id = s.topic_id) AS topic,
       (SELECT q.name FROM postbox.queues q WHERE q.id = s.queue_id) AS queue
FROM postbox.update_subscription($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9::jsonb, $10, $11::jsonb, $12) s

-- name: delete_subscription
SELECT postbox.delete_subscription($1, $2)

-- name: publish_delayed
SELECT postbox.publish_delayed($1, $2, $3, $4, $5::text::jsonb, $6, $7)

-- name: publish_batch
SELECT * FROM postbox.publish_batch($1, $2, $3, $4::jsonb[], $5, $6, $7, $8::jsonb[], $9, $10, $11, $12)

-- name: sns_signing_needs
SELECT coalesce(array_agg(DISTINCT s.sns ->> 'topic_arn') FILTER (WHERE s.id IS NOT NULL), '{}') AS topic_arns,
       t.sns_attributes ->> 'SignatureVersion' AS signature_version
FROM postbox.topics t
LEFT JOIN postbox.subscriptions s
       ON s.topic_id = t.id AND s.sns IS NOT NULL AND NOT coalesce((s.sns ->> 'raw')::boolean, false)
WHERE t.name = $1
GROUP BY t.id

-- name: list_webhook_deliveries
SELECT * FROM postbox.list_webhook_deliveries($1, $2, $3, $4, $5)

-- name: retry_webhook_deliveries
SELECT postbox.retry_webhook_deliveries($1, $2, $3)

-- Webhook delivery: claims with SKIP LOCKED, then one finish per attempt.

-- name: claim_webhook_deliveries
SELECT * FROM postbox.claim_webhook_deliveries($1)

-- name: finish_webhook_deliveries
SELECT outcome FROM postbox.finish_webhook_deliveries($1, $2, $3, $4)

-- name: next_webhook_attempt_at
SELECT postbox.next_webhook_attempt_at()

-- name: expire_webhook_deliveries
SELECT postbox.expire_webhook_deliveries($1)

-- Schedules.

-- name: create_schedule
SELECT * FROM postbox.create_schedule($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13)

-- name: update_schedule
SELECT * FROM postbox.update_schedule($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14)

-- name: get_schedule
SELECT * FROM postbox.get_schedule($1)

-- name: list_schedules
SELECT * FROM postbox.list_schedules($1, $2, $3, $4, $5)

-- name: delete_schedule
SELECT postbox.delete_schedule($1)

-- name: pause_schedule
SELECT * FROM postbox.pause_schedule($1)

-- name: run_schedule
SELECT (r.schedule).*, coalesce(r.message_ids, '{}') AS message_ids FROM postbox.run_schedule($1) r

-- Resuming and firing compute the next fire time between two statements of one
-- transaction, from the locked row and the database's clock.

-- name: lock_schedule
SELECT s.*, now() AS db_now FROM postbox.lock_schedule($1) s

-- name: resume_schedule
SELECT * FROM postbox.resume_schedule($1, $2)

-- name: claim_due_schedules
SELECT s.*, now() AS db_now FROM postbox.claim_due_schedules($1) s

-- name: fire_schedule
SELECT * FROM postbox.fire_schedule($1, $2, $3)

-- name: next_schedule_fire_at
SELECT postbox.next_schedule_fire_at()

-- API keys.

-- name: create_key
SELECT * FROM postbox.create_key($1, $2, $3, $4, $5, $6, $7, $8)

-- name: get_key
SELECT * FROM postbox.get_key($1, $2)

-- name: list_keys
SELECT * FROM postbox.list_keys($1, $2, $3)

-- name: update_key
SELECT * FROM postbox.update_key($1, $2, $3, $4, $5, $6, $7, $8)

-- name: delete_key
SELECT postbox.delete_key($1, $2)

-- Tenants.

-- name: create_tenant
SELECT * FROM postbox.create_tenant($1, $2, $3, $4, $5)

-- name: get_tenant
SELECT * FROM postbox.get_tenant($1)

-- name: list_tenants
SELECT * FROM postbox.list_tenants($1, $2)

-- name: update_tenant
SELECT * FROM postbox.update_tenant($1, $2, $3, $4, $5, $6, $7, $8)

-- name: delete_tenant
SELECT postbox.delete_tenant($1, $2)

-- name: tenant_usage
SELECT * FROM postbox.tenant_usage($1)

-- name: tenant_accounts
SELECT name, account_id FROM postbox.tenants

-- name: queue_metrics
SELECT * FROM postbox.queue_metrics($1)

-- Stream topics: consumer groups and their reads.

-- name: create_consumer_group
SELECT * FROM postbox.create_consumer_group($1, $2, $3, $4, $5)

-- name: set_consumer_group_max_deliveries
SELECT * FROM postbox.set_consumer_group_max_deliveries($1, $2, $3)

-- name: list_stream_dead_letters
SELECT * FROM postbox.list_stream_dead_letters($1, $2, $3, $4)

-- name: replay_stream_dead_letters
SELECT postbox.replay_stream_dead_letters($1, $2, $3)

-- name: purge_stream_dead_letters
SELECT postbox.purge_stream_dead_letters($1, $2, $3)

-- name: get_consumer_group
SELECT * FROM postbox.get_consumer_group($1, $2)

-- name: list_consumer_groups
SELECT * FROM postbox.list_consumer_groups($1, $2, $3)

-- name: delete_consumer_group
SELECT postbox.delete_consumer_group($1, $2)

-- name: pause_consumer_group
SELECT * FROM postbox.pause_consumer_group($1, $2)

-- name: resume_consumer_group
SELECT * FROM postbox.resume_consumer_group($1, $2)

-- name: read_stream
SELECT * FROM postbox.read_stream($1, $2, $3, $4, $5, $6)

-- name: ack_stream
SELECT postbox.ack_stream($1, $2, $3, $4, $5)

-- name: seek_consumer_group
SELECT * FROM postbox.seek_consumer_group($1, $2, $3, $4)

-- name: read_stream_range
SELECT * FROM postbox.read_stream_range($1, $2, $3, $4, $5, $6)

-- name: read_stream_positions
SELECT * FROM postbox.read_stream_positions($1, $2, $3, $4, $5, $6)

-- name: stream_position
SELECT * FROM postbox.stream_position($1, $2)

-- name: set_consumer_group_cursor
SELECT * FROM postbox.set_consumer_group_cursor($1, $2, $3, $4)

-- name: rotate_streams
SELECT postbox.rotate_streams($1, $2)

-- name: publish_due_streams
SELECT postbox.publish_due_streams($1)

-- name: consumer_metrics
SELECT * FROM postbox.consumer_metrics($1)

-- name: stream_metrics
SELECT * FROM postbox.stream_metrics($1)
