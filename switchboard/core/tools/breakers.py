"""Circuit breakers: a connector that keeps failing is paused, so calls fail fast instead of piling up.

The tool gateway keeps one breaker per connector (``Tool.breaker_key``): an external service, or a family of
native tools. Only failures that say something about the connector's health count (rate limits, transient
errors, timeouts); a bad argument or a document too large to parse does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Opens after ``threshold`` consecutive unhealthy failures; half-opens (one probe) after ``cooldown_s``."""

    def __init__(self, threshold: int = 5, cooldown_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._probe_at: float | None = None

    @property
    def state(self) -> Literal["closed", "open", "half_open"]:
        """Where the breaker stands now."""
        if self.opened_at is None:
            return "closed"
        return "half_open" if self._clock() - self.opened_at >= self.cooldown_s else "open"

    def allow(self) -> bool:
        """Whether a call may go ahead; in half-open state, only one probe per cool-down."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return False
        now = self._clock()
        if self._probe_at is not None and now - self._probe_at < self.cooldown_s:
            return False
        self._probe_at = now
        return True

    def record_success(self) -> None:
        """The connector answered: close the breaker."""
        self.failures = 0
        self.opened_at = None
        self._probe_at = None

    def record_failure(self) -> None:
        """An unhealthy failure: count it, and open (or re-open after a failed probe)."""
        self.failures += 1
        self._probe_at = None
        if self.opened_at is not None or self.failures >= self.threshold:
            self.opened_at = self._clock()
