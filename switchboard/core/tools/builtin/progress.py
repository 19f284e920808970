"""What a long tool call shows the user while it runs: one status message, kept up to date, then its final state.

Where the channel edits, one status message is posted after ``after_s`` and edited under the chat's edit budget;
where it cannot, at most ``notices`` plain messages, further and further apart, never a flood. Progress is best
effort: it never fails the call and is never the agent's reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, assert_never

from switchboard.core.tools.status import StatusMessage

__all__ = [
    "FINAL_WAIT_S",
    "NOTICE_SPACING",
    "Ending",
    "Progress",
    "ProgressOptions",
    "duration",
    "notice_times",
]

logger = logging.getLogger(__name__)

NOTICE_SPACING = 6.0
"""On a channel that cannot edit, each notice comes this many times later (since the call began) than the last."""
FINAL_WAIT_S = 5.0
"""Longest the end of a call waits for its status message to take its final state (after a post still in flight)."""
SHOWN_STEPS = 6
"""Commands listed one per line in the status message; the rest are counted."""

Ending = Literal["done", "timed_out", "stopped", "failed"]
"""How a call ended: its commands finished, one hit its deadline, the call was cancelled, or it raised."""


@dataclass(frozen=True, slots=True)
class ProgressOptions:
    """When and how often a running call tells the user (``SWITCHBOARD_SANDBOX__PROGRESS_*``)."""

    after_s: float = 5.0
    """A call that ends sooner shows nothing (0: never show progress)."""
    every_s: float = 5.0
    """How often the status message is brought up to date where the channel edits (the edit budget may skip one)."""
    notices: int = 2
    """Most messages a call posts where the channel cannot edit."""


def notice_times(after_s: float, notices: int) -> list[float]:
    """Seconds into the call at which a channel that cannot edit gets a notice."""
    return [after_s * NOTICE_SPACING**n for n in range(max(notices, 0))]


def duration(seconds: float) -> str:
    """``12 s``, ``2 min 05 s``, ``1 h 03 min`` (whole units, never rounding up)."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class Progress:
    """The status message of one call over ``labels`` (its commands), as an async context around the call.

    Inside the block the call reports each command's end with :meth:`finished` and, before it leaves, how the whole
    call ended with :meth:`end`; an exception leaving the block ends it as ``stopped`` (cancelled) or ``failed``.
    """

    def __init__(
        self,
        status: StatusMessage | None,
        labels: list[str],
        options: ProgressOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._status = status
        self._labels = labels
        self._options = options
        self._clock = clock
        self._started = clock()
        self._outcomes: list[str | None] = [None] * len(labels)
        self._ending: Ending = "done"
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._posted = False
        self.shown = ""
        """The text the status message shows (empty: nothing posted)."""
        self.posts = 0
        """Messages posted (one where the channel edits; up to ``notices`` where it cannot)."""

    def finished(self, index: int, outcome: str) -> None:
        """Command ``index`` ended (``exit 0``, ``timed out``): shown at the next update, which comes early."""
        self._outcomes[index] = outcome
        if any(o is None for o in self._outcomes):  # the last one's end is shown by the final state
            self._changed.set()

    def end(self, ending: Ending) -> None:
        """How the call ended, when it leaves the block without an exception."""
        self._ending = ending

    def text(self, ending: Ending | None = None) -> str:
        """The status message: what runs and for how long, or (``ending``) how the call ended."""
        took = duration(self._clock() - self._started)
        single = len(self._labels) == 1
        what = f"`{self._labels[0]}`" if single else f"{len(self._labels)} commands"
        match ending:
            case None:
                head = f"⏳ Running {what} — {took}"
            case "done":
                head = f"✅ Done in {took}"
            case "timed_out":
                head = f"⏹ Timed out after {took}"
            case "stopped":
                head = f"⏹ Stopped after {took}"
            case "failed":
                head = f"⚠️ Failed after {took}"
            case _:
                assert_never(ending)
        if single:
            outcome = self._outcomes[0]
            return head if ending is None else f"{head}: `{self._labels[0]}`" + (f" ({outcome})" if outcome else "")
        lines = [head]
        for label, outcome in list(zip(self._labels, self._outcomes, strict=True))[:SHOWN_STEPS]:
            state = outcome or ("running" if ending is None else "not finished")
            lines.append(f"• `{label}` — {state}")
        if len(self._labels) > SHOWN_STEPS:
            rest = self._outcomes[SHOWN_STEPS:]
            done = sum(o is not None for o in rest)
            lines.append(f"• … {len(rest)} more ({done} finished)")
        return "\n".join(lines)

    async def __aenter__(self) -> Progress:
        if self._status is not None and self._options.after_s > 0:
            self._task = asyncio.create_task(self._run(self._status))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._task is None or self._status is None:
            return
        # a status message's post and edit complete in order even when their caller stops waiting, so cancelling the
        # updates mid-request is safe: the final edit below still lands after any update or post in flight
        self._task.cancel()
        await asyncio.wait([self._task])  # never raises: a cancellation of this call still reaches it below
        if not self._status.edits or not self._posted:
            return  # nothing to edit: the reply follows (a channel that cannot edit gets no "done" notice)
        ending: Ending = self._ending
        if kind is not None:
            ending = "stopped" if issubclass(kind, asyncio.CancelledError) else "failed"
        final = self.text(ending)
        try:  # a post or hold that outlasts the wait is left to the status message, which the turn's end settles
            shown = await asyncio.wait_for(self._status.edit(final, final=True), FINAL_WAIT_S)
        except Exception as err:  # progress is best effort: never fails the call
            logger.debug("final status not shown: %s", type(err).__name__)
        else:
            if shown:
                self.shown = final

    async def _run(self, status: StatusMessage) -> None:
        try:
            await asyncio.sleep(self._options.after_s)
            if status.edits:
                await self._keep_up(status)
            else:
                await self._notices(status)
        except Exception as err:  # progress is best effort: never fails the call
            logger.debug("progress stopped: %s", type(err).__name__)

    async def _post(self, status: StatusMessage, text: str) -> bool:
        """Post ``text`` (a post the end of the call cuts off still lands, then takes the final state)."""
        self._posted = True
        posted = await status.post(text)
        if posted:
            self.posts += 1
            self.shown = text
        return posted

    async def _keep_up(self, status: StatusMessage) -> None:
        if not await self._post(status, self.text()):
            return
        while True:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(self._options.every_s, 0.05))
            text = self.text()
            if text != self.shown and await status.edit(text):
                self.shown = text

    async def _notices(self, status: StatusMessage) -> None:
        for at in notice_times(self._options.after_s, self._options.notices):
            wait = self._started + at - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._post(status, self.text())
