"""`postbox messages`: send, receive, peek, tail, get, list and cancel messages."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import timedelta
from pathlib import Path

from postbox.v1 import message_pb2, message_service_pb2
from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs

SEND_BATCH = 100  # messages per SendBatch of `messages send --file`
PAGE = 1000  # messages per ListMessages page, at most

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


def send(args: argparse.Namespace, client: Client) -> int:
    if args.file is not None:
        return _send_file(client, args)
    if args.body is None:
        output.note("give a BODY, or --file with one message per line")
        return 2
    body = output.body_bytes(args.body, is_base64=args.base64)
    ttl = None if args.ttl is None else timedelta(seconds=args.ttl)
    output.show_one(
        args, client.send_message(args.queue, body, attributes=attributes(args), ttl=ttl)
    )
    return 0


def attributes(args: argparse.Namespace) -> dict[str, str]:
    """--attribute NAME=VALUE flags: String attributes."""
    given = {}
    for pair in getattr(args, "attribute", None) or []:
        name, _, value = pair.partition("=")
        given[name] = value
    return given


def _send_file(client: Client, args: argparse.Namespace) -> int:
    """Sends a JSON Lines file, a message per line ({"body": ..., "attributes": {...}} or a
    bare string), in batches, with a progress bar."""
    from postbox_client.client import attribute_values
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
        given = {name: str(value) for name, value in (document.get("attributes") or {}).items()}
        entries.append(
            message_service_pb2.SendBatchEntry(body=body, attributes=attribute_values(given))
        )
    sent = 0
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"sending to {args.queue}", total=len(entries))
        for start in range(0, len(entries), SEND_BATCH):
            batch = entries[start : start + SEND_BATCH]
            client.send_batch(args.queue, batch)
            sent += len(batch)
            progress.update(task, completed=sent)
    output.note(f"sent {sent} messages to {args.queue}")
    return 0


def cancel(args: argparse.Namespace, client: Client) -> int:
    client.cancel(args.queue, args.message_id)
    output.note(f"cancelled {args.message_id}")
    return 0


def get(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.get_message(args.queue, args.message_id))
    return 0


def ls(args: argparse.Namespace, client: Client) -> int:
    """Up to --limit messages of a queue (or of every queue) with their state, page by page."""
    state = None if args.state is None else MESSAGE_STATES[args.state]
    listing = client.list_messages(args.queue or "", state=state, page_size=min(args.limit, PAGE))
    listed = list(itertools.islice(listing, args.limit))
    if not listed:
        output.note(f"no message in {args.queue or 'any queue'}")
        return 0
    columns = ("message_id", "queue", "state", "receive_count", "consumer_id", "enqueue_time")
    output.show(args, listed, columns)
    return 0


def receive(args: argparse.Namespace, client: Client) -> int:
    visibility = (
        None if args.visibility_timeout is None else timedelta(seconds=args.visibility_timeout)
    )
    got = client.receive(
        args.queue,
        args.max_messages,
        wait=timedelta(seconds=args.wait),
        visibility_timeout=visibility,
        consumer_id=args.consumer_id or "",
    )
    if not got:
        output.note(f"no message in {args.queue} (waited {args.wait} s)")
        return 0
    output.show(args, got, ("message_id", "body", "receive_count", "receipt"))
    if args.ack:
        client.delete_batch(args.queue, [m.receipt for m in got])
    return 0


def ack(args: argparse.Namespace, client: Client) -> int:
    """Finishes a received job: deleted, with what it produced where the queue keeps history."""
    result = b"" if args.result is None else output.body_bytes(args.result, is_base64=args.base64)
    client.delete(args.queue, args.receipt, result=result)
    output.note("acknowledged")
    return 0


def nack(args: argparse.Namespace, client: Client) -> int:
    """Gives a received job back with why: retried later, or with --dead-letter given up."""
    client.nack(args.queue, args.receipt, error=args.error or "", dead_letter=args.dead_letter)
    output.note("dead-lettered" if args.dead_letter else "given back")
    return 0


def peek(args: argparse.Namespace, client: Client) -> int:
    return show_peeked(args, client, ("message_id", "body", "receive_count", "enqueue_time"))


def show_peeked(args: argparse.Namespace, client: Client, columns: tuple[str, ...]) -> int:
    """Up to --limit messages of a queue, not received (`messages peek`, `dlq peek`)."""
    peeked = client.peek_messages(args.queue, args.limit)
    if not peeked:
        output.note(f"no message in {args.queue}")
        return 0
    output.show(args, peeked, columns)
    return 0


def tail(args: argparse.Namespace, client: Client) -> int:
    """Streams messages as they arrive, one JSON line each; --ack deletes them."""
    try:
        for batch in client.receive_continuously(args.queue, max_total_messages=args.count or None):
            for message in batch:
                document = output.as_dict(message, raw_bodies=args.base64)
                print(json.dumps(document, ensure_ascii=False), flush=True)
            if args.ack and batch:
                client.delete_batch(args.queue, [m.receipt for m in batch])
    except KeyboardInterrupt:
        return 0
    return 0


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    group = verbs.add_parser(
        "messages", help="send, receive, ack, nack, peek, tail, get or list messages"
    )
    sub = group.add_subparsers(dest="messages_verb", required=True)
    sending = client.verb(sub, "send", "send a message, or a JSON Lines file of them", send)
    sending.add_argument("queue")
    sending.add_argument("body", nargs="?")
    sending.add_argument("--file", help="one message per line: a JSON string or {body, attributes}")
    sending.add_argument(
        "--attribute", action="append", metavar="NAME=VALUE", help="a String attribute"
    )
    sending.add_argument(
        "--ttl", type=float, metavar="SECONDS", help="expire the message this long after sending"
    )
    cancelling = client.verb(sub, "cancel", "remove a message no consumer holds", cancel)
    cancelling.add_argument("queue")
    cancelling.add_argument("message_id")
    getting = client.verb(
        sub, "get", "where a message stands in its life: state, attempts, result", get
    )
    getting.add_argument("queue")
    getting.add_argument("message_id")
    listing = client.verb(sub, "list", "messages with their state, of a queue or of all", ls)
    listing.add_argument("queue", nargs="?", help="(default: every queue)")
    listing.add_argument("--state", choices=sorted(MESSAGE_STATES))
    listing.add_argument("--limit", type=int, default=100)
    receiving = client.verb(
        sub, "receive", "receive one batch; says so on stderr when there is none", receive
    )
    receiving.add_argument("queue")
    receiving.add_argument("--max-messages", type=int, default=10)
    receiving.add_argument("--wait", type=int, default=0, help="seconds to wait for a message")
    receiving.add_argument("--ack", action="store_true", help="delete what was received")
    receiving.add_argument("--consumer-id", help="name this consumer (1-128 of A-Z a-z 0-9 _.:@/-)")
    receiving.add_argument(
        "--visibility-timeout", type=float, metavar="SECONDS", help="(default: the queue's)"
    )
    acking = client.verb(sub, "ack", "finish a received message, with an optional result", ack)
    acking.add_argument("queue")
    acking.add_argument("receipt")
    acking.add_argument("--result", help="what the job produced, up to 65,536 bytes")
    nacking = client.verb(sub, "nack", "give a received message back, saying why", nack)
    nacking.add_argument("queue")
    nacking.add_argument("receipt")
    nacking.add_argument("--error", help="why, kept as its last_error (up to 4,096 characters)")
    nacking.add_argument(
        "--dead-letter", action="store_true", help="give up now: to the DLQ, or failed"
    )
    peeking = client.verb(sub, "peek", "look at messages without receiving them", peek)
    peeking.add_argument("queue")
    peeking.add_argument("--limit", type=int, default=10)
    tailing = client.verb(sub, "tail", "print messages as they arrive, a JSON line each", tail)
    tailing.add_argument("queue")
    tailing.add_argument("--ack", action="store_true", help="delete them once printed")
    tailing.add_argument("--count", type=int, help="stop after this many")
