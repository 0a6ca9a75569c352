"""The blocking Client's management calls (postbox_client.operations), against the real
server: each call's effect is read back through another call."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from postbox.v1 import access_service_pb2 as apb
from postbox.v1 import message_pb2
from postbox.v1 import message_service_pb2 as mpb
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import stream_service_pb2 as stpb
from postbox.v1 import topic_service_pb2 as tpb
from postbox_client import AsyncClient, Client, InvalidArgument, NotFound, Unauthenticated
from support import ServerProcess, create_database, drop_database, unique_name


def test_queues_list_update_pause_and_purge(server):
    name = unique_name("sdk_ops_queue")
    with Client(server.target) as client:
        client.create_queue(name)
        client.send(name, "one")
        # One a page: the listing follows the pages.
        full = {q.name: q for q in client.list_queues(1, view=qpb.QUEUE_VIEW_FULL)}
        assert full[name].stats.visible_messages == 1
        basic = {q.name: q for q in client.list_queues()}
        assert not basic[name].HasField("stats")

        updated = client.update_queue(
            name, ["visibility_timeout"], visibility_timeout=timedelta(seconds=7)
        )
        assert updated.visibility_timeout.seconds == 7
        assert client.get_queue(name).visibility_timeout.seconds == 7

        paused = client.pause_queue(name, sends=False)
        assert (paused.send_paused, paused.receive_paused) == (False, True)
        assert client.resume_queue(name).receive_paused is False

        assert client.purge_queue(name).purged_messages == 1
        assert client.peek_messages(name) == []
        client.delete_queue(name)


def test_messages_batches_lookups_and_listings(server):
    name = unique_name("sdk_ops_messages")
    with Client(server.target) as client:
        client.create_queue(name, archive_on_delete=True)
        sent = client.send_message(name, "first", attributes={"kind": "a"})
        assert sent.message_id
        assert sent.duplicate is False
        entries = [mpb.SendBatchEntry(body=f"m{i}".encode()) for i in range(3)]
        assert len(client.send_batch(name, entries).message_ids) == 3

        (got,) = client.receive(
            name, 1, consumer_id="sdk-worker", visibility_timeout=timedelta(seconds=30)
        )
        assert got.message_id == sent.message_id
        looked_up = client.get_message(name, sent.message_id)
        assert looked_up.state == message_pb2.MESSAGE_STATE_IN_FLIGHT
        assert looked_up.consumer_id == "sdk-worker"

        in_flight = client.list_messages(name, state=message_pb2.MESSAGE_STATE_IN_FLIGHT)
        assert [m.message_id for m in in_flight] == [sent.message_id]
        # Two a page: the listing follows the pages to every message.
        assert len(list(client.list_messages(name, page_size=2))) == 4
        # A peek shows the held message too, and stops at its limit.
        assert [m.body for m in client.peek_messages(name, 2)] == [b"first", b"m0"]

        client.delete_batch(name, [got.receipt])
        assert client.get_message(name, sent.message_id).state == (
            message_pb2.MESSAGE_STATE_SUCCEEDED
        )
        # A continuous receive ends after max_total_messages.
        batches = list(client.receive_continuously(name, max_total_messages=3))
        assert sorted(m.body for batch in batches for m in batch) == [b"m0", b"m1", b"m2"]
        with pytest.raises(NotFound):
            list(client.receive_continuously(unique_name("sdk_ops_missing")))
        # Closed before its end, the stream is cancelled: nothing more comes, nothing raises.
        client.send(name, "late")
        stream = client.receive_continuously(name)
        assert [m.body for m in next(stream)] == [b"late"]
        stream.close()
        assert list(stream) == []


def test_a_redrive_moves_dead_letters_back(server):
    dlq, name = unique_name("sdk_ops_dlq"), unique_name("sdk_ops_src")
    with Client(server.target) as client:
        client.create_queue(dlq)
        policy = qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=1)
        client.create_queue(name, dead_letter_policy=policy)
        client.send(name, "poison")
        # Delivery 1, given back at once; the next receive moves it to the dead-letter queue.
        client.receive(name, visibility_timeout=timedelta(0))
        assert client.receive(name) == []
        assert [m.body for m in client.peek_messages(dlq)] == [b"poison"]

        task = client.redrive_messages(dlq)
        deadline = time.monotonic() + 30
        while task.state != qpb.RedriveTask.STATE_COMPLETED:
            assert time.monotonic() < deadline, task
            time.sleep(0.05)
            task = client.get_redrive_task(dlq, task.task_id) or task
        assert task.moved_messages == 1
        assert [t.task_id for t in client.list_redrive_tasks(dlq)] == [task.task_id]
        assert [m.body for m in client.receive(name)] == [b"poison"]
        assert client.get_redrive_task(dlq, "no-such-task") is None


def test_topics_subscriptions_and_consumer_groups(server):
    topic, queue = unique_name("sdk_ops_topic"), unique_name("sdk_ops_sub")
    stream = unique_name("sdk_ops_stream")
    with Client(server.target) as client:
        client.create_queue(queue)
        assert client.create_topic(topic).name == topic
        subscription = tpb.Subscription(topic=topic, name="all", pattern="#", queue=queue)
        client.call(
            client.topics.CreateSubscription,
            tpb.CreateSubscriptionRequest(subscription=subscription),
        )
        assert [s.name for s in client.list_subscriptions(topic)] == ["all"]
        assert topic in [t.name for t in client.list_topics(page_size=1)]
        assert client.get_topic(topic).name == topic
        with pytest.raises(NotFound):
            client.retry_webhook_delivery(topic, "no-such-subscription")

        created = client.create_topic(stream, stream_retention=timedelta(hours=1))
        assert created.stream_retention.seconds == 3600
        group = stpb.ConsumerGroup(topic=stream, name="billing")
        client.call(
            client.streams.CreateConsumerGroup,
            stpb.CreateConsumerGroupRequest(consumer_group=group),
        )
        client.publish(stream, "{}")
        # A delayed publish: the subscribed queue holds it, invisible for the hour.
        delayed = client.publish(topic, "later", delay=timedelta(hours=1))
        assert list(delayed.queues) == [queue]
        assert client.get_queue(queue).stats.delayed_messages == 1
        (listed,) = client.list_consumer_groups(stream)
        assert (listed.name, listed.lag_messages) == ("billing", 1)
        assert client.pause_consumer_group(stream, "billing").paused is True
        assert client.resume_consumer_group(stream, "billing").paused is False

        client.delete_topic(topic)
        with pytest.raises(NotFound):
            client.get_topic(topic)


def test_a_consumer_groups_dead_letters_listed_replayed_and_purged(server):
    stream = unique_name("sdk_ops_dead_stream")
    with Client(server.target) as client:
        client.create_topic(stream, stream_retention=timedelta(hours=1))
        group = stpb.ConsumerGroup(topic=stream, name="billing", max_deliveries=1)
        client.call(
            client.streams.CreateConsumerGroup,
            stpb.CreateConsumerGroupRequest(consumer_group=group),
        )
        client.publish(stream, "good")
        client.publish(stream, "poison")
        wait = timedelta(seconds=10)
        reader = client.stream_reader(stream, "billing", min_messages=2, wait_time=wait)

        def fail_poison() -> None:
            """Reads the batch holding the poison message and nacks that one: with
            max_deliveries 1 it dies at once."""
            batch = reader.read()
            assert batch is not None
            (poison,) = [m for m in batch.messages if m.body == b"poison"]
            batch.ack(nack=[poison.offset])

        fail_poison()
        (dead,) = client.list_stream_dead_letters(stream, "billing", page_size=1)
        assert (dead.message.body, dead.reason, dead.message.delivery_count) == (
            b"poison", "nacked", 1,
        )  # fmt: skip
        assert client.replay_stream_dead_letters(stream, "billing", [dead.message.offset]) == 1
        assert list(client.list_stream_dead_letters(stream, "billing")) == []
        reader = client.stream_reader(stream, "billing", wait_time=wait)
        fail_poison()  # the replayed message leads the group's next batch, and dies again
        assert client.purge_stream_dead_letters(
            stream, "billing", older_than=datetime.now(timezone.utc) - timedelta(hours=1)
        ) == 0  # fmt: skip
        assert client.purge_stream_dead_letters(
            stream, "billing", older_than=datetime.now(timezone.utc) + timedelta(minutes=1)
        ) == 1  # fmt: skip
        assert list(client.list_stream_dead_letters(stream, "billing")) == []
        assert client.replay_stream_dead_letters(stream, "billing") == 0


def test_schedules_pause_run_preview_and_delete(server):
    queue, name = unique_name("sdk_ops_target"), unique_name("sdk_ops_schedule")
    with Client(server.target) as client:
        client.create_queue(queue)
        created = client.create_schedule(
            name, "by hand", queue=queue, interval=timedelta(hours=1), attributes={"by": "sdk"}
        )
        assert (created.target.queue, created.interval.seconds) == (queue, 3600)
        assert created.attributes["by"].string_value == "sdk"
        with pytest.raises(ValueError, match="exactly one of queue and topic"):
            client.create_schedule(unique_name("sdk_ops_nowhere"), "x", interval=timedelta(1))
        with pytest.raises(ValueError, match="exactly one of cron"):
            client.create_schedule(unique_name("sdk_ops_untimed"), "x", queue=queue)
        assert name in [s.name for s in client.list_schedules()]
        assert client.pause_schedule(name).paused is True
        assert [s.name for s in client.list_schedules(paused=True, name_prefix=name)] == [name]
        assert list(client.list_schedules(paused=False, name_prefix=name)) == []
        assert list(client.list_schedules(target_kind="topic", name_prefix=name)) == []
        assert client.get_schedule(name).paused is True
        assert client.resume_schedule(name).paused is False
        ran = client.run_schedule(name)
        assert [m.message_id for m in client.receive(queue)] == list(ran.message_ids)

        times = client.preview_schedule(cron="0 9 * * *", time_zone="Europe/Berlin", count=3)
        assert len(times) == 3
        assert all(t.ToDatetime().hour in (7, 8) for t in times)  # 09:00 in Berlin, in UTC
        start = datetime(2030, 1, 1, 9, tzinfo=timezone.utc)
        (once,) = client.preview_schedule(run_at=start)
        assert once.ToDatetime(tzinfo=timezone.utc) == start
        assert len(client.preview_schedule(interval=timedelta(minutes=5), count=2)) == 2
        with pytest.raises(InvalidArgument):
            client.preview_schedule(cron="61 * * * *")
        with pytest.raises(ValueError, match="exactly one"):
            client.preview_schedule(cron="* * * * *", interval=timedelta(minutes=1))

        client.delete_schedule(name)
        with pytest.raises(NotFound):
            client.get_schedule(name)


def test_api_keys_created_listed_and_revoked(admin_url):
    """On a server of its own: the first key turns anonymous access off."""
    url = create_database(admin_url, "postbox_sdk_keys")
    server = ServerProcess(url).start()
    try:
        with Client(server.target) as anonymous:
            root = anonymous.create_key("root", ["admin:*"])
            assert root.secret.startswith("pbk_")
            assert root.sigv4_secret_access_key
            deadline = time.monotonic() + 30
            while True:  # the server learns of its first key from a notification
                try:
                    list(anonymous.list_keys())
                except Unauthenticated:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with Client(server.target, api_key=root.secret) as client:
            expires = datetime.now(timezone.utc) + timedelta(days=30)
            grant = apb.Grant(permission=apb.PERMISSION_RECEIVE, pattern="orders-*")
            sender = client.create_key("sender", ["send:orders-*", grant], expire_time=expires).key
            assert sender.expire_time.ToDatetime(tzinfo=timezone.utc) - expires < timedelta(1)
            listed = {key.name: key for key in client.list_keys(page_size=1)}
            assert sorted(listed) == ["root", "sender"]
            assert {(g.permission, g.pattern) for g in listed["sender"].grants} == {
                (apb.PERMISSION_SEND, "orders-*"),
                (apb.PERMISSION_RECEIVE, "orders-*"),
            }
            # update_key masks only what it is given: the grants here, the expiry stays.
            changed = client.update_key("sender", grants=["read:orders-*"])
            assert [(g.permission, g.pattern) for g in changed.grants] == [
                (apb.PERMISSION_READ, "orders-*")
            ]
            assert changed.expire_time == sender.expire_time
            limits = apb.RateLimits(sends_per_second=5)
            changed = client.update_key("sender", never_expires=True, rate_limits=limits)
            assert not changed.HasField("expire_time")
            assert changed.rate_limits == limits
            assert len(changed.grants) == 1
            with pytest.raises(ValueError, match="expire_time or never_expires"):
                client.update_key("sender", expire_time=expires, never_expires=True)
            client.delete_key("sender")
            assert [key.name for key in client.list_keys()] == ["root"]
            with pytest.raises(NotFound):
                client.delete_key("sender")
            with pytest.raises(ValueError, match="'write:orders' is not PERMISSION:PATTERN"):
                client.create_key("bad", ["write:orders"])
    finally:
        server.stop()
        drop_database(admin_url, url)


async def test_the_async_receive_names_its_consumer_too(server):
    name = unique_name("sdk_ops_async")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        message_id = await client.send(name, "job")
        (got,) = await client.receive(
            name, consumer_id="async-worker", visibility_timeout=timedelta(seconds=30)
        )
        assert got.message_id == message_id
    with Client(server.target) as blocking:
        assert blocking.get_message(name, message_id).consumer_id == "async-worker"


async def test_create_queue_with_its_dead_letter_queue(server):
    name, fifo = unique_name("sdk_ops_dlq"), unique_name("sdk_ops_dlq") + ".fifo"
    with Client(server.target) as client:
        queue = client.create_queue(name, with_dead_letter_queue=True)
        assert queue.dead_letter_policy.dead_letter_queue == f"{name}-dlq"
        assert client.get_queue(f"{name}-dlq").name == f"{name}-dlq"
    async with AsyncClient(server.target) as client:
        queue = await client.create_queue(
            fifo, with_dead_letter_queue=True, dead_letter_max_receive_count=7
        )
        assert queue.dead_letter_policy.max_receive_count == 7
        assert (await client.get_queue(queue.dead_letter_policy.dead_letter_queue)).fifo


async def test_nack_with_an_error_or_to_the_dead_letter_queue_and_ack_with_a_result(server):
    name = unique_name("sdk_ops_nack")
    with Client(server.target) as client:
        client.create_queue(name, archive_on_delete=True, with_dead_letter_queue=True)
        first, second = client.send(name, "retry me"), client.send(name, "give up")
        got = {m.message_id: m for m in client.receive(name, 2)}
        client.nack(name, got[first].receipt, delay=timedelta(0), error="flaky")
        assert client.get_message(name, first).last_error == "flaky"
        client.nack(name, got[second].receipt, error="bad input", dead_letter=True)
        (dead,) = client.peek_messages(f"{name}-dlq")
        assert (dead.body, dead.last_error) == (b"give up", "bad input")
        (again,) = client.receive(name)
        client.delete(name, again.receipt, result=b"42")
        done = client.get_message(name, first)
        assert (done.state, done.result) == (message_pb2.MESSAGE_STATE_SUCCEEDED, b"42")
    async with AsyncClient(server.target) as async_client:
        await async_client.send(name, "async")
        (got_async,) = await async_client.receive(name)
        await async_client.nack(name, got_async.receipt, error="async flaky", dead_letter=True)
    with Client(server.target) as client:
        dead_letters = {m.body: m.last_error for m in client.peek_messages(f"{name}-dlq")}
        assert dead_letters == {b"give up": "bad input", b"async": "async flaky"}
