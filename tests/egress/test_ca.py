"""The deployment CA: created once, key private, shared by racing processes, trusted by sandboxes only."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cryptography import x509

from switchboard.egress.ca import DeploymentCA


def test_ca_is_created_once_with_a_private_key(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "egress" / "ca"
    ca = DeploymentCA.load_or_create(directory)
    assert stat.S_IMODE(os.stat(ca.key_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert b"PRIVATE KEY" not in ca.cert_path.read_bytes()  # what sandboxes get holds the certificate only
    again = DeploymentCA.load_or_create(directory)
    assert again.cert.fingerprint(again.cert.signature_hash_algorithm) == ca.cert.fingerprint(  # type: ignore[arg-type]
        ca.cert.signature_hash_algorithm  # type: ignore[arg-type]
    )
    assert sorted(p.name for p in directory.parent.iterdir()) == ["ca"]  # no staging left behind


def test_racing_processes_end_up_with_one_ca(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    with ThreadPoolExecutor(8) as pool:
        cas = list(pool.map(lambda _: DeploymentCA.load_or_create(directory), range(8)))
    assert len({ca.cert.serial_number for ca in cas}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca"]


def test_leaf_certificates_are_signed_for_the_host(tmp_path: Path) -> None:
    ca = DeploymentCA.load_or_create(tmp_path / "ca")
    cert_pem, _key = ca.issue("api.example.test")
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.issuer == ca.cert.subject
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["api.example.test"]
    cert.verify_directly_issued_by(ca.cert)
    assert ca.server_context("api.example.test") is ca.server_context("api.example.test")
    assert [p.name for p in (tmp_path / "ca").iterdir() if p.name.startswith(".leaf")] == []
