"""serve() stops what it started when a later start fails: here the HTTP port is taken
after gRPC has started, and the gRPC port, the key cache's and the hub's connections
and the pool are all let go before the error reaches the caller."""

from __future__ import annotations

import asyncio
import socket

import asyncpg
import pytest

from postbox_server.app import serve
from postbox_server.config import Settings
from postbox_server.db.engine import application_name
from postbox_server.workers.maintenance import MaintenanceWorker


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_taken_http_port_stops_what_had_started(database_url: str) -> None:
    grpc_port = _free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        settings = Settings(
            database_url=database_url,
            grpc_host="127.0.0.1",
            grpc_port=grpc_port,
            http_host="127.0.0.1",
            http_port=http_port,
            run_workers=False,
        )
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{http_port}"):
            await asyncio.wait_for(serve(settings), 60)
    # gRPC had started on its port; it is free again.
    with socket.socket() as again:
        again.bind(("127.0.0.1", grpc_port))
    # Nothing of this process is left connected (pool, LISTEN, keys, migration); a
    # backend leaves pg_stat_activity a moment after its client hangs up.
    conn = await asyncpg.connect(database_url)
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            left = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 || '%'",
                application_name(),
            )
            if left == 0 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    assert left == 0


async def test_a_background_task_that_fails_stops_the_server(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies on an error (a bug, not a database outage, which workers ride
    out) ends serve() with that error, after the shutdown: a server left running without
    its maintenance would stop expiring messages with nothing to show for it."""

    async def broken(self: MaintenanceWorker) -> None:
        raise ZeroDivisionError("a bug in the maintenance worker")

    monkeypatch.setattr(MaintenanceWorker, "run", broken)
    settings = Settings(
        database_url=database_url,
        grpc_host="127.0.0.1",
        grpc_port=_free_port(),
        http_host="127.0.0.1",
        http_port=_free_port(),
    )
    with pytest.raises(RuntimeError, match="postbox-maintenance stopped on an error") as ended:
        await asyncio.wait_for(serve(settings), 60)
    assert isinstance(ended.value.__cause__, ZeroDivisionError)
