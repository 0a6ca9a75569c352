"""Each server process's compiled payload schemas, by queue and topic.

A send looks up its queue's schema here, not in the database: the first send to a
queue reads and compiles it, later ones reuse it. Every change of a schema (and
every create and delete of a queue or topic) signals on the wake-up hub's channel
(sql/src/12_payload_schemas.sql), and the process drops that entry; a process whose
LISTEN connection is down caches nothing and reads the schema on every send, since
it cannot hear of changes. A send racing a schema change on another server may be
checked against the schema being replaced, as a send committed just before the
change would have been.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from postbox_server.db.engine import Engine
from postbox_server.db.wakeup import WakeHub
from postbox_server.errors import ApiError, invalid, quoted
from postbox_server.services import payload_schemas

SIGNAL = "payload_schema"
# Entries kept per process, least recently used dropped first: a queue without a
# schema costs a few bytes, one with a schema its compiled validator.
MAX_ENTRIES = 10_000
# Trailing metadata of a refusal for a body that breaks the schema, for the SQS shim:
# that it was one (an SQS client then learns nothing of the queue's size limit), and
# for a batch the index of the refused entry (SendMessageBatch fails it alone).
SCHEMA_VIOLATION = "postbox-payload-schema-violation"
REJECTED_ENTRY = "postbox-rejected-entry"


@dataclass(frozen=True)
class _Entry:
    check: payload_schemas.BodyCheck | None  # None: no schema
    broken: str | None = None  # a stored schema that does not compile (set in SQL)


_NO_SCHEMA = _Entry(None)


class PayloadSchemaCache:
    def __init__(self, engine: Engine, hub: WakeHub) -> None:
        self._engine = engine
        self._hub = hub
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        # Bumped by every change heard of: a lookup that began before one does not store
        # what it read, which may be the schema just replaced.
        self._generation = 0
        hub.on_subject_signal(SIGNAL, self._changed)
        hub.on_lost(lambda: self._changed(""))

    def _changed(self, subject: str) -> None:
        """Forgets `subject` ("queues:<name>" or "topics:<name>"), or everything ("")."""
        self._generation += 1
        kind, _, name = subject.partition(":")
        if not name:
            self._entries.clear()
        else:
            self._entries.pop((kind, name), None)

    def forget(self, kind: str, name: str) -> None:
        """Drops what this process knows of a schema it just changed, before the signal
        arrives: the next send through this server sees the new one."""
        self._changed(f"{kind}:{name}")

    async def _entry(self, kind: str, name: str) -> _Entry:
        key = (kind, name)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        generation = self._generation
        exists, stored = await self._engine.payload_schema(kind, name)
        if not exists:
            return _NO_SCHEMA  # the send fails with NOT_FOUND, or creates the queue
        if stored is None:
            entry = _NO_SCHEMA
        else:
            try:
                entry = _Entry(payload_schemas.compiled(stored))
            except ApiError as error:
                entry = _Entry(None, broken=error.message)
        if generation == self._generation and self._hub.listening:
            self._entries[key] = entry
            if len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)
        return entry

    async def check(self, kind: str, name: str, bodies: Iterable[bytes], *, batch: bool) -> None:
        """Refuses (INVALID_ARGUMENT) bodies that break the schema of queue or topic
        `name` (kind "queues" or "topics"), naming the first violation; for a batch,
        the entry too. FAILED_PRECONDITION for a stored schema that does not compile."""
        entry = await self._entry(kind, name)
        noun = kind[:-1]
        if entry.broken is not None:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the payload_schema of {noun} {quoted(name)} does not compile ({entry.broken}); "
                f"set a valid one with Update{noun.capitalize()}",
            )
        if entry.check is None:
            return
        for index, body in enumerate(bodies):
            violation = entry.check.violation(body)
            if violation is not None:
                where = f"entry {index}: " if batch else ""
                error = invalid(
                    f"{where}body does not match the payload_schema of {noun} {quoted(name)}: "
                    f"{violation}; nothing was stored"
                )
                error.metadata = ((SCHEMA_VIOLATION, noun),)
                if batch:
                    error.metadata += ((REJECTED_ENTRY, str(index)),)
                raise error
