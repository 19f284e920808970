"""Pins the layering of docs/ARCHITECTURE.md §4 and the code conventions it relies on."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from switchboard.channels.registry import CHANNEL_MODULES, Simulation, factory, simulation

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


TABLE = list(CHANNEL_MODULES)


@pytest.mark.parametrize("channel", TABLE)
def test_every_channel_of_the_table_has_module_factory_payloads_and_fake(channel: str) -> None:
    """A channel is a folder: ``factory.py`` (``FACTORY``), ``settings.py`` (its block), its fake; and payloads."""
    module = CHANNEL_MODULES[channel]
    assert module.startswith("switchboard.channels.") and module.endswith(".factory"), "the table names factory.py"
    folder = PKG.parent.joinpath(*module.split(".")[:-1])
    assert folder.name == channel, f"{folder} is named after the channel"
    assert (folder / "factory.py").is_file() and (folder / "settings.py").is_file()
    found = factory(channel)
    assert found is not None and found.name == channel, f"{module} exports FACTORY"
    assert found.settings.__module__ == module.replace(".factory", ".settings"), "the block lives in settings.py"
    payloads = Path(__file__).parent / "payloads" / channel
    assert any(payloads.glob("*.json")), f"tests/payloads/{channel}/ holds sample payloads"
    if not found.builtin:
        assert found.fake is not None, f"{channel} names its built-in fake"
        assert found.fake.startswith(module.rsplit(".", 2)[0] + "."), (
            "the fake lives in the channel's folder (or meta/)"
        )
        assert isinstance(simulation(found), Simulation), f"{found.fake} exports SIMULATION"


def test_nothing_outside_the_channel_folders_and_registry_names_a_platform_s_settings() -> None:
    """``Settings`` has no block per platform, and ``ChannelName`` is no closed list of them."""
    from switchboard.settings import Settings
    from switchboard.types import ChannelName

    assert [name for name in Settings.model_fields if name in TABLE] == []
    assert typing.get_origin(ChannelName) is typing.Annotated and typing.get_args(ChannelName)[0] is str


_WIRING = (
    "cli/checks.py",
    "cli/simulate.py",
    "cli/processes.py",
    "web/webhooks.py",
    "web/app.py",
    "queue/router.py",
    "queue/operators.py",
    "channels/registry.py",
    "settings/__init__.py",
    "settings/channels.py",
    "types.py",
)


def _channel_literals(path: Path) -> list[str]:
    """String constants naming a platform channel, outside the registry's table itself."""
    tree = ast.parse(path.read_text())
    table = {
        id(node)
        for assign in ast.walk(tree)
        if isinstance(assign, ast.AnnAssign | ast.Assign) and isinstance(assign.value, ast.Dict)
        for node in ast.walk(assign.value)
    }
    names = set(TABLE) - {"web"}
    return [
        f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in table
    ]


def test_the_wiring_has_no_branch_for_one_platform() -> None:
    """Routing, checks, simulation and the webhook route find channels in the table, never by name."""
    assert all((PKG / name).is_file() for name in _WIRING), "the wiring files moved: update _WIRING"
    assert [hit for name in _WIRING for hit in _channel_literals(PKG / name)] == []


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
    skill_packages = (PKG / "skills" / "builtin", PKG / "skills" / "templates")
    for path in PKG.rglob("*.py"):
        if path.name.startswith("_") or "static" in path.parts:
            continue
        if path.is_relative_to(skill_packages[0]) or path.is_relative_to(skill_packages[1]):
            continue  # skills' scripts are package data run as `python3 scripts/…`, never imported
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
        *(PKG / "web" / "webchat" / "static").glob("*"),
        *(root / "tests").rglob("*.py"),
        *(root / "bench").rglob("*.py"),
        root / "README.md",
        root / "mkdocs.yml",
        *(root / "docs").rglob("*.md"),  # the manual's pages, ARCHITECTURE.md among them
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


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs give a heading (lower case, punctuation dropped, spaces as hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_a_front_page_that_links_into_the_manual() -> None:
    """The README fits on a few screens, shows both commands, and every link it has leads to a page and heading."""
    root = PKG.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300, "the manual lives in docs/; the README stays a front page"
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert "make run" in quickstart
    assert "make test" in quickstart
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        page = root / path
        if not page.is_file():
            broken.append(target)
        elif anchor and page.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert broken == []
    nav = (root / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {
        str(page.relative_to(root / "docs"))
        for page in (root / "docs").rglob("*.md")
        if "pending" not in page.relative_to(root / "docs").parts
    }
    assert {page for page in pages if page not in nav} == set(), "every page is in the site's nav"


def test_resumable_sends_share_one_loop() -> None:
    """Only ``channels/parts.py`` records a sent part: every channel resumes a multi-part send through it."""
    recorders = [
        f"{path.relative_to(PKG)}:{node.lineno}"
        for path in _modules("channels")
        if path.relative_to(PKG).as_posix() != "channels/parts.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "part_sent"
    ]
    assert recorders == []
