"""The Landlock launcher: confine the command, run it, and end whatever it leaves behind (builtin modules only).

The worker prepares what does not depend on the launcher's own process (:func:`payload`: this module's code and the
seccomp filter as one ``marshal`` blob; the Landlock ruleset as an inherited descriptor), so the launcher starts
within a millisecond or two of a bare interpreter: no ``site``, no source to compile, no module but ``_ctypes``.
Any failure to confine exits with status 126 before the command starts (:func:`main`): a command never runs less
confined than asked.
"""

import _ctypes
import _signal  # type: ignore[import-not-found]  # the C module: ``signal`` imports ``enum``
import marshal
import posix
import sys
import time

__all__ = [
    "FAILED",
    "drop_capabilities",
    "enforce",
    "install_filter",
    "launch",
    "launcher_argv",
    "main",
    "payload",
    "sweep",
]

FAILED = 126
_RESTRICT_SELF = 446  # the same on x86_64 and aarch64
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_EINVAL = 22
_STOP_SIGNALS: tuple[int, ...] = (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGINT)
_SIGKILL: int = _signal.SIGKILL

_BOOTSTRAP = """\
import marshal, posix, sys
try:
    fd, chunks = int(sys.argv[1]), []
    while chunk := posix.read(fd, 65536):
        chunks.append(chunk)
    posix.close(fd)
    code, seccomp = marshal.loads(b"".join(chunks))
    launcher = {"__name__": "switchboard_sandbox_launcher"}
    exec(code, launcher)
except BaseException as err:
    sys.stderr.write(f"sandbox: could not start the launcher: {err!r}\\n")
    sys.stderr.flush()
    posix._exit(126)
launcher["launch"](seccomp, sys.argv[2:])
"""
"""What ``python -I -S -c`` runs: this module's code and the filter, read from the payload pipe (a pipe, not a
file: nothing on disk that a command could change for the next one)."""

_PAYLOAD_MAX = 60_000
"""Largest payload: the runner writes it into the pipe before the launcher starts (a pipe holds 64 KiB)."""
_PAYLOADS: dict[bytes, bytes] = {}


class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "i"


class _UShort(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "H"


class _Pointer(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "P"


class _Char(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "c"


class _Function(_ctypes.CFuncPtr):
    """A function of this process's C library returning ``int`` and keeping ``errno`` (``ctypes.CDLL``'s kind)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Library:
    """The symbols of this process (its C library among them): ``ctypes.CDLL(None)``."""

    _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]


def _libc(name: str) -> _Function:
    return _Function((name, _Library))  # type: ignore[arg-type]  # any object with a ``_handle``, as ``CDLL`` has


def _failed(call: str) -> OSError:
    errno = _ctypes.get_errno()
    return OSError(errno, f"{call} failed: {posix.strerror(errno)}")


def _buffer(data: bytes) -> "_ctypes.Array[_Char]":
    """A writable C copy of ``data`` (kept alive by the caller while the kernel reads it)."""
    array: _ctypes.Array[_Char] = (_Char * max(len(data), 1)).from_buffer_copy(data.ljust(1, b"\0"))
    return array


def enforce(rules: int) -> None:
    """Set ``no_new_privs`` and confine the calling process (and what it executes) to the Landlock ruleset ``rules``.

    Raises:
        OSError: the kernel refused.
    """
    if _libc("prctl")(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
    if _libc("syscall")(_RESTRICT_SELF, rules, 0) != 0:
        raise _failed("landlock_restrict_self")


class _FProg(_ctypes.Structure):
    _fields_ = [("len", _UShort), ("filter", _Pointer)]


def install_filter(program: bytes) -> None:
    """Load a seccomp program (``struct sock_filter[]`` bytes) into the calling process, after ``no_new_privs``.

    Raises:
        OSError: the kernel refused it.
    """
    code = _buffer(program)
    prog = _FProg(len(program) // 8, _ctypes.addressof(code))
    prctl = _libc("prctl")
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
    if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _ctypes.byref(prog), 0, 0) != 0:
        raise _failed("prctl(PR_SET_SECCOMP)")


def payload(seccomp: bytes) -> bytes:
    """What the runner writes into the launcher's payload pipe: this module's compiled code and ``seccomp``.

    The code is compiled from this file once per worker process and filter (the launcher compiles nothing), so every
    command of the worker runs the launcher the worker itself imported.

    Raises:
        OSError: the payload would not fit into a pipe.
    """
    found = _PAYLOADS.get(seccomp)
    if found is None:
        with open(__file__, "rb") as source:
            code = compile(source.read(), __file__, "exec", dont_inherit=True, optimize=2)
        found = marshal.dumps((code, seccomp))
        if len(found) > _PAYLOAD_MAX:
            raise OSError(f"the launcher's payload is {len(found)} bytes, more than a pipe holds")
        _PAYLOADS[seccomp] = found
    return found


def launcher_argv(payload_fd: int, ruleset_fd: int) -> list[str]:
    """The launcher's command line up to ``--`` (the command follows); ``ruleset_fd`` ``-1``: no Landlock."""
    return [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, str(payload_fd), str(ruleset_fd), "--"]


_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SECURE_ALL_LOCKED = 0x3F  # noroot, no_setuid_fixup, keep_caps_locked (and their locks)
_CAP_VERSION_3 = 0x20080522
_LAST_CAP = 63


def drop_capabilities() -> None:
    """Give up every capability for good (the process stays uid 0 where it was root, with no privilege).

    Raises:
        OSError: the kernel refused a step.
    """
    prctl = _libc("prctl")
    if prctl(_PR_SET_SECUREBITS, _SECURE_ALL_LOCKED, 0, 0, 0) != 0:
        raise _failed("prctl(PR_SET_SECUREBITS)")
    for cap in range(_LAST_CAP + 1):
        if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and _ctypes.get_errno() != _EINVAL:  # no such capability
            raise _failed(f"prctl(PR_CAPBSET_DROP, {cap})")
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _buffer(_CAP_VERSION_3.to_bytes(4, sys.byteorder) + bytes(4))  # {version, pid 0: this process}
    data = _buffer(bytes(24))  # two {effective, permitted, inheritable} sets, all empty
    if _libc("capset")(header, data) != 0:
        raise _failed("capset")


class _Stopped(Exception):
    """The runner asked the launcher to end the command (its deadline passed, or the call was cancelled)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/*/children``; ``None`` when the kernel does not offer them."""
    found: list[int] = []
    try:
        tasks = posix.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as children:
                found += [int(each) for each in children.read().split()]
        except FileNotFoundError:
            if not _exists(f"/proc/{pid}"):
                return found  # the process went away meanwhile
            return None  # no CONFIG_PROC_CHILDREN: the caller scans every process
        except OSError:
            continue
    return found


def _exists(path: str) -> bool:
    try:
        posix.stat(path)
    except OSError:
        return False
    return True


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree (read from ``/proc``)."""
    found: list[int] = []
    todo = _children(root)
    if todo is None:
        return _descendants_by_scan(root)
    while todo:
        pid = todo.pop()
        found.append(pid)
        below = _children(pid)
        if below is None:
            return _descendants_by_scan(root)
        todo += below
    return found


def _descendants_by_scan(root: int) -> list[int]:
    """:func:`_descendants` from the parent of every process (kernels without ``/proc/PID/task/TID/children``)."""
    children: dict[int, list[int]] = {}
    for entry in posix.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def sweep(rounds: int = 2000) -> None:
    """SIGKILL every process below this one and reap them, until none is left.

    This process is a child subreaper, so whatever a command left behind (a daemon in a session of its own, a
    double fork) is re-parented here when its parent dies and stays in reach.
    """
    me = posix.getpid()
    for _ in range(rounds):
        try:  # no child at all means nothing below: an orphan would have been re-parented here
            if posix.waitpid(-1, posix.WNOHANG)[0] > 0:
                continue
        except ChildProcessError:
            return
        for pid in _descendants(me):
            try:
                posix.kill(pid, _SIGKILL)
            except OSError:
                continue  # gone meanwhile
        reaped = False
        try:
            while posix.waitpid(-1, posix.WNOHANG)[0] > 0:
                reaped = True
        except ChildProcessError:
            return  # no child left: every descendant is gone (orphans come back here as children)
        if not reaped:
            time.sleep(0.01)


def _execvp(command: list[str]) -> None:
    """``os.execvp``: become ``command``, found on ``PATH`` unless its name holds a slash (never returns).

    Raises:
        OSError: no such program (the error of the last candidate that was not merely missing, else the last).
    """
    if "/" in command[0]:
        posix.execv(command[0], command)
    missing: OSError = FileNotFoundError(2, "No such file or directory", command[0])
    refused: OSError | None = None
    for folder in posix.environ.get(b"PATH", b"/usr/bin:/bin").split(b":"):
        try:
            posix.execv(f"{folder.decode() or '.'}/{command[0]}", command)
        except (FileNotFoundError, NotADirectoryError) as err:
            missing = err
        except OSError as err:
            refused = refused or err
    raise refused or missing


def _exec(rules: int, seccomp: bytes, command: list[str]) -> None:
    """In the forked child: confine, then become the command (never returns)."""
    try:
        for signum in _STOP_SIGNALS:
            _signal.signal(signum, _signal.SIG_DFL)
        if rules >= 0:
            enforce(rules)
            posix.close(rules)
        if seccomp:
            install_filter(seccomp)
        _execvp(command)
    except (OSError, ValueError, KeyError) as err:
        sys.stderr.write(f"sandbox: could not confine the command: {err}\n")
        sys.stderr.flush()
    posix._exit(FAILED)


def main(seccomp: bytes, argv: list[str]) -> int:
    """Confine and run ``argv`` after ``--``, then end whatever it left behind; returns the command's exit status.

    ``argv[0]`` is the inherited ruleset's descriptor (``-1``: no Landlock, the weak floor). The launcher stays as
    the command's parent and a child subreaper. The command runs confined (Landlock's nested domain scopes its
    signals, so it cannot kill the launcher on ABI 6+); when it exits — or when the launcher gets SIGTERM from the
    runner at the deadline — every process it started, daemons included, is killed.

    The launcher (already in its own session, with a scrubbed environment) drops every capability if it runs as root
    (bounding set, ambient, effective, permitted; securebits locked so that ``execve`` gives none back: uid 0 keeps only
    what the owner bits of its files allow), sets ``no_new_privs``, and makes itself a child subreaper. It then forks
    the command, which enforces the ruleset — read and execute beneath the read-only roots, everything beneath the
    writable ones, no TCP bind or connect (ABI 4+), no signals or abstract unix sockets outside its domain (ABI 6+, so
    the command cannot kill its launcher) — loads the seccomp filter, and executes. When the command exits, or the
    runner sends SIGTERM at the deadline, the launcher SIGKILLs every process below it — a daemon that left the process
    group with ``setsid`` is re-parented to the subreaper, so it is among them — and exits with the command's status.
    The weak floor uses the same launcher with seccomp but without a ruleset (``RULESET_FD`` is ``-1``). Any failure to
    confine exits with status 126 before the command starts: a command never runs less confined than asked.
    """
    rules = -1
    try:
        rules = int(argv[0])
        command = argv[argv.index("--") + 1 :]
        if not command:
            raise ValueError("no command")
        if rules >= 0:
            posix.set_inheritable(rules, False)  # the command's process closes it once enforced; nothing else gets it
        if posix.geteuid() == 0:
            drop_capabilities()
        prctl = _libc("prctl")
        if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise _failed("prctl(PR_SET_CHILD_SUBREAPER)")
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
    except (OSError, ValueError, IndexError) as err:
        sys.stderr.write(f"sandbox: could not confine the command: {err}\n")
        return FAILED
    for signum in _STOP_SIGNALS:
        _signal.signal(signum, _stop)
    code = 128 + _SIGKILL
    try:
        child = posix.fork()
        if child == 0:
            _exec(rules, seccomp, command)
        if rules >= 0:
            posix.close(rules)
        while True:
            pid, status = posix.waitpid(-1, 0)  # reaps orphans re-parented here too
            if pid == child:
                code = posix.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
    except _Stopped:
        pass
    finally:
        for signum in _STOP_SIGNALS:
            _signal.signal(signum, _signal.SIG_IGN)
        sweep()
    return code


def launch(seccomp: bytes, argv: list[str]) -> None:
    """The launcher's entry point (from :data:`_BOOTSTRAP`): :func:`main`, then exit with its status at once."""
    status = main(seccomp, argv)
    sys.stderr.flush()
    posix._exit(status)  # no interpreter shutdown: the runner is waiting for this exit
