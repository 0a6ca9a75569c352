"""Console sessions, in this process's memory: a random id (the cookie) maps to the API
key's secret, so the browser's scripts never hold the key, and to a CSRF token bound to
the session that every call must echo in a header.

Sessions do not survive a restart (the operator logs in again) and are not shared
between processes, which is why `serve --workers N` refuses --console-port.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

# An idle session ends after this long; a browser left open polls, so it stays alive.
IDLE_LIFETIME = 12 * 3600.0
# Sessions kept at most; past this the least recently used ends (each is ~200 bytes).
MAX_SESSIONS = 10_000


def _token() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Session:
    # None: opened while the server had no API key, so calls carry none.
    secret: str | None
    csrf: str = field(default_factory=_token)
    last_used: float = field(default_factory=time.monotonic)

    def accepts(self, csrf: str | None) -> bool:
        return csrf is not None and hmac.compare_digest(self.csrf.encode(), csrf.encode())


class Sessions:
    def __init__(
        self, *, idle_lifetime: float = IDLE_LIFETIME, max_sessions: int = MAX_SESSIONS
    ) -> None:
        self._idle_lifetime = idle_lifetime
        self._max_sessions = max_sessions
        # Least recently used first.
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, secret: str | None) -> tuple[str, Session]:
        """A new session and its id (the cookie's value)."""
        while len(self._sessions) >= self._max_sessions:
            self._sessions.popitem(last=False)
        session_id = _token()
        session = Session(secret)
        self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id, now marked as used; None if there is none."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.last_used > self._idle_lifetime:
            del self._sessions[session_id]
            return None
        session.last_used = now
        self._sessions.move_to_end(session_id)
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)
