"""The native REST API under /v1 (beyond-queue's routes), driven with a plain HTTP client
(aiohttp) against a real server over real sockets: each route's shapes and status codes
as beyond-queue's route table gives them, its key and grant rules (Connect's codes), and
bad input refused with a precise 400 that changes nothing."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from openapi_spec_validator import validate
from receiver import Receiver
from support import (
    HttpServerProcess,
    bootstrap_key,
    create_database,
    drop_database,
    unique_name,
)

# beyond-queue's route table, method and path, as its seed lists it (cert aside).
SEED_ROUTES = {
    ("POST", "/v1/queues"), ("GET", "/v1/queues"), ("GET", "/v1/queues/{name}"),
    ("DELETE", "/v1/queues/{name}"), ("POST", "/v1/queues/{name}/purge"),
    ("POST", "/v1/queues/{name}/messages"), ("GET", "/v1/queues/{name}/messages"),
    ("DELETE", "/v1/queues/{name}/messages"), ("DELETE", "/v1/queues/{name}/messages/{id}"),
    ("PATCH", "/v1/queues/{name}/messages/{id}"), ("POST", "/v1/events/{routing_key}"),
    ("POST", "/v1/events/{pattern}/subscriptions"), ("GET", "/v1/events/{pattern}/subscriptions"),
    ("DELETE", "/v1/events/{pattern}/subscriptions/{id}"),
    ("GET", "/v1/queues/{name}/subscriptions"), ("POST", "/v1/schedules"),
    ("GET", "/v1/schedules"), ("GET", "/v1/schedules/{name}"), ("PUT", "/v1/schedules/{name}"),
    ("PATCH", "/v1/schedules/{name}"), ("DELETE", "/v1/schedules/{name}"),
    ("POST", "/v1/schedules/{name}/runs"), ("POST", "/v1/previews"),
}  # fmt: skip
# Headers as beyond-queue's scripts send them: any JSON values.
HEADERS = {"kind": "new", "n": 2, "ratio": 0.5, "retry": True, "none": None, "empty": "",
           "meta": {"tags": ["a", "b"], "depth": {"x": 1}}}  # fmt: skip
# The smallest --http-max-request-size, so a test exceeds it cheaply.
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def rest_server(database_url: str) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(database_url, "--http-max-request-size", str(BODY_LIMIT)).start()
    yield process
    process.stop()


@pytest.fixture
async def http(rest_server: HttpServerProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(rest_server.base) as session:
        yield session


async def request(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """The status, the JSON answer (None when empty) and the headers."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with http.request(method, path, data=data, headers=sent) as answer:
        text = await answer.read()
        return answer.status, json.loads(text) if text else None, dict(answer.headers)


async def new_queue(http: aiohttp.ClientSession, hint: str, **fields: Any) -> str:
    name = unique_name(hint)
    status, created, _ = await request(http, "POST", "/v1/queues", {"name": name, **fields})
    assert status == 201, created
    return name


async def depth(http: aiohttp.ClientSession, queue: str) -> int:
    status, metrics, _ = await request(http, "GET", f"/v1/queues/{queue}")
    assert status == 200, metrics
    return metrics["queue_length"]


async def metrics_when(
    http: aiohttp.ClientSession, queue: str, holds: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The queue's metrics once `holds` is true of them; fails after a minute."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        status, metrics, _ = await request(http, "GET", f"/v1/queues/{queue}")
        assert status == 200, metrics
        if holds(metrics):
            return metrics
        assert asyncio.get_running_loop().time() < deadline, metrics
        await asyncio.sleep(0.2)  # a poll's pace, not a wait for the outcome


def refused(status: int, answer: Any, code: int, *words: str) -> None:
    assert status == code, answer
    assert set(answer) == {"error", "code"}, answer
    for word in words:
        assert word in answer["error"], answer


async def test_the_openapi_document_is_the_route_table(http: aiohttp.ClientSession) -> None:
    status, document, headers = await request(http, "GET", "/v1/openapi.json")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert document["openapi"].startswith("3.1")
    validate(document)  # an independent validator of OpenAPI 3.1
    served = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert served == SEED_ROUTES
    create = document["paths"]["/v1/schedules"]["post"]
    assert set(create["responses"]) >= {"201", "409", "default"}
    receive = document["paths"]["/v1/queues/{name}/messages"]["get"]
    assert [p["name"] for p in receive["parameters"]] == ["name", "max", "vt", "wait", "fifo"]


async def test_queues_create_list_metrics_purge_delete(http: aiohttp.ClientSession) -> None:
    name = unique_name("rest_queue")
    status, created, headers = await request(http, "POST", "/v1/queues", {"name": name})
    assert status == 201, created
    assert headers["Location"] == f"/v1/queues/{name}"
    assert created["name"] == name
    assert created["fifo"] is False
    assert created["is_partitioned"] is False
    assert created["is_unlogged"] is False
    assert created["created_at"].endswith("Z")
    # As beyond-queue's: creating it again is no error.
    status, again, _ = await request(http, "POST", "/v1/queues", {"name": name})
    assert (status, again) == (200, created)
    # A FIFO queue's name says so, as in SQS.
    status, fifo, _ = await request(http, "POST", "/v1/queues", {"name": f"{name}-f.fifo"})
    assert (status, fifo["fifo"]) == (201, True)
    status, clash, _ = await request(
        http, "POST", "/v1/queues", {"name": f"{name}2.fifo", "fifo": False}
    )
    refused(status, clash, 400, "ends in .fifo", "leave out fifo")
    status, listed, _ = await request(http, "GET", "/v1/queues")
    assert f"{name}2.fifo" not in [q["name"] for q in listed]
    status, listed, _ = await request(http, "GET", "/v1/queues")
    assert status == 200
    assert [q for q in listed if q["name"] == name] == [created]
    for i in range(3):
        await request(http, "POST", f"/v1/queues/{name}/messages", {"message": i})
    status, metrics, _ = await request(http, "GET", f"/v1/queues/{name}")
    assert status == 200
    assert metrics["queue_name"] == name
    assert metrics["queue_length"] == metrics["visible_messages"] == 3
    assert 0 <= metrics["newest_msg_age_sec"] <= metrics["oldest_msg_age_sec"]
    # Sends are counted as the servers flush their counts, every few seconds.
    metrics = await metrics_when(http, name, lambda m: m["total_messages"] == 3)
    status, purged, _ = await request(http, "POST", f"/v1/queues/{name}/purge")
    assert (status, purged) == (200, {"deleted": 3})
    status, metrics, _ = await request(http, "GET", f"/v1/queues/{name}")
    assert metrics["queue_length"] == 0
    assert metrics["oldest_msg_age_sec"] is metrics["newest_msg_age_sec"] is None
    assert metrics["total_messages"] == 3  # sent since the queue was made
    status, gone, _ = await request(http, "DELETE", f"/v1/queues/{name}")
    assert (status, gone) == (204, None)
    status, missing, _ = await request(http, "DELETE", f"/v1/queues/{name}")
    refused(status, missing, 404, name)
    assert missing["code"] == "not_found"
    status, missing, _ = await request(http, "GET", f"/v1/queues/{name}")
    refused(status, missing, 404)


async def test_messages_send_receive_visibility_delete(http: aiohttp.ClientSession) -> None:
    queue = await new_queue(http, "rest_messages")
    messages = f"/v1/queues/{queue}/messages"
    status, sent, _ = await request(
        http, "POST", messages, {"message": {"order": 7}, "headers": HEADERS}
    )
    assert status == 201, sent
    assert isinstance(sent["id"], int)
    status, batch, _ = await request(http, "POST", messages, [{"message": "a"}, {"message": [1]}])
    assert status == 201, batch
    assert len(batch["ids"]) == 2
    assert all(isinstance(i, int) for i in batch["ids"])
    # Receive: max, vt, and the shapes.
    status, received, _ = await request(http, "GET", f"{messages}?max=1&vt=60")
    assert status == 200, received
    [first] = received
    assert first["message_id"] == sent["id"]
    assert first["message"] == {"order": 7}
    assert first["headers"] == HEADERS
    assert first["read_ct"] == 1
    assert first["enqueued_at"].endswith("Z")
    # The id is a number standing for this delivery; the receipt comes beside it.
    assert isinstance(first["id"], int)
    assert 0 <= first["id"] < 2**53  # exact as a JavaScript number
    assert first["receipt"].startswith(f"{sent['id'] // 4096}:")
    assert first["id"] != sent["id"]  # a delivery's id, never the message's
    status, rest, _ = await request(http, "GET", f"{messages}?max=10")
    assert sorted(json.dumps(m["message"]) for m in rest) == ['"a"', "[1]"]
    # Nothing visible: the default wait (0) answers at once, empty.
    status, empty, _ = await request(http, "GET", messages)
    assert (status, empty) == (200, [])
    # PATCH: visible again now; the old receipt is stale after the next delivery.
    status, changed, _ = await request(http, "PATCH", f"{messages}/{first['id']}", {"vt": 0})
    assert status == 200, changed
    assert changed["id"] == first["id"]
    assert changed["visible_at"].endswith("Z")
    status, [again], _ = await request(http, "GET", f"{messages}?vt=60")
    assert again["message_id"] == sent["id"]
    assert again["read_ct"] == 2
    assert again["id"] != first["id"]  # another delivery, another number
    # The first consumer's id, after the redelivery: stale, and the message stays.
    status, stale, _ = await request(http, "DELETE", f"{messages}/{first['id']}")
    refused(status, stale, 400, "stale")
    assert stale["code"] == "failed_precondition"
    status, stale, _ = await request(http, "PATCH", f"{messages}/{first['id']}", {"vt": 0})
    refused(status, stale, 400, "stale")
    assert await depth(http, queue) == 3
    status, deleted, _ = await request(http, "DELETE", f"{messages}/{again['id']}")
    assert (status, deleted) == (204, None)
    status, gone, _ = await request(http, "DELETE", f"{messages}/{again['id']}")
    refused(status, gone, 404)
    # Batch delete: the ids deleted, each on its own.
    status, batch_deleted, _ = await request(
        http, "DELETE", messages, {"ids": [rest[0]["id"], rest[1]["id"], first["id"]]}
    )
    assert status == 200, batch_deleted
    assert batch_deleted == {"deleted": [rest[0]["id"], rest[1]["id"]]}
    assert await depth(http, queue) == 0


async def test_a_fifo_queue_made_as_beyond_queue_makes_it_is_reached_by_its_plain_name(
    http: aiohttp.ClientSession, database_url: str
) -> None:
    """beyond-queue's script: {"name": "orders", "fifo": true}, then /v1/queues/orders/...
    The queue is postbox's (and SQS's) `orders.fifo`; the plain name reaches it on every
    queue route while no standard queue `orders` exists."""
    name = unique_name("rest_bq_fifo")
    status, created, headers = await request(
        http, "POST", "/v1/queues", {"name": name, "fifo": True}
    )
    assert status == 201, created
    assert (created["name"], created["fifo"]) == (f"{name}.fifo", True)
    assert headers["Location"] == f"/v1/queues/{name}.fifo"
    status, again, _ = await request(http, "POST", "/v1/queues", {"name": name, "fifo": True})
    assert (status, again) == (200, created)
    messages = f"/v1/queues/{name}/messages"
    status, sent, _ = await request(
        http, "POST", messages,
        [{"message": "a1", "group_id": "a"}, {"message": "a2", "group_id": "a"},
         {"message": "b1", "group_id": "b"}],
    )  # fmt: skip
    assert status == 201, sent
    status, metrics, _ = await request(http, "GET", f"/v1/queues/{name}")
    assert (status, metrics["queue_name"], metrics["queue_length"]) == (200, f"{name}.fifo", 3)
    status, received, _ = await request(http, "GET", f"{messages}?max=10&vt=60&fifo=true")
    assert status == 200, received
    assert [m["message"] for m in received] == ["a1", "a2", "b1"]
    status, changed, _ = await request(http, "PATCH", f"{messages}/{received[2]['id']}", {"vt": 0})
    assert status == 200, changed
    status, deleted, _ = await request(http, "DELETE", f"{messages}/{received[0]['id']}")
    assert (status, deleted) == (204, None)
    status, batch, _ = await request(http, "DELETE", messages, {"ids": [received[1]["id"]]})
    assert (status, batch) == (200, {"deleted": [received[1]["id"]]})
    status, subscriptions, _ = await request(http, "GET", f"/v1/queues/{name}/subscriptions")
    assert (status, subscriptions) == (200, [])
    status, purged, _ = await request(http, "POST", f"/v1/queues/{name}/purge")
    assert (status, purged) == (200, {"deleted": 1})
    # A send without a deduplication_id is not deduplicated, as in beyond-queue...
    for _ in range(2):
        status, _, _ = await request(http, "POST", messages, {"message": "x", "group_id": "x"})
        assert status == 201
    assert await depth(http, name) == 2
    # ...unless the queue deduplicates by content, which then holds as on every door.
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "SELECT postbox.update_queue($1, '{\"content_based_deduplication\": true}')",
            f"{name}.fifo",
        )
    finally:
        await conn.close()
    for _ in range(2):
        status, _, _ = await request(http, "POST", messages, [{"message": "y", "group_id": "y"}])
        assert status == 201
    assert await depth(http, name) == 3
    status, purged, _ = await request(http, "POST", f"/v1/queues/{name}/purge")
    assert (status, purged) == (200, {"deleted": 3})
    # Its full name works as well; the listing shows that one.
    status, metrics, _ = await request(http, "GET", f"/v1/queues/{name}.fifo")
    assert (status, metrics["queue_length"]) == (200, 0)
    status, listed, _ = await request(http, "GET", "/v1/queues")
    assert [q["name"] for q in listed if q["name"].startswith(name)] == [f"{name}.fifo"]
    # With a standard queue of the plain name, the plain name is that queue's, and a
    # 404 of one of its routes is its own: a FIFO message's id deletes nothing there.
    fifo_messages = f"/v1/queues/{name}.fifo/messages"
    await request(http, "POST", fifo_messages, {"message": "f", "group_id": "g"})
    status, [fifo_message], _ = await request(http, "GET", fifo_messages)
    status, standard, _ = await request(http, "POST", "/v1/queues", {"name": name})
    assert (status, standard["fifo"]) == (201, False)
    status, metrics, _ = await request(http, "GET", f"/v1/queues/{name}")
    assert (metrics["queue_name"], metrics["queue_length"]) == (name, 0)
    status, missing, _ = await request(http, "DELETE", f"{messages}/{fifo_message['id']}")
    refused(status, missing, 404)
    assert await depth(http, f"{name}.fifo") == 1
    status, _, _ = await request(http, "DELETE", f"/v1/queues/{name}")
    assert status == 204
    # Then the plain name reaches the FIFO queue again, for its deletion too.
    status, _, _ = await request(http, "DELETE", f"/v1/queues/{name}")
    assert status == 204
    status, gone, _ = await request(http, "GET", f"/v1/queues/{name}")
    refused(status, gone, 404, repr(name))
    status, gone, _ = await request(http, "GET", f"/v1/queues/{name}.fifo")
    refused(status, gone, 404)


async def test_a_delivery_id_works_on_any_process_until_the_message_is_delivered_again(
    http: aiohttp.ClientSession, rest_server: HttpServerProcess, database_url: str
) -> None:
    queue = await new_queue(http, "rest_ids")
    messages = f"/v1/queues/{queue}/messages"
    await request(http, "POST", messages, [{"message": i} for i in range(3)])
    status, received, _ = await request(http, "GET", f"{messages}?max=3&vt=60")
    assert status == 200, received
    first, second, third = received
    assert all(isinstance(m["id"], int) and 0 < m["id"] < 2**53 for m in received)
    other = HttpServerProcess(database_url).start()
    try:
        async with aiohttp.ClientSession(other.base) as elsewhere:
            # Released by its id on another process, then delivered again.
            status, changed, _ = await request(
                elsewhere, "PATCH", f"{messages}/{first['id']}", {"vt": 0}
            )
            assert (status, changed["id"]) == (200, first["id"]), changed
            status, again, _ = await request(http, "GET", f"{messages}?vt=60")
            assert status == 200, again
            assert again[0]["message_id"] == first["message_id"]
            assert again[0]["id"] != first["id"]
            # The first delivery's id is stale now, everywhere: it changes nothing.
            for server in (http, elsewhere):
                status, stale, _ = await request(server, "DELETE", f"{messages}/{first['id']}")
                refused(status, stale, 400, "stale", f"'{first['message_id'] // 4096}#1'")
                status, stale, _ = await request(
                    server, "PATCH", f"{messages}/{first['id']}", {"vt": 0}
                )
                refused(status, stale, 400, "stale")
            status, batch, _ = await request(
                elsewhere, "DELETE", messages, {"ids": [first["id"], second["id"]]}
            )
            assert (status, batch) == (200, {"deleted": [second["id"]]})
            status, done, _ = await request(elsewhere, "DELETE", f"{messages}/{again[0]['id']}")
            assert status == 204, done
            # Deleted: 404 on either process.
            status, gone, _ = await request(elsewhere, "DELETE", f"{messages}/{second['id']}")
            refused(status, gone, 404)
    finally:
        other.stop()
    status, gone, _ = await request(http, "DELETE", f"{messages}/{again[0]['id']}")
    refused(status, gone, 404)
    status, batch, _ = await request(http, "DELETE", messages, {"ids": [third["id"]]})
    assert (status, batch) == (200, {"deleted": [third["id"]]})
    assert await depth(http, queue) == 0


async def test_a_sends_id_deletes_the_message_whoever_holds_it(
    http: aiohttp.ClientSession, database_url: str
) -> None:
    """beyond-queue's scripts delete by the id a send returned, without receiving first,
    and its delete removes the message whoever holds it (DELETE ... WHERE msg_id = $id)."""
    queue = await new_queue(http, "rest_send_ids")
    messages = f"/v1/queues/{queue}/messages"
    # Waiting: deleted (cancelled) by the send's id; then gone.
    status, sent, _ = await request(http, "POST", messages, {"message": "waiting"})
    assert status == 201, sent
    assert sent["id"] % 4096 == 0  # receive-count part 0: the message, not a delivery
    status, deleted, _ = await request(http, "DELETE", f"{messages}/{sent['id']}")
    assert (status, deleted) == (204, None)
    status, gone, _ = await request(http, "DELETE", f"{messages}/{sent['id']}")
    refused(status, gone, 404)
    # Held by a consumer: deleted all the same; the consumer's delivery id is then gone.
    status, held, _ = await request(http, "POST", messages, {"message": "held"})
    status, [delivery], _ = await request(http, "GET", f"{messages}?vt=600")
    assert delivery["message_id"] == held["id"] != delivery["id"]
    status, deleted, _ = await request(http, "DELETE", f"{messages}/{held['id']}")
    assert (status, deleted) == (204, None)
    assert await depth(http, queue) == 0
    status, gone, _ = await request(http, "DELETE", f"{messages}/{delivery['id']}")
    refused(status, gone, 404)
    # PATCH by a send's id changes the lease of the delivery holding the message, and
    # is refused while none does.
    status, sent, _ = await request(http, "POST", messages, {"message": "patched"})
    status, unheld, _ = await request(http, "PATCH", f"{messages}/{sent['id']}", {"vt": 0})
    refused(status, unheld, 400, "not in flight", "delay")
    assert unheld["code"] == "failed_precondition"
    status, [first], _ = await request(http, "GET", f"{messages}?vt=600")
    status, changed, _ = await request(http, "PATCH", f"{messages}/{sent['id']}", {"vt": 0})
    assert (status, changed["id"]) == (200, sent["id"]), changed
    status, [second], _ = await request(http, "GET", f"{messages}?vt=600")
    assert (second["message_id"], second["read_ct"]) == (sent["id"], 2)
    # A stale receive id still deletes nothing; the send's id does, in a batch too.
    status, stale, _ = await request(http, "DELETE", f"{messages}/{first['id']}")
    refused(status, stale, 400, "stale")
    status, batch, _ = await request(
        http, "DELETE", messages, {"ids": [first["id"], sent["id"], 4096 * (2**40)]}
    )
    assert (status, batch) == (200, {"deleted": [sent["id"]]})
    assert await depth(http, queue) == 0
    # Every 4096th delivery is named by its receipt, so part 0 is never a delivery's.
    status, sent, _ = await request(http, "POST", messages, {"message": "often"})
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE postbox.messages SET receive_count = 4095 WHERE id = $1", sent["id"] // 4096
        )
    finally:
        await conn.close()
    status, [often], _ = await request(http, "GET", f"{messages}?vt=600")
    assert often["read_ct"] == 4096
    assert often["id"] == often["receipt"]
    status, deleted, _ = await request(http, "DELETE", f"{messages}/{often['id']}")
    assert (status, deleted) == (204, None)


async def test_receive_waits_for_a_message(http: aiohttp.ClientSession) -> None:
    queue = await new_queue(http, "rest_wait")
    messages = f"/v1/queues/{queue}/messages"
    waiting = asyncio.create_task(request(http, "GET", f"{messages}?wait=20"))
    # The receive may start before or after the send: either way it returns the message,
    # and the 20 s wait is far longer than either takes on a loaded machine.
    await request(http, "POST", messages, {"message": "late"})
    status, [message], _ = await waiting
    assert (status, message["message"]) == (200, "late")


async def test_events_fan_out_to_queues_and_endpoints(http: aiohttp.ClientSession) -> None:
    queue = await new_queue(http, "rest_events")
    word = unique_name("orders").replace("-", "_")
    pattern = f"{word}.*"
    status, subscribed, _ = await request(
        http, "POST", f"/v1/events/{pattern}/subscriptions", {"queue_name": queue}
    )
    assert status == 201, subscribed
    assert subscribed["pattern"] == pattern
    assert subscribed["queue_name"] == queue
    assert subscribed["protocol"] == "sqs"
    assert subscribed["endpoint"] is None
    receiver = Receiver().start()
    try:
        status, hook, _ = await request(
            http,
            "POST",
            f"/v1/events/{pattern}/subscriptions",
            {"protocol": "http", "endpoint": receiver.url("/hook")},
        )
        assert status == 201, hook
        assert hook["protocol"] == "http"
        assert hook["envelope"] is False
        status, listed, _ = await request(http, "GET", f"/v1/events/{pattern}/subscriptions")
        assert status == 200
        assert sorted(s["id"] for s in listed) == sorted([subscribed["id"], hook["id"]])
        status, by_queue, _ = await request(http, "GET", f"/v1/queues/{queue}/subscriptions")
        assert (status, by_queue) == (200, [subscribed])
        status, published, _ = await request(
            http, "POST", f"/v1/events/{word}.created", {"message": {"total": 5}}
        )
        assert status == 201, published
        assert published["queues_matched"] == 1
        assert published["messages"][0]["queue"] == queue
        assert published["webhook_deliveries"] == 1
        # The endpoint gets the raw message, as beyond-queue's REST subscriptions default.
        [delivered] = await asyncio.to_thread(receiver.wait_for, "/hook", 1)
        assert json.loads(delivered.body) == {"total": 5}
    finally:
        receiver.stop()
    status, [message], _ = await request(http, "GET", f"/v1/queues/{queue}/messages")
    assert message["message_id"] == published["messages"][0]["id"]
    assert message["message"] == {"total": 5}
    status, nothing, _ = await request(http, "POST", f"/v1/events/{word}", {"message": 1})
    assert (status, nothing["queues_matched"]) == (201, 0)
    path = f"/v1/events/{pattern}/subscriptions/{subscribed['id']}"
    status, _, _ = await request(http, "DELETE", path)
    assert status == 204
    status, missing, _ = await request(http, "DELETE", path)
    refused(status, missing, 404)
    status, other, _ = await request(
        http,
        "DELETE",
        f"/v1/events/{word}.%23/subscriptions/{hook['id']}",  # "#", escaped
    )
    refused(status, other, 404, "pattern")


async def test_a_delayed_event_is_invisible_until_its_delay(http: aiohttp.ClientSession) -> None:
    """delay: 2 s, so the receive right after the publish is before it (see the engine's
    test_topic_delayed_publish); the wait of 20 s is generous for a loaded machine."""
    queue = await new_queue(http, "rest_delayed_event")
    word = unique_name("later").replace("-", "_")
    status, _, _ = await request(
        http, "POST", f"/v1/events/{word}/subscriptions", {"queue_name": queue}
    )
    assert status == 201
    start = asyncio.get_running_loop().time()
    status, published, _ = await request(
        http, "POST", f"/v1/events/{word}", {"message": "later", "delay": 2}
    )
    assert (status, published["queues_matched"]) == (201, 1)
    status, empty, _ = await request(http, "GET", f"/v1/queues/{queue}/messages")
    assert (status, empty) == (200, [])
    status, [message], _ = await request(http, "GET", f"/v1/queues/{queue}/messages?wait=20")
    assert message["message"] == "later"
    assert asyncio.get_running_loop().time() - start >= 2
    for delay, words in ((-1, ["delay", "0 or more"]), ("2s", ["delay"]), (365 * 86400, ["365"])):
        status, bad, _ = await request(
            http, "POST", f"/v1/events/{word}", {"message": 1, "delay": delay}
        )
        refused(status, bad, 400, *words)
    assert await depth(http, queue) == 1  # the one received


async def test_schedules_create_upsert_pause_run_delete(http: aiohttp.ClientSession) -> None:
    queue = await new_queue(http, "rest_schedules")
    name = unique_name("nightly")
    spec = {
        "name": name,
        "cron": "0 9 * * *",
        "timezone": "Europe/Berlin",
        "target_kind": "queue",
        "target": queue,
        "message": {"job": "report"},
        "headers": {"source": "cron"},
    }
    status, created, headers = await request(http, "POST", "/v1/schedules", spec)
    assert status == 201, created
    assert headers["Location"] == f"/v1/schedules/{name}"
    assert created["cron"] == "0 9 * * *"
    assert created["timezone"] == "Europe/Berlin"
    assert created["status"] == "active"
    assert created["fire_count"] == 0
    assert len(created["next_fires"]) == 5
    assert created["next_fires"][0] == created["next_fire_at"]
    status, taken, _ = await request(http, "POST", "/v1/schedules", spec)
    refused(status, taken, 409)
    status, got, _ = await request(http, "GET", f"/v1/schedules/{name}")
    assert (status, got) == (200, created)
    # PUT: 200 updating, 201 creating.
    status, updated, _ = await request(
        http,
        "PUT",
        f"/v1/schedules/{name}",
        {**spec, "every": "5m", "cron": None, "timezone": None},
    )
    assert status == 200, updated
    assert updated["every"] == 300
    assert "cron" not in updated
    fresh = unique_name("hourly")
    status, made, _ = await request(
        http, "PUT", f"/v1/schedules/{fresh}",
        {"every": 3600, "target_kind": "topic", "target": "reports.hourly", "message": 1},
    )  # fmt: skip
    assert status == 201, made
    assert (made["target_kind"], made["target"]) == ("topic", "reports.hourly")
    # PATCH pauses and resumes.
    status, paused, _ = await request(http, "PATCH", f"/v1/schedules/{name}", {"status": "paused"})
    assert (status, paused["status"], paused["next_fires"]) == (200, "paused", [])
    status, listed, _ = await request(
        http, "GET", f"/v1/schedules?status=paused&name_prefix={name}"
    )
    assert [s["name"] for s in listed] == [name]
    status, listed, _ = await request(http, "GET", "/v1/schedules?target_kind=topic")
    assert fresh in [s["name"] for s in listed]
    assert name not in [s["name"] for s in listed]
    status, resumed, _ = await request(http, "PATCH", f"/v1/schedules/{name}", {"status": "active"})
    assert (status, resumed["status"]) == (200, "active")
    # A run now: 202 with the ids of the messages it committed.
    status, ran, _ = await request(http, "POST", f"/v1/schedules/{name}/runs")
    assert status == 202, ran
    assert ran["schedule"] == name
    assert len(ran["msg_ids"]) == 1
    status, [fired], _ = await request(http, "GET", f"/v1/queues/{queue}/messages")
    assert fired["message_id"] == ran["msg_ids"][0]
    assert fired["message"] == {"job": "report"}
    # As beyond-queue's headers._schedule: which schedule, for when, and that a run is
    # out of band (its scheduled_for is the run's moment).
    schedule_header = fired["headers"].pop("_schedule")
    assert fired["headers"] == {"source": "cron"}
    assert set(schedule_header) == {"name", "scheduled_for", "out_of_band"}
    assert (schedule_header["name"], schedule_header["out_of_band"]) == (name, True)
    assert schedule_header["scheduled_for"].endswith("Z")
    status, after, _ = await request(http, "GET", f"/v1/schedules/{name}")
    assert after["fire_count"] == 1
    assert after["next_fire_at"] == resumed["next_fire_at"]
    # DELETE is idempotent.
    for _ in range(2):
        status, answer, _ = await request(http, "DELETE", f"/v1/schedules/{name}")
        assert (status, answer) == (204, None)
    status, missing, _ = await request(http, "GET", f"/v1/schedules/{name}")
    refused(status, missing, 404)
    status, missing, _ = await request(http, "POST", f"/v1/schedules/{name}/runs")
    refused(status, missing, 404)


async def test_schedule_shapes_policies_and_descriptions(http: aiohttp.ClientSession) -> None:
    """`when` is stored as the cron it means; catchup, catchup_limit and failure_threshold
    round-trip; reads carry human_readable and next_fires; previews the canonical form."""
    queue = await new_queue(http, "rest_when")
    name = unique_name("standup")
    spec = {
        "name": name, "when": "every weekday at 9:30am", "timezone": "Europe/Berlin",
        "target_kind": "queue", "target": queue, "message": "standup",
        "catchup": True, "catchup_limit": 3, "failure_threshold": 5,
    }  # fmt: skip
    status, created, _ = await request(http, "POST", "/v1/schedules", spec)
    assert status == 201, created
    assert (created["cron"], created["timezone"]) == ("30 9 * * MON-FRI", "Europe/Berlin")
    assert "when" not in created
    assert created["human_readable"] == "At 09:30 on Monday through Friday (Europe/Berlin)"
    assert (created["catchup"], created["catchup_limit"]) == (True, 3)
    assert (created["failure_threshold"], created["consecutive_failures"]) == (5, 0)
    assert len(created["next_fires"]) == 5
    # PATCH: catchup off, no threshold.
    status, patched, _ = await request(
        http, "PATCH", f"/v1/schedules/{name}", {"catchup": False, "failure_threshold": 0}
    )
    assert status == 200, patched
    assert (patched["catchup"], patched["catchup_limit"], patched["failure_threshold"]) == (
        False, None, None,
    )  # fmt: skip
    # catchup alone takes the default limit.
    status, patched, _ = await request(http, "PATCH", f"/v1/schedules/{name}", {"catchup": True})
    assert (patched["catchup"], patched["catchup_limit"]) == (True, 100)
    status, preview, _ = await request(
        http, "POST", "/v1/previews", {"when": "every monday and friday at noon", "count": 2}
    )
    assert status == 200, preview
    assert (preview["cron"], preview["timezone"]) == ("0 12 * * MON,FRI", "UTC")
    assert preview["human_readable"] == "At 12:00 on Monday and Friday (UTC)"
    assert all(t.endswith("T12:00:00Z") for t in preview["next_fires"])
    status, preview, _ = await request(http, "POST", "/v1/previews", {"every": "90m"})
    assert (status, preview["human_readable"]) == (200, "Every 1 hour 30 minutes")
    status, preview, _ = await request(http, "POST", "/v1/previews", {"cron": "0  9 * *  sun"})
    assert (preview["cron"], preview["human_readable"]) == (
        "0 9 * * SUN",
        "At 09:00 on Sunday (UTC)",
    )


async def test_previews_store_nothing(http: aiohttp.ClientSession) -> None:
    status, preview, _ = await request(
        http, "POST", "/v1/previews", {"cron": "30 6 * * MON", "timezone": "UTC", "count": 3}
    )
    assert status == 200, preview
    assert preview["cron"] == "30 6 * * MON"
    assert len(preview["next_fires"]) == 3
    assert all(t.endswith("T06:30:00Z") for t in preview["next_fires"])
    status, preview, _ = await request(http, "POST", "/v1/previews", {"every": "1d", "count": 2})
    assert (status, preview["every"], len(preview["next_fires"])) == (200, 86400, 2)
    status, bad, _ = await request(http, "POST", "/v1/previews", {"cron": "61 * * * *"})
    refused(status, bad, 400)
    status, bad, _ = await request(http, "POST", "/v1/previews", {"every": 60, "count": 0})
    refused(status, bad, 400, "count")
    status, bad, _ = await request(http, "POST", "/v1/previews", {"every": 60, "count": 101})
    refused(status, bad, 400, "count")
    status, bad, _ = await request(http, "POST", "/v1/previews", {"count": 3})
    refused(status, bad, 400, "timing")


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("POST", "/messages", {"message": 1, "headers": {"a b": 1}}, ["'a b'", "may only"]),
        ("POST", "/messages", {"message": 1, "delay": -1}, ["delay", "0 or more"]),
        ("POST", "/messages", [{"message": 1}, {"body": 2}], ["[1]", "body"]),
        ("POST", "/messages", b"{not json", ["not JSON"]),
        ("POST", "/messages", b"", ["empty"]),
        ("GET", "/messages?max=ten", None, ["max", "'ten'"]),
        ("GET", "/messages?vt=-5", None, ["vt"]),
        ("GET", "/messages?fifo=maybe", None, ["fifo"]),
        ("GET", "/messages?max=1001", None, ["1001"]),
        ("GET", "/messages?max=0", None, ["max"]),
        ("GET", "/messages?vt=43201", None, ["12 h"]),
        ("GET", "/messages?wait=301", None, ["300"]),
        ("GET", "/messages?wait=1234567890", None, ["9 digits"]),
        ("POST", "/messages", [], ["1"]),
        ("POST", "/messages", [{"message": i} for i in range(1001)], ["1001"]),
        ("POST", "/messages", {"message": 1, "headers": {f"h{i}": i for i in range(101)}}, ["100"]),
        ("DELETE", "/messages", {"ids": []}, ["1"]),
        ("DELETE", "/messages", {"ids": [1.5]}, ["ids"]),
        ("DELETE", "/messages", {"ids": [True]}, ["ids"]),
        ("PATCH", "/messages/1:x", {}, ["vt"]),
        ("PATCH", "/messages/1:x", {"vt": "soon"}, ["vt"]),
        ("DELETE", "/messages/not-a-receipt", None, ["receipt"]),
    ],
)
async def test_bad_input_is_a_precise_400_that_changes_nothing(
    http: aiohttp.ClientSession, method: str, path: str, body: Any, words: list[str]
) -> None:
    queue = await new_queue(http, "rest_bad")
    await request(http, "POST", f"/v1/queues/{queue}/messages", {"message": "kept"})
    raw = body if isinstance(body, bytes) else None
    status, answer, _ = await request(
        http, method, f"/v1/queues/{queue}{path}", None if raw is not None else body, raw=raw
    )
    refused(status, answer, 400, *words)
    assert answer["code"] == "invalid_argument"
    assert await depth(http, queue) == 1
    status, [kept], _ = await request(http, "GET", f"/v1/queues/{queue}/messages")
    assert kept["read_ct"] == 1  # no receive claimed it


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"name": "x", "cron": "* * * * *", "every": 60}, ["one timing"]),
        ({"name": "x", "when": "tomorrow", "target_kind": "queue", "target": "q"},
         ["when", "every day at 9am"]),
        ({"name": "x", "when": "every day at 25:00"}, ["25:00"]),
        ({"name": "x", "when": 9}, ["when", "phrase"]),
        ({"name": "x", "every": 60, "catchup": "yes"}, ["catchup", "true or false"]),
        ({"name": "x", "every": 60, "catchup_limit": 1.5}, ["catchup_limit", "whole number"]),
        ({"name": "x", "every": 60, "failure_threshold": "3"}, ["failure_threshold"]),
        ({"name": "x", "every": "5 minutes"}, ["every", '"5m"']),
        ({"name": "x", "every": 60, "target_kind": "workflow", "target": "w"}, ["target_kind"]),
        ({"name": "x", "every": 60, "timezone": "UTC"}, ["timezone"]),
        ({"name": "x", "every": 60, "target_kind": "queue", "target": "q", "status": "on"},
         ["status"]),
        ({"name": "x", "fire_at": "tomorrow"}, ["fire_at", "RFC 3339"]),
        ({"name": "x", "colour": "red"}, ["colour"]),
        ({"cron": "* * * * *"}, ["name"]),
    ],
)  # fmt: skip
async def test_bad_schedules_are_refused_and_nothing_is_stored(
    http: aiohttp.ClientSession, body: dict[str, Any], words: list[str]
) -> None:
    status, answer, _ = await request(http, "POST", "/v1/schedules", body)
    refused(status, answer, 400, *words)
    status, _, _ = await request(http, "GET", "/v1/schedules/x")
    assert status == 404


async def test_a_body_over_the_limit_is_refused_unread(http: aiohttp.ClientSession) -> None:
    queue = await new_queue(http, "rest_limit")
    status, answer, _ = await request(
        http, "POST", f"/v1/queues/{queue}/messages", {"message": "x" * BODY_LIMIT}
    )
    refused(status, answer, 429, "--http-max-request-size", str(BODY_LIMIT))
    assert answer["code"] == "resource_exhausted"
    assert await depth(http, queue) == 0
    long_name = "q" * 81
    status, answer, _ = await request(http, "POST", "/v1/queues", {"name": long_name})
    refused(status, answer, 400, "81")


async def test_put_names_one_schedule(http: aiohttp.ClientSession) -> None:
    status, answer, _ = await request(http, "PUT", "/v1/schedules/a", {"name": "b", "every": 60})
    refused(status, answer, 400, "'b'", "'a'")


async def test_unknown_paths_and_methods(http: aiohttp.ClientSession) -> None:
    status, answer, _ = await request(http, "GET", "/v1/nothing-here")
    refused(status, answer, 404, "openapi.json")
    status, answer, headers = await request(http, "PUT", "/v1/queues")
    refused(status, answer, 405)
    assert headers["Allow"] == "POST, GET"


async def test_cert_is_served_by_default(http: aiohttp.ClientSession) -> None:
    # No --sns-signing-key: the server made a key beside its data directory (kept over
    # restarts: tests/aws/test_sns_signatures.py), and serves its certificate.
    certs = []
    for path in ("/v1/cert", "/SimpleNotificationService.pem"):
        async with http.get(path) as answer:
            assert answer.status == 200
            assert answer.content_type == "application/x-pem-file"
            certs.append(await answer.read())
    assert certs[0] == certs[1]
    assert certs[0].startswith(b"-----BEGIN CERTIFICATE-----")


# Keys: a database of their own (a key turns authentication on for the whole database).


@pytest.fixture(scope="module")
def keyed(admin_url: str) -> Iterator[tuple[HttpServerProcess, dict[str, str]]]:
    url = create_database(admin_url, "postbox_rest_auth")
    process = HttpServerProcess(url).start()
    secrets = {
        "admin": bootstrap_key(url, "rest-admin", "manage:*", "send:*", "receive:*", "read:*"),
        "sender": bootstrap_key(url, "rest-sender", "send:orders-*", "read:orders-*"),
    }
    probe = urllib.request.Request(f"{process.base}/v1/queues")

    def keys_known() -> bool:
        try:
            urllib.request.urlopen(probe, timeout=5).close()
        except urllib.error.HTTPError as refusal:
            return refusal.code == 401
        return False

    process.wait_ready(keys_known, "authentication turned on by the first key", 30)
    yield process, secrets
    process.stop()
    drop_database(admin_url, url)


async def test_keys_and_grants_answer_as_over_connect(
    keyed: tuple[HttpServerProcess, dict[str, str]],
) -> None:
    server, secrets = keyed
    admin = {"Authorization": f"Bearer {secrets['admin']}"}
    sender = {"Authorization": f"Bearer {secrets['sender']}"}
    mine, other = f"orders-{unique_name('rest')}", f"billing-{unique_name('rest')}"
    async with aiohttp.ClientSession(server.base) as http:
        for name in (mine, other):
            status, created, _ = await request(
                http, "POST", "/v1/queues", {"name": name}, headers=admin
            )
            assert status == 201, created
        send = {"message": "hi"}
        # No key: 401, before the body is looked at (bad input is no different).
        status, answer, _ = await request(http, "POST", f"/v1/queues/{mine}/messages", send)
        refused(status, answer, 401, "API key")
        status, answer, _ = await request(
            http, "POST", f"/v1/queues/{mine}/messages", raw=b"{broken"
        )
        refused(status, answer, 401)
        # Within the grant, and beyond it: Connect's 403 and message.
        status, _, _ = await request(
            http, "POST", f"/v1/queues/{mine}/messages", send, headers=sender
        )
        assert status == 201
        status, answer, _ = await request(
            http, "POST", f"/v1/queues/{other}/messages", send, headers=sender
        )
        refused(status, answer, 403, "'send'", other)
        connect = {"Content-Type": "application/json", **sender}
        async with http.post(
            "/postbox.v1.MessageService/Send",
            data=json.dumps({"queue": other, "body": "aGk="}),
            headers=connect,
        ) as over_connect:
            assert over_connect.status == 403
            assert (await over_connect.json())["message"] == answer["error"]
        status, answer, _ = await request(http, "DELETE", f"/v1/queues/{mine}", headers=sender)
        refused(status, answer, 403, "'manage'")
        # A key's bad input is the key's to hear about.
        status, answer, _ = await request(
            http, "POST", f"/v1/queues/{mine}/messages", raw=b"{broken", headers=sender
        )
        refused(status, answer, 400, "not JSON")
        # A delivery id of no message of the queue: the key first (401), then 404.
        unknown = f"/v1/queues/{mine}/messages/12345"
        status, answer, _ = await request(http, "DELETE", unknown)
        refused(status, answer, 401)
        status, answer, _ = await request(http, "DELETE", unknown, headers=admin)
        refused(status, answer, 404)
        # Lists come back filtered to what the key may read.
        status, listed, _ = await request(http, "GET", "/v1/queues", headers=sender)
        assert status == 200
        names = {q["name"] for q in listed}
        assert mine in names
        assert other not in names


async def test_a_schedule_that_publishes_makes_the_events_topic_it_routes_into(
    http: aiohttp.ClientSession,
) -> None:
    """beyond-queue's exchange is there from the start; here its topic is made by the first
    call that routes into it, a schedule as well as a subscription."""
    status, answer, _ = await request(
        http, "POST", "/postbox.v1.TopicService/DeleteTopic", {"name": "events"}
    )
    assert status in (200, 404), answer  # gone, whichever test of this run made it
    name = unique_name("publishing")
    spec = {"every": 3600, "target_kind": "topic", "target": "reports.hourly", "message": 1}
    status, made, _ = await request(http, "PUT", f"/v1/schedules/{name}", spec)
    assert status == 201, made
    status, topic, _ = await request(
        http, "POST", "/postbox.v1.TopicService/GetTopic", {"name": "events"}
    )
    assert status == 200, topic
    status, _, _ = await request(http, "DELETE", f"/v1/schedules/{name}")
    assert status == 204
