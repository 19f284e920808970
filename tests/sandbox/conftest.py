"""Sandboxes of every kind this host runs, with small limits, over throw-away workspaces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from switchboard.sandbox.detect import choose_now
from switchboard.sandbox.limits import CommandLimits
from switchboard.sandbox.runner import Isolation, Sandbox

LIMITS = CommandLimits(cpu_s=10, memory_mb=512, processes=16, file_mb=1, tmp_mb=8)
"""Small limits, so that the escape tests reach them quickly."""

_CACHE: dict[str, Sandbox | None] = {}


def sandbox_of(kind: Isolation) -> Sandbox:
    """The sandbox of ``kind`` under :data:`LIMITS` (the test is skipped, naming why, if this host has none)."""
    if kind not in _CACHE:
        choice = choose_now(kind, limits=LIMITS, allow_weak=True)
        _CACHE[kind] = choice.sandbox
        if choice.sandbox is None:
            pytest.skip(f"no {kind} sandbox on this host: {choice.reasons}")
    found = _CACHE[kind]
    if found is None:
        pytest.skip(f"no {kind} sandbox on this host")
    return found


@pytest.fixture(params=["bwrap", "landlock"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """Each strong sandbox kind in turn."""
    return sandbox_of(request.param)


@pytest.fixture
def bwrap() -> Sandbox:
    """The bubblewrap sandbox."""
    return sandbox_of("bwrap")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory: a secret of the host beside the workspaces."""
    data = tmp_path / "data"
    (data / "workspaces" / "t").mkdir(parents=True)
    (data / "secret.key").write_text("host-secret-123\n")
    return data


@pytest.fixture
def workspace(data_dir: Path) -> Path:
    """Session A's workspace."""
    path = data_dir / "workspaces" / "t" / "session-a"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def other_workspace(data_dir: Path) -> Path:
    """Session B's workspace, holding B's file."""
    path = data_dir / "workspaces" / "t" / "session-b"
    path.mkdir(mode=0o700)
    (path / "notes.txt").write_text("session-b-private\n")
    return path


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = next(
                (line for line in (entry / "status").read_text().splitlines() if line.startswith("State:")), ""
            )
        except OSError:
            continue
        if marker.encode() in cmdline and "Z" not in state.split()[1:2]:
            found.append(int(entry.name))
    return found
