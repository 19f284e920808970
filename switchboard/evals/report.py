"""What an eval run measured: per scenario and overall, cost per correct result, tokens, latency, approvals, retries.

A result is **correct** when every check passed and its rubric (if any) reached the pass mark, and **compliant** when
every strict (safety) check passed. Cost per correct result is the credits spent over all runs divided by the number
of results both correct and compliant: runs that failed still cost, and a cheap configuration that gets answers wrong
pays for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TextIO

from switchboard.evals.runner import ScenarioResult

__all__ = ["Measures", "by_scenario", "side_by_side", "small_model_verdicts", "summary", "table"]

Measures = dict[str, float | None]


def _rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else 0.0


def summary(results: Sequence[ScenarioResult]) -> Measures:
    """The measures of ``results``: score, correct and compliant counts, cost per correct result, tokens and more.

    Latency p50/p95 is the nearest rank over runs; ``cost_per_correct`` is ``None`` when nothing was correct.
    """
    good = sum(r.correct and r.compliant for r in results)
    credits = sum(r.credits for r in results)
    latencies = [r.latency_ms for r in results]
    return {
        "runs": len(results),
        "mean_score": sum(r.score for r in results) / len(results) if results else 0.0,
        "correct": sum(r.correct for r in results),
        "compliant": sum(r.compliant for r in results),
        "correct_and_compliant": good,
        "credits": credits,
        "cost_per_correct": credits / good if good else None,
        "model_credits": sum(r.model_credits for r in results),
        "model_cost_per_correct": sum(r.model_credits for r in results) / good if good else None,
        "grading_credits": sum(r.grade.credits for r in results if r.grade is not None),
        "tokens": sum(r.input_tokens + r.output_tokens for r in results),
        "turns": sum(r.turns for r in results),
        "steps": sum(r.steps for r in results),
        "approvals": sum(r.approvals for r in results),
        "retries": sum(r.retries for r in results),
        "latency_p50_ms": _rank(latencies, 0.5),
        "latency_p95_ms": _rank(latencies, 0.95),
    }


def by_scenario(results: Sequence[ScenarioResult]) -> dict[str, Measures]:
    """:func:`summary` per scenario (and variant: ``id [variant]``), in first-seen order."""
    groups: dict[str, list[ScenarioResult]] = {}
    for r in results:
        groups.setdefault(r.id + (f" [{r.variant}]" if r.variant else ""), []).append(r)
    return {key: summary(group) for key, group in groups.items()}


def _cost(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def table(results: Sequence[ScenarioResult], out: TextIO) -> None:
    """One line per scenario run, then the run's totals."""
    width = max([len(r.id) for r in results] + [8])
    out.write(
        f"{'scenario':<{width}}  {'ver':<6} {'score':>5}  ok  {'credits':>8}  {'tokens':>6}  turns  appr  retr  "
        f"{'ms':>7}  failed\n"
    )
    for r in results:
        failed = [f"{c.name}{' (strict)' if c.strict else ''}" for c in r.checks if not c.passed]
        if r.grade is not None and not r.grade.passed:
            failed.append(f"rubric {r.rubric}")
        ok = "yes" if r.correct and r.compliant else "no"
        tokens = r.input_tokens + r.output_tokens
        out.write(
            f"{r.id:<{width}}  {r.version:<6} {r.score:>5.2f}  {ok:<3} {r.credits:>8.4g}  {tokens:>6}  {r.turns:>5}  "
            f"{r.approvals:>4}  {r.retries:>4}  {r.latency_ms:>7.0f}  {', '.join(failed)}\n"
        )
    t = summary(results)
    out.write(
        f"{len(results)} scenario(s), mean score {t['mean_score']:.2f}, correct and compliant "
        f"{t['correct_and_compliant']:.0f}/{len(results)}, cost per correct {_cost(t['cost_per_correct'])} credits, "
        f"latency p50 {t['latency_p50_ms']:.0f} ms p95 {t['latency_p95_ms']:.0f} ms, {t['tokens']:.0f} tokens, "
        f"{t['approvals']:.0f} approvals, {t['retries']:.0f} retries\n"
    )


def small_model_verdicts(by_variant: Mapping[str, Sequence[ScenarioResult]], threshold: float) -> list[str]:
    """Whether each routing variant's small model is accurate enough on its jobs.

    Measured on the scenarios where the small model ran at least one step: the share of them that ended correct and
    compliant, against ``threshold``. A wrong result there counts against the small model even when the strong model
    erred too; each line also gives the other variants' rate on the same scenarios, to tell the two apart.
    """
    lines = []
    for name, results in by_variant.items():
        routed = [r for r in results if r.small_steps]
        if not routed:
            continue
        ids = {r.id for r in routed}
        rate = sum(r.correct and r.compliant for r in routed) / len(routed)
        small, steps = sum(r.small_steps for r in routed), sum(r.steps for r in routed)
        others = []
        for other, their in by_variant.items():
            same = [r for r in their if r.id in ids]
            if other != name and same:
                others.append(f"{other} {sum(r.correct and r.compliant for r in same) / len(same):.0%}")
        verdict = "enough" if rate >= threshold else "NOT enough"
        lines.append(
            f"small model of {name}: ran {small} of {steps} steps; correct and compliant on {rate:.0%} of the "
            f"{len(routed)} scenario(s) it ran in (threshold {threshold:.0%}): {verdict}"
            + (f"; same scenarios: {', '.join(others)}" if others else "")
        )
    return lines


def side_by_side(by_variant: Mapping[str, Sequence[ScenarioResult]], out: TextIO, small_threshold: float) -> None:
    """The variants' totals next to each other, then each scenario's verdict per variant."""
    names = list(by_variant)
    width = max([len(n) for n in names] + [7])
    out.write(
        f"{'variant':<{width}}  score  correct  {'credits':>9}  {'per correct':>11}  {'model':>9}  "
        f"{'model/correct':>13}  {'tokens':>7}  {'p50 ms':>7}  {'p95 ms':>7}\n"
    )
    for name in names:
        t = summary(by_variant[name])
        out.write(
            f"{name:<{width}}  {t['mean_score']:>5.2f}  {t['correct_and_compliant']:>3.0f}/{t['runs']:<3.0f}  "
            f"{t['credits'] or 0.0:>9.4g}  {_cost(t['cost_per_correct']):>11}  {t['model_credits'] or 0.0:>9.4g}  "
            f"{_cost(t['model_cost_per_correct']):>13}  {t['tokens']:>7.0f}  "
            f"{t['latency_p50_ms']:>7.0f}  {t['latency_p95_ms']:>7.0f}\n"
        )
    ids = list(dict.fromkeys(r.id for results in by_variant.values() for r in results))
    marks = {name: {r.id: "ok" if r.correct and r.compliant else "FAIL" for r in by_variant[name]} for name in names}
    id_width = max([len(i) for i in ids] + [8])
    out.write(f"{'scenario':<{id_width}}  " + "  ".join(f"{n:<{max(len(n), 4)}}" for n in names) + "\n")
    for scenario_id in ids:
        cells = [f"{marks[n].get(scenario_id, '-'):<{max(len(n), 4)}}" for n in names]
        out.write(f"{scenario_id:<{id_width}}  " + "  ".join(cells) + "\n")
    for line in small_model_verdicts(by_variant, small_threshold):
        out.write(line + "\n")
