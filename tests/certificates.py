"""Certificates made at run time with `cryptography`: a CA that issues server and client
certificates into a directory (the TLS tests of every front door use them)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from postbox_client import TLS


@dataclass(frozen=True)
class Pair:
    certificate: Path
    key: Path

    def tls(self, ca: Path) -> TLS:
        return TLS(ca.read_bytes(), self.certificate.read_bytes(), self.key.read_bytes())


class Authority:
    """A CA that issues certificates into a directory."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        self.certificate = (
            self._builder(subject, self.key.public_key(), subject)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / f"{name}-ca.pem"
        self.path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    @staticmethod
    def _builder(subject: x509.Name, key: ec.EllipticCurvePublicKey, issuer: x509.Name):
        now = datetime.now(timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
        )

    def issue(self, name: str, *, server: bool) -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = self._builder(subject, key.public_key(), self.certificate.subject)
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        pair = Pair(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        pair.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        pair.key.chmod(0o600)
        return pair
