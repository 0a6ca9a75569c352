"""TLS on every front door (the gRPC port, the SQS shim's HTTP port) and on the
channels the CLI and the shim open to a server.

A server takes a certificate chain and its key; with a client CA it also requires
every client to present a certificate that CA signed (mutual TLS). A client takes a
CA bundle (none: the system's) and, for mutual TLS, its own certificate and key.
Files are named by path, never passed by value on a command line: `serve --workers`
hands its workers the same paths.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from postbox_client import TLS


class TlsError(ValueError):
    """A TLS setting that cannot work; the message names the flag and what to fix."""


def _read(flag: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise TlsError(f"{flag} {str(path)[:200]!r}: {error.strerror}") from None


@dataclass(frozen=True)
class ServerTls:
    certificate: Path
    private_key: Path
    # Set: mutual TLS, clients must present a certificate this CA signed.
    client_ca: Path | None = None

    @classmethod
    def from_flags(
        cls, certificate: Path | None, private_key: Path | None, client_ca: Path | None
    ) -> ServerTls | None:
        """The flags' TLS (None: plain), checked now so that a bad file stops the start
        with its flag's name rather than a handshake failure on the first call."""
        if certificate is None and private_key is None:
            if client_ca is not None:
                raise TlsError("--tls-client-ca needs --tls-cert and --tls-key")
            return None
        if certificate is None or private_key is None:
            raise TlsError("give --tls-cert and --tls-key together")
        tls = cls(certificate, private_key, client_ca)
        tls.ssl_context()  # reads and matches the files
        return tls

    def ssl_context(self) -> ssl.SSLContext:
        """A server context for aiohttp; fails with a TlsError naming the bad file."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        for flag, path in (("--tls-cert", self.certificate), ("--tls-key", self.private_key)):
            _read(flag, path)
        try:
            context.load_cert_chain(self.certificate, self.private_key)
        except ssl.SSLError as error:
            raise TlsError(
                f"--tls-cert and --tls-key: not a PEM certificate chain and its key "
                f"({error.reason or error})"
            ) from None
        if self.client_ca is not None:
            try:
                context.load_verify_locations(
                    cadata=_read("--tls-client-ca", self.client_ca).decode()
                )
            except (ssl.SSLError, UnicodeDecodeError) as error:
                raise TlsError(f"--tls-client-ca: not PEM certificates ({error})") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        client_ca = None if self.client_ca is None else _read("--tls-client-ca", self.client_ca)
        return grpc.ssl_server_credentials(
            [(_read("--tls-key", self.private_key), _read("--tls-cert", self.certificate))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )

    def flags(self) -> list[str]:
        """The command-line flags that give this TLS to another `postbox serve`."""
        flags = ["--tls-cert", str(self.certificate), "--tls-key", str(self.private_key)]
        if self.client_ca is not None:
            flags += ["--tls-client-ca", str(self.client_ca)]
        return flags


def add_server_flags(parser: argparse.ArgumentParser, port: str) -> None:
    parser.add_argument(
        "--tls-cert", type=Path, help=f"serve {port} over TLS with this PEM certificate chain"
    )
    parser.add_argument("--tls-key", type=Path, help="the certificate's PEM private key")
    parser.add_argument(
        "--tls-client-ca",
        type=Path,
        help="require client certificates signed by this PEM CA (mutual TLS)",
    )


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    return ServerTls.from_flags(args.tls_cert, args.tls_key, args.tls_client_ca)


def add_client_flags(
    parser: argparse.ArgumentParser, prefix: str = "", environment: bool = False
) -> None:
    """--{prefix}tls, --{prefix}tls-ca, --{prefix}tls-cert, --{prefix}tls-key; with
    `environment`, $POSTBOX_TLS, $POSTBOX_TLS_CA and their siblings are the defaults."""

    def default(name: str) -> str | None:
        return os.environ.get(f"POSTBOX_TLS_{name}") if environment else None

    parser.add_argument(
        f"--{prefix}tls",
        action="store_true",
        default=bool(environment and os.environ.get("POSTBOX_TLS")),
        help="reach the server over TLS, trusting the system's CAs (implied by the next flags)",
    )
    parser.add_argument(
        f"--{prefix}tls-ca", type=Path, default=default("CA"), help="PEM CA bundle to trust"
    )
    parser.add_argument(
        f"--{prefix}tls-cert",
        type=Path,
        default=default("CERT"),
        help="PEM client certificate chain (mutual TLS)",
    )
    parser.add_argument(
        f"--{prefix}tls-key", type=Path, default=default("KEY"), help="its PEM private key"
    )


def client_tls(args: argparse.Namespace, prefix: str = "") -> TLS | None:
    """The client flags' TLS (None: a plaintext channel)."""
    attr = prefix.replace("-", "_")
    ca, certificate, key = (getattr(args, f"{attr}tls_{name}") for name in ("ca", "cert", "key"))
    if (certificate is None) != (key is None):
        raise TlsError(f"give --{prefix}tls-cert and --{prefix}tls-key together")
    if not (getattr(args, f"{attr}tls") or ca or certificate):
        return None
    return TLS(
        root_certificates=None if ca is None else _read(f"--{prefix}tls-ca", ca),
        certificate_chain=None
        if certificate is None
        else _read(f"--{prefix}tls-cert", certificate),
        private_key=None if key is None else _read(f"--{prefix}tls-key", key),
    )
