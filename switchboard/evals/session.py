"""The session an evaluation runs in: history, slots and approval records kept in memory for one scenario.

A scenario's session lives as long as its run, so nothing is shared and nothing needs a lease. Approvals follow the
production store's rules (``switchboard.queue.approvals``): one decision changes a ``pending`` record, bound to the
action's hash, on or after its expiry it is ``expired``, and an approved record is consumed once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from switchboard.core.approvals.grants import GATEWAY_PRINCIPAL
from switchboard.core.approvals.records import (
    ApprovalRecord,
    DecideOutcome,
    DecideResult,
    DecisionVia,
    SessionControl,
    Verdict,
)
from switchboard.core.turn import HistoryEntry

__all__ = ["EvalSession"]


class EvalSession:
    """A :class:`~switchboard.core.turn.SessionStore` and approval store of one scenario."""

    def __init__(self, slots: dict[str, Any]) -> None:
        self.history: list[HistoryEntry] = []
        self.slots = dict(slots)
        self.approvals: dict[str, ApprovalRecord] = {}
        self._control: SessionControl | None = None

    async def load_history(self, limit: int) -> list[HistoryEntry]:
        """The last ``limit`` entries."""
        return self.history[-limit:] if limit > 0 else []

    async def append_history(self, entries: Sequence[HistoryEntry]) -> None:
        """Keep the turn's entries."""
        self.history.extend(entries)

    async def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """The ``search_history`` backend: entries holding every word of ``query`` (any case), most recent first."""
        words = query.lower().split()
        found: list[dict[str, Any]] = []
        for seq in range(len(self.history) - 1, -1, -1):
            entry = self.history[seq]
            if words and all(word in entry.text.lower() for word in words):
                found.append({"role": entry.role, "text": entry.text, "seq": seq, "at": entry.at})
                if len(found) >= limit:
                    break
        return found

    async def load_slots(self) -> dict[str, Any]:
        """The slots as seeded and saved."""
        return dict(self.slots)

    async def save_slot(self, name: str, value: Any) -> None:
        """Overwrite one slot."""
        self.slots[name] = value

    async def reset_conversation(self) -> None:
        """Forget history and slots."""
        self.history.clear()
        self.slots.clear()

    async def approval_open(self, record: ApprovalRecord) -> None:
        """Keep a new pending record (an id is never reused)."""
        if record.id in self.approvals:
            raise ValueError(f"approval id {record.id} is already taken")
        self.approvals[record.id] = record

    async def approval_get(self, approval_id: str) -> ApprovalRecord | None:
        """The record ``approval_id``, if opened."""
        return self.approvals.get(approval_id)

    async def approval_pending(self) -> list[ApprovalRecord]:
        """The records still pending."""
        return [r for r in self.approvals.values() if r.status == "pending"]

    async def approval_decide(
        self,
        approval_id: str,
        verdict: Verdict,
        actor: str,
        via: DecisionVia,
        *,
        action_prefix: str | None,
        run_id: str | None = None,
    ) -> DecideOutcome:
        """Apply one decision: only a ``pending`` record changes, once (the rules of the Redis store's script)."""
        record = self.approvals.get(approval_id)
        if record is None:
            return DecideOutcome(result="not_found")
        if record.status != "pending":
            return DecideOutcome(result="already_decided", record=record)
        now = time.time()
        decided: dict[str, Any] = {"decided_at": now, "decided_in": run_id or record.decided_in}
        if now >= record.expires_at:
            decided |= {"status": "expired", "decided_by": GATEWAY_PRINCIPAL, "decision_via": "expiry"}
            result: DecideResult = "applied" if verdict == "expire" else "expired"
        elif verdict == "expire":
            return DecideOutcome(result="not_due", record=record)
        elif action_prefix and not record.action_sha256.startswith(action_prefix.lower()):
            return DecideOutcome(result="mismatch", record=record)
        else:
            status = "approved" if verdict == "approve" else "denied"
            decided |= {"status": status, "decided_by": actor, "decision_via": via}
            result = "applied"
        self.approvals[approval_id] = changed = record.model_copy(update=decided)
        return DecideOutcome(result=result, record=changed)

    async def approval_supersede(self, approval_id: str) -> bool:
        """``pending`` → ``superseded``; whether it changed."""
        record = self.approvals.get(approval_id)
        if record is None or record.status != "pending":
            return False
        self.approvals[approval_id] = record.model_copy(update={"status": "superseded"})
        return True

    async def approval_settle(
        self, approval_id: str, status: Literal["executed", "refused"], outcome: dict[str, Any] | None
    ) -> bool:
        """Consume an ``approved`` record once: → ``executed`` or ``refused``; whether this call consumed it."""
        record = self.approvals.get(approval_id)
        if record is None or record.status != "approved":
            return False
        self.approvals[approval_id] = record.model_copy(update={"status": status, "outcome": outcome})
        return True

    async def control(self) -> SessionControl | None:
        """The operator holding the conversation (none unless set)."""
        return self._control

    async def set_control(self, control: SessionControl | None) -> None:
        """Take the conversation over, or hand it back."""
        self._control = control
