"""Pins the layering of docs/ARCHITECTURE.md §4 and the code conventions it relies on."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from switchboard.channels.registry import CHANNEL_MODULES, Simulation, factory, simulation

PKG = Path(__file__).resolve().parent.parent / "switchboard"


LAYERS: tuple[tuple[str, ...], ...] = (
    ("types",),
    ("errors",),
    ("tracing",),
    ("skills",),
    ("sandbox",),
    ("core",),
    ("settings",),
    ("channels",),
    ("queue",),
    ("egress",),
    ("connectors",),
    ("outbound",),
    ("worker",),
    ("control",),
    ("web",),
    ("fakes",),
    ("evals",),
    ("cli",),
    ("__main__",),
)
"""The packages of ``switchboard/``, lowest first (docs/ARCHITECTURE.md §4): a module imports its own package and
lower layers only."""

TOP_MODULES = {"__init__", "__main__", "errors", "types", "tracing"}
LAYER_OF = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source_files() -> list[Path]:
    """Every importable module (the skills' scripts are package data, run as ``python3 scripts/…``)."""
    data = (PKG / "skills" / "builtin", PKG / "skills" / "templates")
    return sorted(p for p in PKG.rglob("*.py") if not any(p.is_relative_to(d) for d in data))


MODULES = {_module_name(path): path for path in _source_files()}


def _resolve(name: str) -> str | None:
    """The module of ours an imported name lands in (``a.b.C`` → ``a.b``); ``None`` for a third-party name."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _import_nodes(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import in a module: at the top, under ``TYPE_CHECKING``, inside functions."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _imported(path: Path) -> set[str]:
    """Every name a module imports, absolute (``from x import y`` gives ``x`` and ``x.y``; relative ones resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
        found.add(base)
        found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _imports(path: Path) -> set[str]:
    """The absolute module names a file imports (third-party ones included), for the framework checks."""
    return {name for name in _imported(path) if not name.startswith("switchboard.") or _resolve(name) is not None}


def _graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports (a package's own ``__init__`` when a name comes from it)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = {_resolve(name) for name in _imported(path) if name.split(".")[0] == "switchboard"}
        graph[module] = {t for t in targets if t is not None and t != module and t != "switchboard"}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _back_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} imports {target} ({_layer(target)} is above {_layer(module)})"
        for module, targets in graph.items()
        for target in targets
        if _layer(target) != _layer(module)
        and LAYER_OF.get(_layer(target), len(LAYERS)) >= LAYER_OF.get(_layer(module), len(LAYERS))
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_layer() -> None:
    assert {_layer(module) for module in MODULES} - {"__init__"} == set(LAYER_OF)


def test_imports_go_only_down_the_layers() -> None:
    """TYPE_CHECKING and function-level imports count too: a lazy import still runs back up the layers."""
    assert _back_imports(_graph()) == []


def test_the_layer_check_sees_a_back_import() -> None:
    graph = _graph()
    graph["switchboard.core.turn"] = {*graph["switchboard.core.turn"], "switchboard.queue.keys"}
    assert _back_imports(graph) == ["switchboard.core.turn imports switchboard.queue.keys (queue is above core)"]


def test_there_is_no_import_cycle() -> None:
    assert [" -> ".join(cycle) for cycle in _cycles(_graph())] == []


def test_the_cycle_check_names_a_cycle() -> None:
    graph = _graph()
    assert "switchboard.core.agent.config" in graph["switchboard.core.turn"]
    graph["switchboard.core.agent.config"] = {*graph["switchboard.core.agent.config"], "switchboard.core.turn"}
    assert any({"switchboard.core.agent.config", "switchboard.core.turn"} <= set(cycle) for cycle in _cycles(graph))


def test_the_top_level_holds_the_stage_folders_and_five_modules() -> None:
    modules = {p.stem for p in PKG.glob("*.py")}
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert modules <= TOP_MODULES
    assert folders <= set(LAYER_OF) - TOP_MODULES


def test_no_module_in_a_folder_is_private() -> None:
    """Inside a folder no ``_`` prefix is needed (docs/ARCHITECTURE.md §4): ``__all__`` says what a module shares."""
    private = [
        str(path.relative_to(PKG))
        for path in MODULES.values()
        if path.parent != PKG and path.stem.startswith("_") and path.stem not in {"__init__", "__main__"}
    ]
    assert private == []


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


def _hits(paths: list[Path], banned: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(PKG)} imports {name}"
        for p in paths
        for name in _imports(p)
        if any(name == b or name.startswith(b + ".") for b in banned)
    ]


def test_core_imports_no_io_frameworks() -> None:
    assert _modules("core"), "core/ has modules"
    assert _hits(_modules("core"), ("aiohttp", "rq", "redis")) == []


def test_channels_do_not_import_rq_or_redis() -> None:
    assert _hits(_modules("channels"), ("rq", "redis")) == []


def test_nothing_imports_rq() -> None:
    """rq is no dependency any more: drain jobs live on the shards' own queues (``queue/jobs.py``)."""
    assert _hits(list(MODULES.values()), ("rq",)) == []


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
    "web/webchat/routes.py",
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
    """Every Redis key is spelled in queue/keys.py; other modules ask it (``sb:`` literals, or its prefix)."""
    keys = PKG / "queue" / "keys.py"
    offenders = []
    for path in MODULES.values():
        if path == keys:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sb:"):
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.ImportFrom) and node.module == "switchboard.queue.keys":
                offenders += [f"{path.relative_to(PKG)} imports PREFIX" for a in node.names if a.name == "PREFIX"]
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
