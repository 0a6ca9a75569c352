"""The operator's verbs: `postbox status`, `queues`, `messages`, `dlq`, `topics`, `schedules`.

Each talks to a server through the generated stubs, with the connection flags every client
verb takes (--target, --api-key). Output follows output.py: snake_case, readable bodies,
`-o table|json|yaml`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
from postbox.v1 import (
    message_pb2,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    stream_service_pb2,
    stream_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)

from postbox_server.operator import output

Handler = Callable[[argparse.Namespace, grpc.Channel], int]
SEND_BATCH = 100  # messages per SendBatch of `messages send --file`
PAGE = 1000


class Stubs:
    def __init__(self, channel: grpc.Channel) -> None:
        self.queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        self.messages = message_service_pb2_grpc.MessageServiceStub(channel)
        self.topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        self.schedules = schedule_service_pb2_grpc.ScheduleServiceStub(channel)
        self.streams = stream_service_pb2_grpc.StreamServiceStub(channel)


def pages(call: Callable[..., Any], request: Any, field: str) -> Iterator[Any]:
    """Every item of a paginated List, page after page."""
    while True:
        response = call(request)
        yield from getattr(response, field)
        if not response.next_page_token:
            return
        request.page_token = response.next_page_token


def _show(args: argparse.Namespace, messages: list[Any], columns: tuple[str, ...] = ()) -> None:
    """A list of resources (a JSON or YAML list; a table)."""
    documents = [output.as_dict(m, raw_bodies=getattr(args, "base64", False)) for m in messages]
    output.emit(documents, args.output, columns)


def _show_one(args: argparse.Namespace, message: Any) -> None:
    """One resource (a JSON or YAML object; a table of one row)."""
    document = output.as_dict(message, raw_bodies=getattr(args, "base64", False))
    output.emit([document], args.output, single=True)


# status


def status_rows(stubs: Stubs) -> list[dict[str, Any]]:
    """A row per queue: depth by state, its DLQ's depth, oldest age, sent and received per
    second over the last minute (as the servers counted them) and whether paused."""
    request = queue_service_pb2.ListQueuesRequest(
        page_size=PAGE, view=queue_service_pb2.QUEUE_VIEW_FULL
    )
    queues = list(pages(stubs.queues.ListQueues, request, "queues"))
    by_name = {q.name: q for q in queues}
    rows = []
    for q in queues:
        dlq = q.dead_letter_policy.dead_letter_queue
        dead = by_name.get(dlq)
        dlq_depth = (
            dead.stats.visible_messages
            + dead.stats.in_flight_messages
            + dead.stats.delayed_messages
            if dead is not None
            else None
        )
        paused = [
            part for part, on in (("send", q.send_paused), ("receive", q.receive_paused)) if on
        ]
        rows.append(
            {
                "name": q.name,
                "visible": q.stats.visible_messages,
                "in_flight": q.stats.in_flight_messages,
                "delayed": q.stats.delayed_messages,
                "dlq_depth": dlq_depth if dlq else "",
                "oldest_age_s": round(q.stats.oldest_message_age.ToTimedelta().total_seconds(), 1),
                "sent_per_s": round(q.stats.sent_per_second, 2),
                "received_per_s": round(q.stats.received_per_second, 2),
                "paused": ",".join(paused) or "no",
            }
        )
    return rows


def status(args: argparse.Namespace, channel: grpc.Channel) -> int:
    stubs = Stubs(channel)
    while True:
        rows = status_rows(stubs)
        if args.watch and args.output == "table":
            print("\033[2J\033[H", end="")  # a fresh screen each round
        if rows or args.output != "table":
            output.emit(rows, args.output)
        else:
            output.note("no queues")
        if not args.watch:
            return 0
        sys.stdout.flush()
        time.sleep(args.watch)


# queues


def queues(args: argparse.Namespace, channel: grpc.Channel) -> int:
    stubs = Stubs(channel).queues
    verb = args.queues_verb
    if verb in ("ls", "list"):
        listed = list(
            pages(stubs.ListQueues, queue_service_pb2.ListQueuesRequest(page_size=PAGE), "queues")
        )
        _show(args, listed, ("name", "fifo", "visibility_timeout", "send_paused", "receive_paused"))
    elif verb == "get":
        _show_one(args, stubs.GetQueue(queue_service_pb2.GetQueueRequest(name=args.name)).queue)
    elif verb == "create":
        queue = queue_service_pb2.Queue(name=args.name)
        _queue_settings(queue, args)
        _show_one(args, stubs.CreateQueue(queue_service_pb2.CreateQueueRequest(queue=queue)).queue)
    elif verb == "update":
        queue = queue_service_pb2.Queue(name=args.name)
        mask = _queue_settings(queue, args)
        if not mask:
            output.note("nothing to change: give at least one setting")
            return 2
        request = queue_service_pb2.UpdateQueueRequest(queue=queue)
        request.update_mask.paths.extend(mask)
        _show_one(args, stubs.UpdateQueue(request).queue)
    elif verb == "delete":
        stubs.DeleteQueue(queue_service_pb2.DeleteQueueRequest(name=args.name))
        output.note(f"deleted {args.name}")
    elif verb == "purge":
        purged = stubs.PurgeQueue(queue_service_pb2.PurgeQueueRequest(name=args.name))
        output.note(f"purged {args.name}")
        _show_one(args, purged)
    elif verb in ("pause", "resume"):
        both = not (args.sends or args.receives)
        fields = {"name": args.name, "sends": args.sends or both, "receives": args.receives or both}
        if verb == "pause":
            queue = stubs.PauseQueue(queue_service_pb2.PauseQueueRequest(**fields)).queue
        else:
            queue = stubs.ResumeQueue(queue_service_pb2.ResumeQueueRequest(**fields)).queue
        _show_one(args, queue)
    return 0


def _queue_settings(queue: queue_service_pb2.Queue, args: argparse.Namespace) -> list[str]:
    """Copies the settings given as flags into `queue`; returns their field names."""
    given = []
    for field in ("visibility_timeout", "delivery_delay", "receive_wait_time"):
        seconds = getattr(args, field, None)
        if seconds is not None:
            getattr(queue, field).FromTimedelta(timedelta(seconds=seconds))
            given.append(field)
    retention = getattr(args, "retention", None)
    if retention is not None:
        queue.retention.SetInParent()  # without a period: forever
        if retention != "forever":
            queue.retention.period.FromTimedelta(timedelta(seconds=float(retention)))
        given.append("retention")
    if getattr(args, "max_message_size", None) is not None:
        queue.max_message_size = args.max_message_size
        given.append("max_message_size")
    if getattr(args, "archive", False):
        queue.archive_on_delete = True
        given.append("archive_on_delete")
    if getattr(args, "dead_letter_queue", None):
        queue.dead_letter_policy.dead_letter_queue = args.dead_letter_queue
        queue.dead_letter_policy.max_receive_count = args.max_receive_count
        given.append("dead_letter_policy")
    return given


# messages


def messages(args: argparse.Namespace, channel: grpc.Channel) -> int:
    stubs = Stubs(channel).messages
    verb = args.messages_verb
    if verb == "send":
        if args.file is not None:
            return _send_file(stubs, args)
        if args.body is None:
            output.note("give a BODY, or --file with one message per line")
            return 2
        body = output.body_bytes(args.body, is_base64=args.base64)
        request = message_service_pb2.SendRequest(
            queue=args.queue, body=body, attributes=_attributes(args)
        )
        if args.ttl is not None:
            request.ttl.FromTimedelta(timedelta(seconds=args.ttl))
        _show_one(args, stubs.Send(request))
    elif verb == "cancel":
        stubs.CancelMessage(
            message_service_pb2.CancelMessageRequest(queue=args.queue, message_id=args.message_id)
        )
        output.note(f"cancelled {args.message_id}")
    elif verb == "get":
        lookup = message_service_pb2.GetMessageRequest(queue=args.queue, message_id=args.message_id)
        _show_one(args, stubs.GetMessage(lookup).message)
    elif verb == "list":
        return _list_messages(stubs, args)
    elif verb == "receive":
        receive = message_service_pb2.ReceiveRequest(
            queue=args.queue, max_messages=args.max_messages, consumer_id=args.consumer_id or ""
        )
        receive.wait_time.FromSeconds(args.wait)
        if args.visibility_timeout is not None:
            receive.visibility_timeout.FromTimedelta(timedelta(seconds=args.visibility_timeout))
        got = [m for response in stubs.Receive(receive) for m in response.messages]
        if not got:
            output.note(f"no message in {args.queue} (waited {args.wait} s)")
            return 0
        _show(args, got, ("message_id", "body", "receive_count", "receipt"))
        if args.ack:
            stubs.DeleteBatch(
                message_service_pb2.DeleteBatchRequest(
                    queue=args.queue, receipts=[m.receipt for m in got]
                )
            )
    elif verb == "peek":
        peek = message_service_pb2.PeekMessagesRequest(queue=args.queue, page_size=args.limit)
        peeked = list(stubs.PeekMessages(peek).messages)
        if not peeked:
            output.note(f"no message in {args.queue}")
            return 0
        _show(args, peeked, ("message_id", "body", "receive_count", "enqueue_time"))
    elif verb == "tail":
        return _tail(stubs, args)
    return 0


# `messages list --state` names, as the API's MessageState values.
MESSAGE_STATES = {
    "queued": message_pb2.MESSAGE_STATE_VISIBLE,
    "delayed": message_pb2.MESSAGE_STATE_DELAYED,
    "in_flight": message_pb2.MESSAGE_STATE_IN_FLIGHT,
    "succeeded": message_pb2.MESSAGE_STATE_SUCCEEDED,
    "failed": message_pb2.MESSAGE_STATE_FAILED,
    "dead_lettered": message_pb2.MESSAGE_STATE_DEAD_LETTERED,
    "expired": message_pb2.MESSAGE_STATE_EXPIRED,
    "cancelled": message_pb2.MESSAGE_STATE_CANCELLED,
    "dead": message_pb2.MESSAGE_STATE_DEAD,
}


def _list_messages(stubs: Any, args: argparse.Namespace) -> int:
    """Up to --limit messages of a queue (or of every queue) with their state, page by page."""
    request = message_service_pb2.ListMessagesRequest(
        queue=args.queue or "", page_size=min(args.limit, PAGE)
    )
    if args.state is not None:
        request.state = MESSAGE_STATES[args.state]
    listed = list(itertools.islice(pages(stubs.ListMessages, request, "messages"), args.limit))
    if not listed:
        output.note(f"no message in {args.queue or 'any queue'}")
        return 0
    columns = ("message_id", "queue", "state", "receive_count", "consumer_id", "enqueue_time")
    _show(args, listed, columns)
    return 0


def _attributes(args: argparse.Namespace) -> dict[str, message_pb2.AttributeValue]:
    attributes = {}
    for pair in getattr(args, "attribute", None) or []:
        name, _, value = pair.partition("=")
        attributes[name] = message_pb2.AttributeValue(data_type="String", string_value=value)
    return attributes


def _send_file(stubs: Any, args: argparse.Namespace) -> int:
    """Sends a JSON Lines file, a message per line ({"body": ..., "attributes": {...}} or a
    bare string), in batches, with a progress bar."""
    from rich.progress import Progress

    lines = [line for line in Path(args.file).read_text().splitlines() if line.strip()]
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            document = json.loads(line)
        except json.JSONDecodeError as error:
            output.note(f"{args.file}:{number}: not JSON ({error.msg})")
            return 2
        if isinstance(document, str):
            document = {"body": document}
        body = output.body_bytes(str(document.get("body", "")), is_base64=args.base64)
        attributes = {
            name: message_pb2.AttributeValue(data_type="String", string_value=str(value))
            for name, value in (document.get("attributes") or {}).items()
        }
        entries.append(message_service_pb2.SendBatchEntry(body=body, attributes=attributes))
    sent = 0
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"sending to {args.queue}", total=len(entries))
        for start in range(0, len(entries), SEND_BATCH):
            batch = entries[start : start + SEND_BATCH]
            stubs.SendBatch(message_service_pb2.SendBatchRequest(queue=args.queue, entries=batch))
            sent += len(batch)
            progress.update(task, completed=sent)
    output.note(f"sent {sent} messages to {args.queue}")
    return 0


def _tail(stubs: Any, args: argparse.Namespace) -> int:
    """Streams messages as they arrive, one JSON line each; --ack deletes them."""
    request = message_service_pb2.ReceiveRequest(
        queue=args.queue, max_messages=10, mode=message_service_pb2.RECEIVE_MODE_CONTINUOUS
    )
    if args.count:
        request.max_total_messages = args.count
    try:
        for response in stubs.Receive(request):
            for message in response.messages:
                document = output.as_dict(message, raw_bodies=args.base64)
                print(json.dumps(document, ensure_ascii=False), flush=True)
            if args.ack and response.messages:
                stubs.DeleteBatch(
                    message_service_pb2.DeleteBatchRequest(
                        queue=args.queue, receipts=[m.receipt for m in response.messages]
                    )
                )
    except KeyboardInterrupt:
        return 0
    return 0


# dead-letter queues


def dlq(args: argparse.Namespace, channel: grpc.Channel) -> int:
    stubs = Stubs(channel)
    verb = args.dlq_verb
    if verb == "ls":
        # One listing answers it: each queue names its dead-letter queue, and the
        # full view carries every depth.
        listing = queue_service_pb2.ListQueuesRequest(
            page_size=PAGE, view=queue_service_pb2.QUEUE_VIEW_FULL
        )
        queues = list(pages(stubs.queues.ListQueues, listing, "queues"))
        sources: dict[str, list[str]] = {}
        for queue in queues:
            target = queue.dead_letter_policy.dead_letter_queue
            if target and target != queue.name:
                sources.setdefault(target, []).append(queue.name)
        rows = []
        for queue in queues:
            if queue.name in sources:
                stats = queue.stats
                depth = stats.visible_messages + stats.in_flight_messages + stats.delayed_messages
                rows.append(
                    {
                        "name": queue.name,
                        "messages": depth,
                        "sources": ",".join(sources[queue.name]),
                    }
                )
        if not rows:
            output.note("no queue is another's dead-letter queue")
            return 0
        output.emit(rows, args.output)
    elif verb == "peek":
        request = message_service_pb2.PeekMessagesRequest(queue=args.queue, page_size=args.limit)
        peeked = list(stubs.messages.PeekMessages(request).messages)
        if not peeked:
            output.note(f"no message in {args.queue}")
            return 0
        _show(
            args,
            peeked,
            ("message_id", "body", "receive_count", "dead_letter_source_queue", "last_error"),
        )
    elif verb == "redrive":
        return _redrive(stubs, args)
    return 0


def _redrive(stubs: Stubs, args: argparse.Namespace) -> int:
    """Starts a redrive and follows it with a progress bar until it ends."""
    from rich.progress import Progress

    request = queue_service_pb2.RedriveMessagesRequest(
        dead_letter_queue=args.queue,
        destination=args.to or "",
        max_messages=args.max_messages,
        message_ids=args.id or [],
    )
    task = stubs.queues.RedriveMessages(request).task
    done = {
        queue_service_pb2.RedriveTask.STATE_COMPLETED,
        queue_service_pb2.RedriveTask.STATE_CANCELLED,
        queue_service_pb2.RedriveTask.STATE_FAILED,
    }
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        bar = progress.add_task(f"redriving {args.queue}", total=task.messages_to_move or None)
        while task.state not in done:
            time.sleep(0.2)
            tasks = stubs.queues.ListRedriveTasks(
                queue_service_pb2.ListRedriveTasksRequest(
                    dead_letter_queue=args.queue, page_size=100
                )
            ).tasks
            task = next((t for t in tasks if t.task_id == task.task_id), task)
            progress.update(bar, completed=task.moved_messages, total=task.messages_to_move or None)
    state = queue_service_pb2.RedriveTask.State.Name(task.state).removeprefix("STATE_").lower()
    output.note(f"redrive {state}: {task.moved_messages} of {task.messages_to_move} moved")
    _show_one(args, task)
    return 0 if task.state == queue_service_pb2.RedriveTask.STATE_COMPLETED else 1


# topics and schedules

# What `topics consumers` shows of each group: PgQue's consumer info.
_CONSUMER_COLUMNS = (
    "name", "lag_messages", "lag", "retry_messages", "dead_letter_messages", "max_deliveries",
    "lease_expire_time", "ack_time", "paused",
)  # fmt: skip


def _drain(streams: Any, args: argparse.Namespace) -> int:
    """Waits until a consumer group has read and acknowledged everything: no message past
    its cursor, none given back, no batch out. With --discard, skips what is left first
    (the cursor goes to the log's end). 1 when --timeout passes first."""
    get = stream_service_pb2.GetConsumerGroupRequest(topic=args.name, name=args.group)
    if args.discard:
        # Past every offset: the group reads what is published from now on.
        seek = stream_service_pb2.SeekConsumerGroupRequest(
            topic=args.name, consumer_group=args.group, offset=2**62
        )
        streams.SeekConsumerGroup(seek)
    deadline = time.monotonic() + args.timeout
    while True:
        group = streams.GetConsumerGroup(get).consumer_group
        left = group.lag_messages + group.retry_messages
        if not left and not group.HasField("lease_expire_time"):
            output.note(f"drained {args.name}/{args.group}")
            _show_one(args, group)
            return 0
        if time.monotonic() >= deadline:
            output.note(
                f"{args.name}/{args.group} not drained after {args.timeout:g} s: {left} messages"
                " left" + (", a batch out" if group.HasField("lease_expire_time") else "")
            )
            _show_one(args, group)
            return 1
        time.sleep(0.5)


def topics(args: argparse.Namespace, channel: grpc.Channel) -> int:
    stubs = Stubs(channel).topics
    verb = args.topics_verb
    if verb == "groups":
        groups = stream_service_pb2.ListConsumerGroupsRequest(topic=args.name, page_size=PAGE)
        listed = list(pages(Stubs(channel).streams.ListConsumerGroups, groups, "consumer_groups"))
        _show(args, listed, ("name", "lag_messages", "lag", "cursor_offset", "paused"))
    elif verb == "consumers":
        groups = stream_service_pb2.ListConsumerGroupsRequest(topic=args.name, page_size=PAGE)
        listed = list(pages(Stubs(channel).streams.ListConsumerGroups, groups, "consumer_groups"))
        _show(args, listed, _CONSUMER_COLUMNS)
    elif verb == "drain":
        return _drain(Stubs(channel).streams, args)
    elif verb == "pause-group":
        streams = Stubs(channel).streams
        paused = streams.PauseConsumerGroup(
            stream_service_pb2.PauseConsumerGroupRequest(topic=args.name, name=args.group)
        )
        _show_one(args, paused.consumer_group)
    elif verb == "resume-group":
        streams = Stubs(channel).streams
        resumed = streams.ResumeConsumerGroup(
            stream_service_pb2.ResumeConsumerGroupRequest(topic=args.name, name=args.group)
        )
        _show_one(args, resumed.consumer_group)
    elif verb == "ls":
        listed = list(
            pages(stubs.ListTopics, topic_service_pb2.ListTopicsRequest(page_size=PAGE), "topics")
        )
        _show(args, listed, ("name", "create_time"))
    elif verb == "get":
        _show_one(args, stubs.GetTopic(topic_service_pb2.GetTopicRequest(name=args.name)).topic)
    elif verb == "create":
        topic = topic_service_pb2.Topic(name=args.name)
        if args.stream_retention is not None:
            topic.stream_retention.FromTimedelta(timedelta(seconds=args.stream_retention))
        _show_one(args, stubs.CreateTopic(topic_service_pb2.CreateTopicRequest(topic=topic)).topic)
    elif verb == "delete":
        stubs.DeleteTopic(topic_service_pb2.DeleteTopicRequest(name=args.name))
        output.note(f"deleted {args.name}")
    elif verb == "subscriptions":
        request = topic_service_pb2.ListSubscriptionsRequest(topic=args.name, page_size=PAGE)
        _show(
            args,
            list(pages(stubs.ListSubscriptions, request, "subscriptions")),
            ("name", "pattern", "queue"),
        )
    elif verb == "retry":
        retry = topic_service_pb2.RetryWebhookDeliveryRequest(
            topic=args.name, subscription=args.subscription, delivery_id=args.delivery_id or ""
        )
        retried = stubs.RetryWebhookDelivery(retry).retried_deliveries
        output.note(f"{retried} deliveries due now")
    elif verb == "publish":
        body = output.body_bytes(args.body, is_base64=args.base64)
        publish = topic_service_pb2.PublishRequest(
            topic=args.name,
            routing_key=args.routing_key or "",
            body=body,
            attributes=_attributes(args),
        )
        _show_one(args, stubs.Publish(publish))
    return 0


def schedules(args: argparse.Namespace, channel: grpc.Channel) -> int:
    stubs = Stubs(channel).schedules
    verb = args.schedules_verb
    if verb == "ls":
        request = schedule_service_pb2.ListSchedulesRequest(page_size=PAGE)
        _show(
            args,
            list(pages(stubs.ListSchedules, request, "schedules")),
            ("name", "next_fire_time", "paused"),
        )
    elif verb == "get":
        get = schedule_service_pb2.GetScheduleRequest(name=args.name)
        _show_one(args, stubs.GetSchedule(get).schedule)
    elif verb == "delete":
        stubs.DeleteSchedule(schedule_service_pb2.DeleteScheduleRequest(name=args.name))
        output.note(f"deleted {args.name}")
    elif verb == "pause":
        pause = schedule_service_pb2.PauseScheduleRequest(name=args.name)
        _show_one(args, stubs.PauseSchedule(pause).schedule)
    elif verb == "resume":
        resume = schedule_service_pb2.ResumeScheduleRequest(name=args.name)
        _show_one(args, stubs.ResumeSchedule(resume).schedule)
    elif verb == "run":
        ran = stubs.RunSchedule(schedule_service_pb2.RunScheduleRequest(name=args.name))
        output.note(f"fired {args.name}: {', '.join(ran.message_ids) or 'no message'}")
        _show_one(args, ran.schedule)
    elif verb == "preview":
        preview = schedule_service_pb2.PreviewScheduleRequest(count=args.count)
        if args.cron is not None:
            preview.schedule.cron.expression = args.cron
            preview.schedule.cron.time_zone = args.time_zone
        elif args.interval is not None:
            preview.schedule.interval.FromTimedelta(timedelta(seconds=args.interval))
        else:
            preview.schedule.run_at.FromJsonString(args.run_at)
        for fire_time in stubs.PreviewSchedule(preview).fire_times:
            print(fire_time.ToJsonString())
    return 0


# The parser


def add_parsers(verbs: Any, client: argparse.ArgumentParser, run: Callable[..., int]) -> None:
    """The operator verbs; `client` holds the connection flags, `run` calls a Handler."""
    shown = argparse.ArgumentParser(add_help=False)
    shown.add_argument(
        "-o", "--output", choices=output.FORMATS, default="table", help="table, json or yaml"
    )
    shown.add_argument(
        "--base64", action="store_true", help="bodies in base64, even when they are text"
    )
    common = [client, shown]

    def verb(
        parent: Any, name: str, help_: str, handler: Handler, **kw: Any
    ) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=common, help=help_, **kw)
        parser.set_defaults(run=run, handler=handler)
        return parser

    watch = verb(
        verbs,
        "status",
        "a table of every queue: depth, DLQ depth, oldest age, sent/s, received/s, paused",
        status,
    )
    watch.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS")

    group = verbs.add_parser(
        "queues", help="list, get, create, update, delete, purge, pause, resume"
    )
    sub = group.add_subparsers(dest="queues_verb", required=True)
    verb(sub, "ls", "list queues", queues, aliases=["list"])
    for name, text in (
        ("get", "a queue's attributes and stats"),
        ("delete", "delete a queue and its messages"),
        ("purge", "delete every message of a queue"),
    ):
        verb(sub, name, text, queues).add_argument("name")
    for name in ("create", "update"):
        settings = verb(sub, name, f"{name} a queue", queues)
        settings.add_argument("name")
        for flag in ("visibility-timeout", "delivery-delay", "receive-wait-time"):
            settings.add_argument(f"--{flag}", type=float, metavar="SECONDS")
        settings.add_argument(
            "--retention",
            type=_retention,
            metavar="SECONDS",
            help='how long messages are kept: seconds, or "forever"',
        )
        settings.add_argument("--max-message-size", type=int, metavar="BYTES")
        settings.add_argument(
            "--archive",
            action="store_true",
            help="keep finished messages (their history, for `messages get` and `list`)",
        )
        settings.add_argument("--dead-letter-queue", metavar="QUEUE")
        settings.add_argument(
            "--max-receive-count", type=int, default=5, help="with --dead-letter-queue"
        )
    for name in ("pause", "resume"):
        pausing = verb(sub, name, f"{name} sends and receives (or only those named)", queues)
        pausing.add_argument("name")
        pausing.add_argument("--sends", action="store_true")
        pausing.add_argument("--receives", action="store_true")

    group = verbs.add_parser("messages", help="send, receive, peek, tail, get or list messages")
    sub = group.add_subparsers(dest="messages_verb", required=True)
    send = verb(sub, "send", "send a message, or a JSON Lines file of them", messages)
    send.add_argument("queue")
    send.add_argument("body", nargs="?")
    send.add_argument("--file", help="one message per line: a JSON string or {body, attributes}")
    send.add_argument(
        "--attribute", action="append", metavar="NAME=VALUE", help="a String attribute"
    )
    send.add_argument(
        "--ttl", type=float, metavar="SECONDS", help="expire the message this long after sending"
    )
    cancel = verb(sub, "cancel", "remove a message no consumer holds", messages)
    cancel.add_argument("queue")
    cancel.add_argument("message_id")
    get = verb(sub, "get", "where a message stands in its life: state, attempts, result", messages)
    get.add_argument("queue")
    get.add_argument("message_id")
    listing = verb(sub, "list", "messages with their state, of a queue or of all", messages)
    listing.add_argument("queue", nargs="?", help="(default: every queue)")
    listing.add_argument("--state", choices=sorted(MESSAGE_STATES))
    listing.add_argument("--limit", type=int, default=100)
    receive = verb(
        sub, "receive", "receive one batch; says so on stderr when there is none", messages
    )
    receive.add_argument("queue")
    receive.add_argument("--max-messages", type=int, default=10)
    receive.add_argument("--wait", type=int, default=0, help="seconds to wait for a message")
    receive.add_argument("--ack", action="store_true", help="delete what was received")
    receive.add_argument("--consumer-id", help="name this consumer (1-128 of A-Z a-z 0-9 _.:@/-)")
    receive.add_argument(
        "--visibility-timeout", type=float, metavar="SECONDS", help="(default: the queue's)"
    )
    peek = verb(sub, "peek", "look at messages without receiving them", messages)
    peek.add_argument("queue")
    peek.add_argument("--limit", type=int, default=10)
    tail = verb(sub, "tail", "print messages as they arrive, a JSON line each", messages)
    tail.add_argument("queue")
    tail.add_argument("--ack", action="store_true", help="delete them once printed")
    tail.add_argument("--count", type=int, help="stop after this many")

    group = verbs.add_parser("dlq", help="dead-letter queues: ls, peek, redrive")
    sub = group.add_subparsers(dest="dlq_verb", required=True)
    verb(sub, "ls", "queues that are another's dead-letter queue, with their sources", dlq)
    peek = verb(sub, "peek", "look at dead letters", dlq)
    peek.add_argument("queue")
    peek.add_argument("--limit", type=int, default=10)
    redrive = verb(sub, "redrive", "move dead letters back, showing progress", dlq)
    redrive.add_argument("queue")
    redrive.add_argument("--to", help="destination queue (default: each message's source)")
    redrive.add_argument("--max-messages", type=int)
    redrive.add_argument(
        "--id", action="append", metavar="MESSAGE_ID", help="move only this dead letter (repeat)"
    )

    group = verbs.add_parser(
        "topics",
        help="ls, get, create, delete, subscriptions, groups, consumers, drain, publish, retry",
    )
    sub = group.add_subparsers(dest="topics_verb", required=True)
    verb(sub, "ls", "list topics", topics)
    for name in ("get", "delete", "subscriptions"):
        verb(sub, name, f"{name} a topic" if name != "subscriptions" else "a topic's subscriptions",
             topics).add_argument("name")  # fmt: skip
    create = verb(sub, "create", "create a topic", topics)
    create.add_argument("name")
    create.add_argument(
        "--stream-retention", type=float, metavar="SECONDS",
        help="make it a stream topic that keeps its messages this long for consumer groups",
    )  # fmt: skip
    verb(sub, "groups", "a stream topic's consumer groups, with their lag", topics).add_argument(
        "name"
    )
    verb(sub, "consumers", "a stream topic's consumer groups in full: lag, retries, dead letters, "
         "batch out", topics).add_argument("name")  # fmt: skip
    drain = verb(sub, "drain", "wait until a consumer group has read and acked everything", topics)
    drain.add_argument("name", help="the stream topic")
    drain.add_argument("group", help="the consumer group")
    drain.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS",
        help="give up after this long (exit 1); default 60",
    )  # fmt: skip
    drain.add_argument(
        "--discard", action="store_true",
        help="skip what is left instead: the group's cursor goes to the end of the log",
    )  # fmt: skip
    for name, does in (("pause-group", "stop a consumer group's reads"),
                       ("resume-group", "let a paused consumer group read again")):  # fmt: skip
        changed = verb(sub, name, does, topics)
        changed.add_argument("name", help="the stream topic")
        changed.add_argument("group", help="the consumer group")
    publish = verb(sub, "publish", "publish a message", topics)
    publish.add_argument("name")
    publish.add_argument("body")
    publish.add_argument("--routing-key")
    publish.add_argument("--attribute", action="append", metavar="NAME=VALUE")
    retry = verb(sub, "retry", "retry a webhook subscription's failed deliveries", topics)
    retry.add_argument("name")
    retry.add_argument("subscription")
    retry.add_argument("--delivery-id", help="only this delivery (default: every failed one)")

    group = verbs.add_parser("schedules", help="ls, get, delete, pause, resume, run, preview")
    sub = group.add_subparsers(dest="schedules_verb", required=True)
    verb(sub, "ls", "list schedules", schedules)
    for name in ("get", "delete", "pause", "resume"):
        verb(sub, name, f"{name} a schedule", schedules).add_argument("name")
    verb(sub, "run", "fire a schedule once now", schedules).add_argument("name")
    preview = verb(sub, "preview", "the next fire times of a timing", schedules)
    timing = preview.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPRESSION", help='e.g. "*/5 9-17 * * MON-FRI"')
    timing.add_argument("--interval", type=float, metavar="SECONDS")
    timing.add_argument("--run-at", metavar="TIME", help="RFC 3339, e.g. 2030-01-01T09:00:00Z")
    preview.add_argument("--time-zone", default="UTC", help="IANA name, for --cron")
    preview.add_argument("--count", type=int, default=10)


def _retention(text: str) -> str:
    """--retention's value: "forever" or a number of seconds (checked by the server)."""
    if text != "forever":
        float(text)  # argparse reports a ValueError as an invalid value
    return text
