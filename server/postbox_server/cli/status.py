"""`postbox status`: a row per queue, once or every few seconds; with --tenant, a tenant's
usage against its quotas."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from postbox.v1 import queue_service_pb2
from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs

PAGE = 1000  # queues per ListQueues page


def status_rows(client: Client) -> list[dict[str, Any]]:
    """A row per queue: depth by state, its DLQ's depth, oldest age, sent and received per
    second over the last minute (as the servers counted them) and whether paused."""
    queues = list(client.list_queues(PAGE, view=queue_service_pb2.QUEUE_VIEW_FULL))
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


# TenantUsage's figures and the TenantQuota field that limits each.
_USAGE_QUOTAS = (
    ("queues", "max_queues"),
    ("topics", "max_topics"),
    ("messages", "max_messages"),
    ("bytes", "max_bytes"),
)


def tenant_rows(client: Client, tenant: str) -> list[dict[str, Any]]:
    """A row per quota of the tenant: what it holds (as the answering server last counted
    it), its quota ("none": no limit) and the share of the quota used."""
    answer = client.get_tenant_with_usage(tenant)
    counted = (
        answer.usage.count_time.ToDatetime().isoformat(timespec="seconds") + "Z"
        if answer.usage.HasField("count_time")
        else "not yet"
    )
    rows = []
    for figure, limit in _USAGE_QUOTAS:
        used = getattr(answer.usage, figure)
        quota = getattr(answer.tenant.quota, limit)
        rows.append(
            {
                "tenant": tenant,
                "usage": figure,
                "used": used,
                "quota": quota or "none",
                "used_pct": round(100 * used / quota, 1) if quota else "",
                "counted_at": counted,
            }
        )
    return rows


def status(args: argparse.Namespace, client: Client) -> int:
    while True:
        rows = tenant_rows(client, args.tenant) if args.tenant else status_rows(client)
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


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    watch = client.verb(
        verbs,
        "status",
        "a table of every queue: depth, DLQ depth, oldest age, sent/s, received/s, paused",
        status,
    )
    watch.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS")
    watch.add_argument(
        "--tenant",
        metavar="NAME",
        help="instead: the tenant's queues, topics, messages and bytes against its quotas "
        "(an admin key of the default tenant)",
    )
