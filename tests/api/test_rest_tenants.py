"""Tenants (issue 47) over the REST door (/v1 on the HTTP port): a tenant's key, admin:*
and all, works on its own tenant's queues, events and schedules, never sees another's,
and hears of a foreign name exactly what it hears of a missing one.

A database and server of their own, as test_tenants.py: keys turn authentication on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from auth_support import tenant_server
from support import HttpServerProcess

TENANT_A, TENANT_B = "acme", "globex"
# A queue only tenant B has, and a name no tenant has.
B_ONLY, MISSING = "globex-ledger", "nobody-ledger"


@dataclass
class Doors:
    server: HttpServerProcess
    keys: dict[str, dict[str, str]]  # per tenant: the Authorization header of its admin:* key


@pytest.fixture(scope="module")
def doors(admin_url: str) -> Iterator[Doors]:
    with tenant_server(
        admin_url, "postbox_rest_tenants", HttpServerProcess, TENANT_A, TENANT_B
    ) as (server, secrets):
        keys = {tenant: {"Authorization": f"Bearer {s}"} for tenant, s in secrets.items()}
        yield Doors(server, keys)


@pytest.fixture
async def rest(doors: Doors) -> AsyncIterator[Any]:
    """`rest(tenant, method, path, body)`: the status and JSON answer, with the tenant's key."""
    async with aiohttp.ClientSession(doors.server.base) as http:

        async def call(tenant: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **doors.keys[tenant]}
            async with http.request(method, path, data=data, headers=headers) as answer:
                text = await answer.read()
                return answer.status, json.loads(text) if text else None

        yield call


def _same_answer(foreign: tuple[int, Any], missing: tuple[int, Any]) -> None:
    """A foreign name's answer is a missing name's, but for the name itself."""
    assert foreign[0] == missing[0] == 404, (foreign, missing)
    assert set(foreign[1]) == set(missing[1]) == {"error", "code"}, (foreign, missing)
    assert foreign[1]["code"] == missing[1]["code"] == "not_found"
    unnamed = foreign[1]["error"].replace(B_ONLY, MISSING)
    assert unnamed == missing[1]["error"], (foreign, missing)


async def _depth(rest, tenant: str, queue: str) -> int:
    status, metrics = await rest(tenant, "GET", f"/v1/queues/{queue}")
    assert status == 200, metrics
    assert metrics["queue_name"] == queue  # the caller's name, never the stored one
    return metrics["queue_length"]


async def test_two_tenants_orders_queues_stay_apart_over_rest(rest) -> None:
    for tenant in (TENANT_A, TENANT_B):
        status, created = await rest(tenant, "POST", "/v1/queues", {"name": "orders"})
        assert status == 201, created
        assert created["name"] == "orders"
    status, created = await rest(TENANT_B, "POST", "/v1/queues", {"name": B_ONLY})
    assert status == 201, created
    status, sent = await rest(TENANT_A, "POST", "/v1/queues/orders/messages", {"message": "a1"})
    assert status == 201, sent
    batch = [{"message": "b1"}, {"message": "b2"}]
    status, sent = await rest(TENANT_B, "POST", "/v1/queues/orders/messages", batch)
    assert status == 201, sent
    await rest(TENANT_B, "POST", f"/v1/queues/{B_ONLY}/messages", {"message": "b-ledger"})

    status, listed = await rest(TENANT_A, "GET", "/v1/queues")
    assert status == 200, listed
    assert [q["name"] for q in listed] == ["orders"]
    status, listed = await rest(TENANT_B, "GET", "/v1/queues")
    assert sorted(q["name"] for q in listed) == sorted([B_ONLY, "orders"])
    assert await _depth(rest, TENANT_A, "orders") == 1
    assert await _depth(rest, TENANT_B, "orders") == 2

    status, received = await rest(TENANT_A, "GET", "/v1/queues/orders/messages?max=10&vt=60")
    assert status == 200, received
    assert [m["message"] for m in received] == ["a1"]
    status, deleted = await rest(
        TENANT_A, "DELETE", f"/v1/queues/orders/messages/{received[0]['id']}"
    )
    assert (status, deleted) == (204, None)
    assert await _depth(rest, TENANT_A, "orders") == 0
    assert await _depth(rest, TENANT_B, "orders") == 2
    status, received = await rest(TENANT_B, "GET", "/v1/queues/orders/messages?max=10&vt=60")
    assert sorted(m["message"] for m in received) == ["b1", "b2"]
    # B's delivery id, on A's queue of the same name: not A's to delete or change.
    foreign_delivery = f"/v1/queues/orders/messages/{received[0]['id']}"
    status, answer = await rest(TENANT_A, "DELETE", foreign_delivery)
    assert (status, answer["code"]) == (404, "not_found"), answer
    status, answer = await rest(TENANT_A, "PATCH", foreign_delivery, {"vt": 0})
    assert (status, answer["code"]) == (404, "not_found"), answer
    assert await _depth(rest, TENANT_B, "orders") == 2


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("POST", "/messages", {"message": "from a"}),
        ("GET", "/messages?max=10", None),
        ("DELETE", "/messages", {"ids": [1]}),
        ("DELETE", "/messages/1", None),
        ("PATCH", "/messages/1", {"vt": 0}),
        ("POST", "/purge", None),
        ("GET", "/subscriptions", None),
        ("DELETE", "", None),
    ],
)
async def test_a_foreign_queue_answers_as_a_missing_one(rest, method, suffix, body) -> None:
    status, _ = await rest(TENANT_B, "POST", "/v1/queues", {"name": B_ONLY})
    assert status in (200, 201)  # made here, or there from the test before
    status, before = await rest(TENANT_B, "GET", f"/v1/queues/{B_ONLY}")
    assert status == 200, before
    foreign = await rest(TENANT_A, method, f"/v1/queues/{B_ONLY}{suffix}", body)
    missing = await rest(TENANT_A, method, f"/v1/queues/{MISSING}{suffix}", body)
    _same_answer(foreign, missing)
    status, after = await rest(TENANT_B, "GET", f"/v1/queues/{B_ONLY}")
    assert status == 200, after
    assert after["queue_length"] == before["queue_length"]


async def test_events_and_subscriptions_stay_in_the_tenant(rest) -> None:
    for tenant in (TENANT_A, TENANT_B):
        status, created = await rest(tenant, "POST", "/v1/queues", {"name": "events"})
        assert status == 201, created
    subscribed = {}
    for tenant in (TENANT_A, TENANT_B):
        status, subscribed[tenant] = await rest(
            tenant, "POST", "/v1/events/shop.*/subscriptions", {"queue_name": "events"}
        )
        assert status == 201, subscribed[tenant]
        assert subscribed[tenant]["queue_name"] == "events"
    for tenant in (TENANT_A, TENANT_B):
        status, listed = await rest(tenant, "GET", "/v1/events/shop.*/subscriptions")
        assert (status, listed) == (200, [subscribed[tenant]])
        status, by_queue = await rest(tenant, "GET", "/v1/queues/events/subscriptions")
        assert (status, by_queue) == (200, [subscribed[tenant]])

    status, published = await rest(TENANT_A, "POST", "/v1/events/shop.paid", {"message": "a"})
    assert status == 201, published
    assert published["queues_matched"] == 1
    assert published["messages"][0]["queue"] == "events"
    assert await _depth(rest, TENANT_A, "events") == 1
    assert await _depth(rest, TENANT_B, "events") == 0
    status, published = await rest(TENANT_B, "POST", "/v1/events/shop.paid", {"message": "b"})
    assert (status, published["queues_matched"]) == (201, 1), published
    for tenant in (TENANT_A, TENANT_B):
        status, received = await rest(tenant, "GET", "/v1/queues/events/messages?max=10")
        assert [m["message"] for m in received] == ["a" if tenant == TENANT_A else "b"]

    # B's subscription, by its id under A's key: as missing as an id never made.
    foreign = await rest(
        TENANT_A, "DELETE", f"/v1/events/shop.*/subscriptions/{subscribed[TENANT_B]['id']}"
    )
    missing = await rest(TENANT_A, "DELETE", "/v1/events/shop.*/subscriptions/s0000000000000000")
    assert foreign[0] == missing[0] == 404, (foreign, missing)
    assert foreign[1]["code"] == missing[1]["code"] == "not_found"
    status, listed = await rest(TENANT_B, "GET", "/v1/events/shop.*/subscriptions")
    assert listed == [subscribed[TENANT_B]]


async def test_a_schedule_stays_in_its_tenant(rest) -> None:
    status, created = await rest(TENANT_A, "POST", "/v1/queues", {"name": "reports"})
    assert status == 201, created
    spec = {
        "name": "nightly",
        "cron": "0 9 * * *",
        "target_kind": "queue",
        "target": "reports",
        "message": {"job": "report"},
    }
    status, created = await rest(TENANT_A, "POST", "/v1/schedules", spec)
    assert status == 201, created
    status, listed = await rest(TENANT_B, "GET", "/v1/schedules")
    assert (status, listed) == (200, [])
    status, listed = await rest(TENANT_A, "GET", "/v1/schedules")
    assert [s["name"] for s in listed] == ["nightly"]
    for method, suffix in (("GET", ""), ("POST", "/runs"), ("PATCH", ""), ("DELETE", "")):
        body = {"status": "paused"} if method == "PATCH" else None
        foreign = await rest(TENANT_B, method, f"/v1/schedules/nightly{suffix}", body)
        missing = await rest(TENANT_B, method, f"/v1/schedules/never{suffix}", body)
        if method == "DELETE":  # idempotent: a missing schedule's delete is a 204
            assert foreign == missing == (204, None)
        else:
            assert foreign[0] == missing[0] == 404, (foreign, missing)
            assert set(foreign[1]) == {"error", "code"}, foreign
            assert foreign[1]["code"] == missing[1]["code"] == "not_found"
            assert foreign[1]["error"].replace("nightly", "never") == missing[1]["error"]
    status, got = await rest(TENANT_A, "GET", "/v1/schedules/nightly")
    assert (status, got["status"], got["fire_count"]) == (200, "active", 0), got
    # B may have a schedule of the same name; it targets B's queue, not A's.
    status, created = await rest(TENANT_B, "POST", "/v1/queues", {"name": "reports"})
    assert status == 201, created
    status, created = await rest(TENANT_B, "POST", "/v1/schedules", spec)
    assert status == 201, created
    status, ran = await rest(TENANT_A, "POST", "/v1/schedules/nightly/runs")
    assert status == 202, ran
    assert await _depth(rest, TENANT_A, "reports") == 1
    assert await _depth(rest, TENANT_B, "reports") == 0
    status, got = await rest(TENANT_A, "GET", "/v1/schedules/nightly")
    assert status == 200, got
    assert got["fire_count"] == 1
