"""The seccomp filter, loaded into a real child process: what it refuses and what it lets through."""

from __future__ import annotations

import subprocess
import sys

import pytest

from switchboard.sandbox.seccomp import ARCHES, DENIED, SeccompError, program

PROBE = """
import ctypes, errno, os, socket, sys
from switchboard.sandbox.seccomp import install, program
install(program(inet={inet}))
results = {{}}
for name, family in (("unix", socket.AF_UNIX), ("inet", socket.AF_INET), ("inet6", socket.AF_INET6),
                     ("netlink", socket.AF_NETLINK)):
    try:
        socket.socket(family, socket.SOCK_STREAM if family != socket.AF_NETLINK else socket.SOCK_RAW).close()
        results[name] = "ok"
    except OSError as err:
        results[name] = errno.errorcode[err.errno]
a, b = socket.socketpair()
results["socketpair"] = "ok"
libc = ctypes.CDLL(None, use_errno=True)
results["ptrace"] = "ok" if libc.ptrace(0, 0, 0, 0) == 0 else errno.errorcode[ctypes.get_errno()]
results["unshare"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
print(results)
"""


def probe(inet: bool) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(inet=inet)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return dict(eval(done.stdout))


def test_only_unix_sockets_are_allowed() -> None:
    assert probe(inet=False) == {
        "unix": "ok",
        "inet": "EAFNOSUPPORT",
        "inet6": "EAFNOSUPPORT",
        "netlink": "EAFNOSUPPORT",
        "socketpair": "ok",
        "ptrace": "EPERM",
        "unshare": "EPERM",
    }


def test_the_bridge_variant_also_allows_ip_sockets() -> None:
    found = probe(inet=True)
    assert (found["inet"], found["inet6"], found["netlink"], found["ptrace"]) == ("ok", "ok", "EAFNOSUPPORT", "EPERM")


def test_every_denied_call_has_a_number_on_every_machine() -> None:
    for _arch, numbers in ARCHES.values():
        assert set(DENIED) | {"socket"} == set(numbers)
        assert len(set(numbers.values())) == len(numbers)


def test_the_program_is_whole_instructions_and_fits_the_kernel_limit() -> None:
    for machine in ARCHES:
        code = program(machine)
        assert len(code) % 8 == 0 and len(code) // 8 < 4096


def test_an_unknown_machine_is_refused() -> None:
    with pytest.raises(SeccompError):
        program("sparc64")
