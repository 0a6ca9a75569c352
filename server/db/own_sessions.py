"""This server's own database sessions, as the wake-up hub needs to tell them apart.

A send through this server wakes the queue's local streams itself once it has
committed, so the NOTIFY of that send is redundant here (other servers still need
it): answered, it would make a stream that has claimed the message already claim
again. These sessions do not throttle their NOTIFYs (postbox._notify), so every
other change they make to a waited-on queue wakes by its own NOTIFY.
"""

from __future__ import annotations

# The session setting that tells postbox._notify not to throttle this session's
# NOTIFYs: this server's pool sessions set it when they connect.
UNTHROTTLED_SETTING = "postbox.notify_unthrottled"


class OwnSessions:
    """This process's pool sessions (by backend pid) and the queues each one's latest
    call sends into: a NOTIFY from such a session about such a queue is one this server
    answers with a local wake-up of its own, so the hub skips it. A session's next call
    clears them (the NOTIFY of that send then wakes once more, which costs a look and
    misses nothing), so a NOTIFY of any other call always wakes."""

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._sending: dict[int, set[str]] = {}

    def acquired(self, pid: int) -> None:
        self._pids.add(pid)
        self._sending.pop(pid, None)

    def sending(self, pid: int, queue: str) -> None:
        self._sending.setdefault(pid, set()).add(queue)

    def own(self, pid: int) -> bool:
        return pid in self._pids

    def covers(self, pid: int, queue: str) -> bool:
        return queue in self._sending.get(pid, ())
