"""Stops an embedded PostgreSQL whose `postbox serve` died without stopping it.

A server that exits normally stops its PostgreSQL itself. One killed outright
(SIGKILL, the OOM killer) cannot, and pg_ctl's postmaster, a daemon, would run on
under PID 1 holding the data directory. So the server starts this process beside
it: it waits for the server's exit (a pidfd, no polling), and if the postmaster the
server started still runs, asks it for a fast shutdown (SIGINT). A postmaster that a
newer server started in the same directory meanwhile has another pid and is left alone.

Usage: python -m postbox_server.embedded_watchdog SERVER_PID POSTMASTER_PID
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time


def _wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd (an old kernel): look once a second
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(1)
    try:
        select.select([fd], [], [])  # readable once the process has exited
    finally:
        os.close(fd)


def _gone(pid: int) -> bool:
    """True for a process that has exited, reaped or not.

    A postmaster that pg_ctl started is reparented to PID 1; where PID 1 reaps late
    (some container inits) it lingers as a zombie after a clean stop, and a zombie
    still takes signals without an error.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: a signal decides below
        return False


def main(argv: list[str]) -> None:
    server, postmaster = int(argv[0]), int(argv[1])
    _wait_for_exit(server)
    if _gone(postmaster):
        return  # stopped by the server, as it should be
    try:
        os.kill(postmaster, signal.SIGINT)  # PostgreSQL's fast shutdown
    except ProcessLookupError:
        return  # stopped by the server, as it should be
    print(
        f"postbox: the server ({server}) died without stopping its embedded PostgreSQL; "
        f"stopped it (postmaster {postmaster})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
