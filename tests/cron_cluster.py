"""A private PostgreSQL 15 cluster that preloads Debian's pg_cron, for the tests of
postbox.start()/stop() and uninstall, whatever database the suite is otherwise given.

pg_cron runs its jobs in one database (cron.database_name), here `postgres`, connecting
to it over loopback as the job's owner (trust auth). `.ci/run` installs
postgresql-15-cron.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from bench.pg_cluster import Postgres, scratch_directory


@contextmanager
def cron_cluster(prefix: str) -> Iterator[Postgres]:
    """A started cluster with pg_cron installed in its `postgres` database."""
    directory = scratch_directory(prefix)
    postgres = Postgres(directory / "data").initdb(
        "shared_preload_libraries = 'pg_cron'",
        "cron.database_name = 'postgres'",
        "cron.host = '127.0.0.1'",
    )
    try:
        postgres.start()
        postgres.sql("CREATE EXTENSION pg_cron")
        yield postgres
    finally:
        postgres.stop_if_running()
        shutil.rmtree(directory, ignore_errors=True)
