"""Amazon SNS message signatures: the key, its certificate, and the strings SNS signs.

SNS signs every JSON message it sends (notifications, subscription and unsubscribe
confirmations) with RSA over a canonical string of some of the message's fields:
SignatureVersion 1 with SHA1, 2 with SHA256. Subscribers verify with the certificate at
the message's SigningCertURL. postbox signs with one RSA key that both the server (queue
and webhook notifications) and the SNS shim (confirmations, and the certificate it serves
at /SimpleNotificationService.pem) load from the same PEM file: the operator's, or one
made on first use and kept, so that messages signed before a restart still verify. With
no file named, it is sns-signing-key.pem beside the embedded PostgreSQL's data directory
(default_key_path), which `postbox serve` and `postbox sqs` on one host share.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

# The fields each message type signs, in this order (AWS's "Verifying the signatures of
# Amazon SNS messages"); a notification's Subject only when it has one.
NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = (
    "Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type",
)  # fmt: skip
SIGNATURE_VERSIONS = {"1": hashes.SHA1, "2": hashes.SHA256}
# SNS's default, for a topic without the SignatureVersion attribute.
DEFAULT_SIGNATURE_VERSION = "1"
CERTIFICATE_PATH = "/SimpleNotificationService.pem"
PEM_CONTENT_TYPE = "application/x-pem-file"
_KEY_BITS = 2048
_CERTIFICATE_DAYS = 3650


class SigningKeyError(Exception):
    """The signing key file cannot be read or made; the message says which and why."""


def string_to_sign(message: Mapping[str, str | None]) -> bytes:
    """The canonical string of a message: each signed field present, name and value each
    followed by a newline."""
    fields = NOTIFICATION_FIELDS if message["Type"] == "Notification" else CONFIRMATION_FIELDS
    return "".join(
        f"{name}\n{message[name]}\n" for name in fields if message.get(name) is not None
    ).encode("utf-8")


def signature_version(topic_attributes: Mapping[str, str]) -> str:
    """The topic's SignatureVersion, SNS's default when it has none (or, set in the
    database by hand, one SNS does not have)."""
    version = topic_attributes.get("SignatureVersion") or DEFAULT_SIGNATURE_VERSION
    return version if version in SIGNATURE_VERSIONS else DEFAULT_SIGNATURE_VERSION


@dataclass(frozen=True)
class SigningKey:
    private_key: rsa.RSAPrivateKey
    certificate_pem: bytes

    def sign(self, message: Mapping[str, str | None], version: str) -> str:
        """The base64 Signature of a message under SignatureVersion `version`."""
        algorithm = SIGNATURE_VERSIONS[version]()
        raw = self.private_key.sign(string_to_sign(message), padding.PKCS1v15(), algorithm)
        return base64.b64encode(raw).decode("ascii")

    def signed(self, message: dict[str, str], version: str, cert_url: str) -> dict[str, str]:
        """The message with SignatureVersion, Signature and SigningCertURL added."""
        return {
            **message,
            "SignatureVersion": version,
            "Signature": self.sign(message, version),
            "SigningCertURL": cert_url,
        }


DEFAULT_KEY_NAME = "sns-signing-key.pem"


def default_key_path(data_dir: Path) -> Path:
    """The key file when the operator names none: in postbox's data directory, the one
    that holds the embedded PostgreSQL's (`data_dir`), so it survives restarts, but not
    inside PostgreSQL's own directory, which is PostgreSQL's alone."""
    return data_dir.expanduser().resolve().parent / DEFAULT_KEY_NAME


def certificate_url(base_url: str) -> str:
    """Where an SNS endpoint at `base_url` serves its signing certificate."""
    return base_url.rstrip("/") + CERTIFICATE_PATH


def _self_signed(key: rsa.RSAPrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "postbox SNS message signing")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=_CERTIFICATE_DAYS))
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


def _parse(path: Path, data: bytes) -> SigningKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        # Not the error's text: it may quote the file.
        raise SigningKeyError(
            f"{path}: no unencrypted PEM private key in it ({type(error).__name__})"
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < _KEY_BITS:
        raise SigningKeyError(f"{path}: SNS signs with RSA: give an RSA key of 2048 bits or more")
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []  # a key alone: its certificate is made here
    public = key.public_key().public_numbers()
    for certificate in certificates:
        if certificate.public_key().public_numbers() == public:  # type: ignore[union-attr]
            return SigningKey(key, certificate.public_bytes(serialization.Encoding.PEM))
    if certificates:
        raise SigningKeyError(f"{path}: its certificate is not the private key's")
    return SigningKey(key, _self_signed(key))


def load_or_create(path: Path) -> SigningKey:
    """The key in `path` (a PEM private key, with its certificate or without), or, when
    the file does not exist, a new 2048-bit RSA key and a self-signed certificate written
    there (mode 0600; when two processes race, both use the one that was written first)."""
    try:
        return _parse(path, path.read_bytes())
    except FileNotFoundError:
        pass
    except OSError as error:
        raise SigningKeyError(f"{path}: cannot read it: {error.strerror}") from None
    key = rsa.generate_private_key(public_exponent=65537, key_size=_KEY_BITS)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise SigningKeyError(f"{path}: cannot create its directory: {error.strerror}") from None
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    data = pem + _self_signed(key)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)  # fails if another process made it meanwhile
        except FileExistsError:
            return _parse(path, path.read_bytes())
    except OSError as error:
        raise SigningKeyError(f"{path}: cannot create it: {error.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return _parse(path, data)
