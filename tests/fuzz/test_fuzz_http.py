"""schemathesis against api/openapi.json on a live server with an API key: every
operation, data generated from the document's schemas (with the constraints the protos'
comments state), and for every call:

- no status of 500 or above;
- the answer fits the document: a 200 its response schema, anything else the Connect
  error schema;
- a refused call (4xx) changes nothing: the resource tables read the same before and
  after it.

POSTBOX_FUZZ_HTTP_EXAMPLES sets the examples per operation (a long pass:
scripts/fuzz-http).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    ensure_resource_availability,
    not_a_server_error,
    response_schema_conformance,
    use_after_free,
)
from support import ROOT, HttpServerProcess, bootstrap_key, create_database, drop_database

EXAMPLES = int(os.environ.get("POSTBOX_FUZZ_HTTP_EXAMPLES", "4"))
SCHEMA = schemathesis.openapi.from_path(ROOT / "api" / "openapi.json")

# The resources as the API defines them, less the columns the server's workers change on
# their own (a queue's listener flag, a schedule's fire bookkeeping, a webhook
# subscription's suspension): what a refused call must leave as it was.
RESOURCES = """
SELECT md5(coalesce(string_agg(row, E'\\n' ORDER BY row), '')) FROM (
    SELECT 'queue ' || (to_jsonb(q) - 'listened')::text FROM postbox.queues q
    UNION ALL SELECT 'topic ' || to_jsonb(t)::text FROM postbox.topics t
    UNION ALL SELECT 'subscription ' || (to_jsonb(s) - 'suspended')::text
              FROM postbox.subscriptions s
    UNION ALL SELECT 'group ' || to_jsonb(g)::text FROM postbox.consumer_groups g
    UNION ALL SELECT 'schedule ' || (to_jsonb(s) - 'next_fire_at' - 'last_fire_at'
                                     - 'last_error' - 'fire_count' - 'updated_at')::text
              FROM postbox.schedules s
    UNION ALL SELECT 'key ' || to_jsonb(k)::text FROM postbox.api_keys k
    UNION ALL SELECT 'grant ' || to_jsonb(g)::text FROM postbox.api_key_grants g
) AS resources(row)
"""


# Everything the calls made, gone: each chain starts from the same state, so that a
# chain Hypothesis replays (its generation walks prefixes it ran before) meets the same
# answers and draws the same calls; a queue kept from an earlier chain answered 409
# where the first run's 200 had offered a link, and Hypothesis failed the run as a
# flaky strategy.
RESET = """
DO $$
DECLARE
    queue text;
BEGIN
    PERFORM postbox.delete_tenant(name, true) FROM postbox.tenants;
    PERFORM postbox.delete_schedule(name) FROM postbox.schedules;
    PERFORM postbox.delete_topic(name) FROM postbox.topics;
    LOOP  -- a dead-letter queue goes after the queues that send to it
        SELECT q.name INTO queue FROM postbox.queues q
        WHERE NOT EXISTS (SELECT FROM postbox.queues s WHERE s.dead_letter_queue_id = q.id)
        LIMIT 1;
        EXIT WHEN queue IS NULL;
        PERFORM postbox.drop_queue(queue);
    END LOOP;
    DELETE FROM postbox.api_keys WHERE name <> 'fuzz-admin';
END
$$
"""


@dataclass
class Target:
    base: str
    headers: dict[str, str]
    loop: asyncio.AbstractEventLoop
    conn: asyncpg.Connection

    def resources(self) -> str:
        return self.loop.run_until_complete(self.conn.fetchval(RESOURCES))

    def reset(self) -> None:
        self.loop.run_until_complete(self.conn.execute(RESET))


@pytest.fixture(scope="module")
def target(admin_url: str) -> Iterator[Target]:
    """A server of its own: its admin key turns auth on for the whole database."""
    url = create_database(admin_url, "postbox_fuzz_http")
    server = HttpServerProcess(url).start()
    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(asyncpg.connect(url))
    try:
        secret = bootstrap_key(url, "fuzz-admin", "admin:*")
        yield Target(server.base, {"Authorization": f"Bearer {secret}"}, loop, conn)
    finally:
        loop.run_until_complete(conn.close())
        loop.close()
        server.stop()
        drop_database(admin_url, url)


def test_the_document_offers_only_what_http_serves():
    operations = {result.ok().path for result in SCHEMA.get_all_operations()}
    assert "/postbox.v1.MessageService/StreamingReceive" not in operations
    assert len(operations) >= 60


def test_the_document_carries_the_limits_the_protos_state():
    schemas = SCHEMA.raw_schema["components"]["schemas"]
    queue = schemas["postbox.v1.Queue"]["properties"]
    assert queue["name"]["pattern"] == r"^([A-Za-z0-9_-]{1,80}(\.fifo)?)?$"
    assert queue["tags"]["maxProperties"] == 50
    assert queue["createTime"]["readOnly"] is True
    send = schemas["postbox.v1.SendRequest"]
    assert send["required"] == ["queue"]
    assert send["properties"]["queue"]["pattern"] == r"^[A-Za-z0-9_-]{1,80}(\.fifo)?$"
    assert send["properties"]["priority"] == {**send["properties"]["priority"], "maximum": 9}
    assert {"not": {"required": ["ttl", "expireTime"]}} in send["allOf"]
    batch = schemas["postbox.v1.SendBatchRequest"]["properties"]["entries"]
    assert (batch["minItems"], batch["maxItems"]) == (1, 1000)
    create = schemas["postbox.v1.CreateQueueRequest"]["properties"]["queue"]["allOf"]
    assert create[1]["required"] == ["name"]
    links = SCHEMA.raw_schema["paths"]["/postbox.v1.QueueService/CreateQueue"]["post"]
    assert links["responses"]["200"]["links"]["SendWithQueue"]["requestBody"] == {
        "queue": "$response.body#/queue/name"
    }


@schemathesis.check
def not_a_server_error_but_a_pause(ctx, response, case) -> bool | None:
    """not_a_server_error, less the one 5xx the API documents for a valid call: 503
    UNAVAILABLE from a queue or consumer group that PauseQueue or PauseConsumerGroup
    paused (a client retries it, as RabbitMQ's publishers wait out its flow control)."""
    if response.status_code == 503 and " is paused" in response.json().get("message", ""):
        return None
    return not_a_server_error(ctx, response, case)


# Each operation an id of its own: SCHEMA.parametrize() gives every one the test's id, and
# pytest-xdist's scheduler, which keys tests by id, then runs one of the 75.
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_calls_get_documented_answers_and_refusals_change_nothing(
    operation, data, target
):
    case = data.draw(operation.as_strategy())
    before = target.resources()
    response = case.call(base_url=target.base, headers=target.headers, timeout=30)
    case.validate_response(
        response, checks=[not_a_server_error_but_a_pause, response_schema_conformance]
    )
    if 400 <= response.status_code < 500:
        assert target.resources() == before, (
            f"{case.operation.path} answered {response.status_code} but changed resources: "
            f"{response.text[:300]}"
        )


def test_chained_calls_get_documented_answers(target):
    """Stateful: the document's links chain a call to the resources earlier calls made
    (CreateQueue, then Send to that queue), so the calls reach past "not found"."""

    class Workflow(SCHEMA.as_state_machine()):  # type: ignore[misc]
        before = ""

        def get_call_kwargs(self, case):
            return {"base_url": target.base, "headers": target.headers, "timeout": 30}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            # The targets, and the chains' own: a resource made is found, one deleted is
            # gone. (Not positive_data_acceptance: the document cannot state every rule,
            # a cron expression's grammar say, so a valid-looking request may be refused.)
            case.validate_response(
                response,
                checks=[
                    not_a_server_error_but_a_pause,
                    response_schema_conformance,
                    ensure_resource_availability,
                    use_after_free,
                ],
            )

        def setup(self):
            target.reset()

        def before_call(self, case):
            self.before = target.resources()

        def after_call(self, response, case):
            if 400 <= response.status_code < 500:
                assert target.resources() == self.before, (
                    f"{case.operation.path} answered {response.status_code} but changed "
                    f"resources: {response.text[:300]}"
                )

    Workflow.run(
        settings=settings(
            max_examples=EXAMPLES * 5,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
    )
