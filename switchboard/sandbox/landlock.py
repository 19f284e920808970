"""The worker's side of Landlock: the kernel's ABI version, and each command's ruleset.

A ruleset is created per command in the worker — creating one restricts nobody — and inherited by the launcher
(:mod:`switchboard.sandbox.confine`) as a file descriptor; the command's process enforces it
(:func:`switchboard.sandbox.confine.enforce`) right before it executes: read and execute beneath the read-only
roots, everything beneath the writable ones, no TCP bind or connect (ABI 4+), no signals or abstract unix sockets
outside its domain (ABI 6+, so the command cannot kill its launcher).
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

from switchboard.sandbox.confine import enforce

__all__ = ["abi_version", "restrict", "ruleset"]

_CREATE_RULESET, _ADD_RULE = 444, 445  # the same on x86_64 and aarch64
_VERSION_FLAG = 1
_RULE_PATH_BENEATH = 1

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | 16384 | 32768  # + truncate (ABI 3), ioctl_dev (ABI 5)
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP = 1 | 2  # bind, connect
_SCOPES = 1 | 2  # abstract unix sockets, signals


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def abi_version() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable (asked once per process)."""
    version = _libc().syscall(_CREATE_RULESET, None, 0, _VERSION_FLAG)
    return max(int(version), 0)


def ruleset(read_only: list[str], writable: list[str]) -> int:
    """A ruleset for ``read_only`` and ``writable`` paths and no TCP: its file descriptor (close-on-exec).

    Paths absent on this host are left out.

    Raises:
        OSError: Landlock is unavailable or refused a rule.
    """
    libc = _libc()
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available")
    fs = _FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = struct.pack("=QQQ", fs, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    rules = int(libc.syscall(_CREATE_RULESET, ctypes.c_char_p(attr[:size]), size, 0))
    if rules < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, rights in ((read_only, _READ), (writable, fs)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # absent on this host
                try:
                    allowed = rights if os.path.isdir(path) else rights & _FILE_RIGHTS & fs
                    rule = struct.pack("=Qi", allowed, fd)
                    if libc.syscall(_ADD_RULE, rules, _RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
                finally:
                    os.close(fd)
    except BaseException:
        os.close(rules)
        raise
    return rules


def restrict(read_only: list[str], writable: list[str]) -> int:
    """Confine the calling process to ``read_only`` and ``writable`` paths and no TCP; returns the ABI used.

    Raises:
        OSError: Landlock is unavailable or refused a rule.
    """
    rules = ruleset(read_only, writable)
    try:
        enforce(rules)
    finally:
        os.close(rules)
    return abi_version()
