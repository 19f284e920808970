"""The bubblewrap command line of one sandbox: what the command sees, and nothing else.

Read-only: ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links into it), the few ``/etc`` files programs need
to start (dynamic linker cache, alternatives, time zone, CA certificates — no ``passwd``/``shadow``, no keys), and
the Python interpreter's prefixes (the virtual environment with its data libraries). Writable: the session's
workspace, mounted at ``/workspace``, and a private tmpfs ``/tmp``. Fresh ``/proc`` and ``/dev``. Every namespace
is new (user, pid, net, ipc, uts, cgroup): inside there is only a loopback interface, the command is uid/gid 65534
(nobody) with no capabilities, in its own session (no terminal to inject into), and dies with its parent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CA_CERT",
    "ETC_FILES",
    "PROXY_ADDRESS",
    "PROXY_PORT",
    "WORKSPACE",
    "bwrap_argv",
    "options_through_fd",
    "proxy_binds",
    "python_binds",
    "python_prefixes",
    "system_binds",
]

WORKSPACE = "/workspace"
"""Where the session workspace appears inside the sandbox."""

ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
)
"""The ``/etc`` entries bound read-only (those that exist); nothing else of ``/etc`` is visible."""

PROXY_PORT = 3128
"""Loopback port of the egress bridge inside a sandbox (:mod:`switchboard.sandbox.bridge`)."""
PROXY_ADDRESS = f"127.0.0.1:{PROXY_PORT}"
"""Where a command reaches the egress proxy (``HTTP_PROXY`` names it)."""
_PROXY_DIR = "/run/switchboard"
CA_CERT = f"{_PROXY_DIR}/egress-ca.pem"
"""Where the egress proxy's CA certificate appears inside a sandbox (``SSL_CERT_FILE`` and the like name it)."""

_TOP = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
NOBODY = 65534


def python_prefixes() -> list[str]:
    """The interpreter's prefix and base prefix (a venv and the Python it was made from), outside ``/usr``."""
    found: list[str] = []
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        real = os.path.realpath(prefix)
        for path in (prefix, real):
            if not path.startswith("/usr/") and path != "/usr" and path not in found and os.path.isdir(path):
                found.append(path)
    return found


def system_binds(*, python: bool = True) -> list[str]:
    """Bwrap options for the read-only system: ``/usr``, its top-level links, the ``/etc`` subset, Python.

    ``python=False`` leaves out :func:`python_binds` (bubblewrap binds them after the private ``/tmp``).
    """
    argv: list[str] = []
    for top in _TOP:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for entry in ETC_FILES:
        if os.path.exists(entry):
            argv += ["--ro-bind", entry, entry]
    return argv + python_binds() if python else argv


def python_binds() -> list[str]:
    """Bwrap options binding the interpreter's prefixes read-only.

    A venv may live under ``/tmp``: these are bound after the sandbox's private ``/tmp`` is mounted, so that mount
    does not hide them.
    """
    argv: list[str] = []
    for prefix in python_prefixes():
        argv += ["--ro-bind", prefix, prefix]
    return argv


def bwrap_argv(
    bwrap: str,
    workspace: Path,
    *,
    seccomp_fd: int,
    tmp_bytes: int,
    env: dict[str, str],
    extra: list[str] | None = None,
) -> list[str]:
    """The ``bwrap …`` options up to and including ``--`` (the command follows)."""
    argv = [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
        *system_binds(python=False),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmp_bytes),
        "--tmpfs",
        "/dev/shm",  # noqa: S108 - sized like /tmp: a tmpfs holds memory no resident size counts
        "--remount-ro",
        "/dev",  # nor may the command fill --dev's own (unsized) tmpfs; its devices stay usable
        "--size",
        str(tmp_bytes),
        "--tmpfs",
        "/tmp",  # noqa: S108 - the sandbox's own private tmpfs
        *python_binds(),
        "--bind",
        str(workspace),
        WORKSPACE,
        "--chdir",
        WORKSPACE,
        "--clearenv",
    ]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return [*argv, *(extra or []), "--seccomp", str(seccomp_fd), "--"]


def proxy_binds(
    socket_path: Path | None,
    env: dict[str, str],
    *,
    ca_cert: Path | None = None,
    environment: Mapping[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """Bwrap options binding the egress proxy's socket and the bridge, and the command prefix starting the bridge.

    ``env`` gains ``HTTP_PROXY``/``HTTPS_PROXY`` (both spellings) naming the bridge, then ``environment`` (the proxy
    URL with a grant, the CA variables); ``ca_cert`` is bound read-only at :data:`CA_CERT`. Without a socket:
    nothing.
    """
    if socket_path is None:
        return [], []
    inside_socket, inside_bridge = f"{_PROXY_DIR}/proxy.sock", f"{_PROXY_DIR}/bridge.py"
    url = f"http://{PROXY_ADDRESS}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = url
    env.update(environment or {})
    binds = [
        "--ro-bind-try",  # the proxy may start after the worker: until then, requests through it fail
        str(socket_path),
        inside_socket,
        "--ro-bind",
        str(Path(__file__).with_name("bridge.py")),
        inside_bridge,
    ]
    if ca_cert is not None:
        binds += ["--ro-bind-try", str(ca_cert), CA_CERT]
    start = f'{sys.executable} -I -S {inside_bridge} {inside_socket} {PROXY_PORT} && exec "$@"'
    return binds, ["/bin/sh", "-c", start, "sh"]


def options_through_fd(argv: list[str], seccomp_fd: int) -> tuple[list[str], int]:
    """``argv`` (a full command line from :func:`bwrap_argv` on) with bubblewrap's options moved into a memfd.

    Bubblewrap is pid 1 of the sandbox, and its command line is readable inside: the options name the host paths it
    binds (workspace, data directory, proxy socket, repository). ``bwrap --args FD`` reads them from the returned
    descriptor instead (inheritable; the caller passes it to bubblewrap and closes it). The command after ``--``
    stays on the command line.

    Raises:
        ValueError: ``argv`` does not end its options as :func:`bwrap_argv` does.
    """
    end = ["--seccomp", str(seccomp_fd), "--"]
    cut = next((i + 2 for i in range(len(argv)) if argv[i : i + 3] == end), None)
    if cut is None:
        raise ValueError("not a command line of bwrap_argv: its options do not end with --seccomp FD --")
    fd = os.memfd_create("bwrap-options", 0)
    try:
        data = b"".join(option.encode() + b"\0" for option in argv[1:cut])
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return [argv[0], "--args", str(fd), *argv[cut:]], fd
