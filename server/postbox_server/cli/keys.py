"""`postbox keys`: create, list, update and revoke API keys, on the database or through the
server.

With --database-url the verbs act on the database directly (installing the engine
if needed): that is how the first admin key is made. Otherwise they call
AccessService on --target, through the SDK, with the key of --api-key or POSTBOX_API_KEY.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from postbox.v1 import access_service_pb2 as pb
from postbox_client import Client, PostboxError
from postbox_client.operations import parse_grant

from postbox_server.auth.secrets import Credentials, sigv4_secret
from postbox_server.cli.client import ClientParsers, connect
from postbox_server.cli.flags import Verbs
from postbox_server.cli.rate_limit_flags import add_rate_limit_flags, rate_limits

if TYPE_CHECKING:
    from postbox_server.db.engine import Engine

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(text: str) -> timedelta:
    """--expires-in: a whole number of s, m, h, d or w, as in 30d."""
    match = _DURATION.match(text.strip())
    if match is None or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(
            f"{text[:20]!r} is not a duration: a positive whole number and a unit of "
            "s, m, h, d or w, as in 30d"
        )
    return timedelta(seconds=int(match[1]) * _UNITS[match[2]])


def grant(text: str) -> pb.Grant:
    """--grant PERMISSION:PATTERN, as in send:orders-* (the pattern is checked by the engine)."""
    try:
        return parse_grant(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _expiry(args: argparse.Namespace) -> datetime | None:
    """When --expires-in from now ends; None without it."""
    return datetime.now(timezone.utc) + args.expires_in if args.expires_in else None


def _describe(key: pb.Key) -> str:
    grants = " ".join(
        f"{pb.Permission.Name(g.permission).removeprefix('PERMISSION_').lower()}:{g.pattern}"
        for g in key.grants
    )
    expires = key.expire_time.ToJsonString() if key.HasField("expire_time") else "never"
    used = key.last_used_time.ToJsonString() if key.HasField("last_used_time") else "never"
    line = f"{key.name}\t{grants}\texpires {expires}\tlast used {used}"
    if key.tenant:
        line += f"\ttenant {key.tenant}"
    if key.HasField("rate_limits"):
        limits = json_format.MessageToDict(key.rate_limits, preserving_proto_field_name=True)
        line += "\tlimits " + " ".join(f"{name}={value:g}" for name, value in limits.items())
    return line


async def _update_on_database(engine: Engine, args: argparse.Namespace) -> pb.Key:
    """Changes the fields the flags give, as UpdateKey's update_mask names them."""
    from postbox_server.services.access import grant_arrays, key_resource, rate_limits_json

    permissions: list[str] | None = None
    patterns: list[str] | None = None
    if args.grant:
        permissions, patterns = grant_arrays(args.grant)
    limits = rate_limits(args)
    row = await engine.update_key(
        args.name, permissions, patterns, _sets_expiry(args), _expiry(args),
        limits is not None, rate_limits_json(pb.Key(rate_limits=limits)),
    )  # fmt: skip
    return key_resource(row)


async def _on_database(args: argparse.Namespace) -> Any:
    import asyncpg

    from postbox_server.db.engine import Engine
    from postbox_server.db.migrate import migrate
    from postbox_server.services.access import grant_arrays, key_resource, rate_limits_json

    conn = await asyncpg.connect(args.database_url)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    engine = await Engine.connect(args.database_url, pool_size=1)
    try:
        if args.keys_verb == "create":
            permissions, patterns = grant_arrays(args.grant)
            credentials = Credentials.issue()
            limits = rate_limits_json(pb.Key(rate_limits=rate_limits(args)))
            row = await engine.create_key(
                args.name, credentials.secret_sha256, credentials.sigv4_secret,
                permissions, patterns, _expiry(args), limits, tenant=args.tenant,
            )  # fmt: skip
            return pb.CreateKeyResponse(
                key=key_resource(row),
                secret=credentials.secret,
                sigv4_secret_access_key=credentials.sigv4_secret,
            )
        if args.keys_verb == "list":
            after, keys = "", []
            while page := await engine.list_keys(1000, after):
                keys += [key_resource(row) for row in page]
                after = page[-1]["name"]
            return keys
        if args.keys_verb == "update":
            return await _update_on_database(engine, args)
        await engine.delete_key(args.name)
        return None
    finally:
        await engine.close()


def _sets_expiry(args: argparse.Namespace) -> bool:
    return bool(args.expires_in or args.no_expiry)


def _through_server(args: argparse.Namespace, client: Client) -> Any:
    if args.keys_verb == "create":
        return client.create_key(
            args.name,
            args.grant,
            expire_time=_expiry(args),
            tenant=args.tenant,
            rate_limits=rate_limits(args),
        )
    if args.keys_verb == "list":
        return list(client.list_keys(page_size=1000))
    if args.keys_verb == "update":
        return client.update_key(
            args.name,
            grants=args.grant,
            expire_time=_expiry(args),
            never_expires=args.no_expiry,
            rate_limits=rate_limits(args),
        )
    client.delete_key(args.name)
    return None


def run(args: argparse.Namespace) -> int:
    """Runs a keys verb: on the database with --database-url, else through the server."""
    from postbox_server.errors import ApiError

    if args.keys_verb == "sigv4-secret":
        if not args.api_key:
            print("postbox keys sigv4-secret: set POSTBOX_API_KEY (or --api-key)", file=sys.stderr)
            return 2
        print(sigv4_secret(args.api_key))
        return 0
    if args.keys_verb == "update" and not (
        args.grant or _sets_expiry(args) or rate_limits(args) is not None
    ):
        print(
            "postbox keys update: give --grant, --expires-in, --no-expiry or rate-limit flags "
            "(--sends-per-second and the like, or --no-rate-limits)",
            file=sys.stderr,
        )
        return 2
    try:
        if getattr(args, "database_url", None):
            result = asyncio.run(_on_database(args))
        else:
            with connect(args) as client:
                result = _through_server(args, client)
    except ApiError as error:
        print(f"{error.code.name}: {error.message}", file=sys.stderr)
        return 1
    except PostboxError as error:
        print(error, file=sys.stderr)
        return 1
    if args.keys_verb == "create":
        print(f"created {_describe(result.key)}")
        print(f"SQS: access key id {result.key.name}, secret access key "
              f"{result.sigv4_secret_access_key}")  # fmt: skip
        print("the key's secret, shown only now (send it as `authorization: Bearer <secret>`):")
        print(result.secret)
    elif args.keys_verb == "list":
        for key in result:
            print(_describe(key))
    elif args.keys_verb == "update":
        print(f"updated {_describe(result)}")
    else:
        print(f"revoked {args.name}")
    return 0


def _add_grant_flag(parser: argparse.ArgumentParser, *, required: bool, more: str) -> None:
    parser.add_argument(
        "--grant",
        type=grant,
        action="append",
        required=required,
        metavar="PERMISSION:PATTERN",
        help="send, receive, publish, read, manage or admin on names matching the pattern "
        f"(* matches any run of characters), as in send:orders-* (repeatable{more})",
    )


def add_parser(verbs: Verbs, client: ClientParsers) -> None:
    """The `keys` verb; it takes the connection flags of every client verb, not -o."""
    keys = verbs.add_parser("keys", help="create, list, update or revoke API keys")
    keys.set_defaults(run=run)
    keys_verbs = keys.add_subparsers(dest="keys_verb", required=True)
    on_database = argparse.ArgumentParser(add_help=False)
    on_database.add_argument(
        "--database-url",
        default=None,
        help="act on this database directly instead of calling the server: how the first "
        "admin key is made",
    )
    create = keys_verbs.add_parser(
        "create",
        parents=[client.connection, on_database],
        help="create a key; prints its secret last",
    )
    create.add_argument("name")
    _add_grant_flag(create, required=True, more="")
    create.add_argument("--expires-in", type=duration, help="as in 30d, 12h, 90m (default: never)")
    create.add_argument(
        "--tenant",
        default="",
        help="the tenant the key belongs to (default: the caller's; another tenant takes an "
        "admin key of the default tenant); its grants cover that tenant's names only",
    )
    add_rate_limit_flags(create)
    keys_verbs.add_parser(
        "list", parents=[client.connection, on_database], help="list keys (no secrets)"
    )
    update = keys_verbs.add_parser(
        "update",
        parents=[client.connection, on_database],
        help="change a key's grants, expiry or rate limits; the others stay as they are",
    )
    update.add_argument("name")
    _add_grant_flag(update, required=False, more="; the grants given replace all of the key's")
    expiry = update.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", type=duration, help="from now, as in 30d, 12h, 90m")
    expiry.add_argument("--no-expiry", action="store_true", help="the key never expires")
    add_rate_limit_flags(update, updating=True)
    revoke = keys_verbs.add_parser(
        "revoke", parents=[client.connection, on_database], help="revoke a key"
    )
    revoke.add_argument("name")
    keys_verbs.add_parser(
        "sigv4-secret",
        parents=[client.connection],
        help="print the SQS secret access key of the key whose secret is POSTBOX_API_KEY",
    )
