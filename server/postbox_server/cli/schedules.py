"""`postbox schedules`: list, look at, pause, fire and preview schedules."""

from __future__ import annotations

import argparse
from datetime import timedelta, timezone

from google.protobuf import timestamp_pb2
from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs

PAGE = 1000  # schedules per ListSchedules page


def ls(args: argparse.Namespace, client: Client) -> int:
    listed = list(client.list_schedules(page_size=PAGE))
    output.show(args, listed, ("name", "next_fire_time", "paused"))
    return 0


def get(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.get_schedule(args.name))
    return 0


def delete(args: argparse.Namespace, client: Client) -> int:
    client.delete_schedule(args.name)
    output.note(f"deleted {args.name}")
    return 0


def pause(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.pause_schedule(args.name))
    return 0


def resume(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.resume_schedule(args.name))
    return 0


def fire(args: argparse.Namespace, client: Client) -> int:
    ran = client.run_schedule(args.name)
    output.note(f"fired {args.name}: {', '.join(ran.message_ids) or 'no message'}")
    output.show_one(args, ran.schedule)
    return 0


def preview(args: argparse.Namespace, client: Client) -> int:
    run_at = None
    if args.run_at is not None:
        parsed = timestamp_pb2.Timestamp()
        parsed.FromJsonString(args.run_at)
        run_at = parsed.ToDatetime(tzinfo=timezone.utc)
    fire_times = client.preview_schedule(
        cron=args.cron,
        time_zone=args.time_zone,
        interval=None if args.interval is None else timedelta(seconds=args.interval),
        run_at=run_at,
        count=args.count,
    )
    for fire_time in fire_times:
        print(fire_time.ToJsonString())
    return 0


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    group = verbs.add_parser("schedules", help="ls, get, delete, pause, resume, run, preview")
    sub = group.add_subparsers(dest="schedules_verb", required=True)
    client.verb(sub, "ls", "list schedules", ls)
    for name, handler in (("get", get), ("delete", delete), ("pause", pause), ("resume", resume)):
        client.verb(sub, name, f"{name} a schedule", handler).add_argument("name")
    client.verb(sub, "run", "fire a schedule once now", fire).add_argument("name")
    previewing = client.verb(sub, "preview", "the next fire times of a timing", preview)
    timing = previewing.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPRESSION", help='e.g. "*/5 9-17 * * MON-FRI"')
    timing.add_argument("--interval", type=float, metavar="SECONDS")
    timing.add_argument("--run-at", metavar="TIME", help="RFC 3339, e.g. 2030-01-01T09:00:00Z")
    previewing.add_argument("--time-zone", default="UTC", help="IANA name, for --cron")
    previewing.add_argument("--count", type=int, default=10)
