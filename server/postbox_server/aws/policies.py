"""Access policy documents as AddPermission and RemovePermission edit them, for SQS queues
and SNS topics alike: one statement per label, allowing accounts some of the service's
actions on the resource. postbox stores the document and returns it; it does not enforce
it (the shim's credentials and postbox's API keys decide who may do what)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

# SQS's and SNS's limit on a policy document.
MAX_POLICY_BYTES = 20 * 1024


def load(text: str) -> dict[str, Any] | None:
    """A stored policy document, or None when there is none (or it is not an object)."""
    if not text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def dump(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"))


def statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    found = document.get("Statement", [])
    if isinstance(found, dict):
        return [found]
    return [s for s in found if isinstance(s, dict)] if isinstance(found, list) else []


def has_label(document: dict[str, Any], label: str) -> bool:
    return any(statement.get("Sid") == label for statement in statements(document))


def _one_or_list(values: list[str]) -> str | list[str]:
    return values[0] if len(values) == 1 else values


def add_statement(
    document: dict[str, Any],
    label: str,
    accounts: Sequence[str],
    actions: Sequence[str],
    resource: str,
    *,
    service: str,
    taken: Exception,
) -> dict[str, Any]:
    """The document with an Allow statement named `label` letting the accounts do the
    service's actions ("SQS", "SendMessage": SQS:SendMessage); `taken` is raised when the
    document has a statement of that name already."""
    if has_label(document, label):
        raise taken
    statement = {
        "Sid": label,
        "Effect": "Allow",
        "Principal": {"AWS": _one_or_list([f"arn:aws:iam::{a}:root" for a in accounts])},
        "Action": _one_or_list([f"{service}:{action}" for action in actions]),
        "Resource": resource,
    }
    return {**document, "Statement": [*statements(document), statement]}


def remove_statement(document: dict[str, Any], label: str) -> dict[str, Any]:
    kept = [s for s in statements(document) if s.get("Sid") != label]
    return {**document, "Statement": kept}
