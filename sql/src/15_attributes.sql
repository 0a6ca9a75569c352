-- The message of an attribute check, or NULL when the attribute is valid.
-- Attributes are jsonb objects {"<name>": {"data_type": "String", "string_value": "..."}}
-- with "binary_value" (base64) for Binary types, as the API's AttributeValue.
CREATE FUNCTION postbox.attribute_problem(name text, attribute jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN length(name) NOT BETWEEN 1 AND 256 THEN
            format('attribute name %s must be 1 to 256 characters long', quote_literal(name))
        WHEN name !~ '^[A-Za-z0-9_.-]+$' THEN
            format('attribute name %s may only contain A-Z, a-z, 0-9, "_", "-" and "."', quote_literal(name))
        WHEN name ~* '^(aws|amazon)\.' THEN
            format('attribute name %s must not start with "AWS." or "Amazon."', quote_literal(name))
        WHEN name ~ '(^\.|\.$|\.\.)' THEN
            format('attribute name %s must not start or end with "." nor contain ".."', quote_literal(name))
        WHEN jsonb_typeof(attribute) IS DISTINCT FROM 'object' THEN
            format('attribute %s must be an object with data_type and a value', quote_literal(name))
        WHEN NOT coalesce(attribute ->> 'data_type' ~ '^(String|Number|Binary)(\.[^[:cntrl:]]+)?$', false)
             OR length(attribute ->> 'data_type') > 256 THEN
            format('attribute %s: data_type must be String, Number or Binary, optionally with a '
                   'custom suffix such as "Number.float" (256 characters at most)', quote_literal(name))
        WHEN attribute ->> 'data_type' ~ '^Binary' THEN CASE
            WHEN coalesce(attribute ->> 'binary_value', '') = '' THEN
                format('attribute %s of type %s needs a non-empty binary value',
                       quote_literal(name), attribute ->> 'data_type')
            WHEN attribute ? 'string_value' THEN
                format('attribute %s of type %s takes a binary value, not a string value',
                       quote_literal(name), attribute ->> 'data_type')
            END
        WHEN coalesce(attribute ->> 'string_value', '') = '' THEN
            format('attribute %s of type %s needs a non-empty string value',
                   quote_literal(name), attribute ->> 'data_type')
        WHEN attribute ? 'binary_value' THEN
            format('attribute %s of type %s takes a string value, not a binary value',
                   quote_literal(name), attribute ->> 'data_type')
        WHEN attribute ->> 'data_type' ~ '^Number'
             AND attribute ->> 'string_value' !~ '^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$' THEN
            format('attribute %s of type %s must hold a decimal number, not %s',
                   quote_literal(name), attribute ->> 'data_type', quote_literal(attribute ->> 'string_value'))
    END
$$;

-- The first problem of a batch's per-entry attributes (see attribute_problem),
-- named by entry as _entry_prefix does for a batch of n; NULL when all are
-- valid.
CREATE FUNCTION postbox._attributes_problem(attributes jsonb[], n integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    problem text;
BEGIN
    SELECT postbox._entry_prefix(i, n) || coalesce(
               CASE WHEN jsonb_typeof(a) <> 'object'
                    THEN 'attributes must be a JSON object keyed by attribute name'
                    WHEN (SELECT count(*) FROM jsonb_object_keys(a)) > 100
                    THEN format('%s attributes; a message may have at most 100',
                                (SELECT count(*) FROM jsonb_object_keys(a)))
               END,
               (SELECT postbox.attribute_problem(e.key, e.value)
                FROM jsonb_each(a) AS e
                WHERE postbox.attribute_problem(e.key, e.value) IS NOT NULL
                LIMIT 1))
    INTO problem
    FROM unnest(attributes) WITH ORDINALITY AS t(a, i)
    WHERE a IS NOT NULL AND (
        jsonb_typeof(a) <> 'object'
        OR (SELECT count(*) FROM jsonb_object_keys(a)) > 100
        OR EXISTS (SELECT FROM jsonb_each(a) AS e WHERE postbox.attribute_problem(e.key, e.value) IS NOT NULL))
    LIMIT 1;
    RETURN problem;
END
$$;

-- The attribute part of message_size. PL/pgSQL, so that its plan is cached:
-- a SQL function with a sub-SELECT is planned anew on every call.
CREATE FUNCTION postbox._attributes_size(attributes jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(attributes) IS DISTINCT FROM 'object' THEN
        RETURN 0;
    END IF;
    RETURN coalesce((
        SELECT sum(octet_length(e.key) + octet_length(e.value ->> 'data_type')
                   + coalesce(octet_length(e.value ->> 'string_value'),
                              octet_length(decode(e.value ->> 'binary_value', 'base64')), 0))
        FROM jsonb_each(attributes) AS e), 0);
END
$$;

-- Size of a message as SQS counts it: body plus each attribute's name, type and
-- value. A plain expression, which the planner inlines into the caller.
CREATE FUNCTION postbox.message_size(body bytea, attributes jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(body) + CASE WHEN attributes IS NULL THEN 0
                                     ELSE postbox._attributes_size(attributes) END
$$;
