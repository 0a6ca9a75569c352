"""This server's own database sessions, as the wake-up hub needs to tell them apart.

A send through this server wakes the queue's local streams itself once it has
committed, so the NOTIFY of that send is redundant here (other servers still need
it): answered, it would make a stream that has claimed the message already claim
again. These sessions do not throttle their NOTIFYs (postbox._notify), so every
other change they make to a waited-on queue wakes by its own NOTIFY.
"""

from __future__ import annotations

from collections.abc import Callable

# The session setting that tells postbox._notify not to throttle this session's
# NOTIFYs: this server's pool sessions set it when they connect.
UNTHROTTLED_SETTING = "postbox.notify_unthrottled"


class OwnSessions:
    """This process's pool sessions (by backend pid), and per session and queue the
    NOTIFYs of its sends that the hub has yet to see: the hub skips that many of the
    session's NOTIFYs about the queue, and answers every other one.

    Counted exactly, so that a NOTIFY of another call (a dead-letter move, a FIFO
    promotion) is never taken for a send's: only a send that is a transaction of its
    own (it notifies if and only if it commits) into a queue that the hub had listed
    before the send began (so the send sees the listing and notifies: unthrottled).
    A failed send takes its count back; the hub forgets a queue's counts when it
    unlists the queue and all of them when it listens anew. A NOTIFY not counted
    wakes the queue once more, which costs a look and misses nothing.

    An earlier version forgot a session's sends at its next call: at 100 sends a
    second the session was often busy again before the hub saw the NOTIFY, and each
    such NOTIFY made the stream claim once more for nothing."""

    def __init__(self) -> None:
        self._pids: set[int] = set()
        self._unseen: dict[tuple[int, str], int] = {}
        # Set by the hub: whether it has listed the queue (the listing committed).
        self.listed: Callable[[str], bool] = lambda _queue: False

    def acquired(self, pid: int) -> None:
        self._pids.add(pid)

    def sending(self, pid: int, queue: str) -> bool:
        """Counts the NOTIFY of a send that commits on its own; False when it will not
        notify for sure (the queue is not listed here), and so is not counted."""
        if not self.listed(queue):
            return False
        key = (pid, queue)
        self._unseen[key] = self._unseen.get(key, 0) + 1
        return True

    def failed(self, pid: int, queue: str) -> None:
        """A counted send failed: rolled back, it did not notify."""
        self._take(pid, queue)

    def own(self, pid: int) -> bool:
        return pid in self._pids

    def covers(self, pid: int, queue: str) -> bool:
        """Whether this NOTIFY is one of a counted send (and takes it off the count)."""
        return self._take(pid, queue)

    def forget(self, queue: str | None = None) -> None:
        """Forgets the counts of `queue` (every queue: None), whose NOTIFYs may not come."""
        if queue is None:
            self._unseen.clear()
        else:
            for key in [key for key in self._unseen if key[1] == queue]:
                del self._unseen[key]

    def _take(self, pid: int, queue: str) -> bool:
        key = (pid, queue)
        count = self._unseen.get(key, 0)
        if count == 0:
            return False
        if count == 1:
            del self._unseen[key]
        else:
            self._unseen[key] = count - 1
        return True
