-- Proposed engine changes, measured with `python -m bench --apply-sql bench/proposals/engine-fast-paths.sql`
-- against the same run without them. Not installed by the server: the engine's
-- owner decides. Each fixes a cost the bench found.

-- 1. send_batch checks every entry's size with message_size(), a SQL function the
--    planner cannot inline (it has a subquery over jsonb_each): ~45 us per entry,
--    over half of a 500-entry send_batch. Without attributes the size is the body's.
CREATE OR REPLACE FUNCTION postbox.message_size(body bytea, attributes jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(body) + CASE WHEN attributes IS NULL THEN 0 ELSE coalesce((
        SELECT sum(octet_length(e.key) + octet_length(e.value ->> 'data_type')
                   + coalesce(octet_length(e.value ->> 'string_value'),
                              octet_length(decode(e.value ->> 'binary_value', 'base64')), 0))
        FROM jsonb_each(attributes) AS e
        WHERE jsonb_typeof(attributes) = 'object'), 0) END
$$;

-- 2. receive's priority-0 branch filters on priority = 0, which messages_ready_idx
--    does not hold. With statistics from an emptier table (a burst after a quiet
--    spell, a fresh install) the planner then sorts the whole backlog for each
--    claim: 40-55 ms per receive at 30k waiting messages instead of 0.2 ms. A
--    partial index matching the branch keeps the plan an ordered scan with LIMIT.
CREATE INDEX IF NOT EXISTS messages_ready_normal_idx
    ON postbox.messages (queue_id, visible_at, id) WHERE priority = 0;
