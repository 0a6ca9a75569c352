"""SigV4 signatures the SQS shim forwards, verified with a key's derived SigV4 secret.

The shim parses the HTTP request and computes the string to sign (no secret needed),
then forwards it with the access key id (the key's name) and the signature. The
server holds the key's SigV4 secret and checks the HMAC, so the shim never sees a
key's secret, and a forwarded signature is good for its 15 minutes only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from calendar import timegm

SCHEME = "SigV4"
ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = 15 * 60


class SignatureProblem(ValueError):
    """The forwarded signature does not hold, with the reason."""


def forwarded(key_name: str, string_to_sign: str, signature: str) -> str:
    """The authorization metadata value the shim sends."""
    encoded = base64.b64encode(string_to_sign.encode()).decode()
    return f"{SCHEME} {key_name} {encoded} {signature}"


def parse(value: str) -> tuple[str, str, str]:
    """(key name, string to sign, signature) of an authorization value from `forwarded`."""
    parts = value.split(" ")
    if len(parts) != 4 or parts[0] != SCHEME:
        raise SignatureProblem("the forwarded SigV4 authorization is malformed")
    try:
        string_to_sign = base64.b64decode(parts[2], validate=True).decode()
    except ValueError:  # binascii.Error, UnicodeError, and non-ASCII text for b64decode
        raise SignatureProblem("the forwarded string to sign is not base64 text") from None
    return parts[1], string_to_sign, parts[3]


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def verify(secret: str, string_to_sign: str, signature: str, now: float | None = None) -> None:
    """Raises SignatureProblem unless `signature` signs `string_to_sign` with `secret`,
    within 15 minutes of its date."""
    lines = string_to_sign.split("\n")
    if len(lines) != 4 or lines[0] != ALGORITHM:
        raise SignatureProblem(f"the string to sign is not of {ALGORITHM}")
    amz_date, scope = lines[1], lines[2].split("/")
    try:
        signed_at = timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SignatureProblem("the string to sign has no valid date") from None
    if abs((now or time.time()) - signed_at) > MAX_SKEW:
        raise SignatureProblem("the signature is more than 15 minutes from now")
    if len(scope) != 4 or scope[0] != amz_date[:8] or scope[3] != "aws4_request":
        raise SignatureProblem("the credential scope does not match the date")
    key = _hmac(("AWS4" + secret).encode(), scope[0])
    for part in scope[1:]:
        key = _hmac(key, part)
    expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SignatureProblem("the signature does not match")
