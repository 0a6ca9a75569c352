"""`postbox mcp`, driven as an agent's client drives it: the MCP SDK's own stdio client
spawns the installed command, lists its tools and calls them, against a real server of a
database with API keys, so the keys' grants decide what each tool call may do."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psutil
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult
from postbox_client import Client
from support import (
    POSTBOX,
    ServerProcess,
    bootstrap_key,
    create_database,
    drop_database,
    eventually,
    free_port,
    postbox,
    unique_name,
)

# Every tool `postbox mcp` offers.
TOOLS = {
    "list_queues", "get_queue", "create_queue", "delete_queue", "purge_queue", "queue_stats",
    "send_message", "receive_messages", "ack_message", "nack_message", "peek_messages",
    "get_message", "list_topics", "publish", "list_schedules", "create_schedule",
    "delete_schedule", "list_dead_letters", "redrive_dead_letters",
}  # fmt: skip
# A tool call's answer may wait on the server and the loaded machine (2 cores shared with
# other suites): a bound that only stops a hung test, far above a normal call.
CALL_TIMEOUT = 60.0


class Keys:
    def __init__(self, database_url: str) -> None:
        self.admin = bootstrap_key(database_url, "mcp-admin", "admin:*")
        # Reads everything, and may do nothing else.
        self.reader = bootstrap_key(database_url, "mcp-reader", "read:*")


@pytest.fixture(scope="module")
def mcp_database(admin_url: str) -> Iterator[str]:
    # Keys turn authentication on for the database: not the shared server's.
    url = create_database(admin_url, "postbox_mcp")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def mcp_server(mcp_database: str) -> Iterator[ServerProcess]:
    process = ServerProcess(mcp_database).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def keys(mcp_database: str, mcp_server: ServerProcess) -> Keys:
    # Once the server has installed the engine, whose tables hold the keys.
    return Keys(mcp_database)


@pytest.fixture
def admin(mcp_server: ServerProcess, keys: Keys) -> Iterator[Client]:
    """An SDK client with every grant, to set things up and look at them from outside."""
    with Client(mcp_server.target, api_key=keys.admin) as client:
        yield client


@asynccontextmanager
async def mcp_session(
    *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    """A session with `postbox mcp *args`, spawned by the SDK's stdio client with `env`
    (and only the environment the SDK passes on besides); its stderr goes to a file."""
    params = StdioServerParameters(command=str(POSTBOX), args=["mcp", *args], env=env or {})
    with tempfile.TemporaryFile("w+") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session,
        ):
            await session.initialize()
            yield session


def as_admin(server: ServerProcess, keys: Keys) -> Any:
    return mcp_session("--target", server.target, env={"POSTBOX_API_KEY": keys.admin})


def assert_key_not_shown_by_ps(secret: str) -> None:
    """The running `postbox mcp` has the key, and its command line (what ps shows) not."""
    (server,) = [
        child
        for child in psutil.Process().children(recursive=True)
        if "mcp" in child.cmdline()[1:3]
    ]
    assert secret not in " ".join(server.cmdline())


def answer(result: CallToolResult) -> dict[str, Any]:
    """A successful call's structured answer."""
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    """A failed call's message (a tool error, not a protocol error or a crash), after the
    "Error executing tool <name>: " the MCP SDK puts before every tool error."""
    assert result.is_error, result.structured_content
    text = " ".join(getattr(block, "text", "") for block in result.content)
    sdk_prefix, _, message = text.partition(": ")
    assert sdk_prefix.startswith("Error executing tool "), text
    return message


async def test_lists_every_tool_with_a_description_and_what_it_changes(
    mcp_server: ServerProcess, keys: Keys
) -> None:
    async with as_admin(mcp_server, keys) as session:
        listed = (await session.list_tools()).tools
    assert {tool.name for tool in listed} == TOOLS
    for tool in listed:
        assert tool.description, tool.name
        assert tool.annotations is not None, tool.name
    read_only = {t.name for t in listed if t.annotations and t.annotations.read_only_hint}
    assert read_only == {
        "list_queues", "get_queue", "queue_stats", "peek_messages", "get_message",
        "list_topics", "list_schedules", "list_dead_letters",
    }  # fmt: skip


async def test_a_call_the_keys_grants_refuse_is_a_tool_error_naming_permission_denied(
    mcp_server: ServerProcess, keys: Keys, admin: Client, tmp_path: Any
) -> None:
    queue = unique_name("mcp_denied")
    admin.create_queue(queue)
    # The reader's key from a file: the way that keeps it out of ps besides the environment.
    key_file = tmp_path / "key"
    key_file.write_text(keys.reader + "\n")
    async with mcp_session("--target", mcp_server.target, "--api-key-file", str(key_file)) as s:
        refused = await s.call_tool("send_message", {"queue": queue, "body": "not allowed"})
        message = error_text(refused)
        assert message.count("PERMISSION_DENIED") == 1, message
        assert "'send'" in message, message
        assert queue in message, message
        # The same session goes on, and what the key may do works.
        assert answer(await s.call_tool("get_queue", {"name": queue}))["name"] == queue
        assert_key_not_shown_by_ps(keys.reader)
    assert admin.peek_messages(queue) == []


async def test_sends_receives_and_acks_a_message_with_a_result(
    mcp_server: ServerProcess, keys: Keys
) -> None:
    queue = unique_name("mcp_job")
    async with as_admin(mcp_server, keys) as session:

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            return answer(await session.call_tool(tool, arguments))

        assert_key_not_shown_by_ps(keys.admin)
        created = await call("create_queue", name=queue, keep_history=True)
        assert created["name"] == queue
        assert created["archive_on_delete"] is True
        sent = await call("send_message", queue=queue, body="resize 42.png",
                          attributes={"kind": "resize"})  # fmt: skip
        stats = await call("queue_stats", name=queue)
        assert int(stats["visible_messages"]) == 1
        received = (await call("receive_messages", queue=queue, wait_seconds=5,
                               consumer_id="agent-1"))["messages"]  # fmt: skip
        assert [m["message_id"] for m in received] == [sent["message_id"]]
        assert received[0]["body"] == "resize 42.png"
        assert received[0]["attributes"]["kind"]["string_value"] == "resize"
        held = await call("get_message", queue=queue, message_id=sent["message_id"])
        assert held["state"] == "MESSAGE_STATE_IN_FLIGHT"
        assert held["consumer_id"] == "agent-1"
        await call("ack_message", queue=queue, receipt=received[0]["receipt"], result="done")
        done = await call("get_message", queue=queue, message_id=sent["message_id"])
        assert done["state"] == "MESSAGE_STATE_SUCCEEDED"
        assert done["result"] == "done"
        assert (await call("receive_messages", queue=queue))["messages"] == []
        # The receipt is used up: acking again is the server's refusal, as a tool error.
        again = await session.call_tool(
            "ack_message", {"queue": queue, "receipt": received[0]["receipt"]}
        )
        assert error_text(again).split(":")[0] in {"NOT_FOUND", "FAILED_PRECONDITION"}


async def test_binary_bodies_go_and_come_back_in_base64(
    mcp_server: ServerProcess, keys: Keys, admin: Client
) -> None:
    queue = unique_name("mcp_binary")
    admin.create_queue(queue)
    binary = bytes([0, 1, 2, 255])
    async with as_admin(mcp_server, keys) as session:
        sent = answer(await session.call_tool("send_message", {
            "queue": queue, "body": base64.b64encode(binary).decode(), "body_base64": True,
        }))  # fmt: skip
        peeked = answer(await session.call_tool("peek_messages", {"queue": queue}))["messages"]
    assert admin.get_message(queue, sent["message_id"]).body == binary
    assert peeked[0]["body_base64"] is True
    assert base64.b64decode(peeked[0]["body"]) == binary


async def test_a_nack_to_the_dead_letter_queue_then_a_redrive(
    mcp_server: ServerProcess, keys: Keys, admin: Client
) -> None:
    queue = unique_name("mcp_dl")
    async with as_admin(mcp_server, keys) as session:

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            return answer(await session.call_tool(tool, arguments))

        created = await call("create_queue", name=queue, with_dead_letter_queue=True)
        dead_letter_queue = created["dead_letter_policy"]["dead_letter_queue"]
        sent = await call("send_message", queue=queue, body="bad input")
        received = (await call("receive_messages", queue=queue, wait_seconds=5))["messages"]
        await call("nack_message", queue=queue, receipt=received[0]["receipt"],
                   error="cannot parse", dead_letter=True)  # fmt: skip
        dead = (await call("list_dead_letters", queue=dead_letter_queue))["messages"]
        assert [m["body"] for m in dead] == ["bad input"]
        assert dead[0]["last_error"] == "cannot parse"
        assert dead[0]["dead_letter_source_queue"] == queue
        task = await call("redrive_dead_letters", queue=dead_letter_queue)
        assert task["task_id"]
    # The redrive runs on in the server: wait for the message to be back. The bound
    # stops a hung test on a loaded machine; a redrive of one message takes well under 1 s.
    back = eventually(
        lambda: admin.receive(queue, wait=timedelta(seconds=5)), timeout=60, what="redriven"
    )
    assert [(m.message_id, m.body) for m in back] == [(sent["message_id"], b"bad input")]


async def test_queues_topics_and_schedules(
    mcp_server: ServerProcess, keys: Keys, admin: Client
) -> None:
    queue, topic, schedule = (unique_name(f"mcp_{kind}") for kind in ("q", "t", "s"))
    admin.create_topic(topic)
    async with as_admin(mcp_server, keys) as session:

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            return answer(await session.call_tool(tool, arguments))

        await call("create_queue", name=queue)
        assert queue in [q["name"] for q in (await call("list_queues", limit=1000))["queues"]]
        await call("send_message", queue=queue, body="one")
        assert int((await call("purge_queue", name=queue))["purged_messages"]) == 1
        assert topic in [t["name"] for t in (await call("list_topics", limit=1000))["topics"]]
        published = await call("publish", topic=topic, body="news", routing_key="a.b")
        # No subscription: the publish is committed and reaches no queue.
        assert published["queues"] == []
        assert published["message_ids"] == []
        created = await call("create_schedule", name=schedule, queue=queue, body="tick",
                             interval_seconds=3600)  # fmt: skip
        assert created["target"]["queue"] == queue
        listed = (await call("list_schedules", limit=1000))["schedules"]
        assert schedule in [s["name"] for s in listed]
        await call("delete_schedule", name=schedule)
        assert schedule not in [s["name"] for s in (await call("list_schedules"))["schedules"]]
        await call("delete_queue", name=queue)
        gone = await session.call_tool("get_queue", {"name": queue})
        assert error_text(gone).startswith("NOT_FOUND: ")


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("list_queues", {"limit": 0}, "limit"),
        ("list_queues", {"limit": 1001}, "limit"),
        ("send_message", {"queue": "QUEUE", "body": "not base64!", "body_base64": True},
         "INVALID_ARGUMENT: body is not base64, as body_base64 says it is"),
        ("create_schedule", {"name": "both", "queue": "QUEUE", "body": "x", "cron": "* * * * *",
                             "interval_seconds": 60}, "exactly one of cron, interval and run_at"),
        ("create_schedule", {"name": "neither", "body": "x", "interval_seconds": 60},
         "exactly one of queue and topic"),
        ("send_message", {"queue": "QUEUE", "body": "x", "delay_seconds": 1e300},
         "delay_seconds"),
        ("receive_messages", {"queue": "QUEUE", "wait_seconds": -1}, "wait_seconds"),
    ],
)  # fmt: skip
async def test_input_refused_before_any_call_is_a_tool_error_and_sends_nothing(
    mcp_server: ServerProcess, keys: Keys, admin: Client, tool: str, arguments: dict, says: str
) -> None:
    queue = unique_name("mcp_refused")
    admin.create_queue(queue)
    arguments = {k: queue if v == "QUEUE" else v for k, v in arguments.items()}
    async with as_admin(mcp_server, keys) as session:
        assert says in error_text(await session.call_tool(tool, arguments))
    assert admin.peek_messages(queue) == []
    assert "both" not in [s.name for s in admin.list_schedules()]


async def test_an_unreachable_server_is_a_tool_error_not_a_crash(keys: Keys) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    async with mcp_session("--target", nobody, env={"POSTBOX_API_KEY": keys.admin}) as session:
        for _ in range(2):  # the server process is still there for the next call
            result = await session.call_tool("list_queues", {})
            assert error_text(result).startswith("UNAVAILABLE: "), error_text(result)


def test_the_key_is_refused_on_the_command_line_where_ps_shows_it() -> None:
    refused = postbox("mcp", "--api-key", "pbk_secret")
    assert refused.returncode == 2
    assert "--api-key would show the key to ps" in refused.stderr
    assert "$POSTBOX_API_KEY" in refused.stderr
    missing = postbox("mcp", "--api-key-file", "/nonexistent/key")
    assert missing.returncode == 2
    assert "--api-key-file /nonexistent/key: No such file or directory" in missing.stderr
