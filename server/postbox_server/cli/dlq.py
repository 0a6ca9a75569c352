"""`postbox dlq`: dead-letter queues, their dead letters, and redrives."""

from __future__ import annotations

import argparse
import sys
import time

from postbox.v1 import queue_service_pb2
from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs
from postbox_server.cli.messages import show_peeked

PAGE = 1000  # queues per ListQueues page

# The states a redrive ends in.
DONE = {
    queue_service_pb2.RedriveTask.STATE_COMPLETED,
    queue_service_pb2.RedriveTask.STATE_CANCELLED,
    queue_service_pb2.RedriveTask.STATE_FAILED,
}


def ls(args: argparse.Namespace, client: Client) -> int:
    # One listing answers it: each queue names its dead-letter queue, and the
    # full view carries every depth.
    queues = list(client.list_queues(PAGE, view=queue_service_pb2.QUEUE_VIEW_FULL))
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
                {"name": queue.name, "messages": depth, "sources": ",".join(sources[queue.name])}
            )
    if not rows:
        output.note("no queue is another's dead-letter queue")
        return 0
    output.emit(rows, args.output)
    return 0


def peek(args: argparse.Namespace, client: Client) -> int:
    columns = ("message_id", "body", "receive_count", "dead_letter_source_queue", "last_error")
    return show_peeked(args, client, columns)


def redrive(args: argparse.Namespace, client: Client) -> int:
    """Starts a redrive and follows it with a progress bar until it ends."""
    from rich.progress import Progress

    task = client.redrive_messages(
        args.queue, destination=args.to or "", max_messages=args.max_messages,
        message_ids=args.id or [],
    )  # fmt: skip
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        bar = progress.add_task(f"redriving {args.queue}", total=task.messages_to_move or None)
        while task.state not in DONE:
            time.sleep(0.2)
            task = client.get_redrive_task(args.queue, task.task_id) or task
            progress.update(bar, completed=task.moved_messages, total=task.messages_to_move or None)
    state = queue_service_pb2.RedriveTask.State.Name(task.state).removeprefix("STATE_").lower()
    output.note(f"redrive {state}: {task.moved_messages} of {task.messages_to_move} moved")
    output.show_one(args, task)
    return 0 if task.state == queue_service_pb2.RedriveTask.STATE_COMPLETED else 1


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    group = verbs.add_parser("dlq", help="dead-letter queues: ls, peek, redrive")
    sub = group.add_subparsers(dest="dlq_verb", required=True)
    client.verb(sub, "ls", "queues that are another's dead-letter queue, with their sources", ls)
    peeking = client.verb(sub, "peek", "look at dead letters", peek)
    peeking.add_argument("queue")
    peeking.add_argument("--limit", type=int, default=10)
    redriving = client.verb(sub, "redrive", "move dead letters back, showing progress", redrive)
    redriving.add_argument("queue")
    redriving.add_argument("--to", help="destination queue (default: each message's source)")
    redriving.add_argument("--max-messages", type=int)
    redriving.add_argument(
        "--id", action="append", metavar="MESSAGE_ID", help="move only this dead letter (repeat)"
    )
