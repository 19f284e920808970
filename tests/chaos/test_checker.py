"""The history checker on hand-made histories: each thing it must catch, it catches (pure, no processes)."""

from __future__ import annotations

from typing import Any

from .checker import History, Posted, Reply, Signal, check, message_text

BASE = 10_000


def _posted(*pairs: tuple[int, int], status: int = 200) -> list[Posted]:
    return [Posted(s, i, s * 1000 + i, status, 0.0, 0.0) for s, i in pairs]


def _replies(*items: tuple[int, int] | tuple[int, int, int], at: float = 0.0) -> list[Reply]:
    out: list[Reply] = []
    for seq, item in enumerate(items, 1):
        session, index = item[0], item[1]
        chat = item[2] if len(item) == 3 else BASE + session
        out.append(Reply(seq, chat, f'You said: "{message_text(session, index)}".', at + seq))
    return out


def _start(at: float, message: str, epoch: int, worker: str, attempt: int = 1) -> dict[str, Any]:
    return {
        "kind": "run_started",
        "at": at,
        "message_id": message,
        "epoch": epoch,
        "worker": worker,
        "attempt": attempt,
    }


def _done(at: float, message: str, kind: str = "run_completed") -> dict[str, Any]:
    return {"kind": kind, "at": at, "message_id": message}


def test_clean_history_passes() -> None:
    events = {0: [_start(1.0, "a", 1, "w1"), _done(1.5, "a"), _start(1.6, "b", 1, "w1"), _done(2.0, "b")]}
    report = check(History(_posted((0, 0), (0, 1)), _replies((0, 0), (0, 1)), events))
    assert (report.acked, report.answered, report.runs, report.max_runs_per_session) == (2, 2, 2, 1)
    assert not (report.lost or report.duplicates or report.inversions or report.misrouted or report.takeovers)


def test_lost_duplicated_inverted_and_misrouted_replies_are_reported() -> None:
    posted = _posted((0, 0), (0, 1), (0, 2), (1, 0))
    replies = _replies((0, 1), (0, 0), (0, 1), (1, 0, BASE + 7))
    report = check(History(posted, replies, {}))
    assert report.lost == [(0, 2)]
    assert report.duplicates == {(0, 1): 2} and report.duplicate_replies == 1
    assert report.inversions == {0: [(1, 0)]}
    assert report.misrouted == [(1, 0, BASE + 7)]


def test_unacknowledged_answers_and_dead_letters_are_not_lost() -> None:
    dead = {0: [{"messages": [{"text": message_text(0, 1)}], "reason": "x"}]}
    report = check(
        History(_posted((0, 0), (0, 1)) + _posted((0, 2), status=503), _replies((0, 0), (0, 2)), {}, [], dead)
    )
    assert not report.lost and report.dead_lettered == [(0, 1)] and report.unacked_answered == 1


def test_a_second_run_beside_a_live_one_is_caught() -> None:
    # w1 started a run, w2 started another while w1 was still alive (it was only killed later)
    events = {0: [_start(1.0, "a", 1, "w1"), _start(2.0, "a", 2, "w2", 2), _done(2.5, "a")]}
    signals = [Signal(3.0, "SIGKILL", "w1", 1)]
    report = check(History(_posted((0, 0)), _replies((0, 0)), events, signals))
    assert report.unexplained_takeovers == [(0, 2.0, "w1", "w2")]
    assert report.max_runs_per_session == 2


def test_a_takeover_after_a_kill_is_one_run_at_a_time_and_its_recovery_is_timed() -> None:
    events = {0: [_start(1.0, "a", 1, "w1"), _start(3.5, "a", 2, "w2", 2), _done(4.0, "a")]}
    signals = [Signal(1.2, "SIGKILL", "w1", 1)]
    report = check(History(_posted((0, 0)), _replies((0, 0)), events, signals))
    assert report.takeovers == 1 and not report.unexplained_takeovers and report.max_runs_per_session == 1
    assert len(report.recoveries) == 1 and report.recoveries[0].affected == 1
    assert report.max_recovery_s is not None and abs(report.max_recovery_s - 2.3) < 1e-9


def test_a_session_that_never_recovers_is_reported() -> None:
    events = {0: [_start(1.0, "a", 1, "w1")]}
    report = check(History(_posted((0, 0)), [], events, [Signal(1.2, "SIGKILL", "w1", 1)]))
    assert report.recoveries[0].seconds is None and report.max_recovery_s == float("inf")
    assert report.lost == [(0, 0)]


def test_stale_epochs_and_orphan_completions_are_caught() -> None:
    events = {
        0: [
            _start(1.0, "a", 2, "w2"),
            _start(1.1, "a", 1, "w1"),  # an older epoch accepted after a newer one
            _done(1.5, "a"),
            _done(1.6, "a"),  # completed twice
        ]
    }
    report = check(History(_posted((0, 0)), _replies((0, 0)), events))
    assert report.stale_epochs == [(0, 1, 2)]
    assert report.completions == {(0, "a"): 2}
    assert report.orphan_terminals == [(0, "run_completed", "a")]


def test_duplicates_are_attributed_to_kills_inside_the_send_window_only() -> None:
    # session 0: the reply went out, then w1 was killed before recording it; w2 re-sent it
    # session 1: both replies came from completed runs: nothing excuses the second one
    events = {
        0: [_start(1.0, "a", 1, "w1"), _start(4.0, "a", 2, "w2", 2), _done(4.5, "a")],
        1: [_start(1.0, "b", 1, "w3"), _done(1.5, "b"), _start(2.0, "b", 1, "w3"), _done(2.5, "b")],
    }
    replies = [
        Reply(1, BASE, message_text(0, 0), 1.3),
        Reply(2, BASE + 1, message_text(1, 0), 1.4),
        Reply(3, BASE + 1, message_text(1, 0), 2.4),
        Reply(4, BASE, message_text(0, 0), 4.4),
    ]
    report = check(History(_posted((0, 0), (1, 0)), replies, events, [Signal(1.35, "SIGKILL", "w1", 1)]))
    assert report.window_duplicates == [(0, 0)]
    assert report.unexplained_duplicates == [(1, 0)]


def test_history_round_trips_through_json() -> None:
    history = History(
        _posted((0, 0)),
        _replies((0, 0)),
        {0: [_start(1.0, "a", 1, "w1"), _done(1.5, "a")]},
        [Signal(2.0, "SIGSTOP", "w1", 5)],
        {},
        {"fenced_rejections": 1},
    )
    again = History.loads(history.dumps())
    assert again == history
    assert check(again).summary() == check(history).summary()
