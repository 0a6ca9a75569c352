"""--require-synchronous-commit refuses a database whose commits wait for no standby.

The suite's database has no synchronous standby (synchronous_standby_names is empty),
so a server told to require one exits before serving. tests/ops/test_failover.py starts
the server with the flag on a primary with a synchronous standby, where it serves.
"""

from __future__ import annotations

from support import ServerProcess


def test_refuses_to_serve_without_a_synchronous_standby(database_url):
    server = ServerProcess(database_url, "--require-synchronous-commit")
    server.spawn(
        "serve",
        "--database-url", database_url,
        "--grpc-host", "127.0.0.1",
        "--grpc-port", str(server.port),
        "--require-synchronous-commit",
    )  # fmt: skip
    assert server.process is not None
    # 60 s: a start-up (migration check, key cache, pool) takes about a second.
    assert server.process.wait(60) == 2, server.log()
    log = server.log()
    assert "refusing to serve with --require-synchronous-commit" in log, log
    assert "synchronous_standby_names = ''" in log, log
    assert "postbox serving" not in log
