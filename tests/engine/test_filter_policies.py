"""Filter policies in the Amazon SNS grammar, as the engine validates and evaluates them.

postbox.filter_policy_problem(policy, scope) names what is wrong with a policy (NULL when
it is valid); postbox.filter_matches(policy, scope, attributes, body) says whether a
message passes it. The tables hold the SNS documentation's own examples, every operator
matching and not matching, and one invalid policy per rule.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from support import create_database, drop_database

from postbox_server.db.migrate import migrate

ABSENT = object()  # no policy at all (SQL NULL)


@pytest.fixture(scope="module")
def engine_url(admin_url: str) -> Iterator[str]:
    """A database with the engine installed, shared by this module's tests."""
    url = create_database(admin_url, "postbox_filters")

    async def install() -> None:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(install())
    yield url
    drop_database(admin_url, url)


@pytest.fixture
async def conn(engine_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(engine_url)
    try:
        yield conn
    finally:
        await conn.close()


def s(value: str, data_type: str = "String") -> dict[str, str]:
    return {"data_type": data_type, "string_value": value}


def n(value: str, data_type: str = "Number") -> dict[str, str]:
    return {"data_type": data_type, "string_value": value}


def arr(values: list[Any]) -> dict[str, str]:
    return {"data_type": "String.Array", "string_value": json.dumps(values)}


BINARY = {"data_type": "Binary", "binary_value": "AAEC"}
OTHER = {"other": s("x")}  # an attribute the policies below do not name


async def problem(conn: asyncpg.Connection, policy: Any, scope: str) -> str | None:
    return await conn.fetchval(
        "SELECT postbox.filter_policy_problem($1::text::jsonb, $2)", json.dumps(policy), scope
    )


async def matches(
    conn: asyncpg.Connection, policy: Any, scope: str, attributes: Any = None, body: Any = None
) -> bool:
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    return await conn.fetchval(
        "SELECT postbox.filter_matches($1::text::jsonb, $2, $3::text::jsonb, $4)",
        None if policy is ABSENT else json.dumps(policy),
        scope,
        None if attributes is None else json.dumps(attributes),
        body,
    )


CI = "customer_interests"

# (policy, attributes, expected): MessageAttributes scope.
ATTRIBUTE_CASES = [
    # String exact matching (the SNS documentation's examples).
    ({CI: ["rugby", "tennis"]}, {CI: s("rugby")}, True),
    ({CI: ["rugby", "tennis"]}, {CI: s("tennis")}, True),
    ({CI: ["rugby", "tennis"]}, {CI: arr(["rugby", "tennis"])}, True),
    ({CI: ["rugby", "tennis"]}, {CI: s("baseball")}, False),
    ({CI: ["rugby", "tennis"]}, {CI: arr(["baseball"])}, False),
    ({CI: ["rugby"]}, {CI: s("Rugby")}, False),  # case-sensitive
    ({CI: ["rugby"]}, {CI: s("rugby", "String.custom")}, True),  # a custom suffix
    ({CI: ["rugby"]}, OTHER, False),  # absent
    # String.Array: each element on its own; one that holds no JSON array is a string.
    ({CI: ["tennis"]}, {CI: arr(["rugby", "tennis"])}, True),
    ({CI: ["rugby"]}, {CI: s("rugby", "String.Array")}, True),
    ({CI: ["[oops"]}, {CI: s("[oops", "String.Array")}, True),
    ({CI: [1]}, {CI: arr([1, "a"])}, True),
    ({CI: ["1"]}, {CI: arr([1, "a"])}, False),
    # One that holds a JSON number is that number (moto's test of SNS's behaviour).
    ({CI: [100, 500]}, {CI: s("100", "String.Array")}, True),
    ({CI: ["100"]}, {CI: s("100", "String.Array")}, False),
    # Numbers compare to five digits after the point (SNS's accuracy); more are ignored.
    ({CI: [100.123456789]}, {CI: n("100.1234567")}, True),
    ({CI: [100.123456789, 500]}, {CI: arr([100.1234567, 50])}, True),
    ({CI: [100.12345]}, {CI: n("100.12346")}, False),
    ({CI: [{"numeric": ["=", 1.000001]}]}, {CI: n("1")}, True),
    ({CI: [{"numeric": [">", 1.000001]}]}, {CI: n("1.000009")}, False),
    ({CI: [{"anything-but": [1.000001]}]}, {CI: n("1")}, False),
    ({CI: [{"anything-but": 2.000001}]}, {CI: n("2.00001")}, True),
    ({CI: [{"prefix": "ten"}]}, {CI: arr(["rugby", "tennis"])}, True),
    # anything-but: values, a value, prefix, suffix; the key must be there.
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: s("baseball")}, True),
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: s("football")}, True),
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: arr(["rugby", "baseball"])}, True),
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: arr(["rugby", "tennis"])}, False),
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: s("rugby")}, False),
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, OTHER, False),
    ({CI: [{"anything-but": "rugby"}]}, {CI: s("rugby")}, False),
    ({CI: [{"anything-but": "rugby"}]}, {CI: s("hockey")}, True),
    ({CI: [{"anything-but": {"prefix": "bas"}}]}, {CI: s("baseball")}, False),
    ({CI: [{"anything-but": {"prefix": "bas"}}]}, {CI: s("rugby")}, True),
    ({CI: [{"anything-but": {"suffix": "ball"}}]}, {CI: s("football")}, False),
    ({CI: [{"anything-but": {"suffix": "ball"}}]}, {CI: s("rugby")}, True),
    ({CI: [{"anything-but": ["rugby"]}, {"exists": False}]}, OTHER, True),
    ({CI: [{"anything-but": ["rugby"]}, {"exists": False}]}, {CI: s("golf")}, True),
    ({CI: [{"anything-but": ["rugby"]}, {"exists": False}]}, {CI: s("rugby")}, False),
    # prefix, suffix and equals-ignore-case look at strings only.
    ({CI: [{"prefix": "bas"}]}, {CI: s("baseball")}, True),
    ({CI: [{"prefix": "bas"}]}, {CI: s("basketball")}, True),
    ({CI: [{"prefix": "bas"}]}, {CI: s("rugby")}, False),
    ({"n": [{"prefix": "5"}]}, {"n": n("50")}, False),
    ({CI: [{"suffix": "ball"}]}, {CI: s("baseball")}, True),
    ({CI: [{"suffix": "ball"}]}, {CI: s("rugby")}, False),
    ({CI: [{"equals-ignore-case": "RUGBY"}]}, {CI: s("rugby")}, True),
    ({CI: [{"equals-ignore-case": "RUGBY"}]}, {CI: s("Rugby")}, True),
    ({CI: [{"equals-ignore-case": "RUGBY"}]}, {CI: s("rugby league")}, False),
    # Numbers: Number attributes match numerically; strings never match numbers.
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, {"price_usd": n("301.5")}, True),
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, {"price_usd": n("3.015e2")}, True),
    (
        {"price_usd": [{"numeric": ["=", 301.5]}]},
        {"price_usd": n("301.50000", "Number.float")},
        True,
    ),
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, {"price_usd": n("301.6")}, False),
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, {"price_usd": s("301.5")}, False),
    ({"n": [5]}, {"n": n("5")}, True),
    ({"n": [5]}, {"n": n("5.0")}, True),
    ({"n": [5.0]}, {"n": n("5")}, True),
    ({"n": [5]}, {"n": n("5e0")}, True),
    ({"n": [5]}, {"n": s("5")}, False),
    ({"n": ["5"]}, {"n": n("5")}, False),
    ({"n": ["5"]}, {"n": s("5")}, True),
    ({"price": [{"anything-but": [100, 500]}]}, {"price": n("101")}, True),
    ({"price": [{"anything-but": [100, 500]}]}, {"price": n("100.1")}, True),
    ({"price": [{"anything-but": [100, 500]}]}, {"price": n("100")}, False),
    ({"price": [{"anything-but": [100, 500]}]}, {"price": n("1e2")}, False),
    # Ranges: the ends are inclusive or exclusive as their operators say.
    ({"price_usd": [{"numeric": [">", 0, "<=", 150]}]}, {"price_usd": n("0")}, False),
    ({"price_usd": [{"numeric": [">", 0, "<=", 150]}]}, {"price_usd": n("0.00001")}, True),
    ({"price_usd": [{"numeric": [">", 0, "<=", 150]}]}, {"price_usd": n("150")}, True),
    ({"price_usd": [{"numeric": [">", 0, "<=", 150]}]}, {"price_usd": n("150.00001")}, False),
    ({"price_usd": [{"numeric": [">=", 0, "<", 150]}]}, {"price_usd": n("0")}, True),
    ({"price_usd": [{"numeric": [">=", 0, "<", 150]}]}, {"price_usd": n("-0.00001")}, False),
    ({"price_usd": [{"numeric": [">=", 0, "<", 150]}]}, {"price_usd": n("150")}, False),
    ({"price_usd": [{"numeric": [">=", 0, "<", 150]}]}, {"price_usd": n("149.99999")}, True),
    ({"n": [{"numeric": ["<", 0]}]}, {"n": n("-1")}, True),
    ({"n": [{"numeric": ["<", 0]}]}, {"n": n("0")}, False),
    ({"n": [{"numeric": ["<=", 0]}]}, {"n": n("0")}, True),
    ({"n": [{"numeric": ["<=", 0]}]}, {"n": n("0.1")}, False),
    ({"n": [{"numeric": [">", 0]}]}, {"n": n("0")}, False),
    ({"n": [{"numeric": [">=", 5]}]}, {"n": n("5")}, True),
    ({"n": [{"numeric": [">=", 5]}]}, {"n": n("4.99999")}, False),
    ({"n": [{"numeric": [">", 5]}]}, {"n": s("6")}, False),
    ({"n": [{"numeric": [">", 5]}]}, OTHER, False),
    # exists; false needs some attribute (SNS: an empty set does not match).
    ({"store": [{"exists": True}]}, {"store": s("fans"), CI: arr(["baseball"])}, True),
    ({"store": [{"exists": True}]}, {CI: arr(["baseball", "basketball"])}, False),
    ({"store": [{"exists": False}]}, {"store": s("fans"), CI: arr(["baseball"])}, False),
    ({"store": [{"exists": False}]}, {CI: arr(["baseball", "basketball"])}, True),
    ({"store": [{"exists": False}]}, {}, False),
    ({"store": [{"exists": False}]}, None, False),
    # Binary attributes are left out of filtering altogether.
    ({"bin": [{"exists": True}]}, {"bin": BINARY}, False),
    ({"bin": [{"exists": False}]}, {"bin": BINARY, **OTHER}, True),
    ({"bin": [{"exists": False}]}, {"bin": BINARY}, False),
    # AND across keys, OR within a key's array.
    (
        {CI: ["rugby"], "price_usd": [{"numeric": [">", 100]}]},
        {CI: s("rugby"), "price_usd": n("150")},
        True,
    ),
    (
        {CI: ["rugby"], "price_usd": [{"numeric": [">", 100]}]},
        {CI: s("rugby"), "price_usd": n("50")},
        False,
    ),
    ({CI: ["rugby"], "price_usd": [{"numeric": [">", 100]}]}, {CI: s("rugby")}, False),
    ({CI: ["rugby", {"prefix": "foot"}]}, {CI: s("football")}, True),
    # $or (the documentation's example): source && (metricName || namespace).
    *[
        (
            {
                "source": ["aws.cloudwatch"],
                "$or": [{"metricName": ["CPUUtilization"]}, {"namespace": ["AWS/EC2"]}],
            },
            attributes,
            expected,
        )
        for attributes, expected in [
            ({"source": s("aws.cloudwatch"), "metricName": s("CPUUtilization")}, True),
            ({"source": s("aws.cloudwatch"), "namespace": s("AWS/EC2")}, True),
            ({"source": s("aws.cloudwatch"), "metricName": s("ReadLatency")}, False),
            ({"metricName": s("CPUUtilization"), "namespace": s("AWS/EC2")}, False),
        ]
    ],
    # No policy, or one without keys, passes everything.
    (ABSENT, {CI: s("rugby")}, True),
    ({}, {CI: s("rugby")}, True),
]

# (policy, body, expected): MessageBody scope.
BODY_CASES = [
    ({CI: ["rugby", "tennis"]}, {CI: "rugby"}, True),
    ({CI: ["rugby", "tennis"]}, {CI: "baseball"}, False),
    ({CI: ["rugby", "tennis"]}, {CI: ["baseball", "tennis"]}, True),  # arrays: any element
    ({CI: ["rugby", "tennis"]}, {CI: ["baseball"]}, False),
    ({CI: ["rugby"]}, {CI: [["rugby"]]}, True),  # nested arrays flatten
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: ["rugby", "baseball"]}, True),
    ({CI: [{"anything-but": ["rugby", "tennis"]}]}, {CI: ["rugby"]}, False),
    ({CI: [{"anything-but": ["rugby"]}]}, {CI: None}, False),
    ({CI: [{"anything-but": ["rugby"]}]}, {CI: 5}, True),
    ({"price": [{"anything-but": [100, 500]}]}, {"price": [100, 50]}, True),
    ({"price": [{"anything-but": [100, 500]}]}, {"price": 100}, False),
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, {"price_usd": 301.5}, True),
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, b'{"price_usd": 3.015e2}', True),
    ({"price_usd": [{"numeric": ["=", 301.5]}]}, {"price_usd": "301.5"}, False),
    ({"n": [{"numeric": [">", 0, "<", 10]}]}, {"n": [20, 5]}, True),
    ({"n": [{"numeric": [">", 0, "<", 10]}]}, {"n": [20, -5]}, False),
    ({"n": [5]}, {"n": 5.0}, True),
    # Booleans and null are values of their own.
    ({"ok": [True]}, {"ok": True}, True),
    ({"ok": [True]}, {"ok": "true"}, False),
    ({"ok": [False]}, {"ok": True}, False),
    ({"v": [None]}, {"v": None}, True),
    ({"v": [None]}, {"w": None}, False),
    ({"v": ["null"]}, {"v": None}, False),
    # exists works on leaves with a non-null value.
    ({"store": [{"exists": True}]}, {"store": "fans", CI: ["baseball"]}, True),
    ({"store": [{"exists": True}]}, {CI: ["baseball", "basketball"]}, False),
    ({"store": [{"exists": True}]}, {"store": None}, False),
    ({"store": [{"exists": True}]}, {"store": []}, False),
    ({"store": [{"exists": True}]}, {"store": {"name": "fans"}}, False),
    ({"store": [{"exists": True}]}, {"store": ""}, True),
    ({"store": [{"exists": False}]}, {CI: ["baseball"]}, True),
    ({"store": [{"exists": False}]}, {"store": "fans"}, False),
    ({"store": [{"exists": False}]}, {"store": None}, True),
    ({"store": [{"exists": False}]}, {}, False),
    # Nested keys walk nested objects, and arrays of objects.
    ({"store": {"name": ["fans"]}}, {"store": {"name": "fans"}}, True),
    ({"store": {"name": ["fans"]}}, {"store": {"name": "shop"}}, False),
    ({"store": {"name": ["fans"]}}, {"store": "fans"}, False),
    ({"store": {"name": ["fans"]}}, {"name": "fans"}, False),
    ({"store": {"name": ["fans"]}}, {"store": [{"name": "shop"}, {"name": "fans"}]}, True),
    ({"store": {"name": ["fans"]}}, {"store": [[{"name": "fans"}]]}, True),
    ({"a": {"b": {"c": [{"prefix": "x"}]}}}, {"a": {"b": {"c": "xyz"}}}, True),
    ({"a": {"b": {"c": [{"prefix": "x"}]}}}, {"a": {"b": {"c": "yz"}}}, False),
    ({"a": {"b": [{"exists": False}]}}, {"z": 1}, True),
    ({"a": {"b": [{"exists": False}]}}, {"a": {"b": 1}}, False),
    (
        {"store": {"name": ["fans"], "city": ["Oslo"]}},
        {"store": {"name": "fans", "city": "Oslo", "zip": 1}},
        True,
    ),
    (
        {"store": {"name": ["fans"], "city": ["Oslo"]}},
        {"store": {"name": "fans", "city": "Rome"}},
        False,
    ),
    # The documentation's nested example: only key_d and key_f carry conditions.
    (
        {
            "key_a": {
                "key_b": {"key_c": {"key_d": ["value_one", "value_two"]}},
                "key_e": {"key_f": ["value_three"]},
            }
        },
        {"key_a": {"key_b": {"key_c": {"key_d": "value_two"}}, "key_e": {"key_f": "value_three"}}},
        True,
    ),
    # $or, also around nested keys.
    ({"$or": [{"a": {"b": ["x"]}}, {"c": ["y"]}]}, {"a": {"b": "x"}}, True),
    ({"$or": [{"a": {"b": ["x"]}}, {"c": ["y"]}]}, {"c": "y"}, True),
    ({"$or": [{"a": {"b": ["x"]}}, {"c": ["y"]}]}, {"a": {"b": "y"}, "c": "x"}, False),
    ({"a": {"$or": [{"b": ["x"]}, {"c": ["y"]}]}}, {"a": {"c": "y"}}, True),
    ({"a": {"$or": [{"b": ["x"]}, {"c": ["y"]}]}}, {"c": "y"}, False),
    # "$or" with operator keys in its objects is an ordinary key (checked as one).
    ({"$or": ["x"]}, {"$or": "x"}, True),
    # Bodies that are not UTF-8 JSON objects match nothing, and raise nothing.
    ({CI: ["rugby"]}, b"rugby", False),
    ({CI: ["rugby"]}, b'["rugby"]', False),
    ({CI: ["rugby"]}, b'"rugby"', False),
    ({CI: ["rugby"]}, b"", False),
    ({CI: ["rugby"]}, None, False),
    ({CI: ["rugby"]}, b'{"customer_interests": "rugby"', False),
    ({CI: ["rugby"]}, b'{"customer_interests": "rugby\xff"}', False),
    ({CI: ["rugby"]}, b"\xff\xfe{", False),
    ({CI: ["rugby"]}, b'{"customer_interests": "\\u0000"}', False),
    ({CI: ["rugby"]}, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),
    ({CI: ["rugby"]}, b' \n\t{"customer_interests": "rugby"} ', True),
    ({CI: ["rugby"]}, '{"customer_interests": "rugby", "x": "ø"}'.encode(), True),
    ({CI: [{"exists": False}]}, b"not json", False),
    (ABSENT, b"not json", True),
    ({}, {"a": 1}, True),
]


def _id(case: tuple) -> str:
    return json.dumps(case[0] if case[0] is not ABSENT else None)[:60]


@pytest.mark.parametrize(
    ("policy", "attributes", "expected"), ATTRIBUTE_CASES, ids=[_id(c) for c in ATTRIBUTE_CASES]
)
async def test_attribute_policies(conn, policy, attributes, expected):
    if policy is not ABSENT:
        assert await problem(conn, policy, "attributes") is None
    assert await matches(conn, policy, "attributes", attributes=attributes) is expected
    # The body does not matter to an attribute policy.
    assert await matches(conn, policy, "attributes", attributes=attributes, body=b"{}") is expected


@pytest.mark.parametrize(
    ("policy", "body", "expected"), BODY_CASES, ids=[_id(c) for c in BODY_CASES]
)
async def test_body_policies(conn, policy, body, expected):
    if policy is not ABSENT:
        assert await problem(conn, policy, "body") is None
    assert await matches(conn, policy, "body", body=body) is expected
    # Nor do the attributes to a body policy.
    assert await matches(conn, policy, "body", attributes={CI: s("rugby")}, body=body) is expected


async def test_the_filter_document_of_attributes(conn):
    attributes = {
        "s": s("rugby"),
        "c": s("x", "String.custom"),
        "n": n("3.015e2"),
        "f": n("-.5", "Number.float"),
        "a": arr(["a", 1, True, None]),
        "bad_array": s("[not json", "String.Array"),
        "scalar_array": s('"json, but no array"', "String.Array"),
        "b": BINARY,
        "b2": {"data_type": "Binary.gz", "binary_value": "AAEC"},
    }
    document = await conn.fetchval(
        "SELECT postbox._filter_document($1::text::jsonb)::text", json.dumps(attributes)
    )
    assert json.loads(document) == {
        "s": "rugby",
        "c": "x",
        "n": 301.5,
        "f": -0.5,
        "a": ["a", 1, True, None],
        "bad_array": "[not json",
        "scalar_array": '"json, but no array"',
    }
    for empty in ("null", "[]", '"x"', "{}"):
        assert (
            await conn.fetchval("SELECT postbox._filter_document($1::text::jsonb)::text", empty)
            == "{}"
        )


async def test_an_unknown_scope_is_an_error_to_match_and_a_problem_to_check(conn):
    with pytest.raises(asyncpg.PostgresError, match='"attributes" or "body"') as raised:
        await matches(conn, {"a": ["x"]}, "MessageBody", body=b"{}")
    assert raised.value.sqlstate == "PB400"
    assert 'not "MessageBody"' in await problem(conn, {"a": ["x"]}, "MessageBody")
    assert "not null" in await conn.fetchval("SELECT postbox.filter_policy_problem('{}', NULL)")
    assert await conn.fetchval("SELECT postbox.filter_policy_problem(NULL, 'body')") is None


def _values(count: int) -> list[int]:
    return list(range(count))


def _nest(levels: int, leaf: Any) -> Any:
    for _ in range(levels):
        leaf = {"k": leaf}
    return leaf


# (policy, scope, what the message must say): one invalid policy per rule.
PROBLEM_CASES = [
    # The policy itself.
    ([{"a": ["x"]}], "attributes", "must be a JSON object of keys, not [{"),
    ("a", "body", 'must be a JSON object of keys, not "a"'),
    (None, "body", "must be a JSON object of keys, not null"),
    ({"a": ["x" * 262_200]}, "attributes", "the limit is 256 KiB (262144 bytes)"),
    # Keys: at most five that carry conditions.
    (
        {f"k{i}": ["x"] for i in range(6)},
        "attributes",
        "has 6 keys with conditions; the limit is 5",
    ),
    (
        {"a": {f"k{i}": ["x"] for i in range(6)}},
        "body",
        "has 6 keys with conditions; the limit is 5",
    ),
    (
        {"a": ["x"], "b": {"c": ["x"], "d": {"e": ["x"], "f": ["x"]}}, "g": ["x"], "h": ["x"]},
        "body",
        "has 6 keys",
    ),
    (
        {"a": [1], "$or": [{"b": [1], "c": [1], "d": [1], "e": [1], "f": [1]}, {"g": [1]}]},
        "attributes",
        'has 6 keys with conditions; the limit is 5 (a "$or" counts its largest alternative)',
    ),
    # Combinations: the product of the arrays' lengths, at most 150.
    (
        {"a": _values(6), "b": _values(5), "c": _values(6)},
        "attributes",
        "has 180 combinations of values",
    ),
    ({"a": {"b": {"c": _values(76)}}}, "body", "has 152 combinations of values; the limit is 150"),
    ({"$or": [{"a": _values(100)}, {"b": _values(51)}]}, "attributes", "has 151 combinations"),
    (
        {"x": _values(2), "$or": [{"a": _values(50)}, {"b": _values(26)}]},
        "attributes",
        "has 152 combinations",
    ),
    # Structure.
    (
        {"a": {"b": ["x"]}},
        "attributes",
        'key "a" holds an object, but only the body scope (MessageBody) nests keys',
    ),
    ({"a": "x"}, "attributes", 'key "a" must hold an array of conditions, not "x"'),
    (
        {"a": 5},
        "body",
        'key "a" must hold an array of conditions or an object of nested keys, not 5',
    ),
    ({"a": []}, "attributes", 'key "a" has an empty array; give at least one condition'),
    ({"a": {}}, "body", 'key "a" holds an empty object'),
    ({"a": {"b": {}}}, "body", 'key "a.b" holds an empty object'),
    ({"$or": [{"a": ["x"]}]}, "attributes", '"$or" has one alternative; "$or" needs at least two'),
    ({"$or": [{}, {"a": ["x"]}]}, "attributes", 'an alternative of "$or" is an empty object'),
    (
        {"$or": [{"a": {"b": ["x"]}}, {"c": ["y"]}]},
        "attributes",
        'key "a" holds an object, but only the body',
    ),
    (
        {"$or": [{"numeric": 123}, {"prefix": "abc"}]},
        "body",
        'key "$or": numeric takes [operator, number]',
    ),
    (_nest(152, ["x"]), "body", "nests more than 150 levels deep"),
    # Conditions.
    ({"a": [["x"]]}, "attributes", 'key "a": a condition cannot be an array (["x"])'),
    ({"a": [{}]}, "attributes", 'key "a": a condition object holds exactly one operator, not {}'),
    ({"a": [{"prefix": "a", "suffix": "b"}]}, "attributes", "holds exactly one operator"),
    (
        {"a": [{"cidr": "10.0.0.0/24"}]},
        "attributes",
        'key "a": unknown operator "cidr"; the operators are',
    ),
    ({"a": [{"wildcard": "a*"}]}, "body", 'unknown operator "wildcard"'),
    ({"a": [{"Prefix": "a"}]}, "attributes", 'unknown operator "Prefix"'),
    ({"a": {"b": [{"prefix": 5}]}}, "body", 'key "a.b": prefix takes a string, not 5'),
    ({"a": [{"suffix": ["x"]}]}, "attributes", 'suffix takes a string, not ["x"]'),
    (
        {"a": [{"equals-ignore-case": None}]},
        "attributes",
        "equals-ignore-case takes a string, not null",
    ),
    ({"a": [{"exists": "true"}]}, "attributes", 'exists takes true or false, not "true"'),
    ({"a": [{"exists": 1}]}, "attributes", "exists takes true or false, not 1"),
    # anything-but.
    ({"a": [{"anything-but": []}]}, "attributes", "anything-but needs at least one value"),
    (
        {"a": [{"anything-but": ["x", True]}]},
        "attributes",
        "anything-but lists strings and numbers, not true",
    ),
    (
        {"a": [{"anything-but": [{"prefix": "x"}]}]},
        "attributes",
        "lists strings and numbers, not {",
    ),
    (
        {"a": [{"anything-but": None}]},
        "attributes",
        "anything-but takes a value, an array of values",
    ),
    (
        {"a": [{"anything-but": {"prefix": 5}}]},
        "attributes",
        'or {"suffix": "..."}, not {"prefix": 5}',
    ),
    (
        {"a": [{"anything-but": {"equals-ignore-case": "x"}}]},
        "attributes",
        "anything-but takes a value",
    ),
    (
        {"a": [{"anything-but": {"prefix": "x", "suffix": "y"}}]},
        "attributes",
        "anything-but takes a value",
    ),
    ({"a": [{"anything-but": [1, 2e9]}]}, "attributes", "number 2000000000.0 is out of range"),
    # numeric.
    (
        {"a": [{"numeric": 5}]},
        "attributes",
        'numeric takes [operator, number] or a range [">", low, "<", high]',
    ),
    ({"a": [{"numeric": [">"]}]}, "attributes", '[">", low, "<", high], not [">"]'),
    ({"a": [{"numeric": [">", 1, "<"]}]}, "attributes", "numeric takes [operator, number]"),
    (
        {"a": [{"numeric": ["==", 5]}]},
        "attributes",
        'numeric operator "==" is unknown; the operators are',
    ),
    ({"a": [{"numeric": [5, ">"]}]}, "attributes", "numeric operator 5 is unknown"),
    (
        {"a": [{"numeric": ["=", "5"]}]},
        "attributes",
        'numeric = must be followed by a number, not "5"',
    ),
    ({"a": [{"numeric": ["<", 0, ">", 5]}]}, "attributes", "a numeric range starts with > or >="),
    ({"a": [{"numeric": [">", 0, ">", 5]}]}, "attributes", "a numeric range starts with > or >="),
    ({"a": [{"numeric": ["=", 0, "<", 5]}]}, "attributes", "a numeric range starts with > or >="),
    (
        {"a": [{"numeric": [">", 0, "<", "5"]}]},
        "attributes",
        'numeric < must be followed by a number, not "5"',
    ),
    (
        {"a": [{"numeric": [">", 5, "<", 5]}]},
        "attributes",
        'numeric range [">", 5, "<", 5] is empty',
    ),
    (
        {"a": [{"numeric": [">=", 5, "<=", 1]}]},
        "attributes",
        "is empty: its lower bound must be below",
    ),
    (
        {"a": [{"numeric": ["=", 1e10]}]},
        "attributes",
        "is out of range; numbers lie between -1000000000",
    ),
    ({"a": [{"numeric": [">", -1000000000.5]}]}, "attributes", "-1000000000.5 is out of range"),
    ({"a": [{"numeric": [">", 0, "<", 1000000001]}]}, "attributes", "1000000001 is out of range"),
    # Numbers to equal.
    ({"a": [1e10]}, "attributes", 'key "a": number 10000000000.0 is out of range'),
]


@pytest.mark.parametrize(
    ("policy", "scope", "message"), PROBLEM_CASES, ids=[_id(c) for c in PROBLEM_CASES]
)
async def test_invalid_policies_say_what_to_fix(conn, policy, scope, message):
    found = await problem(conn, policy, scope)
    assert found is not None
    assert message in found
    assert len(found) < 300  # input is quoted as a short prefix


# Valid at the limits: the rules above are not stricter than SNS's.
VALID_CASES = [
    ({f"k{i}": ["x"] for i in range(5)}, "attributes"),
    ({"a": _values(5), "b": _values(5), "c": _values(6)}, "attributes"),  # 150
    ({"a": {"b": {"c": _values(75)}}}, "body"),  # 75 x 2 = 150
    (
        {
            "key_a": {
                "key_b": {"key_c": {"key_d": ["one", "two", "three", "four"]}},
                "key_e": {"key_f": ["one", "two", "three"]},
            }
        },
        "body",
    ),  # the documentation's example: 3 x 4 x 2 x 3 = 72
    ({"a": [1], "$or": [{"b": [1], "c": [1], "d": [1], "e": [1]}, {"f": [1]}]}, "attributes"),
    ({"$or": [{"a": _values(100)}, {"b": _values(50)}]}, "attributes"),
    (
        {
            "a": [
                {"numeric": ["=", 1000000000]},
                {"numeric": [">", -1000000000]},
                1.12345,
                1.1234500,
            ]
        },
        "attributes",
    ),
    ({"a": [True, False, None, "", {"prefix": ""}]}, "attributes"),
    (
        {"a": [{"anything-but": 5}, {"anything-but": [1, "x"]}, {"anything-but": {"suffix": "x"}}]},
        "attributes",
    ),
    ({"a": [{"exists": True}, {"exists": False}]}, "body"),
    ({"$or": ["x"]}, "attributes"),  # not an OR: an ordinary key named "$or"
    ({"a": {"$or": [{"b": ["x"]}, {"c": {"d": ["y"]}}]}}, "body"),
    (_nest(50, ["x"]), "body"),  # 1 x 49 combinations
    (_nest(151, ["x"]), "body"),  # 1 x 150 combinations
    ({}, "attributes"),
]


@pytest.mark.parametrize(("policy", "scope"), VALID_CASES, ids=[_id(c) for c in VALID_CASES])
async def test_valid_policies_at_the_limits(conn, policy, scope):
    assert await problem(conn, policy, scope) is None


async def test_a_deep_body_against_a_deep_policy(conn):
    body = json.dumps(_nest(50, "x")).encode()
    assert await matches(conn, _nest(50, ["x"]), "body", body=body) is True
    assert await matches(conn, _nest(50, ["y"]), "body", body=body) is False
    assert await matches(conn, _nest(49, ["x"]), "body", body=body) is False
