"""The deployment's egress CA: the proxy terminates a sandbox's TLS with certificates it signs.

Generated once into ``<data dir>/egress/ca/`` (directory ``0700``, key ``0600``); sandboxes trust only its
certificate (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``), so nothing but this proxy can
intercept them, and the proxy itself verifies every destination's real certificate as usual.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import ssl
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DeploymentCA"]

_CERT: Final = "ca-cert.pem"
_KEY: Final = "ca-key.pem"
_LEAF_DAYS: Final = 30
_CACHE: Final = 256


def _name(common: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Switchboard"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


class DeploymentCA:
    """A CA certificate and key on disk, and the TLS server contexts it signs per destination host."""

    def __init__(self, directory: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.directory = directory
        self.cert = cert
        self._key = key
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    @property
    def cert_path(self) -> Path:
        """The CA certificate alone (PEM): what a sandbox's ``SSL_CERT_FILE`` points at."""
        return self.directory / _CERT

    @property
    def key_path(self) -> Path:
        """The CA key (``0600``, never given to a sandbox)."""
        return self.directory / _KEY

    @classmethod
    def load_or_create(cls, directory: Path) -> DeploymentCA:
        """Load the CA under ``directory``, creating it first if there is none (safe when processes race)."""
        if not (directory / _KEY).exists():
            directory.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".ca-", dir=directory.parent))  # 0700
            try:
                key = ec.generate_private_key(ec.SECP256R1())
                _write(staging / _KEY, cls._key_pem(key), 0o600)
                _write(staging / _CERT, cls._self_signed(key).public_bytes(serialization.Encoding.PEM), 0o644)
                os.rename(staging, directory)  # atomic; fails when another process won the race
            except OSError:
                if not (directory / _KEY).exists():
                    raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        cert = x509.load_pem_x509_certificate((directory / _CERT).read_bytes())
        loaded = serialization.load_pem_private_key((directory / _KEY).read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{directory / _KEY} is not an EC private key")
        return cls(directory, cert, loaded)

    @staticmethod
    def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @staticmethod
    def _self_signed(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        name = _name(f"Switchboard egress CA {os.urandom(4).hex()}")
        public = key.public_key()
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=3650))
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )

    def issue(self, host: str) -> tuple[bytes, bytes]:
        """A certificate for ``host`` signed by this CA, and its key (both PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host[:64]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=_LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), self._key_pem(key)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host`` (cached for the most recent hosts)."""
        ctx = self._contexts.get(host)
        if ctx is not None:
            self._contexts.move_to_end(host)
            return ctx
        cert, key = self.issue(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # ssl loads a key only from a file: a private 0600 file that exists for the duration of the load
        with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".leaf-", suffix=".pem") as tmp:
            tmp.write(cert + key)
            tmp.flush()
            ctx.load_cert_chain(tmp.name)
        self._contexts[host] = ctx
        if len(self._contexts) > _CACHE:
            self._contexts.popitem(last=False)
        return ctx
