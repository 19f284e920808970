"""Bubblewrap's command line: the order of its mounts, and its options passed through a descriptor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from switchboard.sandbox import bwrap
from switchboard.sandbox.bwrap import bwrap_argv, options_through_fd


def test_the_interpreter_is_bound_after_the_private_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    venv = tmp_path / "checkout" / ".venv"  # a clean checkout under /tmp, as CI makes one
    venv.mkdir(parents=True)
    monkeypatch.setattr(bwrap, "python_prefixes", lambda: [str(venv)])
    argv = bwrap_argv("bwrap", tmp_path / "ws", seccomp_fd=3, tmp_bytes=1 << 20, env={})
    tmpfs = next(i for i, option in enumerate(argv) if option == "--tmpfs" and argv[i + 1] == "/tmp")
    bound = [i for i, option in enumerate(argv) if option == "--ro-bind" and argv[i + 1] == str(venv)]
    assert bound and all(i > tmpfs for i in bound)  # mounted over the tmpfs, so visible inside


def test_bubblewraps_options_go_through_a_descriptor_and_the_command_stays() -> None:
    argv = ["bwrap", "--bind", "/host/data/ws", "/workspace", "--seccomp", "5", "--", "sh", "-c", "echo --seccomp 5 --"]
    moved, fd = options_through_fd(argv, 5)
    try:
        assert moved == ["bwrap", "--args", str(fd), "--", "sh", "-c", "echo --seccomp 5 --"]
        assert os.read(fd, 1000).split(b"\x00") == [b"--bind", b"/host/data/ws", b"/workspace", b"--seccomp", b"5", b""]
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="--seccomp FD"):
        options_through_fd(["bwrap", "--", "true"], 5)
