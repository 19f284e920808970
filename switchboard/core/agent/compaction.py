"""④ Deterministic compaction: recent turns verbatim, older ones folded into a fixed-schema record.

No model is asked: the record (``gw.compaction/1``) is canonical JSON built from the history entries alone, so the
same entries always give byte-identical output and its ``source_sha256`` lets an audit re-derive it. Cuts fall on turn
boundaries, never between a tool call and its result. Native compaction (:mod:`switchboard.core.agent.native`) falls
back to this.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from switchboard.core.agent.programs import cap_output
from switchboard.core.turn import HistoryEntry

__all__ = [
    "ENTRY_OVERHEAD",
    "MIN_BUDGET_CHARS",
    "SCHEMA",
    "Compacted",
    "canonical_json",
    "compact",
    "entry_chars",
    "estimate_tokens",
    "render_record",
    "split_turns",
]

SCHEMA = "gw.compaction/1"
ENTRY_OVERHEAD = 16
"""Characters counted per entry on top of its text (role, separators)."""
USER_TEXT_CHARS = 400
MIN_BUDGET_CHARS = 600
KNOWN_WRITES = frozenset({"write_file", "send_file", "offer_choice"})
SLOT_TOOLS = frozenset({"update_plan", "update_context", "update_state"})
_IN_DOUBT = frozenset({"ambiguous_timeout", "ambiguous"})
"""Failures of a write after it was sent: the record says it may have happened, never plain ``error``."""
# per rendering level: (items, chars) for user messages and for every other section; level 3 shows counts only
_LEVELS = ((12, 400, 10, 200), (6, 200, 5, 120), (2, 100, 2, 80))
_CHOSEN = re.compile(r"chose option (\S+)(?: \((.*)\))?", re.DOTALL)
"""A click on an offered option, as :func:`switchboard.core.inbound.event_text` writes it."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def estimate_tokens(text: str) -> int:
    """A deterministic upper-leaning token estimate: four ASCII characters or one other character each."""
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


def entry_chars(entry: HistoryEntry) -> int:
    """What one entry costs in the prompt, in characters: its text, its tool calls and a fixed overhead."""
    calls = entry.meta.get("tool_calls")
    return len(entry.text) + ENTRY_OVERHEAD + (len(canonical_json(calls)) if calls else 0)


def _calls(entry: HistoryEntry) -> list[dict[str, Any]]:
    calls = entry.meta.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _call_id(entry: HistoryEntry) -> str | None:
    found = entry.meta.get("call_id") or entry.meta.get("tool_call_id")
    return str(found) if found is not None else None


def split_turns(entries: Sequence[HistoryEntry]) -> list[list[HistoryEntry]]:
    """Entries grouped into turns: a user message opens a turn unless a tool call still awaits its result."""
    turns: list[list[HistoryEntry]] = []
    current: list[HistoryEntry] = []
    waiting: list[str] = []
    for entry in entries:
        if entry.role == "user" and current and not waiting:
            turns.append(current)
            current = []
        current.append(entry)
        if entry.role == "assistant":
            calls = _calls(entry)
            waiting = [str(c.get("id", "")) for c in calls] if calls else []  # an answer closes stale calls
        elif entry.role == "tool" and waiting:
            call_id = _call_id(entry)
            waiting.remove(call_id) if call_id in waiting else waiting.pop(0)
    if current:
        turns.append(current)
    return turns


def _ints(value: Any) -> Any:
    """JSON data without floats (canonical form): integral floats become ints, others strings."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else repr(value)
    if isinstance(value, dict):
        return {str(k): _ints(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_ints(v) for v in value]
    return value if value is None or isinstance(value, bool | int | str) else str(value)


def _flat(text: str, limit: int) -> str:
    return cap_output(" ".join(str(text).split()), limit)


@dataclass(frozen=True)
class _Call:
    turn: int
    seq: int
    name: str
    args: dict[str, Any]
    meta: dict[str, Any]
    """The result entry's meta (empty when no result was recorded)."""
    has_result: bool


def _args(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # some providers carry arguments as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def _collect_calls(turns: list[list[HistoryEntry]], seq_of: Callable[[HistoryEntry], int]) -> list[_Call]:
    """Every tool call of the folded turns, paired with its result entry where one was recorded."""
    found: list[_Call] = []
    for number, turn in enumerate(turns, start=1):
        asked: dict[str, tuple[HistoryEntry, dict[str, Any]]] = {}
        for entry in turn:
            for call in _calls(entry):
                asked[str(call.get("id", ""))] = (entry, call)
            if entry.role != "tool":
                continue
            name = entry.meta.get("tool") or entry.meta.get("name")
            call_id = _call_id(entry)
            if call_id not in asked:  # no id: the oldest open call of that name (or any) is the one answered
                call_id = next((k for k, (_, c) in asked.items() if name in (None, c.get("name"))), None)
            call = asked.pop(call_id, (entry, {}))[1] if call_id is not None else {}
            args = _args(entry.meta.get("args") or entry.meta.get("arguments") or call.get("arguments"))
            found.append(
                _Call(number, seq_of(entry), str(name or call.get("name") or "tool"), args, dict(entry.meta), True)
            )
        for entry, call in asked.values():  # calls whose result never arrived (a crash mid-call)
            found.append(
                _Call(number, seq_of(entry), str(call.get("name", "tool")), _args(call.get("arguments")), {}, False)
            )
    return sorted(found, key=lambda c: (c.seq, c.name))


def _status(call: _Call) -> str:
    """``ok``, ``error``, or what keeps the effect open: in doubt (it may have happened) or waiting for a person."""
    if not call.has_result:
        return "unknown_after_crash"
    status = call.meta.get("status")
    if isinstance(status, str):
        return status
    if call.meta.get("error_class") in _IN_DOUBT:
        return f"in_doubt_{call.meta['error_class']}"
    if call.meta.get("error_class") == "needs_approval":
        return "waiting_for_approval"
    return "error" if call.meta.get("ok") is False else "ok"


def _item(turn: int, kind: str, text: Any, seq: int) -> dict[str, Any]:
    return {"turn": turn, "kind": kind, "text": _flat(str(text), USER_TEXT_CHARS), "ref_seq": seq}


class _Fold:
    """The record's sections, filled from the folded entries and the tool calls they hold."""

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []
        self.questions: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self.reads: dict[str, int] = {}
        self.citations: dict[str, dict[str, Any]] = {}
        self.artifacts: dict[str, dict[str, Any]] = {}
        self.slots: dict[str, Any] = {"plan_sha256": None, "context_paths": [], "state_keys": []}

    def entry(self, entry: HistoryEntry, turn: int, seq: int) -> None:
        explicit = entry.meta.get("decision")
        if isinstance(explicit, dict):
            self.decisions.append(_item(turn, str(explicit.get("kind", "decision")), explicit.get("text", ""), seq))
        approval = entry.meta.get("approval")
        if isinstance(approval, dict):
            status = str(approval.get("status", ""))
            about = f"{approval.get('tool', '')} {approval.get('text', '')}".strip()
            if status in {"approved", "denied"}:
                self.decisions.append(_item(turn, "approval", f"{status}: {about}", seq))
            elif status in {"pending", "expired"}:
                self.questions.append(_item(turn, f"approval_{status}", about, seq))

    def slot(self, call: _Call) -> None:
        if call.name == "update_plan":
            self.decisions.append(_item(call.turn, "plan_change", canonical_json(call.args), call.seq))
            self.slots["plan_sha256"] = hashlib.sha256(canonical_json(_ints(call.args)).encode()).hexdigest()
        elif call.name == "update_context":
            self.slots["context_paths"] = [str(p) for p in call.args.get("paths") or []][:50]
        else:
            self.slots["state_keys"] = sorted(str(k) for k in call.args.get("values") or {})[:50]

    def choice(self, call: _Call, answer: HistoryEntry | None, answer_turn: int | None, answer_seq: int) -> None:
        question = str(call.args.get("question", ""))
        options: set[str] = (
            set()
        )  # labels and ids: a typed answer names a label, a click comes as "chose option <id> (<label>)"
        for option in call.args.get("options") or []:
            named = [option.get("id"), option.get("label")] if isinstance(option, dict) else [option]
            options.update(str(name).strip() for name in named if name is not None)
        text = answer.text.strip() if answer is not None else ""
        clicked = _CHOSEN.fullmatch(text)
        if answer is None:
            self.questions.append(_item(call.turn, "ask_user_unanswered", question, call.seq))
        elif answer_turn is not None and ({*clicked.groups()} if clicked else {text}) & options:
            self.decisions.append(_item(answer_turn, "user_choice", f"{question} → {text}", answer_seq))

    def write(self, call: _Call) -> None:
        self.effects.append(
            {
                "turn": call.turn,
                "tool": call.name,
                "class": "write",
                "status": _status(call),
                "action_sha256": call.meta.get("action_sha256"),
                "idempotency_key": call.meta.get("idempotency_key"),
                "resources": [str(r) for r in call.meta.get("resources") or []][:20],
                "result_ref": call.meta.get("file") or call.meta.get("result_ref"),
                "ref_seq": call.seq,
            }
        )
        if call.name == "write_file" and call.args.get("path") and _status(call) == "ok":
            self.artifact(str(call.args["path"]), call, call.meta.get("sha256"))

    def read(self, call: _Call) -> None:
        self.reads[call.name] = self.reads.get(call.name, 0) + 1
        cited = [c for c in call.meta.get("citations") or [] if isinstance(c, dict)]
        ref = call.args.get("url") or (f"file:{call.args['path']}" if call.args.get("path") else None)
        for found in [{"ref": ref, "title": ""}, *cited]:
            key = str(found.get("ref") or "")
            if key and key not in self.citations:
                title = _flat(str(found.get("title") or ""), 200)
                self.citations[key] = {"turn": call.turn, "ref": key, "title": title, "ref_seq": call.seq}

    def artifact(self, path: str, call: _Call, sha256: Any = None) -> None:
        self.artifacts.pop(path, None)  # the latest write of a path is the one that counts
        self.artifacts[path] = {"path": path, "sha256": sha256, "turn": call.turn, "ref_seq": call.seq}


def _record(
    turns: list[list[HistoryEntry]],
    covered: int,
    later: list[HistoryEntry],
    seq_of: Callable[[HistoryEntry], int],
    canonical: dict[int, str],
) -> dict[str, Any]:
    folded = turns[:covered]
    entries = [e for turn in folded for e in turn]
    turn_of = {id(e): n for n, turn in enumerate(folded, start=1) for e in turn}
    users = [e for e in entries if e.role == "user"]
    replies = users[1:] + [e for e in later if e.role == "user"]
    fold = _Fold()
    for entry in entries:
        fold.entry(entry, turn_of[id(entry)], seq_of(entry))
    calls = _collect_calls(folded, seq_of)
    for call in calls:
        if call.name in SLOT_TOOLS:
            fold.slot(call)
            continue
        if call.name == "offer_choice":
            answer = next((u for u in replies if seq_of(u) > call.seq), None)
            fold.choice(call, answer, turn_of.get(id(answer)), seq_of(answer) if answer else 0)
        if (call.meta.get("side_effect") or ("write" if call.name in KNOWN_WRITES else "read")) == "write":
            fold.write(call)
        else:
            fold.read(call)
        for path in call.meta.get("artifacts") or []:
            fold.artifact(str(path), call)
    usage = [e.meta["usage"] for e in entries if isinstance(e.meta.get("usage"), dict)]
    seqs = [seq_of(e) for e in entries]
    source = "[" + ",".join(canonical[id(e)] for e in entries) + "]"  # = canonical_json of the entries' list
    record = {
        "schema": SCHEMA,
        "covers": {"turn_from": 1, "turn_to": covered, "seq_from": min(seqs), "seq_to": max(seqs)},
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "user_constraints": [
            {"turn": turn_of[id(u)], "msg_id": u.message_id, "text": u.text[:USER_TEXT_CHARS], "ref_seq": seq_of(u)}
            for u in users
        ],
        "decisions": sorted(fold.decisions, key=lambda d: (d["ref_seq"], d["kind"])),
        "open_questions": sorted(fold.questions, key=lambda q: (q["ref_seq"], q["kind"])),
        "tool_effects": fold.effects,
        "reads": dict(sorted(fold.reads.items())),
        "citations": sorted(fold.citations.values(), key=lambda c: (c["ref_seq"], c["ref"])),
        "artifacts": sorted(fold.artifacts.values(), key=lambda a: (a["ref_seq"], a["path"])),
        "slots_at_end": fold.slots,
        "usage": {
            "turns": covered,
            "tool_calls": len(calls),
            "cost_units": sum(round(float(c.meta.get("cost") or 0)) for c in calls),
            "input_tokens": sum(int(u.get("input_tokens") or 0) for u in usage),
            "output_tokens": sum(int(u.get("output_tokens") or 0) for u in usage),
        },
        "omitted": {
            "events": len(entries),
            "bytes": sum(len(e.text.encode()) for e in entries),
            "log_range": [min(seqs), max(seqs)],
        },
    }
    return dict(_ints(record))


def _canonical_entry(entry: HistoryEntry) -> str:
    """One entry as canonical JSON, as hashed into ``source_sha256``."""
    at_ms = int(entry.at * 1000)
    return canonical_json(
        {"role": entry.role, "text": entry.text, "message_id": entry.message_id, "at_ms": at_ms, "meta": entry.meta}
    )


def _section(
    title: str, items: list[dict[str, Any]], line: Callable[[dict[str, Any]], str], cap: int, head: int = 0
) -> list[str]:
    """A titled list of at most ``cap`` items: the first ``head`` and the most recent rest, with an overflow line."""
    if not items:
        return []
    lines = [f"{title}:"]
    if len(items) <= cap:
        return lines + [f"- {line(item)}" for item in items]
    head = min(head, cap)
    tail = cap - head
    skipped = items[head : len(items) - tail]
    seqs = [int(item["ref_seq"]) for item in skipped]
    lines += [f"- {line(item)}" for item in items[:head]]
    lines.append(f"- +{len(skipped)} more (log {min(seqs)}–{max(seqs)})")
    return lines + [f"- {line(item)}" for item in items[len(items) - tail :]]


def render_record(record: dict[str, Any], level: int = 0) -> str:
    """The record as prompt text, from a fixed template; higher ``level`` shows less (3: counts only)."""
    covers = record["covers"]
    lines = [
        f"[Earlier conversation, compacted ({record['schema']}): turns {covers['turn_from']}–{covers['turn_to']}, "
        f"log {covers['seq_from']}–{covers['seq_to']}. search_history reads it in full.]"
    ]
    users, decisions, questions = record["user_constraints"], record["decisions"], record["open_questions"]
    effects, citations, artifacts = record["tool_effects"], record["citations"], record["artifacts"]
    if level >= len(_LEVELS):
        counts = {
            "user messages": len(users),
            "decisions": len(decisions),
            "open questions": len(questions),
            "tool effects": len(effects),
        }
        lines.append("Folded: " + ", ".join(f"{n} {name}" for name, n in counts.items() if n) + ".")
    else:
        user_cap, user_chars, cap, chars = _LEVELS[level]
        lines += _section(
            "User said",
            users,
            lambda u: f"[t{u['turn']}] {_flat(u['text'], user_chars)}",
            user_cap,
            head=max(1, user_cap // 3),
        )
        lines += _section(
            "Decisions", decisions, lambda d: f"[t{d['turn']}] {d['kind']}: {_flat(d['text'], chars)}", cap
        )
        lines += _section(
            "Open questions", questions, lambda q: f"[t{q['turn']}] {q['kind']}: {_flat(q['text'], chars)}", cap
        )
        lines += _section("Tool effects", effects, lambda e: _flat(_effect(e), chars), cap)
        if record["reads"]:
            lines.append("Reads: " + ", ".join(f"{name} ×{n}" for name, n in record["reads"].items()))
        lines += _section(
            "Citations", citations, lambda c: _flat(f"[t{c['turn']}] {c['ref']} {c['title']}", chars), cap
        )
        lines += _section("Artifacts", artifacts, lambda a: _flat(f"[t{a['turn']}] {a['path']}", chars), cap)
    usage = record["usage"]
    lines.append(f"Usage: {usage['turns']} turns, {usage['tool_calls']} tool calls, {usage['cost_units']} cost units.")
    return "\n".join(lines)


def _effect(effect: dict[str, Any]) -> str:
    text = f"[t{effect['turn']}] {effect['tool']} {effect['status']}"
    if effect["resources"]:
        text += " " + ", ".join(effect["resources"])
    if effect["result_ref"]:
        text += f" → {effect['result_ref']}"
    return text


@dataclass(frozen=True)
class Compacted:
    """What the prompt gets: the recent turns verbatim and, when older turns were folded, the record."""

    recent: list[HistoryEntry]
    record: dict[str, Any] | None
    rendered: str
    """The record through the fixed template ("" without a record)."""

    @property
    def chars(self) -> int:
        """Characters this costs in the prompt, counted as :func:`entry_chars` counts them."""
        extra = len(self.rendered) + ENTRY_OVERHEAD if self.rendered else 0
        return extra + sum(entry_chars(e) for e in self.recent)

    @property
    def record_json(self) -> str | None:
        """The record as canonical JSON (what is stored and hashed)."""
        return canonical_json(self.record) if self.record is not None else None

    @property
    def record_sha256(self) -> str | None:
        """Identity of the record (sha256 of its canonical JSON), for ``prev`` links and audits."""
        found = self.record_json
        return hashlib.sha256(found.encode()).hexdigest() if found is not None else None

    def entries(self) -> list[HistoryEntry]:
        """The history to send: the rendered record as a leading ``data`` entry (never instructions), then the turns."""
        if not self.rendered:
            return list(self.recent)
        meta = {"kind": "compaction", "record_sha256": self.record_sha256, "trust": "data"}
        first_at = self.recent[0].at if self.recent else 0.0
        return [HistoryEntry(role="user", text=self.rendered, at=first_at, meta=meta), *self.recent]


def compact(
    entries: Sequence[HistoryEntry],
    *,
    budget_chars: int,
    keep_recent_turns: int = 4,
    session_id: str = "",
    prev: str | None = None,
) -> Compacted:
    """Fit ``entries`` into ``budget_chars``: the last turns verbatim, the older ones folded into a record.

    Up to ``keep_recent_turns`` turns stay verbatim; fewer when they do not fit, and as a last resort the
    texts of the latest turn are capped head and tail (its structure — calls and results — is kept).

    What the entries' ``meta`` may carry (all optional; written by the runtime and the queue layer):

    - any entry: ``seq`` (position in the event log), ``decision`` (``{"kind", "text"}``), ``approval``
      (``{"status": "pending|approved|denied|expired", "tool", "text"}``)
    - assistant: ``tool_calls`` (``[{"id", "name", "arguments"}]``), ``usage`` (``{"input_tokens", "output_tokens"}``)
    - tool: ``tool``/``name``, ``call_id``/``tool_call_id``, ``args``/``arguments``, ``ok``, ``status``,
      ``side_effect``, ``idempotency_key``, ``action_sha256``, ``resources``, ``file``/``result_ref``, ``cost``,
      ``citations`` (``[{"ref", "title"}]``), ``artifacts`` (paths)

    Raises:
        ValueError: ``budget_chars`` is too small to hold even the latest turn's structure.
    """
    if budget_chars < MIN_BUDGET_CHARS:
        raise ValueError(f"budget_chars must be at least {MIN_BUDGET_CHARS}")
    entries = list(entries)
    if sum(entry_chars(e) for e in entries) <= budget_chars:
        return Compacted(recent=entries, record=None, rendered="")
    positions = {id(e): i for i, e in enumerate(entries, start=1)}

    def seq_of(entry: HistoryEntry) -> int:
        seq = entry.meta.get("seq")
        return seq if isinstance(seq, int) and not isinstance(seq, bool) else positions[id(entry)]

    turns = split_turns(entries)
    canonical = {id(e): _canonical_entry(e) for e in entries}
    for keep in range(min(max(keep_recent_turns, 1), len(turns)), 0, -1):
        recent = [e for turn in turns[-keep:] for e in turn]
        record = _record(turns, len(turns) - keep, recent, seq_of, canonical) if len(turns) > keep else None
        if record is not None:
            record = {**record, "session_id": session_id, "prev": prev}
        for level in range(len(_LEVELS) + 1):
            found = Compacted(recent, record, render_record(record, level) if record else "")
            if found.chars <= budget_chars:
                return found
            if record is None:
                break
    return _squeeze(found, budget_chars)


def _squeeze(found: Compacted, budget_chars: int) -> Compacted:
    """Cap the texts of the latest turn so it fits, keeping every entry (so calls stay with their results)."""
    room = budget_chars - (found.chars - sum(len(e.text) for e in found.recent))
    if room < 32 * len(found.recent):
        raise ValueError(f"budget_chars={budget_chars} cannot hold the latest turn ({len(found.recent)} entries)")
    low, high = 32, max((len(e.text) for e in found.recent), default=32)
    while low < high:  # the largest per-entry cap under which every text fits in the room
        mid = (low + high + 1) // 2
        low, high = (mid, high) if sum(min(len(e.text), mid) for e in found.recent) <= room else (low, mid - 1)
    recent = [
        e
        if len(e.text) <= low
        else e.model_copy(update={"text": cap_output(e.text, low), "meta": {**e.meta, "truncated_chars": len(e.text)}})
        for e in found.recent
    ]
    return Compacted(recent, found.record, found.rendered)
