"""MessageService: send, stream-receive, delete and change visibility."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
from postbox.v1 import message_pb2, message_service_pb2_grpc
from postbox.v1 import message_service_pb2 as pb

from postbox_server.auth.keys import caller_allows
from postbox_server.config import Settings
from postbox_server.db.engine import Connection, Engine, OutgoingMessage, SentBatch
from postbox_server.db.group_commit import GroupCommit
from postbox_server.db.wakeup import WakeHub
from postbox_server.errors import ApiError, Refused, invalid, quoted
from postbox_server.observability import tracing
from postbox_server.services import convert, deliveries
from postbox_server.services.pagination import (
    decode_id_page_token,
    encode_page_token,
    is_bigint_id,
    next_page,
    page_size_of,
)
from postbox_server.services.payload_schema_cache import PayloadSchemaCache
from postbox_server.services.queues import default_settings
from postbox_server.services.receive.claims import Claims
from postbox_server.services.receive.polling import ReceiveCall
from postbox_server.services.receive.prefetch import Prefetch
from postbox_server.services.receive.streaming import StreamingReceive
from postbox_server.services.send_stream import (
    MAX_BATCHES_IN_PROGRESS,
    MAX_SENDS_IN_PROGRESS,
    TaggedStreamCall,
)
from postbox_server.services.status import reports_errors
from postbox_server.tenant_quotas import TenantQuotas

log = logging.getLogger(__name__)


class MessageService(message_service_pb2_grpc.MessageServiceServicer):
    def __init__(
        self,
        engine: Engine,
        hub: WakeHub,
        *,
        max_message_size: int,
        max_response_size: int = Settings.max_response_size,
        auto_create_queues: bool = False,
        payload_schemas: PayloadSchemaCache | None = None,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.engine = engine
        # Tenants' message and byte quotas, checked before anything is stored.
        self.quotas = quotas or TenantQuotas(engine)
        self.payload_schemas = payload_schemas or PayloadSchemaCache(engine, hub)
        # The settings of a queue a send creates, or None when sends create no queue.
        self.auto_created = default_settings(max_message_size) if auto_create_queues else None
        self.max_message_size = max_message_size
        self.hub = hub
        self.sends: GroupCommit[OutgoingMessage, tuple[str, bool]] = GroupCommit(
            engine, self._send_group
        )
        # Sends with relaxed_durability: groups of their own, never mixed with durable ones.
        self.relaxed_sends: GroupCommit[OutgoingMessage, tuple[str, bool]] = GroupCommit(
            engine, self._send_relaxed_group, relaxed=True
        )
        self.prefetch = Prefetch()
        self.claims = Claims(engine, hub, max_response_size=max_response_size)

    @reports_errors
    async def Send(
        self, request: pb.SendRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendResponse:
        return await self._send(request)

    @reports_errors
    async def SendStream(
        self,
        requests: AsyncIterator[pb.SendStreamRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.SendStreamResponse]:
        # At once, not with the first answer: the SDK writes its first send after it, so
        # that it learns of a server without this method before writing (send_stream.py).
        await context.send_initial_metadata(())
        call = TaggedStreamCall(
            self._send, "send", pb.SendStreamResult, pb.SendStreamResponse, MAX_SENDS_IN_PROGRESS
        )
        async for response in call.run(requests, self.hub.until_closed()):
            yield response

    async def _send(self, request: pb.SendRequest) -> pb.SendResponse:
        """One message, through the group commit; its id once committed."""
        outgoing = convert.outgoing(request, self.max_message_size)
        self.quotas.check_send(request.queue, 1, (request.body,))
        await self.payload_schemas.check("queues", request.queue, (request.body,), batch=False)
        outgoing.attributes = tracing.stamp(outgoing.attributes)
        sends = self.relaxed_sends if request.relaxed_durability else self.sends
        message_id = None
        try:
            try:
                message_id, duplicate = await sends.write(request.queue, outgoing)
            except ApiError as error:
                if not await self._created(request.queue, error):
                    raise
                message_id, duplicate = await sends.write(request.queue, outgoing)
        finally:
            # Failed too: the hub skipped any NOTIFY of the session's last call.
            self.hub.wake(request.queue, sent=() if message_id is None else (message_id,))
        return pb.SendResponse(message_id=message_id, duplicate=duplicate)

    async def _created(self, queue: str, error: ApiError) -> bool:
        """Whether a send that failed with `error` may go again, its queue now created
        (`serve --auto-create-queues`, by a caller that may also manage the name).

        Two first sends that race both end here: one creates the queue, the other's
        ALREADY_EXISTS says it exists all the same, and both send again. Otherwise the
        caller's error stands: NOT_FOUND, as without the setting.
        """
        if (
            self.auto_created is None
            or error.code != grpc.StatusCode.NOT_FOUND
            or not caller_allows("manage", queue)
        ):
            return False
        try:
            await self.engine.create_queue(queue, self.auto_created)
        except ApiError as create_error:
            if create_error.code != grpc.StatusCode.ALREADY_EXISTS:
                raise
        log.info("created queue %s on its first send (--auto-create-queues)", quoted(queue))
        return True

    async def _send_group(
        self, conn: Connection, queue: str, messages: list[OutgoingMessage]
    ) -> list[tuple[str, bool]]:
        """One queue's share of a group of single Sends: (id, duplicate) per message."""
        ids, duplicates = await self.engine.send_batch(queue, messages, conn=conn)
        return list(zip(ids, duplicates, strict=True))

    async def _send_relaxed_group(
        self, conn: Connection, queue: str, messages: list[OutgoingMessage]
    ) -> list[tuple[str, bool]]:
        """_send_group for sends with relaxed_durability."""
        ids, duplicates = await self.engine.send_batch(queue, messages, conn=conn, relaxed=True)
        return list(zip(ids, duplicates, strict=True))

    @reports_errors
    async def SendBatch(
        self, request: pb.SendBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendBatchResponse:
        return await self._send_batch_request(request)

    @reports_errors
    async def SendBatchStream(
        self,
        requests: AsyncIterator[pb.SendBatchStreamRequest | Refused],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.SendBatchStreamResponse]:
        # At once, as SendStream's: the SDK waits for it before its first write.
        await context.send_initial_metadata(())
        call = TaggedStreamCall(
            self._send_batch_request,
            "batch",
            pb.SendBatchStreamResult,
            pb.SendBatchStreamResponse,
            MAX_BATCHES_IN_PROGRESS,
        )
        async for response in call.run(requests, self.hub.until_closed()):
            yield response

    async def _send_batch_request(self, request: pb.SendBatchRequest) -> pb.SendBatchResponse:
        """One batch, in one transaction; its ids once committed."""
        # With tracing on, every message takes the producer's context along.
        traced = tracing.enabled()
        plain = (
            None
            if traced or request.relaxed_durability
            else convert.plain_batch(request, self.max_message_size)
        )
        self.quotas.check_send(
            request.queue, len(request.entries), (entry.body for entry in request.entries)
        )
        await self.payload_schemas.check(
            "queues", request.queue, (entry.body for entry in request.entries), batch=True
        )
        ids: list[str] = []
        try:
            try:
                ids, duplicates = await self._send_batch(request, plain, traced)
            except ApiError as error:
                if not await self._created(request.queue, error):
                    raise
                ids, duplicates = await self._send_batch(request, plain, traced)
        finally:
            self.hub.wake(request.queue, sent=ids)  # failed too, as in Send
        return pb.SendBatchResponse(message_ids=ids, duplicates=duplicates)

    async def _send_batch(
        self, request: pb.SendBatchRequest, plain: convert.PlainBatch | None, traced: bool
    ) -> SentBatch:
        if plain is not None:  # most batches
            ids, duplicates = await self.engine.send_bodies(
                request.queue, plain.bodies, plain.deduplication_ids, request.request_id or None
            )
        else:
            outgoing = []
            for index, entry in enumerate(request.entries):
                try:
                    outgoing.append(convert.outgoing(entry, self.max_message_size))
                except ApiError as error:
                    raise invalid(f"entry {index}: {error.message}") from None
                if traced:
                    outgoing[-1].attributes = tracing.stamp(outgoing[-1].attributes)
            ids, duplicates = await self.engine.send_batch(
                request.queue,
                outgoing,
                relaxed=request.relaxed_durability,
                request_id=request.request_id or None,
            )
        return ids, duplicates

    @reports_errors
    async def Receive(
        self, request: pb.ReceiveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReceiveResponse]:
        call = ReceiveCall(self.engine, self.hub, self.claims, self.prefetch)
        # Closed with this generator: a stream that dies with a batch in hand gives the
        # batch back at once (ReceiveCall.run), not whenever the collector gets to it.
        async with contextlib.aclosing(call.run(request, context)) as responses:
            async for response in responses:
                yield response

    @reports_errors
    async def StreamingReceive(
        self,
        requests: AsyncIterator[pb.StreamingReceiveRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.StreamingReceiveResponse]:
        call = StreamingReceive(self.engine, self.hub, self.claims, self.prefetch)
        async for response in call.run(requests):
            yield response

    @reports_errors
    async def Delete(
        self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteResponse:
        [receipt] = await deliveries.resolved(self.engine, request.queue, [request.receipt])
        # A delete with a result is not handed to a stream's claim, which keeps none.
        handed = None if request.result else self.prefetch.hand(request.queue, [receipt])
        if handed is None or await handed.outcomes != ["ok"]:
            # Deleted here, or told precisely why not: a handed delete that was not
            # "ok" changed nothing.
            with deliveries.quoting(request.receipt, receipt):
                await self.engine.delete(request.queue, receipt, request.result or None)
        self.prefetch.settled([receipt])
        return pb.DeleteResponse()

    @reports_errors
    async def DeleteBatch(
        self, request: pb.DeleteBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteBatchResponse:
        receipts = await deliveries.resolved(self.engine, request.queue, request.receipts)
        outcomes: list[str] | None = None
        if request.results:
            # Deleted here: a stream's claim, which takes handed deletes, keeps no results.
            results = [result or None for result in request.results]
            outcomes = await self.engine.delete_batch(request.queue, receipts, results)
        else:
            handed = self.prefetch.hand(request.queue, receipts)
            outcomes = None if handed is None else await handed.outcomes
        if outcomes is None:
            outcomes = await self.engine.delete_batch(request.queue, receipts)
        self.prefetch.settled(receipts)  # ok, stale or gone: none is pending now
        return pb.DeleteBatchResponse(results=convert.batch_results(outcomes))

    @reports_errors
    async def ChangeVisibility(
        self, request: pb.ChangeVisibilityRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChangeVisibilityResponse:
        timeout = convert.optional_timedelta(request, "visibility_timeout")
        if timeout is None:
            raise invalid("visibility_timeout is required (0 makes the message visible at once)")
        [receipt] = await deliveries.resolved(self.engine, request.queue, [request.receipt])
        with deliveries.quoting(request.receipt, receipt):
            await self.engine.change_visibility(request.queue, receipt, timeout)
        self.prefetch.settled([receipt])
        if timeout == timedelta(0):
            self.hub.wake(request.queue)
        return pb.ChangeVisibilityResponse()

    @reports_errors
    async def Nack(
        self, request: pb.NackRequest, context: grpc.aio.ServicerContext
    ) -> pb.NackResponse:
        await self.engine.nack(
            request.queue,
            request.receipt,
            convert.optional_timedelta(request, "delay"),
            request.error or None,
            request.dead_letter,
        )
        self.prefetch.settled([request.receipt])
        self.hub.wake(request.queue)  # a waiting stream sets a timer for the backoff
        return pb.NackResponse()

    @reports_errors
    async def PeekMessages(
        self, request: pb.PeekMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.PeekMessagesResponse:
        if request.state not in convert.STATE_FILTERS:
            raise invalid(f"state {request.state} is not a known message state")
        page_size = page_size_of(request.page_size)
        after = decode_id_page_token(request.page_token, "PeekMessages")
        rows = await self.engine.peek_messages(
            request.queue, convert.STATE_FILTERS[request.state], after, page_size + 1
        )
        response = pb.PeekMessagesResponse(messages=[convert.message(r) for r in rows[:page_size]])
        if len(rows) > page_size:
            last = str(rows[page_size - 1]["message_id"])
            response.next_page_token = encode_page_token("PeekMessages", last)
        return response

    @reports_errors
    async def GetMessage(
        self, request: pb.GetMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMessageResponse:
        row = await self.engine.get_message(request.queue, _message_id(request.message_id))
        return pb.GetMessageResponse(message=convert.message(row))

    @reports_errors
    async def CancelMessage(
        self, request: pb.CancelMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelMessageResponse:
        await self.engine.cancel_message(request.queue, _message_id(request.message_id))
        return pb.CancelMessageResponse()

    @reports_errors
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        if request.state not in convert.LIFE_STATE_FILTERS:
            raise invalid(f"state {request.state} is not a known message state")
        page_size = page_size_of(request.page_size)
        after = decode_id_page_token(request.page_token, "ListMessages")
        rows = await self.engine.list_messages(
            request.queue or None, convert.LIFE_STATE_FILTERS[request.state], after, page_size + 1
        )
        page, token = next_page(rows, page_size, "ListMessages", key="message_id")
        return pb.ListMessagesResponse(
            messages=[convert.message(row) for row in page], next_page_token=token
        )

    @reports_errors
    async def ListArchivedMessages(
        self, request: pb.ListArchivedMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListArchivedMessagesResponse:
        page_size = page_size_of(request.page_size)
        after = decode_id_page_token(request.page_token, "ListArchivedMessages")
        rows = await self.engine.list_archived_messages(request.queue, after, page_size + 1)
        response = pb.ListArchivedMessagesResponse(
            messages=[
                message_pb2.ArchivedMessage(
                    message=convert.message(row),
                    archive_time=convert.timestamp(row["archived_at"]),
                    reason=convert.archive_reason(row["reason"]),
                )
                for row in rows[:page_size]
            ]
        )
        if len(rows) > page_size:
            last = str(rows[page_size - 1]["message_id"])
            response.next_page_token = encode_page_token("ListArchivedMessages", last)
        return response

    @reports_errors
    async def ChangeVisibilityBatch(
        self, request: pb.ChangeVisibilityBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChangeVisibilityBatchResponse:
        receipts, timeouts = [], []
        for index, entry in enumerate(request.entries):
            timeout = convert.optional_timedelta(entry, "visibility_timeout")
            if timeout is None:
                raise invalid(f"entry {index}: visibility_timeout is required")
            receipts.append(entry.receipt)
            timeouts.append(timeout)
        outcomes = await self.engine.change_visibility_batch(request.queue, receipts, timeouts)
        self.prefetch.settled(receipts)
        if timedelta(0) in timeouts:
            self.hub.wake(request.queue)
        return pb.ChangeVisibilityBatchResponse(results=convert.batch_results(outcomes))


def _message_id(text: str) -> int:
    if not is_bigint_id(text):
        raise invalid(f"message_id {quoted(text)} is not a message id of this server")
    return int(text)
