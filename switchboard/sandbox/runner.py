"""Run one shell command in a fresh sandbox over a workspace, with limits, and capture its output.

:class:`Sandbox` is chosen once at start-up (``bwrap``, ``landlock`` or ``weak``). Each command runs in a process
group of its own, killed whole at its deadline or on cancellation, with its cgroups swept or a memory watchdog where
there are none; under Landlock and the weak floor the launcher is a subreaper and kills what the command left, so
nothing a command started outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, assert_never

from switchboard.sandbox import confine
from switchboard.sandbox.bwrap import (
    WORKSPACE,
    bwrap_argv,
    options_through_fd,
    proxy_binds,
    python_prefixes,
    system_binds,
)
from switchboard.sandbox.capture import StreamCapture, read_into
from switchboard.sandbox.landlock import ruleset
from switchboard.sandbox.limits import CommandCgroup, CommandLimits, memfd_memory, process_tree, tasks_of_this_user
from switchboard.sandbox.seccomp import SeccompError, program

__all__ = ["GRANT_SHOWN_AS", "CommandResult", "EgressAccess", "Isolation", "Sandbox"]

Isolation = Literal["bwrap", "landlock", "weak"]
"""Which sandbox runs commands (strongest first)."""

_PATH = "/usr/local/bin:/usr/bin:/bin"
_DRAIN_S = 1.0
"""After the command ended, how long its output pipes may stay open (a stray holder is killed before)."""
_SWEEP_S = 5.0
"""How long a Landlock/weak launcher may take to kill its command's processes after SIGTERM."""
_WATCH_S = 0.1
"""How often the memory watchdog sums the resident memory of a command's processes (no memory cgroup)."""
_PROGRAM_LINE = 16 * 2**20
"""Longest line a long-lived program may write on its stdout (one JSON-RPC message of an MCP server)."""
GRANT_SHOWN_AS = "<egress-grant>"
"""What a command's output shows in place of its egress grant's token (``echo $HTTP_PROXY``)."""


@dataclass(frozen=True, slots=True)
class EgressAccess:
    """One call's way out through the host's egress proxy (bubblewrap only; other kinds keep no network).

    The proxy knows the command by ``token`` (its grant for one agent and session, valid while the call runs).
    """

    socket: Path
    """The proxy's unix socket on the host: bound into the sandbox, reached through the bridge."""
    ca_cert: Path
    """The deployment CA's certificate on the host, bound read-only at :data:`~switchboard.sandbox.bwrap.CA_CERT`."""
    environment: Mapping[str, str]
    """``HTTP(S)_PROXY`` with the token, ``NO_PROXY``, and the CA variables naming the certificate inside."""
    token: str
    """The grant's token: replaced by :data:`GRANT_SHOWN_AS` in whatever the command prints."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command produced."""

    stdout: str
    stderr: str
    exit_code: int | None
    """``None`` when it was killed at its deadline."""
    timed_out: bool
    duration_s: float

    def outcome(self) -> dict[str, object]:
        """The Responses API's outcome: ``{"type": "exit", "exit_code": n}`` or ``{"type": "timeout"}``."""
        if self.timed_out:
            return {"type": "timeout"}
        return {"type": "exit", "exit_code": self.exit_code}


@dataclass(slots=True)
class Sandbox:
    """The sandbox every command of this worker runs in."""

    kind: Isolation
    limits: CommandLimits = field(default_factory=CommandLimits)
    bwrap: str = ""
    """The ``bwrap`` executable (``kind == "bwrap"``)."""
    prlimit: str = "prlimit"
    seccomp: bytes = b""
    pids_root: Path | None = None
    """Where per-command ``pids`` cgroups are made (root workers); ``None``: ``RLIMIT_NPROC`` caps processes."""
    memory_root: Path | None = None
    """Where per-command memory cgroups are made; ``None``: a watchdog enforces the command's memory budget."""
    concurrency: int = 16
    """Commands running at once in this worker; more wait for a slot."""
    detail: str = ""
    """How the isolation was established, for ``switchboard check`` and the session record."""
    proxy_socket: Path | None = None
    """A unix socket bound into every command (bubblewrap only), reached through ``HTTP(S)_PROXY`` without a grant;
    the worker passes its egress proxy per call instead (:class:`EgressAccess`)."""
    seccomp_inet: bytes = b""
    """The filter that also allows IP sockets, for commands with egress (made on first use)."""
    seccomp_local: bytes = b""
    """The filter of Landlock and weak commands, which refuses ``AF_UNIX`` sockets (made on first use)."""
    _slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = field(default_factory=dict)
    """The concurrency slots of each event loop using this sandbox (detection probes in a loop of its own)."""

    @property
    def label(self) -> str:
        """The isolation's short name, recorded with every result: ``bwrap+seccomp``, ``landlock+seccomp``, ``weak``."""
        match self.kind:
            case "bwrap":
                return "bwrap+seccomp"
            case "landlock":
                return "landlock+seccomp"
            case "weak":
                return "weak"
            case _:
                assert_never(self.kind)

    def _env(self, tmp: str, home: str) -> dict[str, str]:
        path = ":".join([*(f"{p}/bin" for p in python_prefixes()), _PATH])
        return {
            "PATH": path,
            "HOME": home,
            "TMPDIR": tmp,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            "MPLCONFIGDIR": f"{tmp}/matplotlib",
        }

    def _filter(self, egress: EgressAccess | None) -> bytes:
        """The seccomp program of a command.

        Bubblewrap: ``AF_UNIX`` sockets stay allowed (its mount namespace holds no host socket but the egress
        proxy's, bound in on purpose), and IP sockets only when the command reaches the proxy over the sandbox's
        loopback. Landlock and the weak floor share the host's file system, and Landlock does not mediate
        ``connect()`` to a pathname socket: their filter refuses ``AF_UNIX`` sockets (the weak floor keeps its IP
        sockets: it has no network isolation anyway).
        """
        match self.kind:
            case "bwrap":
                if egress is None or self.proxy_socket is not None:
                    return self.seccomp  # with a socket bound into every command, built with IP sockets already
                if not self.seccomp_inet:
                    self.seccomp_inet = program(inet=True)
                return self.seccomp_inet
            case "landlock" | "weak":
                if not self.seccomp_local:
                    try:
                        self.seccomp_local = program(inet=self.kind == "weak", unix=False, shared_pids=True)
                    except SeccompError:  # no table for this machine: only the weak floor runs without one
                        return b""
                return self.seccomp_local
            case _:
                assert_never(self.kind)

    def _argv(
        self,
        command: str,
        workspace: Path,
        tmp: str,
        seccomp_fd: int,
        egress: EgressAccess | None = None,
        ruleset_fd: int = -1,
        file_bytes: int | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """The full command line and the environment of the spawned process.

        ``seccomp_fd``: the pipe holding the seccomp filter (bubblewrap) or the launcher's payload (Landlock, weak:
        :func:`~switchboard.sandbox.confine.payload`); ``ruleset_fd``: the command's Landlock ruleset (``-1``: none,
        :func:`~switchboard.sandbox.landlock.ruleset`); ``file_bytes``: a lower file-size limit (``RLIMIT_FSIZE``).
        """
        shared = self.kind != "bwrap" and self.pids_root is None  # no user namespace: counted with the worker's
        limit = self.limits.prlimit_argv(  # + 1: the launcher stays, as the command's parent
            self.prlimit,
            nproc=self.pids_root is None,
            already=tasks_of_this_user() + 1 if shared else 0,
            file_bytes=file_bytes,
        )
        shell = ["/bin/sh", "-c", command]
        match self.kind:
            case "bwrap":
                env = self._env("/tmp", WORKSPACE)  # noqa: S108 - the sandbox's private tmpfs
                if egress is not None:
                    extra, bridge = proxy_binds(
                        egress.socket, env, ca_cert=egress.ca_cert, environment=egress.environment
                    )
                else:
                    extra, bridge = proxy_binds(self.proxy_socket, env)
                head = bwrap_argv(  # its options (--setenv with the grant among them) go through a memfd
                    self.bwrap,
                    workspace,
                    seccomp_fd=seccomp_fd,
                    tmp_bytes=self.limits.tmp_mb * 2**20,
                    env=env,
                    extra=extra,
                )
                return [*head, *bridge, *limit, *shell], {}
            case "landlock" | "weak":
                launcher = confine.launcher_argv(seccomp_fd, ruleset_fd)
                return [*launcher, *limit, *shell], self._env(tmp, str(workspace))
            case _:
                assert_never(self.kind)

    async def run(
        self,
        command: str,
        workspace: Path,
        *,
        timeout_s: float,
        max_output: int,
        egress: EgressAccess | None = None,
        stop: asyncio.Event | None = None,
        file_bytes: int | None = None,
    ) -> CommandResult:
        """Run ``command`` with ``/bin/sh -c`` over ``workspace``; never raises for what the command does.

        ``egress``: the command's way to the egress proxy (used by bubblewrap; the other kinds have no network).
        Cancelling the awaiting task kills the command's process group, and so does setting ``stop`` (the result
        is then that of a killed command, not a timeout). ``file_bytes``: the largest file it may write, if lower
        than the sandbox's limit (``0``: none at all).
        """
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            for stale in [other for other in self._slots if other.is_closed()]:
                del self._slots[stale]
            slots = self._slots[loop] = asyncio.Semaphore(self.limits.slots(self.concurrency))
        if self.kind != "bwrap":
            egress = None
        async with slots:
            deadline = min(timeout_s, self.limits.max_wall_s)
            done = await self._run(command, workspace, deadline, max_output, egress, stop, file_bytes)
        if egress is None or not egress.token:
            return done
        hide = egress.token
        return replace(
            done, stdout=done.stdout.replace(hide, GRANT_SHOWN_AS), stderr=done.stderr.replace(hide, GRANT_SHOWN_AS)
        )

    async def _run(
        self,
        command: str,
        workspace: Path,
        timeout_s: float,
        max_output: int,
        egress: EgressAccess | None,
        stop: asyncio.Event | None = None,
        file_bytes: int | None = None,
    ) -> CommandResult:
        tmp = tempfile.mkdtemp(prefix="sb-tmp-") if self.kind != "bwrap" else ""
        read_fd, write_fd = os.pipe()
        rules = options_fd = -1
        cgroup = None
        if self.pids_root is not None or self.memory_root is not None:
            cgroup = CommandCgroup(self.limits, pids_root=self.pids_root, memory_root=self.memory_root)
        started = time.monotonic()
        try:
            launched = self.kind != "bwrap"  # by the launcher, which gets its code and the filter in the pipe
            os.write(write_fd, confine.payload(self._filter(None)) if launched else self._filter(egress))
            os.close(write_fd)
            write_fd = -1
            if self.kind == "landlock":  # the system and the Python prefixes bubblewrap binds, read-only
                rules = ruleset(_read_only_roots(), [str(workspace), tmp, "/dev/null"])
            argv, env = self._argv(command, workspace, tmp, read_fd, egress, rules, file_bytes)
            if self.kind == "bwrap":  # pid 1 inside is bubblewrap: its command line names no host path
                argv, options_fd = options_through_fd(argv, read_fd)
            if cgroup is not None:  # join the cgroups before anything forks
                argv = [*_JOIN, *cgroup.procs, "--", *argv]
            loop = asyncio.get_running_loop()
            exited = asyncio.Event()
            transport, protocol = await loop.subprocess_exec(
                lambda: _Protocol(exited, loop),
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=tuple(fd for fd in (read_fd, rules, options_fd) if fd >= 0),
                env=env,
                cwd="/" if self.kind == "bwrap" else str(workspace),  # bubblewrap changes into the workspace itself
            )
            proc = asyncio.subprocess.Process(transport, protocol, loop)
            for fd in (read_fd, rules, options_fd):
                if fd >= 0:
                    os.close(fd)
            read_fd = rules = options_fd = -1
            return await self._collect(proc, transport, exited, cgroup, timeout_s, max_output, started, stop)
        finally:
            for fd in (read_fd, write_fd, rules, options_fd):
                if fd >= 0:
                    os.close(fd)
            if cgroup is not None:
                cgroup.remove()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)

    @contextlib.asynccontextmanager
    async def program(
        self,
        command: Sequence[str],
        workspace: Path,
        *,
        egress: EgressAccess | None = None,
        env: Mapping[str, str] | None = None,
        binds: Sequence[str] = (),
    ) -> AsyncIterator[asyncio.subprocess.Process]:
        """Start a long-lived program (a stdio MCP server) in a fresh bubblewrap sandbox over ``workspace``.

        The sandbox is a command's (same namespaces, mounts, seccomp filter and limits, bar the wall-clock deadline and
        the concurrency slots), its stdin, stdout and stderr are pipes, and it is killed whole when the block ends.
        ``env``: variables besides the sandbox's own (the proxy's come last); ``binds``: more bubblewrap options (a
        read-only program file). Where no memory cgroup can be made, each process is bound by ``RLIMIT_AS`` alone.

        Raises:
            ValueError: this sandbox is not bubblewrap (Landlock and the weak floor share the host's file system).
            OSError: the sandbox could not be started.
        """
        if self.kind != "bwrap":
            raise ValueError(f"a {self.label} sandbox cannot hold a long-lived program (bubblewrap only)")
        read_fd, write_fd = os.pipe()
        options_fd = -1
        cgroup = None
        proc: asyncio.subprocess.Process | None = None
        if self.pids_root is not None or self.memory_root is not None:
            cgroup = CommandCgroup(self.limits, pids_root=self.pids_root, memory_root=self.memory_root)
        try:
            os.write(write_fd, self._filter(egress))
            os.close(write_fd)
            write_fd = -1
            inside = {**(env or {}), **self._env("/tmp", WORKSPACE)}  # noqa: S108 - the sandbox's private tmpfs
            if egress is not None:
                extra, bridge = proxy_binds(
                    egress.socket, inside, ca_cert=egress.ca_cert, environment=egress.environment
                )
            else:
                extra, bridge = proxy_binds(self.proxy_socket, inside)
            head = bwrap_argv(
                self.bwrap,
                workspace,
                seccomp_fd=read_fd,
                tmp_bytes=self.limits.tmp_mb * 2**20,
                env=inside,
                extra=[*extra, *binds],
            )
            limit = self.limits.prlimit_argv(self.prlimit, nproc=self.pids_root is None)
            argv, options_fd = options_through_fd([*head, *bridge, *limit, *command], read_fd)
            if cgroup is not None:
                argv = [*_JOIN, *cgroup.procs, "--", *argv]
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(read_fd, options_fd),
                env={},
                cwd="/",
                limit=_PROGRAM_LINE,
            )
            for fd in (read_fd, options_fd):
                os.close(fd)
            read_fd = options_fd = -1
            yield proc
        finally:
            for fd in (read_fd, write_fd, options_fd):
                if fd >= 0:
                    os.close(fd)
            if proc is not None:
                _kill(proc, cgroup)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), _SWEEP_S)
            if cgroup is not None:
                await _emptied(cgroup)
                cgroup.remove()

    async def _collect(
        self,
        proc: asyncio.subprocess.Process,
        transport: asyncio.SubprocessTransport,
        exited: asyncio.Event,
        cgroup: CommandCgroup | None,
        timeout_s: float,
        max_output: int,
        started: float,
        stop: asyncio.Event | None = None,
    ) -> CommandResult:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = StreamCapture(max_output), StreamCapture(max_output)
        readers = asyncio.gather(read_into(proc.stdout, out), read_into(proc.stderr, err))
        timed_out = False
        tripped = asyncio.Event()
        watchdog = asyncio.create_task(self._watch_memory(proc.pid, tripped)) if self.memory_root is None else None
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    await _first(exited, stop)  # not proc.wait(): that also waits for every holder of the pipes
            except TimeoutError:
                timed_out = True
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if self.kind != "bwrap" and not exited.is_set():
                await _stop_launcher(proc, exited)
            _kill(proc, cgroup)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(readers), _DRAIN_S)
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await readers
            if cgroup is not None:
                await _emptied(cgroup)
            transport.close()  # a process still holding the pipes after the group kill keeps nobody waiting
            await asyncio.shield(exited.wait())
            if watchdog is not None:
                await asyncio.wait([watchdog])
        duration = time.monotonic() - started
        code = None if timed_out else proc.returncode
        if code is not None and code < 0:  # killed by a signal: the shell's convention
            code = 128 - code
        stderr = err.text()
        budget = f"its memory budget of {self.limits.memory_mb} MB (all its processes together)"
        if tripped.is_set():
            stderr += f"\nsandbox: the command was killed: it passed {budget}\n"
        elif cgroup is not None and (killed := cgroup.oom_kills()):
            stderr += f"\nsandbox: {killed} process(es) of the command killed: it passed {budget}\n"
        return CommandResult(out.text(), stderr, code, timed_out, duration)

    async def _watch_memory(self, root: int, tripped: asyncio.Event) -> None:
        """Kill the command's process tree when its resident memory and its memfds pass the budget; set ``tripped``.

        For hosts without a memory cgroup. Sampled every :data:`_WATCH_S`: a burst between two samples goes unseen.
        """
        budget = self.limits.memory_mb * 2**20
        while True:
            await asyncio.sleep(_WATCH_S)
            tree = await asyncio.to_thread(process_tree, root)
            if not tree:
                return
            if sum(tree.values()) + await asyncio.to_thread(memfd_memory, tree) > budget:
                tripped.set()
                for _ in range(3):  # what forked meanwhile
                    for pid in tree:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                    tree = await asyncio.to_thread(process_tree, root)
                return


_JOIN = ["/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"', "sh"]
"""Join the cgroup files that follow (up to ``--``), then become the command."""


async def _first(exited: asyncio.Event, stop: asyncio.Event | None) -> None:
    """Wait until the command exits, or until ``stop`` is set."""
    if stop is None:
        await exited.wait()
        return
    waits = [asyncio.ensure_future(exited.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stream protocol of :func:`asyncio.create_subprocess_exec`, telling at once when the process exits."""

    def __init__(self, exited: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self._exited = exited

    def process_exited(self) -> None:
        super().process_exited()
        self._exited.set()


_DEVICES = ["/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"]
"""Character devices a Landlock command reads (bubblewrap's ``--dev`` has them too); ``/dev/null`` is writable."""


def _read_only_roots() -> list[str]:
    """The read-only system paths of the Landlock sandbox (the same set bubblewrap binds, and harmless devices)."""
    binds = system_binds()
    return [binds[i + 1] for i, option in enumerate(binds) if option == "--ro-bind"] + _DEVICES


async def _stop_launcher(proc: asyncio.subprocess.Process, exited: asyncio.Event) -> None:
    """Ask the Landlock/weak launcher to kill every process of its command (daemons included), then wait for it.

    A plain group kill would take the launcher down first, and a daemon that left the group would survive; if the
    launcher does not exit within :data:`_SWEEP_S` (killed by an unscoped command), the group kill follows anyway.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(exited.wait()), _SWEEP_S)


def _kill(proc: asyncio.subprocess.Process, cgroup: CommandCgroup | None) -> None:
    """SIGKILL the command's process group, and every process left in its cgroup."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if cgroup is not None:
        _kill_all(cgroup)


async def _emptied(cgroup: CommandCgroup) -> None:
    """Wait (briefly) until the cgroups hold no process, so they can be removed."""
    for _ in range(50):
        if not cgroup.members():
            return
        _kill_all(cgroup)
        await asyncio.sleep(0.02)


def _kill_all(cgroup: CommandCgroup) -> None:
    for pid in cgroup.members():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
