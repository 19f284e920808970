"""The Landlock/weak launcher: prepared by the worker, light to start, and as confining as before.

The worker compiles the launcher once and sends it with the seccomp filter through a pipe, and creates each command's
Landlock ruleset itself; the launcher imports nothing but the ``_ctypes`` extension. What the command gets is
unchanged: the same filter, no capabilities, ``no_new_privs``, and no descriptor of the launcher's.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.sandbox import confine
from switchboard.sandbox.runner import Isolation
from switchboard.sandbox.seccomp import program
from tests.sandbox.conftest import sandbox_of

MODULES = "import sys\n{run}\nprint('\\n'.join(sorted(sys.modules)))"


def _modules_after(run: str) -> set[str]:
    """The modules loaded in ``python -I -S`` (how the launcher starts) after ``run``."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", MODULES.format(run=run)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_launcher_imports_no_module_but_the_ctypes_extension() -> None:
    source = Path(confine.__file__).read_text()
    launcher = _modules_after(f"exec(compile({source!r}, 'launcher', 'exec'), {{'__name__': 'launcher'}})")
    bare = _modules_after("pass")
    assert launcher - bare == {"_ctypes"}, "every module the launcher imports is paid by every command"


def test_the_payload_is_the_launchers_code_and_the_filter_a_command_was_built() -> None:
    landlock, weak = sandbox_of("landlock"), sandbox_of("weak")
    per_command = program(inet=False, unix=False, shared_pids=True)  # what each Landlock command got, built again
    assert landlock._filter(None) == per_command
    code, seccomp = marshal.loads(confine.payload(landlock._filter(None)))
    assert seccomp == per_command and code.co_filename == confine.__file__
    assert marshal.loads(confine.payload(weak._filter(None)))[1] == program(inet=True, unix=False, shared_pids=True)
    assert confine.payload(per_command) is confine.payload(per_command), "compiled once per worker"


PRIVILEGES = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
header, sets = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
assert libc.capget(header, sets) == 0
print("sets", *sets)
print("bounding", *(cap for cap in range(64) if libc.prctl(23, cap, 0, 0, 0) == 1))  # PR_CAPBSET_READ
print("no_new_privs", libc.prctl(39, 0, 0, 0, 0), "seccomp", libc.prctl(21, 0, 0, 0, 0))
"""
"""Inside the sandbox (``/proc`` is out of reach under Landlock): capabilities, ``no_new_privs``, seccomp mode."""

FDS = """
import os
found = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
    except OSError:
        continue
    found.append(fd)
print(found)
"""
"""Inside the sandbox: the descriptors beyond stdin, stdout and stderr the command inherited."""


@pytest.mark.parametrize("kind", ["landlock", "weak"])
async def test_a_launched_command_has_no_capability_no_new_privileges_and_the_filter(
    kind: Isolation, workspace: Path
) -> None:
    (workspace / "privileges.py").write_text(PRIVILEGES)
    done = await sandbox_of(kind).run("python3 privileges.py", workspace, timeout_s=20, max_output=2000)
    assert done.exit_code == 0, done.stderr
    sets, bounding, flags = done.stdout.splitlines()
    assert (sets, flags) == ("sets 0 0 0 0 0 0", "no_new_privs 1 seccomp 2")
    if os.geteuid() == 0:  # a root worker's commands give up the bounding set too (others have nothing to give up)
        assert bounding == "bounding"


@pytest.mark.parametrize("kind", ["landlock", "weak"])
async def test_no_descriptor_of_the_launcher_reaches_the_command_or_stays_open_in_the_worker(
    kind: Isolation, workspace: Path
) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    (workspace / "fds.py").write_text(FDS)
    done = await sandbox_of(kind).run("python3 fds.py", workspace, timeout_s=20, max_output=2000)
    assert (done.exit_code, done.stdout) == (0, "[]\n"), done.stderr
    assert sorted(os.listdir("/proc/self/fd")) == before, "the payload pipe or the ruleset stayed open in the worker"


def _launch(
    payload_fd: int, ruleset_fd: int, marker: Path, pass_fds: tuple[int, ...]
) -> subprocess.CompletedProcess[str]:
    argv = [*confine.launcher_argv(payload_fd, ruleset_fd), "/bin/sh", "-c", f"touch {marker}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, pass_fds=pass_fds)


def test_a_launcher_without_its_payload_or_its_ruleset_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"not a payload")
        os.close(write_fd)
        done = _launch(read_fd, -1, marker, (read_fd,))
        assert done.returncode == confine.FAILED and "could not start the launcher" in done.stderr
    finally:
        os.close(read_fd)
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, confine.payload(program(unix=False)))
        os.close(write_fd)
        done = _launch(read_fd, 1000, marker, (read_fd,))  # a ruleset that is not there
        assert done.returncode == confine.FAILED and "could not confine the command" in done.stderr
    finally:
        os.close(read_fd)
    assert not marker.exists(), "the command ran although it could not be confined"


def test_the_launcher_alone_still_runs_a_command_it_confines(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, confine.payload(program(unix=False)))
        os.close(write_fd)
        done = _launch(read_fd, -1, tmp_path / "ran", (read_fd,))
    finally:
        os.close(read_fd)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()
