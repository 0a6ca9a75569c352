"""AWS Signature Version 4: checking that a request was signed with a known key.

The string to sign is computed with botocore's signer, the code AWS clients sign
with; only the headers the client says it signed take part, as the protocol demands.
A static credential's signature is checked here; an API key's is forwarded to the
server, which holds the key's SigV4 secret (postbox_server/auth/sigv4.py).
"""

from __future__ import annotations

import configparser
import hashlib
import re
import time
from calendar import timegm
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials
from multidict import CIMultiDictProxy

from postbox_server.auth.sigv4 import SignatureProblem, forwarded
from postbox_server.auth.sigv4 import verify as verify_signature
from postbox_server.aws.errors import (
    INCOMPLETE_SIGNATURE,
    INVALID_CLIENT_TOKEN_ID,
    MISSING_AUTHENTICATION_TOKEN,
    REQUEST_EXPIRED,
    SIGNATURE_DOES_NOT_MATCH,
    AwsError,
)
from postbox_server.errors import quoted

ALGORITHM = "AWS4-HMAC-SHA256"
# The services this shim serves, as credential scopes name them.
SERVICES = ("sqs", "sns")
MAX_SKEW = 15 * 60
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-f]{64})\s*$"
)
_AMZ_DATE = "%Y%m%dT%H%M%SZ"
# A region a request may name: it goes into the ARNs of its answers.
_REGION = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,49}")
_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method."
)


def load_credentials(
    pairs: Iterable[tuple[str, str]], files: Iterable[Path] = ()
) -> dict[str, str]:
    """Access key -> secret key, from explicit pairs and AWS-style credentials files.

    A credentials file is the AWS CLI's INI format: every section's
    aws_access_key_id / aws_secret_access_key pair is accepted.
    """
    found = dict(pairs)
    for path in files:
        parser = configparser.ConfigParser()
        if not parser.read(path):
            raise FileNotFoundError(f"credentials file {path} cannot be read")
        for section in parser.sections():
            key = parser.get(section, "aws_access_key_id", fallback=None)
            secret = parser.get(section, "aws_secret_access_key", fallback=None)
            if not key or not secret:
                raise ValueError(
                    f"credentials file {path}: section [{section}] needs aws_access_key_id "
                    "and aws_secret_access_key"
                )
            found[key] = secret
    return found


class _ExpectedSignature(SigV4Auth):
    """botocore's signer, restricted to the headers the client signed."""

    def __init__(
        self, credentials: Credentials, service: str, region: str, signed: list[tuple[str, str]]
    ):
        super().__init__(credentials, service, region)
        self._signed = signed

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        headers = HTTPHeaders()
        for name, value in self._signed:
            headers[name] = value  # repeated names add values, as received
        return headers


@dataclass(frozen=True)
class SignedRequest:
    """A request's SigV4 claim: who signed, what was signed, and the signature."""

    access_key: str
    string_to_sign: str
    signature: str

    def forwarded_metadata(self) -> tuple[tuple[str, str], ...]:
        """The claim for the server to verify with the key's SigV4 secret."""
        return (
            (
                "authorization",
                forwarded(self.access_key, self.string_to_sign, self.signature),
            ),
        )


def signed_request(
    method: str, host: str, raw_path: str, headers: CIMultiDictProxy[str], body: bytes
) -> SignedRequest:
    """The request's SigV4 claim; AwsError when it is missing, malformed or out of date."""
    authorization = headers.get("Authorization")
    if not authorization:
        raise AwsError(MISSING_AUTHENTICATION_TOKEN, "Request is missing Authentication Token")
    match = _AUTHORIZATION.match(authorization)
    # ASCII, as every part of a string to sign is (a lenient HTTP decoding may hand us
    # anything): the claim is forwarded as UTF-8 and must survive the trip.
    if match is None or not authorization.startswith(ALGORITHM) or not authorization.isascii():
        raise AwsError(
            INCOMPLETE_SIGNATURE,
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' "
            f"parameters of algorithm {ALGORITHM}.",
        )
    scope = match["credential"].split("/")
    if len(scope) != 5 or scope[3] not in SERVICES or scope[4] != "aws4_request":
        raise AwsError(
            INCOMPLETE_SIGNATURE,
            "Credential should be scoped to a valid region and to service sqs or sns: "
            f"{match['credential']}",
        )
    access_key, date, region, service = scope[0], scope[1], scope[2], scope[3]
    amz_date = headers.get("X-Amz-Date", "")
    signed_at = _timestamp(amz_date)
    now = time.time()
    if signed_at < now - MAX_SKEW:
        raise AwsError(
            REQUEST_EXPIRED,
            f"Request has expired: signed at {amz_date}, more than 15 minutes ago.",
        )
    if signed_at > now + MAX_SKEW:
        raise AwsError(
            SIGNATURE_DOES_NOT_MATCH,
            f"Signature not yet current: {amz_date} is more than 15 minutes ahead.",
        )
    if date != amz_date[:8]:
        raise AwsError(
            SIGNATURE_DOES_NOT_MATCH,
            f"Credential date {date} does not match the X-Amz-Date {amz_date}.",
        )
    body_hash = hashlib.sha256(body).hexdigest()
    if headers.get("X-Amz-Content-SHA256", body_hash) != body_hash:
        raise AwsError(SIGNATURE_DOES_NOT_MATCH, "X-Amz-Content-SHA256 is not the body's hash.")

    signed_names = match["signed"].split(";")
    signed = [(name, value) for name in signed_names for value in headers.getall(name, [])]
    for name, value in signed:
        # botocore's canonical form handles ASCII values only (a non-ASCII one becomes an
        # email Header object it cannot fold), and no AWS client signs any other.
        if not value.isascii():
            raise AwsError(
                INCOMPLETE_SIGNATURE,
                f"The signed header {quoted(name)} holds characters that are not ASCII; "
                "SigV4 signs ASCII header values only.",
            )
    request = AWSRequest(method=method, url=f"http://{host}{raw_path}", data=body)
    request.context["timestamp"] = amz_date
    # The string to sign needs no secret; the signature is checked against it.
    signer = _ExpectedSignature(Credentials(access_key, ""), service, region, signed)
    string_to_sign = signer.string_to_sign(request, signer.canonical_request(request))
    return SignedRequest(access_key, string_to_sign, match["signature"])


class Verifier:
    """Checks signatures of the static credentials given on the shim's command line."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.secrets = dict(secrets)

    def verify(self, signed: SignedRequest) -> None:
        """Raises AwsError unless a static credential made the signature."""
        secret = self.secrets.get(signed.access_key)
        if secret is None:
            raise AwsError(
                INVALID_CLIENT_TOKEN_ID, "The security token included in the request is invalid."
            )
        try:
            verify_signature(secret, signed.string_to_sign, signed.signature)
        except SignatureProblem:
            raise AwsError(SIGNATURE_DOES_NOT_MATCH, _MISMATCH) from None


def _scope(authorization: str) -> list[str] | None:
    """The credential scope of a SigV4 Authorization header (access key, date, region,
    service, terminator), or None when it has none."""
    match = _AUTHORIZATION.match(authorization)
    if match is None:
        return None
    scope = match["credential"].split("/")
    return scope if len(scope) == 5 else None


def credential_service(authorization: str) -> str | None:
    """The service a SigV4 Authorization header is scoped to, or None when it has none."""
    scope = _scope(authorization)
    return None if scope is None else scope[3]


def credential_region(authorization: str) -> str | None:
    """The region a SigV4 Authorization header is scoped to, or None when it has none
    or one that could not be part of an ARN."""
    scope = _scope(authorization)
    return None if scope is None or not is_region(scope[2]) else scope[2]


def is_region(text: str) -> bool:
    """Whether a region name may go into an ARN: AWS's regions, and names such as
    "local" that clients of emulators give, are letters, digits and hyphens."""
    return _REGION.fullmatch(text) is not None


def _timestamp(amz_date: str) -> float:
    try:
        if not amz_date.isascii():  # strptime's %Y would take digits of any script
            raise ValueError(amz_date)
        return timegm(time.strptime(amz_date, _AMZ_DATE))
    except ValueError:
        raise AwsError(
            INCOMPLETE_SIGNATURE,
            "Authorization header requires an X-Amz-Date header of the form YYYYMMDD'T'HHMMSS'Z'.",
        ) from None
