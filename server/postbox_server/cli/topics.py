"""`postbox topics`: topics, their subscriptions and a stream topic's consumer groups."""

from __future__ import annotations

import argparse
from datetime import timedelta

from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs
from postbox_server.cli.messages import attributes

PAGE = 1000  # items per List page


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
        "topics", help="ls, get, create, delete, subscriptions, groups, publish, retry"
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
