"""Certificates the TLS tests make for themselves: a CA, a server certificate for loopback, client certificates.

Made with the ``cryptography`` package (a test dependency), short-lived, EC P-256 keys (fast to make):
nothing is read from or written to the system's trust store.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that signs certificates; ``pem`` is its certificate file (what a client trusts)."""

    name: str
    pem: Path
    _cert: x509.Certificate
    _key: ec.EllipticCurvePrivateKey

    def issue(self, folder: Path, name: str, *, server: bool) -> Pair:
        """A certificate for ``name``: a server one valid for 127.0.0.1 and localhost, or a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(name, key, issuer=self._cert.subject)
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
            usage = ExtendedKeyUsageOID.SERVER_AUTH
        else:
            usage = ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        cert = builder.sign(self._key, hashes.SHA256())
        return _write(folder, name, cert, key)


def authority(folder: Path, name: str) -> Authority:
    """A new self-signed CA whose certificate is ``folder/<name>.pem``."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = _builder(name, key, issuer=subject)
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    builder = builder.add_extension(usage, critical=True)
    cert = builder.sign(key, hashes.SHA256())
    pair = _write(folder, name, cert, key)
    return Authority(name=name, pem=pair.cert, _cert=cert, _key=key)


def _builder(name: str, key: ec.EllipticCurvePrivateKey, *, issuer: x509.Name) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _write(folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return Pair(cert_path, key_path)
