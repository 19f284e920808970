"""④ CodeAct: the model answers with a short program that calls tools as functions; it runs in Monty.

Every tool call leaves the sandboxed interpreter through ``call_tool``, routed through the tool gateway, so
validation, authorisation, approvals and idempotency apply to programs exactly as to direct calls. A program paused
at a call (an approval) is dumped as a versioned envelope and resumed in any worker process. Monty's blocking calls
run on the :class:`ProgramRunner`'s threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pydantic_monty as monty

from switchboard.core.agent.programs import (
    MONTY_VERSION,
    CappedOutput,
    PausedProgram,
    ProgramLimits,
    ProgramResult,
    ProgramSnapshotError,
    cap_output,
    from_sandbox,
    to_sandbox,
)
from switchboard.core.tools.definition import Tool
from switchboard.errors import BudgetExceededError, ToolError

__all__ = [
    "MONTY_VERSION",
    "CallTool",
    "PauseOn",
    "PauseProgram",
    "PausedProgram",
    "ProgramLimits",
    "ProgramResult",
    "ProgramRunner",
    "ProgramSnapshotError",
    "cap_output",
    "default_runner",
    "resume_program",
    "run_program",
    "tool_params",
]

logger = logging.getLogger(__name__)

CallTool = Callable[[str, dict[str, Any]], Awaitable[Any]]
PauseOn = Callable[[str, dict[str, Any]], bool]
_T = TypeVar("_T")


class PauseProgram(Exception):
    """Raised by ``call_tool`` to stop the program at this call, unmade (see :attr:`ProgramResult.paused`)."""


_DEFAULT_LIMITS = ProgramLimits()
_ERROR_CHARS = 2000
_EXC_NAMES: tuple[tuple[type[BaseException], monty.ExcType], ...] = (
    (FileNotFoundError, "FileNotFoundError"),
    (PermissionError, "PermissionError"),
    (TimeoutError, "TimeoutError"),
    (KeyError, "KeyError"),
    (IndexError, "IndexError"),
    (TypeError, "TypeError"),
    (NotImplementedError, "NotImplementedError"),
    (ValueError, "ValueError"),
    (OSError, "OSError"),
)
_TOOL_ERROR_TYPES: dict[str, monty.ExcType] = {
    "validation": "ValueError",
    "auth": "PermissionError",
    "ambiguous_timeout": "TimeoutError",
}


def tool_params(tools: Iterable[Tool]) -> dict[str, list[str]]:
    """Parameter names of each tool in declaration order, so programs may pass arguments positionally."""
    return {tool.name: list(tool.input.model_fields) for tool in tools}


class ProgramRunner:
    """A pool of Monty workers plus the threads that talk to them; each program checks a worker out.

    Workers start on first use and are reused across programs (a run then costs well under a millisecond
    of overhead). Safe to share between event loops and threads, but not across a ``fork``.
    """

    def __init__(self, *, max_processes: int | None = None, checkout_timeout_s: float = 30.0) -> None:
        """Configure the pool.

        Args:
            max_processes: Programs that may run (or wait on a tool) at once; more wait for a worker.
                Defaults to twice the CPU count, at least 4.
            checkout_timeout_s: How long a program waits for a free worker before failing.
        """
        self.max_processes = max_processes or max(4, 2 * (os.cpu_count() or 1))
        self.checkout_timeout_s = checkout_timeout_s
        self._lock = threading.Lock()
        self._pool: monty.Monty | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    def _threads(self) -> ThreadPoolExecutor:
        """The threads that talk to Monty, started on first use.

        Raises:
            RuntimeError: this process was forked from one that had started Monty (its runtime does not
                survive a ``fork``): start the runner in the child instead, or use ``spawn``.
        """
        with self._lock:
            if self._pid and self._pid != os.getpid():
                raise RuntimeError("this ProgramRunner was started before a fork; create a new one in this process")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_processes + 2, thread_name_prefix="monty")
                self._pid = os.getpid()
            return self._executor

    def _get_pool(self) -> monty.Monty:
        with self._lock:
            if self._pool is None:
                pool = monty.Monty(
                    min_processes=1, max_processes=self.max_processes, checkout_timeout=self.checkout_timeout_s
                )
                pool.__enter__()
                self._pool = pool
            return self._pool

    def close(self) -> None:
        """Stop the workers and threads (idempotent)."""
        with self._lock:
            pool, executor, self._pool, self._executor = self._pool, self._executor, None, None
            ours = self._pid == os.getpid()
        if executor is not None and ours:
            executor.shutdown(wait=False, cancel_futures=True)
        if pool is not None and ours:
            pool.__exit__(None, None, None)

    async def run(
        self,
        code: str,
        *,
        call_tool: CallTool,
        tool_names: Sequence[str] | None = None,
        inputs: Mapping[str, Any] | None = None,
        limits: ProgramLimits | None = None,
        pause_on: PauseOn | None = None,
        tool_params: Mapping[str, Sequence[str]] | None = None,
    ) -> ProgramResult:
        """Run ``code``; see :func:`run_program`."""
        limits = limits or _DEFAULT_LIMITS
        names = tuple(tool_names) if tool_names is not None else None
        values = {name: to_sandbox(value) for name, value in (inputs or {}).items()}
        for name in values:
            if not name.isidentifier() or (names is not None and name in names):
                raise ValueError(f"input {name!r} is not a valid variable name, or shadows a tool")
        params = {k: list(v) for k, v in (tool_params or {}).items()}
        program = _Program(self, limits, call_tool, names, params, pause_on, CappedOutput(limits.max_output_chars))

        async def start() -> monty.SyncSnapshot:
            return await program.call(program.open_with, "feed_start", code, values)

        return await program.execute(start)

    async def resume(
        self,
        paused: PausedProgram | bytes,
        result: Any = None,
        *,
        call_tool: CallTool,
        error: BaseException | None = None,
        pause_on: PauseOn | None = None,
        key: bytes | None = None,
    ) -> ProgramResult:
        """Continue a paused program; see :func:`resume_program`."""
        if not isinstance(paused, PausedProgram):
            paused = PausedProgram.load(bytes(paused), key=key)
        out = CappedOutput(paused.limits.max_output_chars, *paused.output)
        params = {k: list(v) for k, v in paused.tool_params.items()}
        program = _Program(self, paused.limits, call_tool, paused.tool_names, params, pause_on, out, paused.calls + 1)
        answer = _exception_for(paused.tool, error) if error is not None else _returned(result)

        async def start() -> monty.SyncSnapshot:
            snap = await program.call(program.open_with, "load_snapshot", paused.snapshot, None)
            if not isinstance(snap, monty.FunctionSnapshot) or snap.function_name != paused.tool:
                raise ProgramSnapshotError(f"the snapshot is not paused at a call to {paused.tool!r}")
            return await program.call(snap.resume, answer)

        return await program.execute(start)


class _Program:
    """One program run: its Monty session (driven on the runner's threads, one call at a time), output, calls."""

    def __init__(
        self,
        runner: ProgramRunner,
        limits: ProgramLimits,
        call_tool: CallTool,
        names: tuple[str, ...] | None,
        params: dict[str, list[str]],
        pause_on: PauseOn | None,
        out: CappedOutput,
        calls: int = 0,
    ) -> None:
        self.runner, self.limits, self.call_tool, self.names = runner, limits, call_tool, names
        self.params, self.pause_on, self.out, self.calls = params, pause_on, out, calls
        self._lock = threading.Lock()
        self._checkout: monty.MontySession | None = None
        self._closed = False

    def result(self, error: str | None = None, value: Any = None, paused: PausedProgram | None = None) -> ProgramResult:
        return ProgramResult(output=self.out.render(), value=value, error=error, calls=self.calls, paused=paused)

    async def execute(self, start: Callable[[], Awaitable[monty.SyncSnapshot]]) -> ProgramResult:
        try:
            return await self.drive(await start())
        except monty.MontyError as exc:
            return self.result(error=_describe(exc))
        except TimeoutError:  # no worker came free within the checkout timeout
            return self.result(error="no sandbox worker was free in time; try again")
        finally:
            self.close()

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.runner._threads(), self._locked, fn, args)

    def _locked(self, fn: Callable[..., _T], args: tuple[Any, ...]) -> _T:
        with self._lock:
            return fn(*args)

    def open_with(self, how: str, source: Any, inputs: dict[str, Any] | None) -> monty.SyncSnapshot:
        """Check a worker out and start the program (``feed_start``) or restore it (``load_snapshot``)."""
        if self._closed:  # cancelled before this ran: take no worker
            raise asyncio.CancelledError
        checkout = self.runner._get_pool().checkout(
            script_name="program.py", limits=self.limits.as_monty(), os_policy={"sleep": "zero"}
        )
        session = checkout.__enter__()
        self._checkout = checkout
        # tool names resolve to host functions in name lookups; calls to them are answered by hand
        lookup = {name: _never_called for name in self.names or ()}
        if how == "feed_start":
            return session.feed_start(source, inputs=inputs, external_lookup=lookup, print_callback=self.out.write)
        return session.load_snapshot(source, external_lookup=lookup, print_callback=self.out.write)

    def close(self) -> None:
        """Return the worker to the pool once any in-flight call is done (without waiting for it)."""
        self._closed = True

        def release() -> None:
            checkout, self._checkout = self._checkout, None
            if checkout is not None:
                try:
                    checkout.__exit__(None, None, None)
                except Exception as exc:  # a crashed worker is replaced by the pool; a closed pool is gone
                    logger.debug("monty session ended with %s", type(exc).__name__)

        with contextlib.suppress(RuntimeError):  # the runner is shutting down
            self.runner._threads().submit(self._locked, release, ())

    async def drive(self, snap: monty.SyncSnapshot) -> ProgramResult:
        """Answer the program's suspensions until it completes, fails, pauses or runs out of calls."""
        while not isinstance(snap, monty.MontyComplete):
            if isinstance(snap, monty.NameLookupSnapshot):
                snap = await self.call(snap.resume_auto)  # a tool name, else NameError
                continue
            if isinstance(snap, monty.FutureSnapshot):
                return self.result(error="tools are plain functions: call them without await")
            if snap.is_os_function:  # no files, environment or network: Monty's default refuses
                snap = await self.call(snap.resume_not_handled)
                continue
            name = str(snap.function_name)
            if self.names is not None and name not in self.names:
                snap = await self.call(snap.resume, _raise("NameError", f"name {name!r} is not defined"))
                continue
            try:
                args = _bind(name, snap.args, snap.kwargs, self.params.get(name))
            except TypeError as exc:
                snap = await self.call(snap.resume, _raise("TypeError", str(exc)))
                continue
            if self.calls >= self.limits.max_calls:
                return self.result(error=f"the program tried more than {self.limits.max_calls} tool calls; do less")
            if self.pause_on is not None and self.pause_on(name, args):
                return self.result(paused=await self._pause(snap, name, args))
            self.calls += 1
            try:
                value = await self.call_tool(name, args)
            except BudgetExceededError:
                raise
            except PauseProgram:  # the call did not happen: the snapshot waits at it
                self.calls -= 1
                return self.result(paused=await self._pause(snap, name, args))
            except Exception as exc:
                snap = await self.call(snap.resume, _exception_for(name, exc))
                continue
            snap = await self.call(snap.resume, _returned(value))
        return self.result(value=from_sandbox(snap.output))

    async def _pause(self, snap: monty.FunctionSnapshot, name: str, args: dict[str, Any]) -> PausedProgram:
        return PausedProgram(
            snapshot=await self.call(snap.dump),
            tool=name,
            args=args,
            calls=self.calls,
            limits=self.limits,
            tool_names=self.names,
            tool_params=self.params,
            output=(self.out.head, self.out.tail, self.out.total),
        )


def _never_called(*_args: Any, **_kwargs: Any) -> None:
    raise RuntimeError("tool calls from programs are answered by the runner")


def _raise(exc_type: monty.ExcType, message: str) -> monty.ExternalExceptionData:
    return {"exc_type": exc_type, "message": message}


def _bind(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], params: Sequence[str] | None) -> dict[str, Any]:
    bound = {str(k): from_sandbox(v) for k, v in kwargs.items()}
    if not args:
        return bound
    if params is None:
        raise TypeError(f"{name}() takes keyword arguments only: call it as {name}(name=value, ...)")
    if len(args) > len(params):
        raise TypeError(f"{name}() takes at most {len(params)} positional arguments ({', '.join(params)})")
    for param, value in zip(params, args, strict=False):
        if param in bound:
            raise TypeError(f"{name}() got multiple values for argument {param!r}")
        bound[param] = from_sandbox(value)
    return bound


def _returned(value: Any) -> monty.ExternalReturnValue:
    return {"return_value": to_sandbox(value)}


def _exception_for(tool: str, exc: BaseException) -> monty.ExternalExceptionData:
    exc_type: monty.ExcType = "RuntimeError"
    if isinstance(exc, ToolError):
        exc_type = _TOOL_ERROR_TYPES.get(exc.error_class, "RuntimeError")
    else:
        exc_type = next((name for cls, name in _EXC_NAMES if isinstance(exc, cls)), "RuntimeError")
    return _raise(exc_type, f"{tool}: {exc}")


def _describe(exc: monty.MontyError) -> str:
    if isinstance(exc, monty.MontyRuntimeError | monty.MontySyntaxError):
        text = exc.display("traceback")
    elif isinstance(exc, monty.MontyCrashedError):
        text = f"the sandbox worker stopped ({exc}); the program did not finish"
    else:
        text = str(exc)
    return cap_output(text, _ERROR_CHARS)


_default: ProgramRunner | None = None
_default_lock = threading.Lock()


def default_runner() -> ProgramRunner:
    """The process-wide runner :func:`run_program` uses (started on first use, closed at exit).

    Monty's runtime does not survive a ``fork``: a child forked after the parent ran programs gets a clear
    ``RuntimeError``; start worker processes with ``spawn``, or fork before the first program.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = ProgramRunner()
            atexit.register(_default.close)
        return _default


async def run_program(
    code: str,
    *,
    call_tool: CallTool,
    tool_names: Sequence[str] | None = None,
    inputs: Mapping[str, Any] | None = None,
    limits: ProgramLimits = _DEFAULT_LIMITS,
    pause_on: PauseOn | None = None,
    tool_params: Mapping[str, Sequence[str]] | None = None,
    runner: ProgramRunner | None = None,
) -> ProgramResult:
    """Run one program in a fresh Monty session.

    Args:
        code: The program (a Python subset: no classes with inheritance, generators, imports of
            third-party modules, files, environment or network).
        call_tool: Performs one tool call (through the tool gateway) and returns its result, or raises;
            the error then surfaces in the program as an exception it may catch. A
            :class:`~switchboard.errors.BudgetExceededError` is not caught: it ends the program and
            propagates to the caller.
        tool_names: The functions the program may call; ``None`` sends every unknown call to
            ``call_tool`` (which then answers unknown names itself).
        inputs: Globals of the program: slots and variables bound by earlier tool results.
        limits: Time, memory, output and call budgets.
        pause_on: Consulted before each call with its name and keyword arguments; true stops the program
            there and returns it in :attr:`ProgramResult.paused` (the call is not made).
        tool_params: Parameter names per tool, so positional arguments map to names
            (see :func:`tool_params`); without them tools take keyword arguments only.
        runner: The worker pool (default: :func:`default_runner`).

    Returns:
        The printed output (capped head and tail), the value of the last expression, and the error
        (traceback text) when the program failed.
    """
    return await (runner or default_runner()).run(
        code,
        call_tool=call_tool,
        tool_names=tool_names,
        inputs=inputs,
        limits=limits,
        pause_on=pause_on,
        tool_params=tool_params,
    )


async def resume_program(
    paused: PausedProgram | bytes,
    result: Any = None,
    *,
    call_tool: CallTool,
    error: BaseException | None = None,
    pause_on: PauseOn | None = None,
    key: bytes | None = None,
    runner: ProgramRunner | None = None,
) -> ProgramResult:
    """Continue a paused program, in this process or any other, with the paused call's outcome.

    Args:
        paused: The :class:`PausedProgram`, or the bytes of its :meth:`~PausedProgram.dump`.
        result: What the paused call returned (ignored when ``error`` is given).
        call_tool: Performs the program's further calls, as in :func:`run_program`.
        error: Raise this in the program at the paused call instead (e.g. ``PermissionError("approval
            denied")``); the program may catch it.
        pause_on: Gate for further calls, as in :func:`run_program`.
        key: Verify the envelope's HMAC with this key (when ``paused`` is bytes).
        runner: The worker pool (default: :func:`default_runner`).

    Raises:
        ProgramSnapshotError: the envelope is corrupt, unsigned or altered, or from another Monty version.
    """
    return await (runner or default_runner()).resume(
        paused, result, call_tool=call_tool, error=error, pause_on=pause_on, key=key
    )
