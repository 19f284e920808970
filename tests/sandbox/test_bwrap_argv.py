"""The order of bubblewrap's mounts: the private /tmp must not hide an interpreter installed below /tmp."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.sandbox import bwrap
from switchboard.sandbox.bwrap import bwrap_argv


def test_the_interpreter_is_bound_after_the_private_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    venv = tmp_path / "checkout" / ".venv"  # a clean checkout under /tmp, as CI makes one
    venv.mkdir(parents=True)
    monkeypatch.setattr(bwrap, "python_prefixes", lambda: [str(venv)])
    argv = bwrap_argv("bwrap", tmp_path / "ws", seccomp_fd=3, tmp_bytes=1 << 20, env={})
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs + 1] == "/tmp"
    bound = [i for i, option in enumerate(argv) if option == "--ro-bind" and argv[i + 1] == str(venv)]
    assert bound and all(i > tmpfs for i in bound)  # mounted over the tmpfs, so visible inside
