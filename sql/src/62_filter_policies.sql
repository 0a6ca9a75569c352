-- Subscription filter policies in the grammar of Amazon SNS: a JSON object of
-- keys, each an array of conditions (any may match) or, in the body scope, an
-- object of nested keys; all keys must match. The scope is 'attributes' (SNS's
-- MessageAttributes, matched against _filter_document of the attributes) or
-- 'body' (MessageBody, matched against the body parsed as a JSON object).
-- Policies are data walked by these functions, never SQL.

-- A policy value shown in a message: its JSON, cut to a short prefix with its length.
CREATE FUNCTION postbox._filter_quote(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(value::text) <= 80 THEN value::text
                ELSE left(value::text, 80) || '… (' || octet_length(value::text) || ' bytes)' END
$$;

-- Whether a "$or" key's value makes it an OR, as SNS decides: an array of at
-- least two objects, none of which has an operator's name as a key. Otherwise
-- "$or" is an ordinary key.
CREATE FUNCTION postbox._filter_is_or(value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(value) = 'array' THEN
        jsonb_array_length(value) >= 2
        AND NOT EXISTS (
            SELECT FROM jsonb_array_elements(value) AS e
            WHERE jsonb_typeof(e) <> 'object'
               OR EXISTS (SELECT FROM jsonb_object_keys(e) AS k
                          WHERE k IN ('prefix', 'suffix', 'equals-ignore-case', 'anything-but', 'numeric',
                                      'exists', 'cidr', 'wildcard')))
        ELSE false END
$$;

-- The problem of a number in a policy, or NULL: SNS takes -10^9 to 10^9. More
-- digits after the decimal point than SNS's five are taken, and ignored (see
-- _filter_fixed).
CREATE FUNCTION postbox._filter_number_problem(value jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN abs(value::numeric) > 1000000000 THEN
            format('number %s is out of range; numbers lie between -1000000000 and 1000000000',
                   postbox._filter_quote(value))
    END
$$;

-- A number as filter policies compare it: cut to the five digits after the
-- decimal point SNS matches with ("five digits of accuracy"), towards minus
-- infinity, as SNS's rule engine cuts its fixed-point form.
CREATE FUNCTION postbox._filter_fixed(n numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT floor(n * 100000) / 100000
$$;

-- Whether a policy value equals a document value: numbers by _filter_fixed,
-- the rest as jsonb.
CREATE FUNCTION postbox._filter_same(a jsonb, b jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(a) = 'number' AND jsonb_typeof(b) = 'number'
                THEN postbox._filter_fixed(a::numeric) = postbox._filter_fixed(b::numeric)
                ELSE a = b END
$$;

-- The problem of a "numeric" operator's array, or NULL: [op, n] with op one of
-- = < <= > >=, or a range [> or >=, low, < or <=, high] with low below high.
CREATE FUNCTION postbox._filter_numeric_problem(arg jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(arg) IS DISTINCT FROM 'array' OR jsonb_array_length(arg) NOT IN (2, 4) THEN
        RETURN format('numeric takes [operator, number] or a range [">", low, "<", high], not %s',
                      postbox._filter_quote(arg));
    END IF;
    IF jsonb_typeof(arg -> 0) <> 'string' OR arg ->> 0 NOT IN ('=', '<', '<=', '>', '>=') THEN
        RETURN format('numeric operator %s is unknown; the operators are =, <, <=, > and >=',
                      postbox._filter_quote(arg -> 0));
    END IF;
    IF jsonb_typeof(arg -> 1) <> 'number' THEN
        RETURN format('numeric %s must be followed by a number, not %s', arg ->> 0, postbox._filter_quote(arg -> 1));
    END IF;
    IF jsonb_array_length(arg) = 2 THEN
        RETURN postbox._filter_number_problem(arg -> 1);
    END IF;
    IF arg ->> 0 NOT IN ('>', '>=') OR jsonb_typeof(arg -> 2) <> 'string' OR arg ->> 2 NOT IN ('<', '<=') THEN
        RETURN format('a numeric range starts with > or >= and a lower bound and ends with < or <= and an '
                      'upper bound, not %s', postbox._filter_quote(arg));
    END IF;
    IF jsonb_typeof(arg -> 3) <> 'number' THEN
        RETURN format('numeric %s must be followed by a number, not %s', arg ->> 2, postbox._filter_quote(arg -> 3));
    END IF;
    IF (arg -> 1)::numeric >= (arg -> 3)::numeric THEN
        RETURN format('numeric range %s is empty: its lower bound must be below its upper bound',
                      postbox._filter_quote(arg));
    END IF;
    RETURN coalesce(postbox._filter_number_problem(arg -> 1), postbox._filter_number_problem(arg -> 3));
END
$$;

-- The problem of one condition of a key's array, or NULL: a string, number,
-- true, false or null to equal, or an object of one operator.
CREATE FUNCTION postbox._filter_condition_problem(condition jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    op text;
    arg jsonb;
    element jsonb;
BEGIN
    CASE jsonb_typeof(condition)
    WHEN 'string', 'boolean', 'null' THEN
        RETURN NULL;
    WHEN 'number' THEN
        RETURN postbox._filter_number_problem(condition);
    WHEN 'array' THEN
        RETURN format('a condition cannot be an array (%s); list the values in the key''s own array',
                      postbox._filter_quote(condition));
    ELSE
        NULL;
    END CASE;
    IF (SELECT count(*) FROM jsonb_object_keys(condition)) <> 1 THEN
        RETURN format('a condition object holds exactly one operator, not %s',
                      postbox._filter_quote(condition));
    END IF;
    SELECT e.key, e.value INTO op, arg FROM jsonb_each(condition) AS e;
    CASE op
    WHEN 'prefix', 'suffix', 'equals-ignore-case' THEN
        IF jsonb_typeof(arg) <> 'string' THEN
            RETURN format('%s takes a string, not %s', op, postbox._filter_quote(arg));
        END IF;
    WHEN 'exists' THEN
        IF jsonb_typeof(arg) <> 'boolean' THEN
            RETURN format('exists takes true or false, not %s', postbox._filter_quote(arg));
        END IF;
    WHEN 'numeric' THEN
        RETURN postbox._filter_numeric_problem(arg);
    WHEN 'anything-but' THEN
        CASE jsonb_typeof(arg)
        WHEN 'string' THEN
            NULL;
        WHEN 'number' THEN
            RETURN postbox._filter_number_problem(arg);
        WHEN 'array' THEN
            IF jsonb_array_length(arg) = 0 THEN
                RETURN 'anything-but needs at least one value';
            END IF;
            FOR element IN SELECT jsonb_array_elements(arg) LOOP
                IF jsonb_typeof(element) = 'number' THEN
                    IF postbox._filter_number_problem(element) IS NOT NULL THEN
                        RETURN postbox._filter_number_problem(element);
                    END IF;
                ELSIF jsonb_typeof(element) <> 'string' THEN
                    RETURN format('anything-but lists strings and numbers, not %s', postbox._filter_quote(element));
                END IF;
            END LOOP;
        WHEN 'object' THEN
            IF (SELECT count(*) FROM jsonb_object_keys(arg)) <> 1
               OR coalesce(jsonb_typeof(arg -> 'prefix'), jsonb_typeof(arg -> 'suffix')) IS DISTINCT FROM 'string' THEN
                RETURN format('anything-but takes a value, an array of values, {"prefix": "..."} or '
                              '{"suffix": "..."}, not %s', postbox._filter_quote(arg));
            END IF;
        ELSE
            RETURN format('anything-but takes a value, an array of values, {"prefix": "..."} or '
                          '{"suffix": "..."}, not %s', postbox._filter_quote(arg));
        END CASE;
    ELSE
        RETURN format('unknown operator %s; the operators are prefix, suffix, equals-ignore-case, anything-but, '
                      'numeric and exists', postbox._filter_quote(to_jsonb(op)));
    END CASE;
    RETURN NULL;
END
$$;

-- Walks a policy object (the whole policy, a nested key's object, or a "$or"
-- alternative): its first problem, or its count of keys holding conditions (a
-- "$or" counts its largest alternative) and its combinations of values (the
-- product of the arrays' lengths, each weighted by its key's nesting depth as
-- SNS counts it; a "$or" the sum of its alternatives'). depth counts enclosing
-- nested keys, level all recursion, which 150 bounds: past it no policy keeps
-- within 150 combinations, and the stack stays small.
CREATE FUNCTION postbox._filter_policy_walk(node jsonb, scope text, path text, depth integer, level integer,
                                            OUT problem text, OUT keys integer, OUT combinations numeric)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    here text;
    sub record;
    alternative jsonb;
    widest integer;
    total numeric;
    condition jsonb;
BEGIN
    keys := 0;
    combinations := 1;
    IF level > 150 THEN
        problem := format('filter policy nests more than 150 levels deep at %s; it cannot keep within 150 '
                          'combinations of values', postbox._filter_quote(to_jsonb(path)));
        RETURN;
    END IF;
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(node) AS e LOOP
        here := CASE WHEN path = '' THEN k ELSE path || '.' || k END;
        IF k = '$or' AND postbox._filter_is_or(v) THEN
            widest := 0;
            total := 0;
            FOR alternative IN SELECT jsonb_array_elements(v) LOOP
                IF alternative = '{}' THEN
                    problem := format('an alternative of %s is an empty object; give each at least one key',
                                      postbox._filter_quote(to_jsonb(here)));
                    RETURN;
                END IF;
                sub := postbox._filter_policy_walk(alternative, scope, path, depth, level + 1);
                IF sub.problem IS NOT NULL THEN
                    problem := sub.problem;
                    RETURN;
                END IF;
                widest := greatest(widest, sub.keys);
                total := total + sub.combinations;
            END LOOP;
            keys := keys + widest;
            combinations := combinations * total;
        ELSIF jsonb_typeof(v) = 'object' THEN
            IF scope = 'attributes' THEN
                problem := format('key %s holds an object, but only the body scope (MessageBody) nests keys; '
                                  'give an array of conditions', postbox._filter_quote(to_jsonb(here)));
                RETURN;
            ELSIF v = '{}' THEN
                problem := format('key %s holds an empty object; give it nested keys or an array of conditions',
                                  postbox._filter_quote(to_jsonb(here)));
                RETURN;
            END IF;
            sub := postbox._filter_policy_walk(v, scope, here, depth + 1, level + 1);
            IF sub.problem IS NOT NULL THEN
                problem := sub.problem;
                RETURN;
            END IF;
            keys := keys + sub.keys;
            combinations := combinations * sub.combinations;
        ELSIF jsonb_typeof(v) = 'array' THEN
            IF k = '$or' AND jsonb_array_length(v) = 1 AND postbox._filter_is_or(v || v) THEN
                problem := format('%s has one alternative; "$or" needs at least two',
                                  postbox._filter_quote(to_jsonb(here)));
                RETURN;
            ELSIF jsonb_array_length(v) = 0 THEN
                problem := format('key %s has an empty array; give at least one condition',
                                  postbox._filter_quote(to_jsonb(here)));
                RETURN;
            END IF;
            FOR condition IN SELECT jsonb_array_elements(v) LOOP
                problem := postbox._filter_condition_problem(condition);
                IF problem IS NOT NULL THEN
                    problem := format('key %s: %s', postbox._filter_quote(to_jsonb(here)), problem);
                    RETURN;
                END IF;
            END LOOP;
            keys := keys + 1;
            combinations := combinations * jsonb_array_length(v) * greatest(depth, 1);
        ELSE
            problem := format('key %s must hold an array of conditions%s, not %s',
                              postbox._filter_quote(to_jsonb(here)),
                              CASE WHEN scope = 'body' THEN ' or an object of nested keys' ELSE '' END,
                              postbox._filter_quote(v));
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The problem of a filter policy for a scope ('attributes' or 'body'), or NULL
-- when it is valid (a NULL policy is none, and valid). The size limit applies
-- to the policy's canonical JSON; the caller checks the text it was given.
CREATE FUNCTION postbox.filter_policy_problem(policy jsonb, scope text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    walk record;
BEGIN
    IF scope IS NULL OR scope NOT IN ('attributes', 'body') THEN
        RETURN format('filter policy scope must be "attributes" (MessageAttributes) or "body" (MessageBody), not %s',
                      coalesce(postbox._filter_quote(to_jsonb(scope)), 'null'));
    ELSIF policy IS NULL THEN
        RETURN NULL;
    ELSIF jsonb_typeof(policy) <> 'object' THEN
        RETURN format('filter policy must be a JSON object of keys, not %s', postbox._filter_quote(policy));
    ELSIF octet_length(policy::text) > 262144 THEN
        RETURN format('filter policy is %s bytes long; the limit is 256 KiB (262144 bytes)',
                      octet_length(policy::text));
    END IF;
    walk := postbox._filter_policy_walk(policy, scope, '', 0, 0);
    IF walk.problem IS NOT NULL THEN
        RETURN walk.problem;
    ELSIF walk.keys > 5 THEN
        RETURN format('filter policy has %s keys with conditions; the limit is 5%s', walk.keys,
                      CASE WHEN policy::text LIKE '%"$or"%' THEN ' (a "$or" counts its largest alternative)' ELSE '' END);
    ELSIF walk.combinations > 150 THEN
        RETURN format('filter policy has %s combinations of values; the limit is 150 (multiply the lengths of its '
                      'arrays of conditions%s; a "$or" adds up its alternatives)', walk.combinations,
                      CASE WHEN scope = 'body' THEN ', each times the nesting depth of its key' ELSE '' END);
    END IF;
    RETURN NULL;
END
$$;

-- One attribute as a filter document value, or NULL to leave it out: String
-- types a JSON string, Number types a JSON number, String.Array the JSON
-- array or number it holds ("100" is the number 100, as SNS matches it), else
-- a string, Binary nothing (SNS ignores
-- binary attributes). A number too far out of numeric's range stays a string.
CREATE FUNCTION postbox._filter_attribute_value(attribute jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    data_type text := attribute ->> 'data_type';
    string_value text := attribute ->> 'string_value';
    parsed jsonb;
BEGIN
    IF data_type IS NULL OR string_value IS NULL THEN
        RETURN NULL;
    ELSIF data_type = 'String.Array' THEN
        -- Only what may be a JSON array or number is parsed, in a subtransaction.
        IF ltrim(string_value, E' \t\n\r') ~ '^(\[|[0-9-])' THEN
            BEGIN
                parsed := string_value::jsonb;
            EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
                parsed := NULL;
            END;
            IF jsonb_typeof(parsed) IN ('array', 'number') THEN
                RETURN parsed;
            END IF;
        END IF;
        RETURN to_jsonb(string_value);
    ELSIF data_type LIKE 'Number%' THEN
        IF length(string_value) <= 1000
           AND string_value ~ '^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?$' THEN
            RETURN to_jsonb(string_value::numeric);
        END IF;
        RETURN to_jsonb(string_value);
    ELSIF data_type LIKE 'String%' THEN
        RETURN to_jsonb(string_value);
    END IF;
    RETURN NULL;
END
$$;

-- The attributes as the document an attribute-scope policy matches: an object
-- of each attribute's _filter_attribute_value, binary ones left out.
CREATE FUNCTION postbox._filter_document(attributes jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(attributes) IS DISTINCT FROM 'object' THEN
        RETURN '{}';
    END IF;
    RETURN coalesce((
        SELECT jsonb_object_agg(e.key, v.value)
        FROM jsonb_each(attributes) AS e, postbox._filter_attribute_value(e.value) AS v(value)
        WHERE v.value IS NOT NULL), '{}');
END
$$;

-- The body as the document a body-scope policy matches, or NULL when it is not
-- a UTF-8 JSON object. Exposed so that a publish can parse a body once for all
-- of a topic's subscriptions.
CREATE FUNCTION postbox._filter_body_document(body bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    document jsonb;
BEGIN
    -- Most bodies that are no JSON object fail here, without a subtransaction.
    IF body IS NULL OR substr(ltrim(body, '\x20090a0d'::bytea), 1, 1) <> '\x7b'::bytea THEN
        RETURN NULL;
    END IF;
    BEGIN
        document := convert_from(body, 'UTF8')::jsonb;
    EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
        RETURN NULL;
    END;
    RETURN CASE WHEN jsonb_typeof(document) = 'object' THEN document END;
END
$$;

-- What a document value holds for a policy key, as a JSON array: with objects
-- false its leaf values (itself when a scalar, none when an object: conditions
-- apply to leaves only), with objects true the objects a nested key walks
-- into (itself when an object); arrays give what their elements hold.
CREATE FUNCTION postbox._filter_values(value jsonb, objects boolean) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL THEN
        RETURN '[]';
    ELSIF jsonb_typeof(value) <> 'array' THEN
        RETURN CASE WHEN (jsonb_typeof(value) = 'object') = objects THEN jsonb_build_array(value) ELSE '[]' END;
    ELSIF NOT objects AND NOT EXISTS (
            SELECT FROM jsonb_array_elements(value) AS e WHERE jsonb_typeof(e) IN ('array', 'object')) THEN
        RETURN value;
    END IF;
    RETURN coalesce((SELECT jsonb_agg(h) FROM jsonb_array_elements(value) AS e,
                                              jsonb_array_elements(postbox._filter_values(e, objects)) AS h), '[]');
END
$$;

-- _filter_values of a key across a set of document objects (a JSON array).
CREATE FUNCTION postbox._filter_gather(nodes jsonb, key text, objects boolean) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_array_length(nodes) = 1 THEN
        RETURN postbox._filter_values(nodes -> 0 -> key, objects);
    END IF;
    RETURN coalesce((SELECT jsonb_agg(h) FROM jsonb_array_elements(nodes) AS n,
                                              jsonb_array_elements(postbox._filter_values(n -> key, objects)) AS h),
                    '[]');
END
$$;

-- Whether any of a key's conditions matches any of its leaf values. Equality
-- is jsonb's (strings to strings, numbers numerically, true, false, null);
-- prefix, suffix and equals-ignore-case look at strings, numeric at numbers;
-- anything-but needs a non-null value that is none of its values; exists asks
-- for a non-null value, or none, and exists false never matches an empty
-- document (SNS: "an empty set of attributes results in the filter not
-- matching").
CREATE FUNCTION postbox._filter_conditions_match(conditions jsonb, leaves jsonb, empty boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    condition jsonb;
    op text;
    arg jsonb;
    leaf jsonb;
    hit boolean;
BEGIN
    FOR condition IN SELECT jsonb_array_elements(conditions) LOOP
        IF jsonb_typeof(condition) = 'number' THEN
            IF EXISTS (SELECT FROM jsonb_array_elements(leaves) AS l WHERE postbox._filter_same(condition, l)) THEN
                RETURN true;
            END IF;
            CONTINUE;
        ELSIF jsonb_typeof(condition) <> 'object' THEN
            IF leaves @> jsonb_build_array(condition) THEN
                RETURN true;
            END IF;
            CONTINUE;
        END IF;
        SELECT e.key, e.value INTO op, arg FROM jsonb_each(condition) AS e LIMIT 1;
        IF op = 'exists' THEN
            IF arg = to_jsonb(EXISTS (SELECT FROM jsonb_array_elements(leaves) AS l WHERE l <> 'null'))
               AND (arg = 'true' OR NOT empty) THEN
                RETURN true;
            END IF;
            CONTINUE;
        END IF;
        FOR leaf IN SELECT jsonb_array_elements(leaves) LOOP
            hit := CASE op
                WHEN 'prefix' THEN
                    jsonb_typeof(leaf) = 'string' AND starts_with(leaf #>> '{}', arg #>> '{}')
                WHEN 'suffix' THEN
                    jsonb_typeof(leaf) = 'string' AND right(leaf #>> '{}', length(arg #>> '{}')) = arg #>> '{}'
                WHEN 'equals-ignore-case' THEN
                    jsonb_typeof(leaf) = 'string' AND lower(leaf #>> '{}') = lower(arg #>> '{}')
                WHEN 'anything-but' THEN
                    leaf <> 'null' AND CASE jsonb_typeof(arg)
                        WHEN 'object' THEN jsonb_typeof(leaf) = 'string' AND CASE
                            WHEN arg ? 'prefix' THEN NOT starts_with(leaf #>> '{}', arg ->> 'prefix')
                            ELSE right(leaf #>> '{}', length(arg ->> 'suffix')) <> arg ->> 'suffix' END
                        WHEN 'array' THEN NOT EXISTS (SELECT FROM jsonb_array_elements(arg) AS a
                                                      WHERE postbox._filter_same(a, leaf))
                        ELSE NOT postbox._filter_same(arg, leaf) END
                WHEN 'numeric' THEN
                    jsonb_typeof(leaf) = 'number' AND postbox._filter_numeric_matches(arg, leaf::numeric)
                ELSE false
            END;
            IF hit THEN
                RETURN true;
            END IF;
        END LOOP;
    END LOOP;
    RETURN false;
END
$$;

-- Whether a number meets a "numeric" operator's comparison or range, both
-- sides cut to five digits after the point (_filter_fixed).
CREATE FUNCTION postbox._filter_numeric_matches(arg jsonb, n numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT bool_and(CASE c.op
                        WHEN '=' THEN postbox._filter_fixed(n) = c.bound
                        WHEN '<' THEN postbox._filter_fixed(n) < c.bound
                        WHEN '<=' THEN postbox._filter_fixed(n) <= c.bound
                        WHEN '>' THEN postbox._filter_fixed(n) > c.bound
                        WHEN '>=' THEN postbox._filter_fixed(n) >= c.bound
                        ELSE false END)
    FROM (SELECT arg ->> i AS op, postbox._filter_fixed((arg -> (i + 1))::numeric) AS bound
          FROM generate_series(0, jsonb_array_length(arg) - 2, 2) AS i) AS c
$$;

-- Whether a policy object matches a set of document objects (a JSON array:
-- the document itself, or what a nested key reached, arrays flattened). Every
-- key must match; a key's leaves are gathered from all the objects, so each
-- key is matched on its own; "$or" needs one alternative to match. empty says
-- the document had no keys at all.
CREATE FUNCTION postbox._filter_policy_matches(policy jsonb, nodes jsonb, empty boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    alternative jsonb;
    matched boolean;
BEGIN
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(policy) AS e LOOP
        IF k = '$or' AND postbox._filter_is_or(v) THEN
            matched := false;
            FOR alternative IN SELECT jsonb_array_elements(v) LOOP
                IF postbox._filter_policy_matches(alternative, nodes, empty) THEN
                    matched := true;
                    EXIT;
                END IF;
            END LOOP;
            IF NOT matched THEN
                RETURN false;
            END IF;
        ELSIF jsonb_typeof(v) = 'object' THEN
            IF NOT postbox._filter_policy_matches(v, postbox._filter_gather(nodes, k, true), empty) THEN
                RETURN false;
            END IF;
        ELSIF jsonb_typeof(v) = 'array' THEN
            IF NOT postbox._filter_conditions_match(v, postbox._filter_gather(nodes, k, false), empty) THEN
                RETURN false;
            END IF;
        ELSE
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END
$$;

-- Whether a policy matches a document already made (_filter_document of the
-- attributes, or _filter_body_document of the body, NULL when the body is no
-- JSON object): NULL policy matches everything, a NULL document nothing else.
CREATE FUNCTION postbox._filter_matches_document(policy jsonb, document jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN policy IS NULL THEN true
        WHEN document IS NULL OR jsonb_typeof(policy) <> 'object' THEN false
        ELSE postbox._filter_policy_matches(policy, jsonb_build_array(document), document = '{}')
    END
$$;

-- Whether a message passes a subscription's filter policy in a scope:
-- 'attributes' matches the message's attributes, 'body' its body, which must
-- be a UTF-8 JSON object (else false, never an error). A NULL policy passes
-- everything. Semantics as SNS's: see _filter_policy_matches and
-- _filter_conditions_match.
CREATE FUNCTION postbox.filter_matches(policy jsonb, scope text, attributes jsonb, body bytea) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF policy IS NULL THEN
        RETURN true;
    ELSIF scope = 'attributes' THEN
        RETURN postbox._filter_matches_document(policy, postbox._filter_document(attributes));
    ELSIF scope = 'body' THEN
        RETURN postbox._filter_matches_document(policy, postbox._filter_body_document(body));
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PB400',
        MESSAGE = format('filter policy scope must be "attributes" or "body", not %s',
                         coalesce(quote_literal(scope), 'NULL'));
END
$$;
