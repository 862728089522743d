"""The site's CA and the broker's TLS certificate (the ``cryptography`` package).

A site with its own PKI passes its CA (``--ca-cert``/``--ca-key``): the broker's
certificate is then signed by it. Keys are EC P-256; certificates name the broker by
every host name and address the agents use (subjectAltName), which is what TLS checks.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
BROKER_DAYS = 825  # what clients accept for a server certificate


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(name: str) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, private key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def load_ca(
    cert_pem: bytes, key_pem: bytes
) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    """The CA's certificate and key; ValueError when they do not belong together."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, (ec.EllipticCurvePrivateKey,)) and not hasattr(key, "sign"):
        raise ValueError("the CA key cannot sign")
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if public != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise ValueError("the CA key is not the key of the CA certificate")
    return cert, key  # type: ignore[return-value]


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def broker_certificate(
    hosts: Sequence[str], ca_cert_pem: bytes, ca_key_pem: bytes
) -> tuple[bytes, bytes]:
    """A server certificate for the broker, valid for every one of ``hosts``, signed by the
    CA: (certificate PEM, private key PEM)."""
    if not hosts:
        raise ValueError("the broker certificate needs at least one host name")
    ca_cert, ca_key = load_ca(ca_cert_pem, ca_key_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=BROKER_DAYS))
        .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def certificate_hosts(cert_pem: bytes) -> list[str]:
    """The host names and addresses a certificate is valid for (its subjectAltName)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(n.value) for n in names]
