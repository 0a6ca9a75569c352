"""Fuzz targets: each parser of outside input, fed arbitrary bytes.

A target returns when its parser accepts the input or refuses it with the parser's
documented error (AwsError, ApiError, ConnectError, ValueError, SignatureProblem, as
named per target); anything else escapes and is a finding. Refusals are also rendered
the way the server sends them (XML, JSON, a gRPC status), since a message that quotes
the input can break its own encoding.

Inputs are plain files, so seeds are readable: tests/fuzz/corpus/<target>/.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import grpc
from multidict import CIMultiDict, CIMultiDictProxy

from postbox_server.auth import sigv4 as forwarded_sigv4
from postbox_server.aws import jsonproto, query
from postbox_server.aws import sigv4 as sqs_sigv4
from postbox_server.aws.errors import AwsError
from postbox_server.aws.sqs import protocol as sqs_protocol
from postbox_server.aws.sqs import receipts, shapes
from postbox_server.db import errors as db_errors
from postbox_server.errors import MAX_MESSAGE, ApiError
from postbox_server.http import connect
from postbox_server.services import pagination
from postbox_server.workers.scheduling import Timing

# A seed may say @NOW@ where a request carries its signing time and @TODAY@ for its
# credential's date, so that seeds stay inside SigV4's 15-minute window whenever they run.
NOW = b"@NOW@"
TODAY = b"@TODAY@"


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _refused_sqs(error: AwsError) -> None:
    """An SQS refusal renders in both protocols, and stays short."""
    query.encode_error(error, "request-id", sqs_protocol.NAMESPACE)
    jsonproto.encode_error(error, sqs_protocol.ERROR_NAMESPACE)
    assert len(error.message) <= MAX_MESSAGE, len(error.message)


def _refused_api(error: ApiError) -> None:
    assert error.code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), error.message
    assert len(error.message) <= MAX_MESSAGE, len(error.message)


def sqs_query(data: bytes) -> None:
    """A query-protocol body: form text, its Action, the action's parameters."""
    try:
        form = query.parse_form(query.form_text(data))
        action = form.get("Action", "")
        if action in shapes.ACTIONS:
            query.decode(shapes.ACTIONS[action][0], form)
    except AwsError as error:
        _refused_sqs(error)


def sqs_json(data: bytes) -> None:
    """An awsJson 1.0 request: the X-Amz-Target on the first line, the body after it."""
    target, _, body = data.partition(b"\n")
    try:
        action = jsonproto.action_of(_text(target), sqs_protocol.TARGET_PREFIX)
        if action in shapes.ACTIONS:
            jsonproto.decode(shapes.ACTIONS[action][0], body)
    except AwsError as error:
        _refused_sqs(error)


def _headers(block: bytes) -> CIMultiDictProxy[str]:
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()).encode()
    headers: CIMultiDict[str] = CIMultiDict()
    for line in block.replace(NOW, now).replace(TODAY, now[:8]).split(b"\n"):
        name, colon, value = line.partition(b":")
        if colon:
            headers.add(_text(name).strip(), _text(value).strip())
    return CIMultiDictProxy(headers)


def sigv4(data: bytes) -> None:
    """SigV4 headers as the shim reads them (Authorization, X-Amz-Date,
    X-Amz-Content-SHA256, the signed ones), a blank line, the body; then the claim the
    shim forwards, as the server reads it."""
    block, _, body = data.partition(b"\n\n")
    headers = _headers(block)
    sqs_sigv4.credential_service(headers.get("Authorization", ""))
    try:
        signed = sqs_sigv4.signed_request("POST", "localhost:9324", "/", headers, body)
    except AwsError as error:
        _refused_sqs(error)
        return
    claim = signed.forwarded_metadata()[0][1]
    try:
        _, string_to_sign, signature = forwarded_sigv4.parse(claim)
        forwarded_sigv4.verify("secret", string_to_sign, signature)
    except forwarded_sigv4.SignatureProblem:
        pass
    try:
        sqs_sigv4.Verifier({"AKIDEXAMPLE": "secret"}).verify(signed)
    except AwsError as error:
        _refused_sqs(error)


def forwarded_claim(data: bytes) -> None:
    """The `authorization: SigV4 ...` claim a client may send the server directly."""
    try:
        _, string_to_sign, signature = forwarded_sigv4.parse(_text(data))
        forwarded_sigv4.verify("secret", string_to_sign, signature)
    except forwarded_sigv4.SignatureProblem:
        pass


def schedule_expression(data: bytes) -> None:
    """A cron expression on the first line, its time zone on the second."""
    expression, _, zone = _text(data).partition("\n")
    timing = Timing(cron_expression=expression, time_zone=zone.strip("\n") or "UTC")
    start = datetime(2026, 3, 29, 0, 30, tzinfo=timezone.utc)  # a DST change in Europe
    try:
        timing.preview(start, 5)
    except ApiError as error:
        _refused_api(error)


def tokens_and_receipts(data: bytes) -> None:
    """Page tokens (by name and by id), SQS receipt handles, message ids."""
    text = _text(data)
    for decode in (pagination.decode_page_token, pagination.decode_id_page_token):
        try:
            decode(text, "ListQueues")
        except ApiError as error:
            _refused_api(error)
    try:
        receipts.decode(text, "orders")
    except AwsError as error:
        _refused_sqs(error)
    if pagination.is_bigint_id(text):
        assert 0 <= int(text) < 2**63, text  # fits the engine's bigint ids


def connect_envelope(data: bytes) -> None:
    """A Connect request body: an enveloped streaming request, then the message in JSON
    and in binary protobuf; and the text as a Connect-Timeout-Ms header."""
    from postbox.v1 import message_service_pb2, queue_service_pb2

    try:
        payload = connect.single_envelope(data)
    except ValueError:
        payload = data
    for codec in (connect.Codec("json"), connect.Codec("proto")):
        for message_class in (
            message_service_pb2.SendRequest,
            queue_service_pb2.CreateQueueRequest,
        ):
            try:
                codec.decode(payload, message_class)
            except ValueError as error:
                connect.invalid(str(error)).body()
    try:
        connect.timeout_seconds(_text(data))
    except connect.ConnectError as error:
        if error.code != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        error.body()


class _Engine:
    """A connection to a database with the engine installed, for the parsers written in
    SQL: $POSTBOX_FUZZ_DATABASE_URL."""

    def __init__(self) -> None:
        import asyncpg

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(
            asyncpg.connect(os.environ["POSTBOX_FUZZ_DATABASE_URL"])
        )

    def fetch(self, sql: str, *args: object) -> object:
        try:
            return self.loop.run_until_complete(self.conn.fetchval(sql, *args))
        except Exception as exc:  # the server's one translation of database errors
            raise db_errors.translate(exc) from exc


_engine: _Engine | None = None


def _the_engine() -> _Engine:
    global _engine
    if _engine is None:
        _engine = _Engine()
    return _engine


# Words of the filter policy grammar, so that generated policies reach its rules.
_POLICY_WORDS = [
    "prefix", "suffix", "anything-but", "numeric", "exists", "equals-ignore-case", "cidr",
    "wildcard", "$or", "=", "<", "<=", ">", ">=", "color", "size", "a", "b", "",
]  # fmt: skip
_DATA_TYPES = ["String", "Number", "String.Array", "Binary", "Number.float", "Custom"]


def _json_value(fdp: Any, depth: int = 0) -> Any:
    """A JSON value drawn from the fuzzer's bytes: every input is valid JSON, so every
    input reaches the engine's policy walker (which no Python coverage can guide)."""
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 6 else 4)
    if kind == 0:
        return fdp.PickValueInList(_POLICY_WORDS)
    if kind == 1:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 20))
    if kind == 2:
        return fdp.ConsumeIntInRange(-(2**70), 2**70)
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind == 4:
        return fdp.PickValueInList([True, False, None])
    if kind in (5, 6):
        return {
            fdp.PickValueInList(_POLICY_WORDS): _json_value(fdp, depth + 1)
            for _ in range(fdp.ConsumeIntInRange(0, 4))
        }
    return [_json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]


def _generated_message(data: bytes) -> tuple[bytes, bytes, bytes]:
    import atheris

    fdp = atheris.FuzzedDataProvider(data)
    policy = json.dumps(_json_value(fdp))
    attributes = {
        fdp.PickValueInList(_POLICY_WORDS): {
            "data_type": fdp.PickValueInList(_DATA_TYPES),
            "string_value": json.dumps(_json_value(fdp, 4)),
        }
        for _ in range(fdp.ConsumeIntInRange(0, 3))
    }
    body = json.dumps(_json_value(fdp)).encode()
    return policy.encode(), json.dumps(attributes).encode(), body


def filter_policy(data: bytes) -> None:
    """An SNS filter policy on the first line, a message's attributes (the engine's JSON
    form) on the second, its body after: checked in both scopes, then matched. An input
    that does not start with "{" is read as the fuzzer's choices of a policy, attributes
    and body, all valid JSON."""
    if data.startswith(b"{"):
        policy, _, rest = data.partition(b"\n")
        attributes, _, body = rest.partition(b"\n")
    else:
        policy, attributes, body = _generated_message(data)
    engine = _the_engine()
    try:
        json.loads(policy)  # as TopicService reads it before the engine does
        json.loads(attributes)
    except ValueError:
        return
    for scope in ("attributes", "body"):
        try:
            problem = engine.fetch(
                "SELECT postbox.filter_policy_problem($1::jsonb, $2)", _text(policy), scope
            )
            if problem is None:
                engine.fetch(
                    "SELECT postbox.filter_matches($1::jsonb, $2, $3::jsonb, $4)",
                    _text(policy), scope, _text(attributes), body,
                )  # fmt: skip
        except ApiError as error:
            _refused_api(error)


def engine_receipts(data: bytes) -> None:
    """Receipts as the engine splits them (postbox._parse_receipts), one per line."""
    lines = [_text(line) for line in data.split(b"\n")]
    try:
        _the_engine().fetch("SELECT count(*) FROM postbox._parse_receipts($1)", lines)
    except ApiError as error:
        _refused_api(error)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "sqs_query": sqs_query,
    "sqs_json": sqs_json,
    "sigv4": sigv4,
    "forwarded_claim": forwarded_claim,
    "schedule_expression": schedule_expression,
    "tokens_and_receipts": tokens_and_receipts,
    "connect_envelope": connect_envelope,
    "filter_policy": filter_policy,
    "engine_receipts": engine_receipts,
}
# The targets that need $POSTBOX_FUZZ_DATABASE_URL.
ENGINE_TARGETS = frozenset({"filter_policy", "engine_receipts"})
