"""Workspace file tools: read, write, list; every path confined to the session workspace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from switchboard.core.tools.builtin import files
from switchboard.core.tools.builtin.files import (
    TOOLS,
    ListFilesInput,
    ReadFileInput,
    WriteFileInput,
    list_files,
    read_file,
    resolve_in_workspace,
    write_file,
)
from switchboard.core.tools.definition import ToolContext
from switchboard.errors import ToolError

BAD_PATHS = ["../secret.txt", "a/../../secret.txt", "/etc/passwd", "~/notes.md", "", "C:\\Windows\\win.ini", "a\x00b"]


def make_ctx(workspace: Path) -> ToolContext:
    return ToolContext(
        session_key="default/assistant/web/default/c1",
        tenant="default",
        run_id="run-1",
        actor="user-1",
        workspace=workspace,
        idempotency_key="key-1",
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "sessions" / "c1"  # not created yet: the tools create it on demand


async def call(fn: Any, model: type[BaseModel], ctx: ToolContext, **args: Any) -> Any:
    return await fn(model.model_validate(args), ctx)


async def test_write_then_read_round_trips_and_creates_the_workspace(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    assert not workspace.exists()
    written = await call(write_file, WriteFileInput, ctx, path="notes/today.md", content="# Plan\nship it ✓\n")
    assert written == {"path": "notes/today.md", "bytes": len("# Plan\nship it ✓\n".encode()), "appended": False}
    assert (workspace / "notes" / "today.md").read_text() == "# Plan\nship it ✓\n"
    await call(write_file, WriteFileInput, ctx, path="./notes/today.md", content="more\n", append=True)
    read = await call(read_file, ReadFileInput, ctx, path="notes/today.md")
    assert read["content"] == "# Plan\nship it ✓\nmore\n"
    assert read["truncated"] is False


async def test_list_files_shows_entries_without_temporary_files(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    await call(write_file, WriteFileInput, ctx, path="b.txt", content="bb")
    await call(write_file, WriteFileInput, ctx, path="docs/a.md", content="a")
    top = await call(list_files, ListFilesInput, ctx)
    assert top["path"] == "."
    assert top["entries"] == [{"path": "b.txt", "type": "file", "bytes": 2}, {"path": "docs", "type": "dir"}]
    deep = await call(list_files, ListFilesInput, ctx, path="docs", recursive=True)
    assert deep["entries"] == [{"path": "docs/a.md", "type": "file", "bytes": 1}]
    assert not [p for p in workspace.rglob("*") if p.name.startswith(".write-")]


async def test_empty_workspace_lists_nothing(workspace: Path) -> None:
    listed = await call(list_files, ListFilesInput, make_ctx(workspace))
    assert listed == {"path": ".", "entries": [], "truncated": False}
    assert workspace.is_dir()


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("model", [ReadFileInput, WriteFileInput])
def test_paths_outside_the_workspace_are_refused_before_anything_runs(model: type[BaseModel], bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        model.model_validate({"path": bad, "content": "x"})
    assert info.value.errors()[0]["loc"] == ("path",)


@pytest.mark.parametrize("bad", BAD_PATHS)
def test_resolve_refuses_paths_outside_the_workspace(workspace: Path, bad: str) -> None:
    with pytest.raises(ToolError) as info:
        resolve_in_workspace(workspace, bad)
    assert info.value.error_class == "validation"


async def test_symlinks_leading_out_are_refused_for_reads_writes_and_listings(tmp_path: Path, workspace: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    workspace.mkdir(parents=True)
    (workspace / "escape").symlink_to(outside, target_is_directory=True)
    (workspace / "secret-link.txt").symlink_to(outside / "secret.txt")
    ctx = make_ctx(workspace)
    for path in ("escape/secret.txt", "secret-link.txt"):
        with pytest.raises(ToolError, match="leads out of the session workspace"):
            await call(read_file, ReadFileInput, ctx, path=path)
    with pytest.raises(ToolError, match="leads out"):
        await call(write_file, WriteFileInput, ctx, path="escape/planted.txt", content="x")
    with pytest.raises(ToolError, match="leads out"):
        await call(list_files, ListFilesInput, ctx, path="escape")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret"


async def test_symlinks_inside_the_workspace_are_followed(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    await call(write_file, WriteFileInput, ctx, path="real/data.txt", content="inside")
    (workspace / "alias").symlink_to(workspace / "real", target_is_directory=True)
    read = await call(read_file, ReadFileInput, ctx, path="alias/data.txt")
    assert read["content"] == "inside"


async def test_long_files_come_back_as_head_and_tail(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    text = "START\n" + "".join(f"row {i}\n" for i in range(10_000)) + "END\n"
    await call(write_file, WriteFileInput, ctx, path="big.log", content=text)
    read = await call(read_file, ReadFileInput, ctx, path="big.log", max_chars=1000)
    assert read["truncated"] is True
    assert read["chars"] == len(text)
    assert len(read["content"]) <= 1000
    assert read["content"].startswith("START\nrow 0\n") and read["content"].endswith("row 9999\nEND\n")
    assert "chars omitted" in read["content"]


async def test_size_caps_and_binary_files_give_clear_errors(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(workspace)
    workspace.mkdir(parents=True)
    (workspace / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(ToolError, match="not UTF-8 text: use read_document"):
        await call(read_file, ReadFileInput, ctx, path="image.png")
    with pytest.raises(ToolError, match=r"no file 'missing\.txt'"):
        await call(read_file, ReadFileInput, ctx, path="missing.txt")
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 10)
    (workspace / "eleven.txt").write_text("x" * 11)
    with pytest.raises(ToolError, match="over the 10-byte read cap"):
        await call(read_file, ReadFileInput, ctx, path="eleven.txt")
    monkeypatch.setattr(files, "WORKSPACE_QUOTA_BYTES", 100)
    with pytest.raises(ToolError, match="quota"):
        await call(write_file, WriteFileInput, ctx, path="fill.txt", content="y" * 200)
    assert not (workspace / "fill.txt").exists()
    with pytest.raises(ValidationError):
        WriteFileInput.model_validate({"path": "huge.txt", "content": "z" * (files.MAX_WRITE_CHARS + 1)})


async def test_writing_over_a_directory_is_refused(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    (workspace / "dir").mkdir(parents=True)
    with pytest.raises(ToolError, match="is a directory"):
        await call(write_file, WriteFileInput, ctx, path="dir", content="x")


def test_tool_declarations() -> None:
    by_name = {tool.name: tool for tool in TOOLS}
    assert set(by_name) == {"read_file", "write_file", "list_files"}
    assert by_name["write_file"].side_effect == "write"
    assert by_name["read_file"].side_effect == "read" and by_name["list_files"].side_effect == "read"


async def test_ranged_reads_page_through_by_characters(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    text = "".join(f"{i:04d}|" for i in range(1000))  # 5,000 characters on one line
    await call(write_file, WriteFileInput, ctx, path="one-line.json", content=text)
    first = await call(read_file, ReadFileInput, ctx, path="one-line.json", offset=0, max_chars=2000)
    assert first["content"] == text[:2000] and first["end"] == 2000 and first["chars"] == 5000
    assert first["next"] == "more follows: read_file with offset=2000"
    middle = await call(read_file, ReadFileInput, ctx, path="one-line.json", offset=2000, max_chars=2000)
    last = await call(read_file, ReadFileInput, ctx, path="one-line.json", offset=4000, max_chars=2000)
    assert first["content"] + middle["content"] + last["content"] == text
    assert "next" not in last and last["end"] == 5000
    past = await call(read_file, ReadFileInput, ctx, path="one-line.json", offset=9000)
    assert past["content"] == "" and "next" not in past


async def test_ranged_reads_page_through_by_lines(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    text = "".join(f"row {i}\n" for i in range(1, 1001))
    await call(write_file, WriteFileInput, ctx, path="rows.txt", content=text)
    window = await call(read_file, ReadFileInput, ctx, path="rows.txt", start_line=500, end_line=502)
    assert window["content"] == "row 500\nrow 501\nrow 502\n" and window["lines"] == 1000
    assert window["next"] == "more follows: read_file with start_line=503"
    tail = await call(read_file, ReadFileInput, ctx, path="rows.txt", start_line=999)
    assert tail["content"] == "row 999\nrow 1000\n" and "next" not in tail
    capped = await call(read_file, ReadFileInput, ctx, path="rows.txt", start_line=1, max_chars=100)
    assert capped["end_line"] == 15 and capped["content"] == "".join(f"row {i}\n" for i in range(1, 16))  # 96 chars
    whole = await call(read_file, ReadFileInput, ctx, path="rows.txt", max_chars=200)
    assert "offset" in whole["next"] and whole["truncated"] is True


def test_a_read_takes_one_kind_of_range() -> None:
    with pytest.raises(ValidationError, match="either offset or start_line"):
        ReadFileInput.model_validate({"path": "a.txt", "offset": 3, "start_line": 2})
    with pytest.raises(ValidationError, match="end_line is before start_line"):
        ReadFileInput.model_validate({"path": "a.txt", "start_line": 5, "end_line": 2})
    with pytest.raises(ValidationError):
        ReadFileInput.model_validate({"path": "a.txt", "offset": -1})


def test_read_file_results_are_shown_inline_up_to_its_own_cap() -> None:
    read_tool = {tool.name: tool for tool in TOOLS}["read_file"]
    assert read_tool.max_inline_bytes is not None and read_tool.max_inline_bytes >= 4 * files.MAX_READ_CHARS


LONG = "/".join(["a" * 200] * 5)  # 1,004 bytes
TOO_DEEP_OR_LONG = {
    "d/" * 32 + "f.txt": "33 components, over the most of 32",
    LONG + "/" + "b" * 20: "1025 bytes long, over the most of 1024",
    "n" * 256: "256 bytes long, over the most of 255",
    "docs/" + "é" * 128: "256 bytes long, over the most of 255",  # 128 characters, 256 bytes
    "a\ud800.txt": "not valid text",
}
AT_THE_BOUNDS = ["d/" * 31 + "f.txt", LONG + "/" + "b" * 19, "n" * 255, "docs/" + "é" * 127 + "e"]


@pytest.mark.parametrize(("bad", "reason"), TOO_DEEP_OR_LONG.items(), ids=lambda v: f"{len(v)} chars")
async def test_paths_too_deep_or_too_long_are_refused_without_making_anything(
    workspace: Path, bad: str, reason: str
) -> None:
    for model in (ReadFileInput, WriteFileInput, ListFilesInput):
        with pytest.raises(ValidationError, match=reason):
            model.model_validate({"path": bad, "content": "x"} if model is WriteFileInput else {"path": bad})
    with pytest.raises(ToolError, match=reason) as info:  # the tool body checks too, whatever called it
        await write_file(WriteFileInput.model_construct(path=bad, content="x", append=False), make_ctx(workspace))
    assert info.value.error_class == "validation" and str(workspace.parent) not in str(info.value)
    assert not workspace.exists()  # refused before the workspace (or any directory of the path) is made


@pytest.mark.parametrize("good", AT_THE_BOUNDS, ids=lambda v: f"{len(v)} chars")
async def test_paths_at_the_bounds_are_written(workspace: Path, good: str) -> None:
    written = await call(write_file, WriteFileInput, make_ctx(workspace), path=good, content="x")
    assert written == {"path": good, "bytes": 1, "appended": False} and (workspace / good).read_text() == "x"


async def test_a_recursive_listing_walks_the_whole_tree_in_order(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    for path in ("b.txt", "a/z.txt", "a/b/c/d.txt", "a/b/a.txt"):
        await call(write_file, WriteFileInput, ctx, path=path, content="x")
    (workspace / "link").symlink_to(workspace / "a", target_is_directory=True)  # listed, never entered
    listed = await call(list_files, ListFilesInput, ctx, recursive=True)
    assert [(e["path"], e["type"]) for e in listed["entries"]] == [
        ("a", "dir"),
        ("a/b", "dir"),
        ("a/b/a.txt", "file"),
        ("a/b/c", "dir"),
        ("a/b/c/d.txt", "file"),
        ("a/z.txt", "file"),
        ("b.txt", "file"),
        ("link", "symlink"),
    ]
