"""`postbox topics`: topics, their subscriptions and a stream topic's consumer groups."""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs
from postbox_server.cli.messages import attributes

PAGE = 1000  # items per List page
# What `topics consumers` shows of each group: PgQue's consumer info.
CONSUMER_COLUMNS = (
    "name", "lag_messages", "lag", "retry_messages", "dead_letter_messages", "max_deliveries",
    "lease_expire_time", "ack_time", "paused",
)  # fmt: skip
PAST_THE_END = 2**62  # an offset past every log: seeking there skips what is left


def ls(args: argparse.Namespace, client: Client) -> int:
    output.show(args, list(client.list_topics(page_size=PAGE)), ("name", "create_time"))
    return 0


def get(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.get_topic(args.name))
    return 0


def create(args: argparse.Namespace, client: Client) -> int:
    retention = None if args.stream_retention is None else timedelta(seconds=args.stream_retention)
    output.show_one(args, client.create_topic(args.name, stream_retention=retention))
    return 0


def delete(args: argparse.Namespace, client: Client) -> int:
    client.delete_topic(args.name)
    output.note(f"deleted {args.name}")
    return 0


def subscriptions(args: argparse.Namespace, client: Client) -> int:
    listed = list(client.list_subscriptions(args.name, page_size=PAGE))
    output.show(args, listed, ("name", "pattern", "queue"))
    return 0


def groups(args: argparse.Namespace, client: Client) -> int:
    listed = list(client.list_consumer_groups(args.name, page_size=PAGE))
    output.show(args, listed, ("name", "lag_messages", "lag", "cursor_offset", "paused"))
    return 0


def consumers(args: argparse.Namespace, client: Client) -> int:
    output.show(
        args, list(client.list_consumer_groups(args.name, page_size=PAGE)), CONSUMER_COLUMNS
    )
    return 0


def drain(args: argparse.Namespace, client: Client) -> int:
    """Waits until a consumer group has read and acknowledged everything: no message past
    its cursor, none given back, no batch out. With --discard, skips what is left first.
    1 when --timeout passes first."""
    if args.discard:
        client.seek_consumer_group(args.name, args.group, offset=PAST_THE_END)
    deadline = time.monotonic() + args.timeout
    while True:
        group = client.get_consumer_group(args.name, args.group)
        left = group.lag_messages + group.retry_messages
        batch_out = group.HasField("lease_expire_time")
        if not left and not batch_out:
            output.note(f"drained {args.name}/{args.group}")
            output.show_one(args, group)
            return 0
        if time.monotonic() >= deadline:
            output.note(
                f"{args.name}/{args.group} not drained after {args.timeout:g} s: {left} messages"
                " left" + (", a batch out" if batch_out else "")
            )
            output.show_one(args, group)
            return 1
        time.sleep(0.5)  # a poll of the group's counts, which move as its readers ack


def pause_group(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.pause_consumer_group(args.name, args.group))
    return 0


def resume_group(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.resume_consumer_group(args.name, args.group))
    return 0


def retry(args: argparse.Namespace, client: Client) -> int:
    retried = client.retry_webhook_delivery(args.name, args.subscription, args.delivery_id or "")
    output.note(f"{retried} deliveries due now")
    return 0


def publish(args: argparse.Namespace, client: Client) -> int:
    body = output.body_bytes(args.body, is_base64=args.base64)
    published = client.publish(
        args.name, body, routing_key=args.routing_key or "", attributes=attributes(args)
    )
    output.show_one(args, published)
    return 0


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    group = verbs.add_parser(
        "topics",
        help="ls, get, create, delete, subscriptions, groups, consumers, drain, publish, retry",
    )
    sub = group.add_subparsers(dest="topics_verb", required=True)
    client.verb(sub, "ls", "list topics", ls)
    for name, text, handler in (
        ("get", "get a topic", get),
        ("delete", "delete a topic", delete),
        ("subscriptions", "a topic's subscriptions", subscriptions),
    ):
        client.verb(sub, name, text, handler).add_argument("name")
    creating = client.verb(sub, "create", "create a topic", create)
    creating.add_argument("name")
    creating.add_argument(
        "--stream-retention", type=float, metavar="SECONDS",
        help="make it a stream topic that keeps its messages this long for consumer groups",
    )  # fmt: skip
    client.verb(
        sub, "groups", "a stream topic's consumer groups, with their lag", groups
    ).add_argument("name")
    client.verb(
        sub, "consumers",
        "a stream topic's consumer groups in full: lag, retries, dead letters, batch out",
        consumers,
    ).add_argument("name")  # fmt: skip
    draining = client.verb(
        sub, "drain", "wait until a consumer group has read and acked everything", drain
    )
    draining.add_argument("name", help="the stream topic")
    draining.add_argument("group", help="the consumer group")
    draining.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS",
        help="give up after this long (exit 1); default 60",
    )  # fmt: skip
    draining.add_argument(
        "--discard", action="store_true",
        help="skip what is left instead: the group's cursor goes to the end of the log",
    )  # fmt: skip
    for name, does, handler in (
        ("pause-group", "stop a consumer group's reads", pause_group),
        ("resume-group", "let a paused consumer group read again", resume_group),
    ):
        changed = client.verb(sub, name, does, handler)
        changed.add_argument("name", help="the stream topic")
        changed.add_argument("group", help="the consumer group")
    publishing = client.verb(sub, "publish", "publish a message", publish)
    publishing.add_argument("name")
    publishing.add_argument("body")
    publishing.add_argument("--routing-key")
    publishing.add_argument("--attribute", action="append", metavar="NAME=VALUE")
    retrying = client.verb(sub, "retry", "retry a webhook subscription's failed deliveries", retry)
    retrying.add_argument("name")
    retrying.add_argument("subscription")
    retrying.add_argument("--delivery-id", help="only this delivery (default: every failed one)")
