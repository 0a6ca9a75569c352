-- Statements the server sends. Each calls one function of the SQL engine
-- (sql/postbox--*.sql), where the rules live; the server only binds values.

-- name: ping
SELECT 1

-- name: create_queue
SELECT * FROM postbox.create_queue($1, $2::jsonb)

-- name: get_queue
SELECT * FROM postbox.get_queue($1)

-- name: get_queue_with_stats
SELECT q.*, s.* FROM postbox.get_queue($1) q, postbox.queue_stats($1) s

-- name: list_queues
SELECT * FROM postbox.list_queues($1, $2, $3)

-- name: update_queue
SELECT * FROM postbox.update_queue($1, $2::jsonb)

-- name: drop_queue
SELECT postbox.drop_queue($1)

-- name: purge_queue
SELECT postbox.purge_queue($1)

-- name: send
SELECT postbox.send($1, $2, $3::jsonb, $4)

-- name: send_batch
SELECT id FROM postbox.send_batch($1, $2, $3::jsonb[], $4) AS id

-- name: receive
SELECT * FROM postbox.receive($1, $2, $3)

-- name: next_visible_at
SELECT postbox.next_visible_at($1)

-- name: release
SELECT postbox.release($1, $2)

-- name: delete_batch
SELECT outcome FROM postbox.delete_batch($1, $2) ORDER BY i

-- name: change_visibility_batch
SELECT outcome FROM postbox.change_visibility_batch($1, $2, $3) ORDER BY i

-- name: delete
SELECT postbox.delete($1, $2)

-- name: change_visibility
SELECT postbox.change_visibility($1, $2, $3)
