"""`postbox tenants`: create, get, list, update and delete tenants through the server
(AccessService), with an admin key of the default tenant."""

from __future__ import annotations

import argparse

from postbox_client import Client

from postbox_server.cli import output
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs
from postbox_server.cli.rate_limit_flags import add_rate_limit_flags, rate_limits

PAGE = 1000  # tenants per ListTenants page
COLUMNS = ("name", "account_id", "description")
# Quota flags: (flag's dest, what it limits); each is TenantQuota's field of the same name.
QUOTA_FLAGS = (
    ("max_queues", "queues it may own"),
    ("max_topics", "topics it may own"),
    ("max_messages", "messages its queues may hold"),
    ("max_bytes", "bytes of message bodies its queues may hold"),
)


def _quota(args: argparse.Namespace) -> dict[str, int]:
    """The quota flags given, by TenantQuota field."""
    return {name: getattr(args, name) for name, _ in QUOTA_FLAGS if getattr(args, name) is not None}


def create(args: argparse.Namespace, client: Client) -> int:
    created = client.create_tenant(
        args.name,
        account_id=args.account_id or "",
        description=args.description or "",
        rate_limits=rate_limits(args),
        **_quota(args),
    )
    output.show_one(args, created)
    return 0


def get(args: argparse.Namespace, client: Client) -> int:
    output.show_one(args, client.get_tenant(args.name))
    return 0


def ls(args: argparse.Namespace, client: Client) -> int:
    output.show(args, list(client.list_tenants(page_size=PAGE)), COLUMNS)
    return 0


def update(args: argparse.Namespace, client: Client) -> int:
    quota = _quota(args)
    limits = rate_limits(args)
    if args.account_id is None and args.description is None and not quota and limits is None:
        raise SystemExit(
            "postbox tenants update: give --account-id, --description, a quota flag "
            "(--max-queues, --max-topics, --max-messages, --max-bytes) or rate-limit flags "
            "(--sends-per-second and the like, or --no-rate-limits)"
        )
    changed = client.update_tenant(
        args.name,
        account_id=args.account_id,
        description=args.description,
        rate_limits=limits,
        **quota,
    )
    output.show_one(args, changed)
    return 0


def delete(args: argparse.Namespace, client: Client) -> int:
    client.delete_tenant(args.name, force=args.force)
    output.note(f"deleted tenant {args.name}")
    return 0


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    group = verbs.add_parser("tenants", help="create, get, list, update, delete tenants")
    sub = group.add_subparsers(dest="tenants_verb", required=True)
    creating = client.verb(sub, "create", "create a tenant", create)
    creating.add_argument("name", help="1-32 characters of a-z, 0-9 and -")
    updating = client.verb(
        sub, "update", "change a tenant's account id, description, quota or rate limits", update
    )
    updating.add_argument("name")
    for parser in (creating, updating):
        parser.add_argument(
            "--account-id", help="12 digits: its AWS account id at the SQS shim (default: random)"
        )
        parser.add_argument("--description", help="at most 256 characters")
        for name, what in QUOTA_FLAGS:
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                type=int,
                metavar="N",
                help=f"quota: most {what}; 0: no limit",
            )
        add_rate_limit_flags(parser, updating=parser is updating)
    client.verb(sub, "get", "show a tenant", get).add_argument("name")
    client.verb(sub, "list", "list tenants", ls)
    deleting = client.verb(sub, "delete", "delete a tenant and its keys", delete)
    deleting.add_argument("name")
    deleting.add_argument(
        "--force",
        action="store_true",
        help="delete its queues (with their messages), topics and schedules too",
    )
