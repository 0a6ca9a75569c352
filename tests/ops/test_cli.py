"""The `postbox` command's verbs, run as a user runs them, against a real server."""

from __future__ import annotations

import asyncio
import base64
import json

import asyncpg
import grpc
import pytest
import yaml
from google.protobuf.duration_pb2 import Duration
from postbox.v1 import schedule_service_pb2, schedule_service_pb2_grpc
from support import create_database, drop_database, postbox, seconds, unique_name


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    result = postbox(*args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _json_documents(text: str) -> list[dict]:
    """The JSON objects the client verbs print, one after another."""
    decoder = json.JSONDecoder()
    documents, position = [], 0
    while (position := _skip_space(text, position)) < len(text):
        document, position = decoder.raw_decode(text, position)
        documents.append(document)
    return documents


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


async def _installed_version(url: str) -> str | None:
    from postbox_server.db.migrate import format_version, installed_version

    conn = await asyncpg.connect(url)
    try:
        version = await installed_version(conn)
    finally:
        await conn.close()
    return None if version is None else format_version(version)


def test_migrate_installs_the_engine_once(admin_url):
    url = create_database(admin_url, "postbox_cli")
    try:
        assert asyncio.run(_installed_version(url)) is None
        first = ok("migrate", "--database-url", url)
        version = asyncio.run(_installed_version(url))
        assert version is not None
        assert first == f"postbox SQL {version} installed\n"
        # Again, from DATABASE_URL: nothing to do, the same version.
        assert ok("migrate", env={"DATABASE_URL": url}) == first
        result = postbox("migrate", env={"DATABASE_URL": ""})
        assert result.returncode == 2
        assert "give --database-url or set DATABASE_URL" in result.stderr
    finally:
        drop_database(admin_url, url)


def test_queues_send_and_receive(server):
    target = ["--target", server.target]
    name = unique_name("cli")
    created = json.loads(
        ok("queues", "create", name, "--visibility-timeout", "5", "-o", "json", *target)
    )
    assert created["name"] == name
    assert created["visibility_timeout"] == "5s"  # snake_case, as in the protos
    listed = json.loads(ok("queues", "ls", "-o", "json", *target))
    assert name in [queue["name"] for queue in listed]
    assert name in ok("queues", "list", *target)  # a table, with the old verb name
    assert json.loads(ok("queues", "get", name, "-o", "json", *target))["name"] == name

    sent = json.loads(ok("messages", "send", name, "hello from the shell", "-o", "json", *target))
    assert sent["message_id"]
    (received,) = json.loads(
        ok("messages", "receive", name, "--ack", "--wait", "1", "-o", "json", *target)
    )
    assert received["body"] == "hello from the shell"  # text, not base64
    assert received["message_id"] == sent["message_id"]
    # Acknowledged with --ack: nothing left, which stderr says, exiting 0.
    empty = postbox("messages", "receive", name, *target)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr.startswith(f"no message in {name}")

    assert postbox("queues", "delete", name, *target).stderr.strip() == f"deleted {name}"
    missing = postbox("messages", "send", name, "x", *target)
    assert missing.returncode == 1
    assert missing.stderr.startswith("NOT_FOUND: ")
    assert name in missing.stderr


def test_binary_bodies_print_in_base64_and_text_on_request(server):
    target = ["--target", server.target]
    name = unique_name("cli_binary")
    ok("queues", "create", name, *target)
    body = base64.b64encode(b"\x00\xff binary").decode()
    ok("messages", "send", name, body, "--base64", *target)
    ok("messages", "send", name, "plain text", *target)
    peeked = yaml.safe_load(ok("messages", "peek", name, "-o", "yaml", *target))
    assert [m["body"] for m in peeked] == [body, "plain text"]
    forced = json.loads(ok("messages", "peek", name, "--base64", "-o", "json", *target))
    assert forced[1]["body"] == base64.b64encode(b"plain text").decode()


def test_queues_create_with_dlq(server):
    target = ["--target", server.target]
    name = unique_name("cli_with_dlq")
    created = json.loads(
        ok("queues", "create", name, "--with-dlq", "--max-receive-count", "3", "-o", "json",
           *target)
    )  # fmt: skip
    assert created["dead_letter_policy"] == {
        "dead_letter_queue": f"{name}-dlq",
        "max_receive_count": 3,
    }
    assert json.loads(ok("queues", "get", f"{name}-dlq", "-o", "json", *target))["name"] == (
        f"{name}-dlq"
    )


def test_status_shows_every_queue_with_zeros(server):
    target = ["--target", server.target]
    dlq, name = unique_name("cli_status_dlq"), unique_name("cli_status")
    ok("queues", "create", dlq, *target)
    ok("queues", "create", name, "--dead-letter-queue", dlq, "--max-receive-count", "2", *target)
    ok("messages", "send", name, "one", *target)
    ok("queues", "pause", name, "--receives", *target)
    rows = {row["name"]: row for row in json.loads(ok("status", "-o", "json", *target))}
    # The send may or may not be in the last minute's rate yet (the server flushes
    # every few seconds; tests/ops/test_throughput.py waits for it).
    assert rows[name] | {"oldest_age_s": 0, "sent_per_s": 0} == {
        "name": name,
        "visible": 1,
        "in_flight": 0,
        "delayed": 0,
        "dlq_depth": 0,
        "oldest_age_s": 0,
        "sent_per_s": 0,
        "received_per_s": 0,
        "paused": "receive",
    }
    assert rows[dlq]["dlq_depth"] == ""  # it has no dead-letter queue of its own
    table = ok("status", *target)
    assert "in_flight" in table
    assert name in table


def test_messages_send_a_file_in_batches_and_tail_them(server, tmp_path):
    target = ["--target", server.target]
    name = unique_name("cli_file")
    ok("queues", "create", name, *target)
    lines = [json.dumps({"body": f"m{i}", "attributes": {"n": str(i)}}) for i in range(250)]
    (tmp_path / "msgs.jsonl").write_text("\n".join(lines) + "\n")
    sent = postbox("messages", "send", name, "--file", str(tmp_path / "msgs.jsonl"), *target)
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr.strip().endswith(f"sent 250 messages to {name}")
    tailed = ok("messages", "tail", name, "--ack", "--count", "250", *target)
    documents = [json.loads(line) for line in tailed.splitlines()]
    assert sorted(d["body"] for d in documents) == sorted(f"m{i}" for i in range(250))
    assert documents[0]["attributes"]["n"]["string_value"].isdigit()


def test_dlq_ls_peek_and_redrive(server):
    target = ["--target", server.target]
    dlq, name = unique_name("cli_dlq"), unique_name("cli_src")
    ok("queues", "create", dlq, *target)
    ok("queues", "create", name, "--dead-letter-queue", dlq, "--max-receive-count", "1", *target)
    ok("messages", "send", name, "poison", *target)
    # Delivery 1, given back at once; the next receive moves it to the dead-letter queue.
    ok("messages", "receive", name, "--visibility-timeout", "0", *target)
    assert postbox("messages", "receive", name, *target).stdout == ""
    listed = json.loads(ok("dlq", "ls", "-o", "json", *target))
    assert {"name": dlq, "messages": 1, "sources": name} in listed
    (dead,) = json.loads(ok("dlq", "peek", dlq, "-o", "json", *target))
    assert dead["body"] == "poison"
    redriven = postbox("dlq", "redrive", dlq, *target)
    assert redriven.returncode == 0, redriven.stderr
    assert "redrive completed: 1 of 1 moved" in redriven.stderr


def test_topics_and_schedules_verbs(server):
    target = ["--target", server.target]
    topic = unique_name("cli_topic")
    ok("topics", "create", topic, *target)
    assert topic in ok("topics", "ls", *target)
    published = json.loads(ok("topics", "publish", topic, "{}", "-o", "json", *target))
    assert published["publish_id"]
    ok("topics", "delete", topic, *target)
    assert topic not in ok("topics", "ls", *target)
    assert isinstance(json.loads(ok("schedules", "ls", "-o", "json", *target)), list)


def test_a_stream_topic_and_its_groups_lag(server):
    from postbox.v1 import stream_service_pb2, stream_service_pb2_grpc

    target = ["--target", server.target]
    topic = unique_name("cli_stream")
    created = json.loads(
        ok("topics", "create", topic, "--stream-retention", "3600", "-o", "json", *target)
    )
    assert created["stream_retention"] == "3600s"
    group = stream_service_pb2.ConsumerGroup(topic=topic, name="billing")
    stream_service_pb2_grpc.StreamServiceStub(
        grpc.insecure_channel(server.target)
    ).CreateConsumerGroup(stream_service_pb2.CreateConsumerGroupRequest(consumer_group=group))
    ok("topics", "publish", topic, "{}", *target)
    (listed,) = json.loads(ok("topics", "groups", topic, "-o", "json", *target))
    assert (listed["name"], listed["lag_messages"]) == ("billing", "1")
    assert "billing" in ok("topics", "groups", topic, *target)
    paused = json.loads(ok("topics", "pause-group", topic, "billing", "-o", "json", *target))
    assert paused["paused"] is True
    (listed,) = json.loads(ok("topics", "groups", topic, "-o", "json", *target))
    assert listed["paused"] is True
    resumed = json.loads(ok("topics", "resume-group", topic, "billing", "-o", "json", *target))
    assert resumed.get("paused", False) is False


def test_consumers_and_drain_a_consumer_group(server):
    from postbox.v1 import stream_service_pb2, stream_service_pb2_grpc

    target = ["--target", server.target]
    topic = unique_name("cli_drain")
    ok("topics", "create", topic, "--stream-retention", "3600", *target)
    streams = stream_service_pb2_grpc.StreamServiceStub(grpc.insecure_channel(server.target))
    group = stream_service_pb2.ConsumerGroup(topic=topic, name="billing", max_deliveries=3)
    streams.CreateConsumerGroup(stream_service_pb2.CreateConsumerGroupRequest(consumer_group=group))
    ok("topics", "publish", topic, "a", *target)
    ok("topics", "publish", topic, "b", *target)
    (listed,) = json.loads(ok("topics", "consumers", topic, "-o", "json", *target))
    assert (listed["name"], listed["lag_messages"], listed["max_deliveries"]) == ("billing", "2", 3)
    table = ok("topics", "consumers", topic, *target)
    assert "retry_messages" in table
    assert "dead_letter_messages" in table
    # Nobody reads: the drain gives up, says what is left, and exits 1.
    waited = postbox("topics", "drain", topic, "billing", "--timeout", "0", *target)
    assert waited.returncode == 1, waited.stderr
    assert f"{topic}/billing not drained after 0 s: 2 messages left" in waited.stderr
    read = stream_service_pb2.ReadStreamRequest(
        topic=topic, consumer_group="billing", min_messages=2, wait_time=seconds(10)
    )
    batch = streams.ReadStream(read)
    assert len(batch.messages) == 2
    waited = postbox("topics", "drain", topic, "billing", "--timeout", "0", *target)
    assert waited.returncode == 1
    assert "2 messages left, a batch out" in waited.stderr  # out, not yet acked
    streams.AckStream(
        stream_service_pb2.AckStreamRequest(
            topic=topic, consumer_group="billing", batch=batch.batch
        )
    )
    drained = postbox("topics", "drain", topic, "billing", "-o", "json", *target)
    assert drained.returncode == 0, drained.stderr
    assert f"drained {topic}/billing" in drained.stderr
    ok("topics", "publish", topic, "c", *target)
    skipped = postbox("topics", "drain", topic, "billing", "--discard", *target)
    assert skipped.returncode == 0, skipped.stderr
    state = streams.GetConsumerGroup(
        stream_service_pb2.GetConsumerGroupRequest(topic=topic, name="billing")
    ).consumer_group
    assert state.lag_messages == 0


def test_cancel_ttl_run_and_preview_verbs(server):
    target = ["--target", server.target]
    queue = unique_name("cli_new")
    ok("queues", "create", queue, *target)
    sent = json.loads(
        ok("messages", "send", queue, "later", "--ttl", "3600", "-o", "json", *target)
    )
    (peeked,) = json.loads(ok("messages", "peek", queue, "-o", "json", *target))
    assert peeked["expire_time"]
    cancelled = postbox("messages", "cancel", queue, sent["message_id"], *target)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled {sent['message_id']}" in cancelled.stderr
    assert postbox("messages", "peek", queue, *target).stdout == ""

    schedule = unique_name("cli_schedule")
    channel = grpc.insecure_channel(server.target)
    schedule_service_pb2_grpc.ScheduleServiceStub(channel).CreateSchedule(
        schedule_service_pb2.CreateScheduleRequest(
            schedule=schedule_service_pb2.Schedule(
                name=schedule,
                interval=Duration(seconds=3600),
                target=schedule_service_pb2.ScheduleTarget(queue=queue),
                body=b"by hand",
            )
        )
    )
    channel.close()
    ran = postbox("schedules", "run", schedule, *target)
    assert ran.returncode == 0, ran.stderr
    assert f"fired {schedule}: " in ran.stderr
    (got,) = json.loads(ok("messages", "receive", queue, "-o", "json", *target))
    assert got["body"] == "by hand"
    times = ok(
        "schedules", "preview", "--cron", "0 9 * * *", "--time-zone", "Europe/Berlin",
        "--count", "3", *target,
    ).split()  # fmt: skip
    assert len(times) == 3
    assert all(t.endswith(("T08:00:00Z", "T07:00:00Z")) for t in times), times
    bad = postbox("schedules", "preview", "--cron", "61 * * * *", *target)
    assert bad.returncode == 1
    assert "bad minute" in bad.stderr


def test_version_help_and_completion():
    assert ok("--version").startswith("postbox ")
    assert "complete" in ok("completion", "bash")
    assert "--output" in ok("messages", "receive", "--help")


def test_the_target_comes_from_the_environment(server):
    env = {"POSTBOX_TARGET": server.target}
    name = unique_name("cli_env")
    ok("queues", "create", name, env=env)
    assert name in ok("queues", "ls", env=env)
    ok("queues", "delete", name, env=env)


@pytest.mark.parametrize(
    "verb",
    [["queues", "ls"], ["messages", "send", "q", "x"], ["messages", "receive", "q"], ["status"]],
)
def test_an_unreachable_server_is_an_error_not_a_traceback(verb):
    result = postbox(*verb, "--target", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith("UNAVAILABLE: ")
    assert "Traceback" not in result.stderr


def test_messages_get_and_list_follow_a_job_through_its_life(server):
    target = ["--target", server.target]
    name = unique_name("cli_jobs")
    ok("queues", "create", name, "--archive", *target)
    sent = json.loads(ok("messages", "send", name, "job", "-o", "json", *target))
    (received,) = json.loads(
        ok("messages", "receive", name, "--consumer-id", "cli-worker", "-o", "json", *target)
    )
    held = json.loads(ok("messages", "get", name, sent["message_id"], "-o", "json", *target))
    assert held["state"] == "MESSAGE_STATE_IN_FLIGHT"
    assert held["consumer_id"] == "cli-worker"
    assert held["receive_count"] == 1
    second = json.loads(ok("messages", "send", name, "second", "-o", "json", *target))
    in_flight = json.loads(
        ok("messages", "list", name, "--state", "in_flight", "-o", "json", *target)
    )
    assert [m["message_id"] for m in in_flight] == [received["message_id"]]
    every = json.loads(ok("messages", "list", name, "-o", "json", *target))
    assert [m["state"] for m in every] == ["MESSAGE_STATE_IN_FLIGHT", "MESSAGE_STATE_VISIBLE"]
    queued = json.loads(ok("messages", "list", name, "--state", "queued", "-o", "json", *target))
    assert [m["message_id"] for m in queued] == [second["message_id"]]
    table = ok("messages", "list", name, *target)  # a row per message, its state shown
    assert "MESSAGE_STATE_VISIBLE" in table
    assert "MESSAGE_STATE_IN_FLIGHT" in table
    bad = postbox("messages", "receive", name, "--consumer-id", "no spaces", *target)
    assert bad.returncode != 0
    assert "consumer_id 'no spaces' (9 characters) must be 1 to 128 characters" in bad.stderr
    missing = postbox("messages", "get", name, "999999999", *target)
    assert missing.returncode != 0
    assert "is not in queue" in missing.stderr


def test_messages_nack_retries_or_fails_a_job_with_its_error(server):
    target = ["--target", server.target]
    name = unique_name("cli_nack")
    ok("queues", "create", name, "--archive", *target)
    sent = json.loads(ok("messages", "send", name, "job", "-o", "json", *target))

    def take() -> str:
        (got,) = json.loads(ok("messages", "receive", name, "--wait", "5", "-o", "json", *target))
        return got["receipt"]

    # A plain nack gives it back with its error; the queue's backoff is 1 s, the wait 5 s.
    assert ok("messages", "nack", name, take(), "--error", "smtp 451", *target) == ""
    back = json.loads(ok("messages", "get", name, sent["message_id"], "-o", "json", *target))
    assert back["state"] in ("MESSAGE_STATE_DELAYED", "MESSAGE_STATE_VISIBLE")
    assert back["last_error"] == "smtp 451"
    # --dead-letter gives up: no DLQ, so the job fails for good, with its reason.
    ok("messages", "nack", name, take(), "--error", "no such mailbox", "--dead-letter", *target)
    failed = json.loads(ok("messages", "get", name, sent["message_id"], "-o", "json", *target))
    assert failed["state"] == "MESSAGE_STATE_FAILED"
    assert failed["last_error"] == "no such mailbox"
    # An ack of a receipt that is none fails.
    stale = postbox("messages", "ack", name, "not-a-receipt", *target)
    assert stale.returncode != 0


def test_queue_updates_purges_and_schedule_verbs(server):
    target = ["--target", server.target]
    name = unique_name("cli_update")
    ok("queues", "create", name, *target)
    updated = json.loads(
        ok("queues", "update", name, "--visibility-timeout", "9", "--retention", "forever",
           "-o", "json", *target)
    )  # fmt: skip
    assert updated["visibility_timeout"] == "9s"
    assert "period" not in updated["retention"]  # forever
    untouched = json.loads(ok("queues", "get", name, "-o", "json", *target))["delivery_delay"]
    nothing = postbox("queues", "update", name, *target)
    assert (nothing.returncode, nothing.stderr.strip()) == (
        2, "nothing to change: give at least one setting"
    )  # fmt: skip
    assert json.loads(ok("queues", "get", name, "-o", "json", *target))["delivery_delay"] == (
        untouched
    )
    ok("messages", "send", name, "one", *target)
    ok("messages", "send", name, "two", *target)
    purged = postbox("queues", "purge", name, "-o", "json", *target)
    assert purged.stderr.strip() == f"purged {name}"
    assert json.loads(purged.stdout) == {"purged_messages": "2"}
    paused = json.loads(ok("queues", "pause", name, "-o", "json", *target))
    assert (paused["send_paused"], paused["receive_paused"]) == (True, True)
    resumed = json.loads(ok("queues", "resume", name, "--sends", "-o", "json", *target))
    assert (resumed["send_paused"], resumed["receive_paused"]) == (False, True)

    topic = unique_name("cli_subs")
    ok("topics", "create", topic, *target)
    assert json.loads(ok("topics", "subscriptions", topic, "-o", "json", *target)) == []
    assert json.loads(ok("topics", "get", topic, "-o", "json", *target))["name"] == topic

    schedule = unique_name("cli_timer")
    with grpc.insecure_channel(server.target) as channel:
        schedule_service_pb2_grpc.ScheduleServiceStub(channel).CreateSchedule(
            schedule_service_pb2.CreateScheduleRequest(
                schedule=schedule_service_pb2.Schedule(
                    name=schedule,
                    interval=Duration(seconds=3600),
                    target=schedule_service_pb2.ScheduleTarget(queue=name),
                )
            )
        )
    assert json.loads(ok("schedules", "pause", schedule, "-o", "json", *target))["paused"]
    assert json.loads(ok("schedules", "get", schedule, "-o", "json", *target))["paused"]
    assert not json.loads(ok("schedules", "resume", schedule, "-o", "json", *target))["paused"]
    assert ok("schedules", "delete", schedule, *target) == ""
    assert postbox("schedules", "get", schedule, *target).stderr.startswith("NOT_FOUND: ")
    assert ok("schedules", "preview", "--run-at", "2030-01-01T10:00:00+01:00", *target) == (
        "2030-01-01T09:00:00Z\n"
    )
    assert len(ok("schedules", "preview", "--interval", "60", "--count", "4", *target).split()) == 4
