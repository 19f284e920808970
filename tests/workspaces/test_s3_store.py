"""The S3 workspace store on its own: incremental sync, quotas on the store, path safety, isolation, deletion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.messages import session_key
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.workspaces.disk import Quotas, workspace_for
from switchboard.core.workspaces.s3 import S3Workspaces, build_workspace_store
from switchboard.core.workspaces.store import WorkspaceStore
from switchboard.errors import ConfigError, ToolError
from switchboard.settings import Settings, load_settings
from tests.core.turns import make_tool

from .conftest import KEY_ID, SECRET, StoreFactory, keys

CHAT = session_key("acme", "a", "telegram", "default", "42")
TOPIC = session_key("acme", "a", "telegram", "default", "42", "7")  # its key extends the chat's
OTHER_TENANT = session_key("globex", "a", "telegram", "default", "42")


def put(store: S3Workspaces, session: str, name: str, data: bytes) -> Path:
    """Write through the quotas into the session's working copy, as a file tool does."""
    home = workspace_for(store.root, session)
    store.workspaces.store(home, home / name, data, shown=name)
    return home / name


async def test_hydrate_downloads_only_what_changed_since_this_worker_last_had_it(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    a, b = make_store(tmp_path / "a"), make_store(tmp_path / "b")
    await a.hydrate(CHAT)
    put(a, CHAT, "keep.txt", b"same")
    put(a, CHAT, "edit.txt", b"v1")
    put(a, CHAT, "drop.txt", b"bye")
    await a.persist(CHAT)
    kept = (workspace_for(a.root, CHAT) / "keep.txt").stat()

    await b.hydrate(CHAT)
    home_b = workspace_for(b.root, CHAT)
    assert sorted(p.name for p in home_b.iterdir()) == ["drop.txt", "edit.txt", "keep.txt"]
    put(b, CHAT, "edit.txt", b"v2, longer")
    (home_b / "drop.txt").unlink()
    await b.persist(CHAT)

    home_a = workspace_for(a.root, CHAT)
    (home_a / "stray.tmp").write_bytes(b"never persisted")  # a crash before persisting: the store wins
    await a.hydrate(CHAT)
    assert sorted(p.name for p in home_a.iterdir()) == ["edit.txt", "keep.txt"]
    assert (home_a / "edit.txt").read_bytes() == b"v2, longer"
    again = (home_a / "keep.txt").stat()
    assert (again.st_ino, again.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)  # not downloaded again


async def test_a_persist_over_the_session_quota_stores_nothing_and_resets_the_working_copy(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store = make_store(tmp_path / "a", quotas=Quotas(session_bytes=1000))
    await store.hydrate(CHAT)
    put(store, CHAT, "base.txt", b"b" * 100)
    await store.persist(CHAT)
    before = await keys(s3, bucket)
    home = workspace_for(store.root, CHAT)
    (home / "base.txt").write_bytes(b"changed")  # a sandboxed command writes straight to disk
    (home / "one.bin").write_bytes(b"1" * 600)
    (home / "two.bin").write_bytes(b"2" * 600)
    with pytest.raises(ToolError, match="would hold 1207 bytes, over the 1000-byte quota") as refused:
        await store.persist(CHAT)
    assert refused.value.error_class == "permanent"
    assert await keys(s3, bucket) == before  # not one of the three files
    assert sorted(p.name for p in home.iterdir()) == ["base.txt"]
    assert (home / "base.txt").read_bytes() == b"b" * 100


async def test_a_tool_whose_files_pass_the_tenant_quota_fails_with_the_reason_and_nothing_is_stored(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store = make_store(tmp_path / "a", quotas=Quotas(tenant_bytes=1000))
    await store.hydrate(TOPIC)
    put(store, TOPIC, "held.bin", b"h" * 700)
    await store.persist(TOPIC)
    before = await keys(s3, bucket)

    async def dump(args: Any, ctx: ToolContext) -> dict[str, bool]:  # writes around the quotas, like a shell
        (ctx.workspace / "dump.bin").write_bytes(b"d" * 400)
        return {"ok": True}

    gateway = ToolGateway(
        ToolRegistry([make_tool("dump", dump, side_effect="write")]),
        workspace_root=store.root,
        workspaces=store.workspaces,
        store=store,
    )
    await store.hydrate(CHAT)
    home = workspace_for(store.root, CHAT)
    home.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(session_key=CHAT, tenant="acme", run_id="r1", actor="u", workspace=home, idempotency_key="")
    outcome = await gateway.call("dump", {}, ctx)
    assert not outcome.ok and outcome.error_class == "permanent"
    assert "this tenant's workspaces would hold 1100 bytes, over the 1000-byte quota" in str(outcome.error)
    assert await keys(s3, bucket) == before
    assert not (home / "dump.bin").exists()

    # another tenant has a quota of its own
    await store.hydrate(OTHER_TENANT)
    put(store, OTHER_TENANT, "fine.bin", b"f" * 900)
    await store.persist(OTHER_TENANT)
    assert len(await keys(s3, bucket)) == len(before) + 1


@pytest.mark.parametrize("path", ["../x.txt", "a/../../x.txt", "/etc/passwd", "~/x", "", "C:/x"])
async def test_reads_that_leave_the_workspace_are_refused(make_store: StoreFactory, tmp_path: Path, path: str) -> None:
    store = make_store(tmp_path / "a")
    with pytest.raises(ToolError) as refused:
        await store.read(CHAT, path)
    assert refused.value.error_class == "validation"


async def test_symlinks_are_never_stored_and_hostile_keys_never_become_files(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    a, b = make_store(tmp_path / "a"), make_store(tmp_path / "b")
    secret = tmp_path / "host-secret.txt"
    secret.write_bytes(b"root:x:0:0")
    outside = tmp_path / "outside"
    outside.mkdir()
    await a.hydrate(CHAT)
    put(a, CHAT, "real.txt", b"ok")
    home = workspace_for(a.root, CHAT)
    (home / "link.txt").symlink_to(secret)
    (home / "dir").symlink_to(outside, target_is_directory=True)
    await a.persist(CHAT)
    assert [k.rsplit("/", 1)[-1] for k in await keys(s3, bucket)] == ["real.txt"]
    with pytest.raises(FileNotFoundError):
        await b.read(CHAT, "link.txt")

    prefix = "deploy/" + workspace_for(Path(), CHAT).as_posix() + "/"
    for hostile in ["../../../escape.txt", "a/../../escape.txt", "/abs.txt", "./dot.txt", "dir/into-symlink.txt"]:
        await s3.put_object(Bucket=bucket, Key=prefix + hostile, Body=b"planted")
    await a.hydrate(CHAT)  # the symlinks go (the store has none); only plain names become files
    assert not (home / "link.txt").is_symlink() and not (home / "dir").is_symlink()
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [
        "dir",
        "dir/into-symlink.txt",
        "real.txt",
    ]
    assert list(outside.iterdir()) == [] and secret.read_bytes() == b"root:x:0:0"
    assert not list(tmp_path.rglob("escape.txt")) and not list(tmp_path.rglob("abs.txt"))


async def test_one_session_cannot_read_another_sessions_files(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(tmp_path / "a")
    await store.hydrate(CHAT)
    put(store, CHAT, "mine.txt", b"chat only")
    await store.persist(CHAT)
    assert await store.read(CHAT, "mine.txt") == b"chat only"
    for session in (TOPIC, OTHER_TENANT):
        with pytest.raises(FileNotFoundError):
            await store.read(session, "mine.txt")
        with pytest.raises(ToolError):
            await store.read(session, f"../{workspace_for(Path(), CHAT).name}/mine.txt")
    chat, topic = store._session_prefix(CHAT), store._session_prefix(TOPIC)
    assert not chat.startswith(topic) and not topic.startswith(chat)  # sibling prefixes, whatever the ids


async def test_delete_removes_the_sessions_keys_and_working_copy_only(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store = make_store(tmp_path / "a")
    for session in (CHAT, TOPIC):
        await store.hydrate(session)
        put(store, session, "f.txt", session.encode())
        await store.persist(session)
    await store.delete(CHAT)
    assert [k.startswith(store._session_prefix(TOPIC)) for k in await keys(s3, bucket)] == [True]
    assert not workspace_for(store.root, CHAT).exists() and workspace_for(store.root, TOPIC).exists()
    with pytest.raises(FileNotFoundError):
        await store.read(CHAT, "f.txt")


async def test_credentials_come_from_the_standard_aws_variables_when_none_are_configured(
    s3_url: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bare = S3Workspaces(tmp_path / "w1", bucket=bucket, endpoint_url=s3_url, region="us-east-1")
    with pytest.raises(OSError, match="has no credentials"):
        await bare.read(CHAT, "x.txt")
    await bare.aclose()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    store = S3Workspaces(tmp_path / "w2", bucket=bucket, endpoint_url=s3_url, region="us-east-1")
    try:
        with pytest.raises(FileNotFoundError):
            await store.read(CHAT, "x.txt")
    finally:
        await store.aclose()


def test_the_s3_backend_is_configured_by_environment(tmp_path: Path) -> None:
    env = {
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_WORKSPACES__BACKEND": "s3",
        "SWITCHBOARD_WORKSPACES__ROOT": str(tmp_path / "cache"),
        "SWITCHBOARD_WORKSPACES__S3__BUCKET": "sessions",
        "SWITCHBOARD_WORKSPACES__S3__PREFIX": "/prod/eu/",
        "SWITCHBOARD_WORKSPACES__S3__ENDPOINT_URL": "http://minio.internal:9000",
        "SWITCHBOARD_WORKSPACES__S3__SECRET_ACCESS_KEY": "not-in-repr",
        "SWITCHBOARD_WORKSPACES__TENANT_QUOTA_MB": "7",
    }
    settings = load_settings(env)
    assert "not-in-repr" not in repr(settings)
    store = build_workspace_store(settings.workspace_path, settings.workspaces)
    assert isinstance(store, S3Workspaces)
    assert (store.bucket, store.prefix, store.root) == ("sessions", "prod/eu/", tmp_path / "cache")
    assert store.quotas.tenant_bytes == 7 * 2**20
    with pytest.raises(ConfigError):
        _store(load_settings({**env, "SWITCHBOARD_WORKSPACES__S3__PREFIX": "a/../b"}))
    with pytest.raises(ConfigError):
        _store(load_settings({**env, "SWITCHBOARD_WORKSPACES__S3__BUCKET": ""}))


def test_starting_a_worker_does_not_import_the_s3_client() -> None:
    code = "import sys, switchboard.cli.worker, switchboard.core.workspaces.s3; print('aiobotocore' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert done.stdout.strip() == "False"


def _store(settings: Settings) -> WorkspaceStore:
    return build_workspace_store(settings.workspace_path, settings.workspaces)
