"""--require-synchronous-commit: refuse to serve where an OK would not wait for a standby."""

from __future__ import annotations

from postbox_server.db.engine import Engine

# synchronous_commit levels at which a commit returns only once a synchronous
# standby has flushed it (remote_apply: and applied it). remote_write waits only
# for the standby's operating system; local and off wait for no standby.
_WAITS_FOR_STANDBY_FLUSH = ("on", "remote_apply")


class NotDurable(Exception):
    """The database would acknowledge commits that no synchronous standby holds yet."""


async def require_synchronous_commit(engine: Engine) -> None:
    """Raises NotDurable unless the pool's sessions commit synchronously to a standby.

    The settings as the server's own role and database see them (ALTER ROLE/DATABASE
    ... SET count). A synchronous standby that is named but away makes commits wait,
    not succeed: an OK still means the standby has the message.
    """
    level, standby_names = await engine.replication_settings()
    if level in _WAITS_FOR_STANDBY_FLUSH and standby_names.strip():
        return
    raise NotDurable(
        "refusing to serve with --require-synchronous-commit: this database acknowledges "
        f"commits before a standby has them (synchronous_commit = {level!r}, "
        f"synchronous_standby_names = {standby_names[:60]!r}). On the primary, set "
        "synchronous_standby_names to the standby (or '*'), and synchronous_commit to 'on' "
        "for postbox's role (ALTER ROLE ... SET synchronous_commit = on), or serve without "
        "the flag."
    )
