"""The procedures HTTP serves: each RPC's handler as the gRPC server registers it, wrapped
in the same interceptors, found by its path (/postbox.v1.QueueService/CreateQueue)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from postbox_server.interceptors import WrapsEachMethod, aio_handler


@dataclass(frozen=True)
class Procedure:
    path: str
    method: MethodDescriptor
    handler: grpc.RpcMethodHandler
    request_class: type[Message]
    response_class: type[Message]

    @property
    def server_streaming(self) -> bool:
        return self.method.server_streaming

    @property
    def client_streaming(self) -> bool:
        return self.method.client_streaming


class MethodTable:
    """Stands in for a grpc server in the generated add_*Servicer_to_server functions and
    keeps the handlers they register, by method path."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        """The generated code registers every method below as well; nothing to keep here."""

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


def procedures(
    services: Sequence[ServiceDescriptor],
    table: MethodTable,
    interceptors: Sequence[WrapsEachMethod],
) -> dict[str, Procedure]:
    """Every method of `services`, wrapped by `interceptors` (the first outermost, as a
    grpc server applies them)."""
    found: dict[str, Procedure] = {}
    for service in services:
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            handler = table.handlers.get(path)
            if handler is None:
                raise LookupError(f"no servicer registered {path}")
            for interceptor in reversed(interceptors):
                # None: the interceptor leaves this method's handler as it is.
                handler = interceptor.wrap(aio_handler(handler), path) or handler
            found[path] = Procedure(
                path,
                method,
                handler,
                message_factory.GetMessageClass(method.input_type),
                message_factory.GetMessageClass(method.output_type),
            )
    return found
