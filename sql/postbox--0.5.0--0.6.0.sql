-- postbox 0.5.0 -> 0.6.0: settling by receipt costs less. Receipts are checked
-- with a pattern without counted repetitions and the dashes' places, not with
-- translate(), which walks multibyte characters; and when every receipt of a
-- batch settled its message, the outcomes are all 'ok' without a second parse.
-- Apply with `psql -1 -f`, ALTER EXTENSION postbox UPDATE, or `postbox migrate`.

-- Splits receipts into (position, message id, lease); malformed ones get NULLs.
CREATE OR REPLACE FUNCTION postbox._parse_receipts(receipts text[])
RETURNS TABLE (i bigint, receipt text, message_id bigint, lease uuid)
LANGUAGE sql IMMUTABLE AS $$
    -- A pattern without counted repetitions, then lengths and the dashes'
    -- places: counted repetitions cost more than the rest of a delete together,
    -- and translate() walks the text character by character as multibyte.
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
          FROM unnest(receipts) WITH ORDINALITY AS u(r, i), strpos(r, ':') AS colon) AS t
$$;

-- Outcome per receipt of an operation that matched `done` of them:
-- 'ok', 'invalid' (malformed), 'stale' (delivered again since) or 'not_found'.
CREATE OR REPLACE FUNCTION postbox._receipt_outcomes(q postbox.queues, receipts text[], done bigint[])
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

INSERT INTO postbox.schema_version (version) VALUES ('0.6.0');
