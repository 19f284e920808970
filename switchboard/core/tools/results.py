"""How large tool results are shown and kept: data cards that keep both ends, and files within the quotas.

A result too large for the model's context becomes a data card (type, shape, the first and the last items or
characters) bound to a variable; a very large one is also saved under ``results/`` in the session workspace,
counted against its quotas like any other write. Messages shown to the model never carry a host path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from switchboard.core.workspaces.disk import Workspaces, make_private_dir

__all__ = ["data_card", "save_result", "scrub_paths"]


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _preview(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return value if len(value) <= 120 else value[:80] + " … " + value[-37:]
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        if depth >= 1:
            return f"<object with {len(value)} keys>"
        items = list(value.items())
        out = {str(k): _preview(v, depth + 1) for k, v in items[:8]}
        if len(items) > 8:
            out["..."] = f"+{len(items) - 8} more keys"
        return out
    if isinstance(value, list | tuple):
        return f"<list of {len(value)}>"
    return _preview(str(value), depth)


def data_card(value: Any, *, size_bytes: int, limit: int = 1536) -> dict[str, Any]:
    """A small description of a large value: its type, shape and a sample, within ``limit`` bytes of JSON.

    Previews keep both ends: a list's first and last items (``sample``, ``sample_tail``), a text's head and
    tail, an object's first and last keys, so what a result ends with is never lost.
    """
    card: dict[str, Any] = {"bytes": size_bytes}
    if isinstance(value, list | tuple):
        card["type"] = "list"
        card["length"] = len(value)
        if value and all(isinstance(item, dict) for item in value):
            columns: dict[str, None] = {}
            for item in value[:200]:
                columns.update(dict.fromkeys(map(str, item)))
            card["columns"] = list(columns)[:30]
        card["sample"] = [_preview(item) for item in value[:3]]
        if len(value) > 3:
            card["sample_tail"] = [_preview(item) for item in value[max(3, len(value) - 2) :]]
    elif isinstance(value, dict):
        card["type"] = "object"
        card["key_count"] = len(value)
        keys = [str(k) for k in value]
        card["keys"] = keys[:30]
        if len(keys) > 30:
            card["last_keys"] = keys[-5:]
        card["sample"] = _preview(value)
    elif isinstance(value, str):
        card["type"] = "text"
        card["chars"] = len(value)
        card["head"] = value[:400]
        card["tail"] = value[-200:]
    else:
        card["type"] = type(value).__name__
        card["preview"] = str(value)[:300]
    while len(_json(card).encode()) > limit:
        sample = card.get("sample")
        tail = card.get("sample_tail")
        if isinstance(sample, list) and len(sample) > 1:
            card["sample"] = sample[:1]
        elif isinstance(tail, list) and len(tail) > 1:
            card["sample_tail"] = tail[-1:]
        elif "sample_tail" in card and "sample" in card:
            del card["sample"]
        elif "sample_tail" in card:
            del card["sample_tail"]
        elif "sample" in card:
            del card["sample"]
        elif "head" in card and len(card["head"]) > 50:
            card["head"], card["tail"] = card["head"][:100], card["tail"][-50:]
        elif "columns" in card and len(card["columns"]) > 5:
            card["columns"] = card["columns"][:5]
        elif "keys" in card and len(card["keys"]) > 5:
            card["keys"] = card["keys"][:5]
        else:
            break
    return card


def save_result(workspaces: Workspaces, workspace: Path, relative: str, text: str) -> None:
    """Write a large result to ``relative`` in the session workspace, within the workspace quotas.

    Raises:
        ToolError: a quota would be passed (the result stays available as a variable).
    """
    make_private_dir(workspace)
    workspaces.store(workspace, workspace.resolve() / relative, text.encode(), shown=relative)


def scrub_paths(text: str, workspace: Path, root: Path) -> str:
    """``text`` with every host location of the workspace (and the workspaces root) made relative or hidden."""
    bases = ((workspace.resolve(), ""), (workspace, ""), (root.resolve(), "<workspaces>/"), (root, "<workspaces>/"))
    for base, shown in bases:
        prefix = str(base).rstrip("/")
        if len(prefix) > 1 and prefix in text:
            text = text.replace(prefix + "/", shown).replace(prefix, shown.rstrip("/") or ".")
    return text
