"""The shipped demo's rule ``publish-needs-approval`` against the ways a ``write_file`` could land in ``outbox/``.

The rule reads ``write_file``'s normalised path, so it holds only if the path names the file written: every spelling
of an ``outbox/`` path is asked about, and a path through a symlink (one the shell made, say) is refused rather than
written where the policy did not look. The shell itself can write anywhere in the workspace: that limit is
documented (docs/getting-started.md), not hidden.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.approvals.policy import Policy
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import ToolGateway
from switchboard.settings import load_settings
from tests.core.test_gateway_approvals import ctx

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "switchboard.yaml"


def _demo_policy(base_env: dict[str, str]) -> Policy:
    settings = load_settings(base_env | {"SWITCHBOARD_CONFIG": str(SHIPPED)})
    demo = settings.file.agents["demo"]
    assert demo.policy is not None
    return Policy.of(("agent:demo", demo.policy))


def _gateway(tmp_path: Path) -> ToolGateway:
    return ToolGateway(default_registry(), workspace_root=tmp_path / "ws", backoff_base_s=0.0)


def _outbox_files(workspace: Path) -> list[str]:
    outbox = workspace / "outbox"
    return sorted(p.name for p in outbox.iterdir()) if outbox.is_dir() else []


@pytest.mark.parametrize(
    "arguments",
    [
        {"path": "outbox/a.md", "content": "x"},
        {"path": "./outbox/a.md", "content": "x"},
        {"path": "outbox//a.md", "content": "x"},
        {"path": " outbox/a.md", "content": "x"},
        {"path": "outbox\\a.md", "content": "x"},
        {"path": "outbox/a.md", "content": "x", "append": True},
    ],
)
async def test_every_spelling_of_an_outbox_write_is_asked_about(
    base_env: dict[str, str], tmp_path: Path, arguments: dict[str, Any]
) -> None:
    context = ctx(tmp_path, policy=_demo_policy(base_env), agent="demo")
    outcome = await _gateway(tmp_path).call("write_file", arguments, context)
    assert (outcome.ok, outcome.error_class, outcome.policy) == (
        False,
        "needs_approval",
        "approve:publish-needs-approval",
    )
    assert _outbox_files(context.workspace) == []


@pytest.mark.parametrize("path", ["outbox/../outbox/a.md", "../outbox/a.md", "/outbox/a.md"])
async def test_a_path_that_climbs_is_refused(base_env: dict[str, str], tmp_path: Path, path: str) -> None:
    context = ctx(tmp_path, policy=_demo_policy(base_env), agent="demo")
    outcome = await _gateway(tmp_path).call("write_file", {"path": path, "content": "x"}, context)
    assert not outcome.ok and outcome.error_class == "validation"
    assert _outbox_files(context.workspace) == []


@pytest.mark.parametrize("link", ["pub", "docs/pub"])
async def test_a_write_through_a_symlink_into_outbox_is_refused_not_run(
    base_env: dict[str, str], tmp_path: Path, link: str
) -> None:
    context = ctx(tmp_path, policy=_demo_policy(base_env), agent="demo")
    workspace = context.workspace
    (workspace / "outbox").mkdir(parents=True)
    (workspace / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(workspace / "outbox", workspace / link)  # what `ln -s` in a shell command makes
    outcome = await _gateway(tmp_path).call("write_file", {"path": f"{link}/a.md", "content": "x"}, context)
    assert not outcome.ok and outcome.error_class == "validation", outcome
    assert "symlink" in (outcome.error or "")
    assert _outbox_files(workspace) == []
    os.symlink(workspace / "outbox" / "b.md", workspace / "b.md")  # a link to a file, too
    outcome = await _gateway(tmp_path).call("write_file", {"path": "b.md", "content": "x"}, context)
    assert not outcome.ok and outcome.error_class == "validation", outcome
    assert _outbox_files(workspace) == []


async def test_the_demo_shop_database_is_never_written_by_sql(base_env: dict[str, str], tmp_path: Path) -> None:
    settings = load_settings(base_env | {"SWITCHBOARD_CONFIG": str(SHIPPED)})
    databases = settings.file.agents["demo"].databases
    shop = databases["shop"].path
    before = hashlib.sha256(shop.read_bytes()).hexdigest()
    context = ctx(tmp_path, databases=databases)
    gateway = _gateway(tmp_path)
    for statement in (
        "DELETE FROM shop.orders",
        "UPDATE shop.products SET price_eur = 0",
        "INSERT INTO shop.products SELECT * FROM shop.products",
        "DROP TABLE shop.orders",
        "CREATE TABLE shop.evil (a)",
        "ALTER TABLE shop.products ADD COLUMN x",
        "PRAGMA shop.journal_mode = DELETE",
        "DETACH shop",
        f"ATTACH '{shop}' AS rw",
        "WITH x AS (SELECT 1) DELETE FROM shop.orders",
        "CREATE TRIGGER t AFTER INSERT ON shop.orders BEGIN DELETE FROM shop.orders; END",
        "REPLACE INTO shop.products (sku) VALUES ('x')",
        "VACUUM shop",
        "REINDEX shop.products",
    ):
        outcome = await gateway.call("sql", {"statement": statement}, context)
        assert not outcome.ok, (statement, outcome.value)
    assert hashlib.sha256(shop.read_bytes()).hexdigest() == before
    read = await gateway.call("sql", {"statement": "SELECT COUNT(*) AS n FROM shop.orders"}, context)
    assert read.ok, read
