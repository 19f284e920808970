"""Pins the layering of docs/ARCHITECTURE.md §4 and the code conventions it relies on."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "switchboard"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


def _hits(paths: list[Path], banned: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(PKG)} imports {name}"
        for p in paths
        for name in _imports(p)
        if any(name == b or name.startswith(b + ".") for b in banned)
    ]


def test_core_imports_no_io_frameworks_nor_outer_layers() -> None:
    assert _modules("core"), "core/ has modules"
    assert _hits(_modules("core"), ("aiohttp", "rq", "redis", "switchboard.channels", "switchboard.queue")) == []


def test_channels_do_not_import_queue_or_rq() -> None:
    assert _hits(_modules("channels"), ("rq", "redis", "switchboard.queue")) == []


def test_only_queue_imports_rq() -> None:
    outside = [p for p in PKG.rglob("*.py") if "queue" not in p.relative_to(PKG).parts]
    assert _hits(outside, ("rq",)) == []


def test_no_grab_bag_modules() -> None:
    assert [p.name for p in PKG.rglob("*.py") if p.stem in {"utils", "helpers", "misc", "common"}] == []


CHANNELS = ["telegram", "web"]


@pytest.mark.parametrize("channel", CHANNELS)
def test_every_channel_has_module_registry_entry_and_payloads(channel: str) -> None:
    assert (PKG / "channels" / f"{channel}.py").is_file()
    registry = (PKG / "channels" / "registry.py").read_text()
    assert f"{channel.capitalize()}Channel" in registry
    payloads = Path(__file__).parent / "payloads" / channel
    assert any(payloads.glob("*.json")), f"tests/payloads/{channel}/ holds sample payloads"


def test_redis_key_strings_live_in_keys_module() -> None:
    offenders = []
    for path in [*_modules("queue"), PKG / "app.py", PKG / "webchat.py"]:
        if path.name == "keys.py" or not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sb:"):
                offenders.append(f"{path.name}: {node.value!r}")
    assert offenders == []


def test_public_modules_declare_all() -> None:
    missing = []
    for path in PKG.rglob("*.py"):
        if path.name.startswith("_") or "static" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if "__all__" not in names:
            missing.append(str(path.relative_to(PKG)))
    assert missing == []


def test_the_repository_explains_itself() -> None:
    """Comments and docs point at the repository's own architecture document, never at a brief outside it."""
    root = PKG.parent
    # built from parts, so that this file passes its own check
    banned = tuple(a + b for a, b in (("DESIGN", " §"), ("DESIGN", ".md"), ("STYLE", ".md"), ("..", "/shared")))
    texts = [
        *PKG.rglob("*.py"),
        *(PKG / "channels" / "static").glob("*"),
        *(root / "tests").rglob("*.py"),
        *(root / "bench").rglob("*.py"),
        root / "README.md",
        root / "docs" / "ARCHITECTURE.md",
    ]
    offenders = [
        f"{path.relative_to(root)}: {word}"
        for path in texts
        if path.is_file() and path.suffix != ".pyc"
        for word in banned
        if word in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert offenders == []
    sections = set(re.findall(r"^## (\d+)\.", (root / "docs" / "ARCHITECTURE.md").read_text(), re.MULTILINE))
    cited = {
        f"{path.relative_to(root)}: §{number}"
        for path in texts
        if path.is_file() and path.suffix != ".pyc"
        for number in re.findall(r"ARCHITECTURE\.md §(\d+)", path.read_text(encoding="utf-8", errors="replace"))
        if number not in sections
    }
    assert cited == set(), "every cited section exists"
