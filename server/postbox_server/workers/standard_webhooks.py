"""What a webhook receiver gets: the JSON envelope of a message and its Standard Webhooks headers.

The envelope follows Google Pub/Sub push requests (a "message" object with base64
"data", "attributes", "messageId" and "publishTime", and the "subscription"), with
postbox's routing key, ordering key and typed attributes. The headers follow the
Standard Webhooks specification: webhook-id (the same for every attempt of one
delivery), webhook-timestamp (Unix seconds) and webhook-signature, "v1," and the
base64 HMAC-SHA256 of "<id>.<timestamp>.<body>" keyed with the secret's bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

from postbox_server.db.engine import Row

SECRET_PREFIX = "whsec_"
USER_AGENT = "postbox-webhooks"


def delivery_id(publish_id: UUID, row_id: int) -> str:
    """The webhook-id of a delivery: unique across databases, stable across its attempts."""
    return f"msg_{publish_id.hex}_{row_id}"


_DELIVERY_ID = re.compile(r"msg_[0-9a-f]{32}_([0-9]{1,18})")


def delivery_row(delivery_id: str) -> int | None:
    """The engine's row id in a delivery id (see delivery_id); None if it is not one."""
    match = _DELIVERY_ID.fullmatch(delivery_id)
    return int(match.group(1)) if match else None


def rfc3339(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _attributes(text: str | None) -> dict[str, dict[str, str]]:
    """Engine attribute JSON as the proto3 JSON of AttributeValue (binary values stay base64)."""
    if not text:
        return {}
    renamed = {
        "data_type": "dataType",
        "string_value": "stringValue",
        "binary_value": "binaryValue",
    }
    return {
        name: {renamed[key]: value for key, value in attribute.items()}
        for name, attribute in json.loads(text).items()
    }


def envelope(delivery: Row) -> bytes:
    """The POST body for a claimed delivery (a row of postbox.claim_webhook_deliveries)."""
    message: dict[str, Any] = {
        "messageId": str(delivery["publish_id"]),
        "publishTime": rfc3339(delivery["published_at"]),
        "routingKey": delivery["routing_key"],
        "data": base64.b64encode(delivery["body"]).decode("ascii"),
        "attributes": _attributes(delivery["attributes"]),
    }
    if delivery["ordering_key"]:
        message["orderingKey"] = delivery["ordering_key"]
    document = {
        "topic": delivery["topic"],
        "subscription": delivery["subscription"],
        "deliveryAttempt": delivery["attempt"],
        "message": message,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header value for one signing secret ("whsec_<base64>")."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(secret: str, webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header of a webhook POST."""
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, webhook_id, timestamp, body),
    }
