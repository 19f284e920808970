"""The signing key of paused programs: the configured one, else generated once per data directory."""

from __future__ import annotations

import stat
from pathlib import Path

from switchboard.core.approvals.suspend import KEY_FILE, approval_id_for, snapshot_key


def test_a_generated_key_is_private_and_stable(tmp_path: Path) -> None:
    first = snapshot_key(None, tmp_path / "data")
    assert len(first) == 64 and first == snapshot_key(None, tmp_path / "data")  # every later process reads it
    assert stat.S_IMODE((tmp_path / "data" / KEY_FILE).stat().st_mode) == 0o600
    assert snapshot_key(None, tmp_path / "other") != first
    assert snapshot_key("configured-secret", tmp_path / "data") == b"configured-secret"


def test_approval_ids_are_keyed_and_stable() -> None:
    one = approval_id_for(b"k1", "idem-key")
    assert one == approval_id_for(b"k1", "idem-key") and one != approval_id_for(b"k2", "idem-key")
    assert len(one) == 12 and one.replace("-", "").replace("_", "").isalnum()
