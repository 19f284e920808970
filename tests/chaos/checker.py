"""A pure checker over a chaos run's history: what was acknowledged, answered, run, killed and when.

It takes plain records (no Redis, no processes), so a failing run can be saved and checked again. What it
derives, per docs/ARCHITECTURE.md §3:

- **lost**: acknowledged messages (webhook 2xx) with neither a reply nor a dead letter;
- **duplicates**: replies beyond the first for one message;
- **inversions**: per session, a reply for message *i* recorded after a reply for a later message *j > i*;
- **runs**: intervals from the fenced ``run_started`` facts (with their epochs) to the run's terminal fact; a run
  that never finished (its worker was killed or frozen) ends when that signal reached its worker; the maximum
  number of one session's runs alive at once, and of sessions running at once;
- **takeovers**: a run starting while the session's previous run had not finished; *unexplained* when the
  previous run's worker was neither killed nor stopped before it (a second run beside a live one);
- **stale epochs**: a ``run_started`` whose epoch is lower than one already in the log (a zombie write accepted);
- **recovery**: for every kill, the time until each session it interrupted made progress again.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "History",
    "Posted",
    "Recovery",
    "Reply",
    "Report",
    "Run",
    "Signal",
    "check",
    "message_text",
    "parse_text",
]

_TEXT = re.compile(r"\bs(\d+)-m(\d+)\b")
_EPS = 0.001
_OUTCOME = {"SIGKILL": "killed", "SIGSTOP": "stopped", "REDIS_DOWN": "interrupted"}
_TERMINAL = {"run_completed", "run_failed", "run_dead_lettered", "run_cancelled"}


def message_text(session: int, index: int) -> str:
    """The text sent as message ``index`` of session ``session`` (the offline model repeats it verbatim)."""
    return f"s{session}-m{index}"


def parse_text(text: str) -> tuple[int, int] | None:
    """The ``(session, index)`` a reply (or a dead-lettered message) is about, if it names one."""
    found = _TEXT.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True, slots=True)
class Posted:
    """One webhook request the test made."""

    session: int
    index: int
    update_id: int
    status: int
    """HTTP status; 0 when the request itself failed."""
    sent_at: float
    done_at: float


@dataclass(frozen=True, slots=True)
class Reply:
    """One successful ``sendMessage`` the fake platform recorded."""

    seq: int
    chat_id: int
    text: str
    at: float


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal the harness sent to a worker process group."""

    at: float
    kind: str
    """``SIGKILL``, ``SIGSTOP`` or ``SIGCONT`` to a worker; ``REDIS_DOWN`` when Redis itself was killed (every run
    alive then died with it)."""
    worker: str | None
    """The worker id the process announced (``None`` if it had not started listening yet)."""
    pid: int


@dataclass(slots=True)
class History:
    """Everything a chaos run recorded."""

    posted: list[Posted]
    replies: list[Reply]
    events: dict[int, list[dict[str, Any]]]
    """Session index → its event log, oldest first (``decode_entries`` dicts)."""
    signals: list[Signal] = field(default_factory=list)
    dead_letters: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Session index → its dead-letter records."""
    counters: dict[str, int] = field(default_factory=dict)
    """Queue counters at the end (``send_window_duplicates``, ``fenced_rejections``, ...)."""
    chat_base: int = 10_000
    """Session ``s`` talks in chat ``chat_base + s``."""

    def dumps(self) -> str:
        """The history as JSON (to save a failing run and check it again with :meth:`loads`)."""
        return json.dumps(
            {
                "posted": [list(vars_of(p)) for p in self.posted],
                "replies": [list(vars_of(r)) for r in self.replies],
                "events": {str(k): v for k, v in self.events.items()},
                "signals": [list(vars_of(s)) for s in self.signals],
                "dead_letters": {str(k): v for k, v in self.dead_letters.items()},
                "counters": self.counters,
                "chat_base": self.chat_base,
            }
        )

    @classmethod
    def loads(cls, text: str) -> History:
        """Read a history saved with :meth:`dumps`."""
        raw = json.loads(text)
        return cls(
            posted=[Posted(*p) for p in raw["posted"]],
            replies=[Reply(*r) for r in raw["replies"]],
            events={int(k): v for k, v in raw["events"].items()},
            signals=[Signal(*s) for s in raw["signals"]],
            dead_letters={int(k): v for k, v in raw["dead_letters"].items()},
            counters=raw["counters"],
            chat_base=raw["chat_base"],
        )


def vars_of(record: Posted | Reply | Signal) -> tuple[Any, ...]:
    """A record's fields in order."""
    return tuple(getattr(record, name) for name in record.__slots__)


@dataclass(slots=True)
class Run:
    """One run of one session, from its ``run_started`` fact."""

    session: int
    message_id: str
    epoch: int
    worker: str
    start: float
    end: float | None = None
    outcome: str = "open"
    """The terminal fact's kind, ``killed``, ``stopped``, ``interrupted`` (Redis died) or ``taken_over``."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """How long the sessions a kill interrupted took to make progress again."""

    at: float
    worker: str | None
    affected: int
    seconds: float | None
    """The slowest affected session's delay; ``None`` when one never progressed; 0 when none was affected."""


@dataclass(slots=True)
class Report:
    """The checker's findings."""

    acked: int = 0
    answered: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    duplicates: dict[tuple[int, int], int] = field(default_factory=dict)
    unacked_answered: int = 0
    misrouted: list[tuple[int, int, int]] = field(default_factory=list)
    inversions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    dead_lettered: list[tuple[int, int]] = field(default_factory=list)
    runs: int = 0
    max_runs_per_session: int = 0
    max_sessions_running: int = 0
    takeovers: int = 0
    unexplained_takeovers: list[tuple[int, float, str, str]] = field(default_factory=list)
    stale_epochs: list[tuple[int, int, int]] = field(default_factory=list)
    orphan_terminals: list[tuple[int, str, str]] = field(default_factory=list)
    completions: dict[tuple[int, str], int] = field(default_factory=dict)
    """``(session, message id)`` completed more than once."""
    recoveries: list[Recovery] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)
    """Highest ``run_started`` attempt of a message → how many messages reached it."""
    window_duplicates: list[tuple[int, int]] = field(default_factory=list)
    """Duplicated messages whose first reply went out while the run that sent it was then killed or stopped."""
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def duplicate_replies(self) -> int:
        """Replies beyond the first, over all messages."""
        return sum(n - 1 for n in self.duplicates.values())

    @property
    def unexplained_duplicates(self) -> list[tuple[int, int]]:
        """Duplicated messages not explained by a kill inside the send window."""
        return [k for k in self.duplicates if k not in self.window_duplicates]

    @property
    def max_recovery_s(self) -> float | None:
        """The slowest recovery after a kill (``inf`` when a session never recovered)."""
        if not self.recoveries:
            return None
        return max(float("inf") if r.seconds is None else r.seconds for r in self.recoveries)

    def summary(self) -> str:
        """A few lines for the test output (``pytest -s``) and failure messages."""
        inversions = sum(len(v) for v in self.inversions.values())
        recovered = [r for r in self.recoveries if r.affected]
        lines = [
            f"acked={self.acked} answered={self.answered} lost={len(self.lost)} "
            f"duplicate_replies={self.duplicate_replies} dead_lettered={len(self.dead_lettered)} "
            f"unacked_answered={self.unacked_answered} misrouted={len(self.misrouted)}",
            f"order inversions={inversions} in {len(self.inversions)} sessions; runs={self.runs} "
            f"max_runs_per_session={self.max_runs_per_session} max_sessions_running={self.max_sessions_running}",
            f"takeovers={self.takeovers} unexplained={len(self.unexplained_takeovers)} "
            f"stale_epoch_starts={len(self.stale_epochs)} orphan_terminals={len(self.orphan_terminals)} "
            f"repeated_completions={len(self.completions)} attempts={dict(sorted(self.attempts.items()))}",
            f"duplicates inside a send window={len(self.window_duplicates)} "
            f"unexplained duplicates={len(self.unexplained_duplicates)}",
            f"counters={dict(sorted(self.counters.items()))}",
        ]
        if self.recoveries:
            worst = self.max_recovery_s
            shown = "never" if worst == float("inf") else f"{worst:.2f}s"
            lines.append(
                f"kills={len(self.recoveries)} interrupting={len(recovered)} "
                f"affected_sessions={sum(r.affected for r in recovered)} worst_recovery={shown}"
            )
        for label, items in (
            ("lost", self.lost),
            ("duplicates", list(self.duplicates.items())),
            ("inversions", list(self.inversions.items())),
            ("unexplained takeovers", self.unexplained_takeovers),
            ("stale epochs", self.stale_epochs),
            ("orphan terminals", self.orphan_terminals),
        ):
            if items:
                lines.append(f"  {label} (first 10): {items[:10]}")
        return "\n".join(lines)


def _at(event: dict[str, Any]) -> float:
    value = event.get("at")
    return float(value) if isinstance(value, int | float) else float(event["ts"])


def _signal_between(signals: list[Signal], worker: str, start: float, end: float) -> Signal | None:
    """The first kill or stop of ``worker``, or death of Redis, in ``[start, end]``."""
    for sig in signals:
        ours = sig.worker == worker and sig.kind in ("SIGKILL", "SIGSTOP")
        if (ours or sig.kind == "REDIS_DOWN") and start <= sig.at <= end:
            return sig
    return None


def _runs(session: int, events: list[dict[str, Any]], signals: list[Signal], report: Report) -> list[Run]:
    """Rebuild a session's runs from its event log, in log order."""
    runs: list[Run] = []
    current: Run | None = None
    top_epoch = 0
    completed: Counter[str] = Counter()

    def close(run: Run, at: float, outcome: str) -> None:
        signal = _signal_between(signals, run.worker, run.start, at)
        if signal is not None and outcome in ("taken_over", "run_dead_lettered"):
            run.end, run.outcome = signal.at, _OUTCOME[signal.kind]
        else:
            run.end, run.outcome = at, outcome

    for event in events:
        kind = event.get("kind")
        at = _at(event)
        if kind == "run_started":
            epoch = int(event.get("epoch", 0))
            if epoch < top_epoch:
                report.stale_epochs.append((session, epoch, top_epoch))
            top_epoch = max(top_epoch, epoch)
            if current is not None:
                report.takeovers += 1
                if _signal_between(signals, current.worker, current.start, at) is None:
                    report.unexplained_takeovers.append((session, at, current.worker, str(event.get("worker"))))
                    # the old run was alive when the new one began: it ends when its worker was signalled, if ever
                    later = [s.at for s in signals if s.worker == current.worker and s.kind == "SIGKILL" and s.at > at]
                    current.end, current.outcome = (min(later) if later else at), "taken_over"
                else:
                    close(current, at, "taken_over")
            current = Run(session, str(event.get("message_id")), epoch, str(event.get("worker")), at)
            runs.append(current)
        elif kind in _TERMINAL:
            message_id = str(event.get("message_id"))
            if kind == "run_completed":
                completed[message_id] += 1
            if current is not None and current.message_id == message_id:
                close(current, at, str(kind))
                current = None
            elif kind != "run_dead_lettered":  # a message past max_attempts is dead-lettered without a new run
                report.orphan_terminals.append((session, str(kind), message_id))
    if current is not None:  # never finished: interrupted by a signal (or still running when the log was read)
        signal = _signal_between(signals, current.worker, current.start, float("inf"))
        if signal is not None:
            current.end, current.outcome = signal.at, _OUTCOME[signal.kind]
    for message_id, count in completed.items():
        if count > 1:
            report.completions[(session, message_id)] = count
    return runs


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = alive = 0
    for _, step in points:  # ends sort before starts at the same instant
        alive += step
        best = max(best, alive)
    return best


def _recoveries(runs: list[Run], events: dict[int, list[dict[str, Any]]], signals: list[Signal]) -> list[Recovery]:
    out: list[Recovery] = []
    for sig in signals:
        if sig.kind != "SIGKILL":
            continue
        hit = {r.session for r in runs if r.worker == sig.worker and r.outcome == "killed" and r.end == sig.at}
        delays: list[float | None] = []
        for session in hit:
            later = [
                _at(e)
                for e in events.get(session, [])
                if e.get("kind") in ("run_started", "run_dead_lettered") and _at(e) > sig.at
            ]
            delays.append(min(later) - sig.at if later else None)
        worst: float | None = 0.0
        if delays:
            worst = None if any(d is None for d in delays) else max(d for d in delays if d is not None)
        out.append(Recovery(sig.at, sig.worker, len(hit), worst))
    return out


def check(history: History) -> Report:
    """Derive the :class:`Report` of a run's history (pure: no I/O)."""
    report = Report(counters=dict(history.counters))
    acked = {(p.session, p.index) for p in history.posted if 200 <= p.status < 300}
    report.acked = len(acked)
    first_seen: dict[int, list[int]] = defaultdict(list)
    counts: Counter[tuple[int, int]] = Counter()
    for reply in sorted(history.replies, key=lambda r: r.seq):
        found = parse_text(reply.text)
        if found is None:
            continue  # a notice (dead letter) or another kind of send
        session, index = found
        if reply.chat_id != history.chat_base + session:
            report.misrouted.append((session, index, reply.chat_id))
        counts[found] += 1
        if counts[found] == 1:
            first_seen[session].append(index)
    dead = {
        found
        for records in history.dead_letters.values()
        for record in records
        for message in record.get("messages", [])
        if (found := parse_text(str(message.get("text", "")))) is not None
    }
    report.dead_lettered = sorted(dead)
    report.answered = len(set(counts) & acked)
    report.unacked_answered = len(set(counts) - acked)
    report.lost = sorted(acked - set(counts) - dead)
    report.duplicates = {k: n for k, n in sorted(counts.items()) if n > 1}
    for session, order in first_seen.items():
        bad: list[tuple[int, int]] = []
        highest = -1
        for index in order:
            if index < highest:
                bad.append((highest, index))
            highest = max(highest, index)
        if bad:
            report.inversions[session] = bad
    runs: list[Run] = []
    for session, events in sorted(history.events.items()):
        session_runs = _runs(session, events, history.signals, report)
        # starts are logged to the millisecond: an end within 1 ms of the next start is not an overlap
        closed = [(r.start, r.end - _EPS) for r in session_runs if r.end is not None]
        report.max_runs_per_session = max(report.max_runs_per_session, _max_overlap(closed))
        runs.extend(session_runs)
    report.runs = len(runs)
    report.max_sessions_running = _max_overlap(
        [(r.start, r.end) for r in runs if r.end is not None and r.outcome == "run_completed"]
    )
    report.recoveries = _recoveries(runs, history.events, history.signals)
    top: dict[tuple[int, str], int] = {}
    for session, events in history.events.items():
        for event in events:
            if event.get("kind") == "run_started":
                key = (session, str(event.get("message_id")))
                top[key] = max(top.get(key, 0), int(event.get("attempt", 1)))
    report.attempts = dict(Counter(top.values()))
    report.window_duplicates = _window_duplicates(report.duplicates, history, runs)
    return report


def _window_duplicates(
    duplicates: dict[tuple[int, int], int], history: History, runs: list[Run]
) -> list[tuple[int, int]]:
    """Duplicates whose first reply came from a run that was then killed (or frozen) before recording it.

    The run that sent a reply is the session's last run started before the fake recorded it (runs of one
    session follow each other; the next one starts a lease TTL after a kill). The fake may record a send a
    moment after the kill that cut its run short (the request was already on the wire), so the kill time
    itself is not compared.
    """
    first: dict[tuple[int, int], float] = {}
    for reply in sorted(history.replies, key=lambda r: r.seq):
        found = parse_text(reply.text)
        if found in duplicates and found not in first:
            first[found] = reply.at
    explained: list[tuple[int, int]] = []
    for (session, index), at in sorted(first.items()):
        before = [run for run in runs if run.session == session and run.start <= at]
        if before and max(before, key=lambda run: run.start).outcome in _OUTCOME.values():
            explained.append((session, index))
    return explained
