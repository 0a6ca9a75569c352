"""Actions on a received message's lease: delete it, or change its visibility.

Single and batch actions alike go through postbox's batch RPCs, whose per-entry
status tells a vanished message (NOT_FOUND) from a vanished queue (the call's status).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
from postbox.v1 import message_service_pb2 as pb

from postbox_server.aws.errors import AwsError, invalid_parameter, missing_parameter
from postbox_server.aws.sqs import batches, receipts
from postbox_server.aws.sqs.actions.base import Call, Result, action, bounded
from postbox_server.aws.sqs.queue_attributes import is_fifo
from postbox_server.errors import quoted

_OK = grpc.StatusCode.OK.value[0]
_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
_STALE = grpc.StatusCode.FAILED_PRECONDITION.value[0]
_MAX_VISIBILITY = 43_200

Outcome = Callable[[int, str], "AwsError | None"]


def _standard_delete_outcome(code: int, handle: str) -> AwsError | None:
    # SQS answers success for a message deleted already (or expired), and on a standard
    # queue for a stale handle too ("the request succeeds, but the message might not be
    # deleted"): postbox deletes nothing then, the current holder keeps its lease.
    if code in (_OK, _NOT_FOUND, _STALE):
        return None
    return receipts.invalid(handle)


def _fifo_delete_outcome(code: int, handle: str) -> AwsError | None:
    # A FIFO queue refuses a handle whose message was delivered again since.
    if code == _STALE:
        return invalid_parameter(
            f"Value {quoted(handle)} for parameter ReceiptHandle is invalid. "
            "Reason: The receipt handle has expired."
        )
    return _standard_delete_outcome(code, handle)


def _visibility_outcome(code: int, handle: str) -> AwsError | None:
    if code == _OK:
        return None
    if code in (_NOT_FOUND, _STALE):
        return invalid_parameter(
            f"Value {quoted(handle)} for parameter ReceiptHandle is invalid. "
            "Reason: Message does not exist or is not available for visibility timeout change."
        )
    return receipts.invalid(handle)


async def _apply(
    queue: str,
    handles: Sequence[str],
    send: Callable[[list[int], list[str]], Any],
    outcome: Outcome,
) -> list[AwsError | None]:
    """One outcome per handle: handles that do not decode fail here, the rest in postbox."""
    results: list[AwsError | None] = [None] * len(handles)
    positions, decoded = [], []
    for position, handle in enumerate(handles):
        try:
            decoded.append(receipts.decode(handle, queue))
            positions.append(position)
        except AwsError as error:
            results[position] = error
    if decoded:
        response = await send(positions, decoded)
        for position, status in zip(positions, response.results, strict=True):
            results[position] = outcome(status.code, handles[position])
    return results


async def _delete(call: Call, queue: str, handles: Sequence[str]) -> list[AwsError | None]:
    def send(_positions: list[int], decoded: list[str]) -> Any:
        return call.backend.call(
            call.backend.messages.DeleteBatch, pb.DeleteBatchRequest(queue=queue, receipts=decoded)
        )

    outcome = _fifo_delete_outcome if is_fifo(queue) else _standard_delete_outcome
    return await _apply(queue, handles, send, outcome)


async def _change(
    call: Call, queue: str, handles: Sequence[str], timeouts: Sequence[int]
) -> list[AwsError | None]:
    def send(positions: list[int], decoded: list[str]) -> Any:
        entries = []
        for position, receipt in zip(positions, decoded, strict=True):
            entry = pb.ChangeVisibilityBatchEntry(receipt=receipt)
            entry.visibility_timeout.FromSeconds(timeouts[position])
            entries.append(entry)
        return call.backend.call(
            call.backend.messages.ChangeVisibilityBatch,
            pb.ChangeVisibilityBatchRequest(queue=queue, entries=entries),
        )

    return await _apply(queue, handles, send, _visibility_outcome)


def _raise_first(outcomes: list[AwsError | None]) -> Result:
    if outcomes[0] is not None:
        raise outcomes[0]
    return {}


def _report(entries: Sequence[dict[str, Any]], outcomes: Sequence[AwsError | None]) -> Result:
    successful, failed = [], []
    for entry, error in zip(entries, outcomes, strict=True):
        if error is None:
            successful.append({"Id": entry["Id"]})
        else:
            failed.append(batches.failure(entry["Id"], error))
    return {"Successful": successful, "Failed": failed}


@action("DeleteMessage")
async def delete_message(call: Call) -> Result:
    queue = call.queue()
    return _raise_first(await _delete(call, queue, [call.required("ReceiptHandle")]))


@action("DeleteMessageBatch")
async def delete_message_batch(call: Call) -> Result:
    queue = call.queue()
    entries = batches.entries(call.params, "DeleteMessageBatchRequestEntry")
    handles = [entry.get("ReceiptHandle") or "" for entry in entries]
    return _report(entries, await _delete(call, queue, handles))


@action("ChangeMessageVisibility")
async def change_message_visibility(call: Call) -> Result:
    queue = call.queue()
    handle = call.required("ReceiptHandle")
    timeout = call.integer("VisibilityTimeout", 0, _MAX_VISIBILITY)
    if timeout is None:
        raise missing_parameter("VisibilityTimeout")
    return _raise_first(await _change(call, queue, [handle], [timeout]))


@action("ChangeMessageVisibilityBatch")
async def change_message_visibility_batch(call: Call) -> Result:
    queue = call.queue()
    entries = batches.entries(call.params, "ChangeMessageVisibilityBatchRequestEntry")
    checked, timeouts, early = [], [], {}
    for entry in entries:
        try:
            timeout = bounded(entry, "VisibilityTimeout", 0, _MAX_VISIBILITY)
            if timeout is None:
                raise missing_parameter("VisibilityTimeout")
        except AwsError as error:
            early[entry["Id"]] = error
        else:
            checked.append(entry)
            timeouts.append(timeout)
    outcomes = await _change(
        call, queue, [entry.get("ReceiptHandle") or "" for entry in checked], timeouts
    )
    by_id = dict(zip((entry["Id"] for entry in checked), outcomes, strict=True))
    return _report(entries, [early.get(entry["Id"], by_id.get(entry["Id"])) for entry in entries])
