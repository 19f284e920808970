"""The progress policy of a long tool call: what the status message says, when it is posted, edited and ended.

The channel end is a recorder of the :class:`~switchboard.core.tools.status.StatusMessage` calls (the queue layer's real
one is tested through the fake platforms in ``tests/sandbox/test_shell_progress.py``).
"""

from __future__ import annotations

import asyncio

import pytest

from switchboard.core.tools.builtin.progress import Progress, ProgressOptions, duration, notice_times


class Status:
    """Records what the policy asks of the channel."""

    def __init__(self, *, edits: bool, fail: bool = False) -> None:
        self.edits = edits
        self.fail = fail
        self.posted: list[str] = []
        self.edited: list[tuple[str, bool]] = []
        self.changed = asyncio.Event()

    async def post(self, text: str) -> bool:
        if self.fail:
            raise RuntimeError("the platform is down")
        self.posted.append(text)
        self.changed.set()
        return True

    async def edit(self, text: str, *, final: bool = False) -> bool:
        if self.fail:
            raise RuntimeError("the platform is down")
        self.edited.append((text, final))
        self.changed.set()
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def until(check: Status, count: int, edits: bool = False) -> None:
    while len(check.edited if edits else check.posted) < count:
        check.changed.clear()
        await asyncio.wait_for(check.changed.wait(), 10)


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.4, "0 s"), (12.9, "12 s"), (65, "1 min 05 s"), (3725, "1 h 02 min"), (-1, "0 s")]
)
def test_durations_read_naturally_and_never_round_up(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_notices_come_further_and_further_apart() -> None:
    assert notice_times(5.0, 3) == [5.0, 30.0, 180.0]
    assert notice_times(5.0, 0) == []


def test_one_command_is_named_in_the_header_and_several_are_listed_with_their_outcomes() -> None:
    clock = Clock()
    one = Progress(None, ["make"], ProgressOptions(), clock=clock)
    clock.now += 7.5
    assert one.text() == "⏳ Running `make` — 7 s"
    one.finished(0, "exit 2")
    assert one.text("done") == "✅ Done in 7 s: `make` (exit 2)"

    many = Progress(None, [f"job {n}" for n in range(8)], ProgressOptions(), clock=clock)
    many.finished(1, "exit 0")
    many.finished(7, "timed out")
    clock.now += 30
    assert many.text().splitlines() == [
        "⏳ Running 8 commands — 30 s",
        "• `job 0` — running",
        "• `job 1` — exit 0",
        "• `job 2` — running",
        "• `job 3` — running",
        "• `job 4` — running",
        "• `job 5` — running",
        "• … 2 more (1 finished)",
    ]
    assert many.text("timed_out").splitlines()[:2] == ["⏹ Timed out after 30 s", "• `job 0` — not finished"]
    assert many.text("stopped").startswith("⏹ Stopped after 30 s")
    assert many.text("failed").startswith("⚠️ Failed after 30 s")


async def test_an_editing_channel_gets_one_message_edited_as_commands_finish_then_the_final_state() -> None:
    status = Status(edits=True)
    progress = Progress(status, ["slow", "quick"], ProgressOptions(after_s=0.01, every_s=60), clock=Clock())
    async with progress:
        await until(status, 1)
        progress.finished(1, "exit 0")  # wakes the update at once, long before every_s
        await until(status, 1, edits=True)
        progress.finished(0, "exit 3")
    assert status.posted == ["⏳ Running 2 commands — 0 s\n• `slow` — running\n• `quick` — running"]
    assert status.edited == [
        ("⏳ Running 2 commands — 0 s\n• `slow` — running\n• `quick` — exit 0", False),
        ("✅ Done in 0 s\n• `slow` — exit 3\n• `quick` — exit 0", True),
    ]


async def test_a_channel_that_cannot_edit_gets_at_most_the_bounded_notices_and_no_final_state() -> None:
    status = Status(edits=False)
    options = ProgressOptions(after_s=0.01, every_s=0.01, notices=2)
    async with Progress(status, ["slow"], options):
        await until(status, 2)
        await asyncio.sleep(notice_times(0.01, 3)[-1] * 3)  # well past when a third notice would be due
    assert len(status.posted) == 2 and all(p.startswith("⏳ Running `slow` — ") for p in status.posted)
    assert status.edited == []


async def test_a_cancelled_call_ends_its_status_as_stopped_and_is_still_cancelled() -> None:
    status = Status(edits=True)
    started = asyncio.Event()

    async def call() -> None:
        async with Progress(status, ["slow"], ProgressOptions(after_s=0.01, every_s=0.01)):
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(call())
    await started.wait()
    await until(status, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert status.edited[-1][1] and status.edited[-1][0].startswith("⏹ Stopped after "), status.edited
    edits = len(status.edited)
    await asyncio.sleep(0.1)  # ten update intervals: none comes after the end
    assert len(status.edited) == edits


async def test_a_failing_channel_never_fails_the_call() -> None:
    status = Status(edits=True, fail=True)
    async with Progress(status, ["slow"], ProgressOptions(after_s=0.01, every_s=0.01)) as progress:
        await asyncio.sleep(0.1)
        progress.end("done")
    assert (status.posted, status.edited) == ([], [])


async def test_a_call_that_ends_first_shows_nothing() -> None:
    status = Status(edits=True)
    async with Progress(status, ["quick"], ProgressOptions(after_s=30)):
        pass
    assert (status.posted, status.edited) == ([], [])


class SlowPost(Status):
    """A channel whose post is answered only once ``answer`` is set (the platform is slow)."""

    def __init__(self) -> None:
        super().__init__(edits=True)
        self.answer = asyncio.Event()
        self.asked = asyncio.Event()

    async def post(self, text: str) -> bool:
        self.asked.set()
        await self.answer.wait()
        return await super().post(text)


async def test_a_post_still_in_flight_when_the_call_ends_is_still_given_the_final_state() -> None:
    """The status message orders its post before the final edit: the policy asks for the final state regardless."""
    status = SlowPost()
    async with Progress(status, ["slow"], ProgressOptions(after_s=0.01, every_s=60)) as progress:
        await asyncio.wait_for(status.asked.wait(), 10)
        progress.end("done")
    assert status.posted == [] and [final for _, final in status.edited] == [True]
    assert status.edited[0][0].startswith("✅ Done in ")
