"""`postbox queues`: list, get, create, update, delete, purge, pause, resume."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from postbox.v1 import queue_service_pb2
from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs

PAGE = 1000  # queues per ListQueues page


def ls(args: argparse.Namespace, client: Client) -> int:
    columns = ("name", "fifo", "visibility_timeout", "send_paused", "receive_paused")
    output.show(args, list(client.list_queues(PAGE)), columns)
    return 0


def get(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.get_queue(args.name))
    return 0


def create(args: argparse.Namespace, client: Client) -> int:
    with_dlq = {}
    if args.with_dlq:
        with_dlq = {
            "with_dead_letter_queue": True,
            "dead_letter_max_receive_count": args.max_receive_count,
        }
    output.show_one(args, client.create_queue(args.name, **with_dlq, **_queue_settings(args)))
    return 0


def update(args: argparse.Namespace, client: Client) -> int:
    settings = _queue_settings(args)
    if not settings:
        output.note("nothing to change: give at least one setting")
        return 2
    output.show_one(args, client.update_queue(args.name, list(settings), **settings))
    return 0


def delete(args: argparse.Namespace, client: Client) -> int:
    client.delete_queue(args.name)
    output.note(f"deleted {args.name}")
    return 0


def purge(args: argparse.Namespace, client: Client) -> int:
    purged = client.purge_queue(args.name)
    output.note(f"purged {args.name}")
    output.show_one(args, purged)
    return 0


def pause(args: argparse.Namespace, client: Client) -> int:
    both = not (args.sends or args.receives)
    sends, receives = args.sends or both, args.receives or both
    if args.queues_verb == "pause":
        queue = client.pause_queue(args.name, sends=sends, receives=receives)
    else:
        queue = client.resume_queue(args.name, sends=sends, receives=receives)
    output.show_one(args, queue)
    return 0


def _queue_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Queue fields the flags set, by field name (an update's mask)."""
    given: dict[str, Any] = {}
    for field in ("visibility_timeout", "delivery_delay", "receive_wait_time"):
        seconds = getattr(args, field, None)
        if seconds is not None:
            given[field] = timedelta(seconds=seconds)
    retention = getattr(args, "retention", None)
    if retention is not None:
        # Without a period: forever.
        given["retention"] = queue_service_pb2.Retention(
            period=None if retention == "forever" else timedelta(seconds=float(retention))
        )
    if getattr(args, "max_message_size", None) is not None:
        given["max_message_size"] = args.max_message_size
    if getattr(args, "archive", False):
        given["archive_on_delete"] = True
    if getattr(args, "dead_letter_queue", None):
        given["dead_letter_policy"] = queue_service_pb2.DeadLetterPolicy(
            dead_letter_queue=args.dead_letter_queue, max_receive_count=args.max_receive_count
        )
    return given


def _retention(text: str) -> str:
    """--retention's value: "forever" or a number of seconds (checked by the server)."""
    if text != "forever":
        float(text)  # argparse reports a ValueError as an invalid value
    return text


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    group = verbs.add_parser(
        "queues", help="list, get, create, update, delete, purge, pause, resume"
    )
    sub = group.add_subparsers(dest="queues_verb", required=True)
    client.verb(sub, "ls", "list queues", ls, aliases=["list"])
    for name, text, handler in (
        ("get", "a queue's attributes and stats", get),
        ("delete", "delete a queue and its messages", delete),
        ("purge", "delete every message of a queue", purge),
    ):
        client.verb(sub, name, text, handler).add_argument("name")
    for name, handler in (("create", create), ("update", update)):
        settings = client.verb(sub, name, f"{name} a queue", handler)
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
            "--max-receive-count",
            type=int,
            default=5,
            help="with --dead-letter-queue" + (" or --with-dlq" if name == "create" else ""),
        )
        if name == "create":
            settings.add_argument(
                "--with-dlq",
                action="store_true",
                help="create its dead-letter queue <name>-dlq too (<base>-dlq.fifo for a FIFO "
                "queue), in one transaction",
            )
    for name in ("pause", "resume"):
        pausing = client.verb(sub, name, f"{name} sends and receives (or only those named)", pause)
        pausing.add_argument("name")
        pausing.add_argument("--sends", action="store_true")
        pausing.add_argument("--receives", action="store_true")
