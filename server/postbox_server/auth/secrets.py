"""Key secrets: made here, shown once, stored only as what verifies them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

PREFIX = "pbk_"
_SIGV4_LABEL = b"postbox sigv4 secret access key v1"


def new_secret() -> str:
    """256 random bits, base64url; the prefix lets secret scanners recognise a leaked one."""
    return PREFIX + secrets.token_urlsafe(32)


def secret_sha256(secret: str) -> bytes:
    """What the database keeps to recognise a secret. A fast hash is enough: the secret
    has 256 random bits, so there is nothing to guess that a slow hash would protect."""
    return hashlib.sha256(secret.encode()).digest()


def sigv4_secret(secret: str) -> str:
    """The key's AWS secret access key at the SQS shim.

    SigV4 is an HMAC: whoever verifies it needs the signing secret. Deriving it from
    the key's secret means the database stores a value that signs SQS requests but is
    no bearer secret (the bearer check hashes what it is given and finds no key).
    """
    digest = hmac.new(secret.encode(), _SIGV4_LABEL, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True)
class Credentials:
    """A new key's secret and what the database keeps of it."""

    secret: str
    secret_sha256: bytes
    sigv4_secret: str

    @classmethod
    def issue(cls) -> Credentials:
        secret = new_secret()
        return cls(secret, secret_sha256(secret), sigv4_secret(secret))
