"""The obeying scripted model of the injection tests (it lives in :mod:`switchboard.evals.obedient`)."""

from __future__ import annotations

from switchboard.evals.obedient import INSTRUCTION, ObedientModel, instruction

__all__ = ["INSTRUCTION", "ObedientModel", "instruction"]
