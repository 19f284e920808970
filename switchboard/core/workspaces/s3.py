"""Session workspaces in an object store over the S3 API (AWS S3, MinIO, Cloudflare R2, …), and the store factory.

Keys mirror the local layout (tenant and session digests), so no session's prefix lies inside another's; a path
becomes a key only if it is a plain relative path within the bounds. Workers keep working copies and move only what
changed (:mod:`switchboard.core.workspaces.sync`); a persist refused by a quota uploads nothing. ``aiobotocore`` is
optional (``switchboard[s3]``) and imported on first use; credentials come from the settings, else botocore's chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, assert_never

from switchboard.core.tools.builtin.files import check_relative_path
from switchboard.core.workspaces.config import WorkspaceSettings
from switchboard.core.workspaces.disk import Quotas, Workspaces, tenant_dir, workspace_for
from switchboard.core.workspaces.safepaths import UnsafePathError, read_regular
from switchboard.core.workspaces.store import MAX_READ_BYTES, LocalWorkspaces, WorkspaceStore
from switchboard.core.workspaces.sync import (
    LocalFile,
    Synced,
    load_manifest,
    manifest_path,
    prune,
    remote_name,
    save_manifest,
    scan,
    write_copy,
)
from switchboard.errors import ConfigError, ToolError

__all__ = ["S3Workspaces", "build_workspace_store"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_DELETE_BATCH = 1000
_REFUSED_KEPT = 10_000
"""Most keys one ``DeleteObjects`` request takes."""


def _etag(value: object) -> str:
    return str(value or "").strip('"')


def _read_local(home: Path, name: str) -> tuple[LocalFile, bytes] | None:
    """A regular file of the working copy, read without following a symlink (``None``: gone, or not a file now)."""
    try:
        st, data = read_regular(home, tuple(name.split("/")))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, UnsafePathError):
        return None
    return LocalFile(st.st_size, st.st_mtime_ns), data


class _KeyRefusedError(OSError):
    """The store answered that it will not hold this key (HTTP 400: too long, a character it refuses)."""


@asynccontextmanager
async def _store_errors(what: str) -> AsyncIterator[None]:
    """Errors of the object store as ``OSError`` (``FileNotFoundError`` for a missing key); no credential shown."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in {"NoSuchKey", "404", "NotFound"}:
            raise FileNotFoundError(what) from None
        refused = _KeyRefusedError if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 400 else OSError
        raise refused(f"the workspace store refused {what}: {code or 'error'}") from None
    except NoCredentialsError:
        raise OSError(f"the workspace store has no credentials ({what}): see SWITCHBOARD_WORKSPACES__S3__*") from None
    except BotoCoreError as exc:
        raise OSError(f"the workspace store could not be reached ({what}): {type(exc).__name__}") from None


class S3Workspaces:
    """Session workspaces in an S3 bucket, worked on in local copies (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        addressing_style: str = "auto",
        workspaces: Workspaces | None = None,
        concurrency: int = 8,
    ) -> None:
        """Keep workspaces in ``bucket``.

        Args:
            root: Where this worker keeps its working copies (and what it last synced, under ``.sync``).
            bucket: The bucket (it must exist).
            prefix: Keys start with it (``a/b`` → ``a/b/t-…/…``); empty: at the bucket's top.
            endpoint_url: The S3 API's address (MinIO, R2, a test server); ``None``: AWS.
            region: The bucket's region (``None``: botocore's default chain).
            access_key_id: With ``secret_access_key``; ``None``: botocore's standard credential chain.
            secret_access_key: See ``access_key_id``.
            addressing_style: ``auto``, ``path`` (most self-hosted servers) or ``virtual``.
            workspaces: The quotas, shared with the tools that write (told what the tenant's other workspaces hold).
            concurrency: Transfers in flight at once per hydrate or persist.

        Raises:
            ConfigError: no bucket, or a prefix with ``..`` or an empty segment.
        """
        if not bucket:
            raise ConfigError("the S3 workspace store needs a bucket", field="workspaces.s3.bucket")
        cleaned = prefix.strip("/")
        if cleaned and any(part in {"", ".", ".."} for part in cleaned.split("/")):
            raise ConfigError("the S3 prefix may not hold '..', '.' or '//'", field="workspaces.s3.prefix")
        self.root = root
        self.bucket = bucket
        self.prefix = f"{cleaned}/" if cleaned else ""
        self.workspaces = workspaces or Workspaces(root)
        self._options: dict[str, Any] = {"endpoint_url": endpoint_url, "region_name": region}
        if access_key_id and secret_access_key:
            self._options |= {"aws_access_key_id": access_key_id, "aws_secret_access_key": secret_access_key}
        self._addressing = addressing_style
        self._limit = asyncio.Semaphore(max(1, concurrency))
        self._exit: AsyncExitStack | None = None
        self._s3: Any = None
        self._opening = asyncio.Lock()
        self._refused: set[tuple[str, str]] = set()
        """Keys the store refused, logged once each (forgotten past :data:`_REFUSED_KEPT`)."""

    @property
    def quotas(self) -> Quotas:
        """The session and tenant quotas checked on the store."""
        return self.workspaces.quotas

    def path(self, session_key: str) -> Path:
        """The session's working copy on this worker."""
        return workspace_for(self.root, session_key)

    def _tenant_prefix(self, session_key: str) -> str:
        return f"{self.prefix}{tenant_dir(Path(), session_key).name}/"

    def _session_prefix(self, session_key: str) -> str:
        return f"{self._tenant_prefix(session_key)}{workspace_for(Path(), session_key).name}/"

    async def _client(self) -> Any:
        if self._s3 is None:
            async with self._opening:
                if self._s3 is None:
                    from aiobotocore.config import AioConfig  # imported here: worker start time matters
                    from aiobotocore.session import get_session

                    stack = AsyncExitStack()
                    config = AioConfig(s3={"addressing_style": self._addressing}, retries={"mode": "standard"})
                    client = get_session().create_client("s3", config=config, **self._options)
                    self._s3 = await stack.enter_async_context(client)
                    self._exit = stack
        return self._s3

    async def _call(self, what: str, call: Callable[[Any], Awaitable[_T]]) -> _T:
        client = await self._client()
        async with self._limit, _store_errors(what):
            return await call(client)

    async def _listing(self, session_key: str) -> tuple[dict[str, tuple[str, int]], int]:
        """The session's files in the store (name → entity tag, size), and the bytes of the tenant's other ones."""
        client = await self._client()
        mine = self._session_prefix(session_key)
        files: dict[str, tuple[str, int]] = {}
        others = 0
        async with _store_errors("a listing"):
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._tenant_prefix(session_key)
            )
            async for page in pages:
                for item in page.get("Contents", ()):
                    key, size = str(item["Key"]), int(item.get("Size", 0))
                    if not key.startswith(mine):
                        others += size
                    elif (name := remote_name(key[len(mine) :])) is not None:
                        files[name] = (_etag(item.get("ETag")), size)
        return files, others

    async def hydrate(self, session_key: str) -> Path:
        """Download what changed in the store since this worker last synced the session; drop what is gone."""
        home = self.path(session_key)
        remote, others = await self._listing(session_key)
        where = manifest_path(self.root, session_key)
        manifest = await asyncio.to_thread(load_manifest, where)
        local, odd = await asyncio.to_thread(scan, home)
        await asyncio.to_thread(prune, home, [*odd, *(name for name in local if name not in remote)])
        kept = {
            name: synced
            for name, (etag, _) in remote.items()
            if (synced := manifest.get(name)) is not None and synced.etag == etag and synced.matches(local.get(name))
        }

        async def fetch(name: str, etag: str) -> None:
            data: bytes = await self._call(name, lambda s3: self._get(s3, self._session_prefix(session_key) + name))
            try:
                written = await asyncio.to_thread(write_copy, home, name, data)
            except ToolError:
                logger.warning("a workspace file was not copied: its path leads out of the working directory")
                return
            kept[name] = Synced(etag, written.size, written.mtime_ns)

        await asyncio.gather(*(fetch(name, etag) for name, (etag, _) in remote.items() if name not in kept))
        await asyncio.to_thread(save_manifest, where, kept)
        self.workspaces.elsewhere[home.resolve()] = others
        return home

    async def _get(self, s3: Any, key: str, limit: int | None = None) -> bytes:
        extra = {"Range": f"bytes=0-{limit}"} if limit is not None else {}
        answer = await s3.get_object(Bucket=self.bucket, Key=key, **extra)
        async with answer["Body"] as body:
            data: bytes = await body.read()
        return data

    async def persist(self, session_key: str) -> None:
        """Upload the files that changed and delete the keys of those removed, within the quotas."""
        home = self.path(session_key)
        where = manifest_path(self.root, session_key)
        manifest = await asyncio.to_thread(load_manifest, where)
        local, _ = await asyncio.to_thread(scan, home)
        prefix = self._session_prefix(session_key)
        local = self._storable(local, prefix)
        changed = [name for name, f in local.items() if not ((s := manifest.get(name)) and s.matches(f))]
        removed = [name for name in manifest if name not in local]
        if not changed and not removed:
            return
        _, others = await self._listing(session_key)
        refusal = self._over_quota(len(local), sum(f.size for f in local.values()), others)
        if refusal is not None:
            await self.hydrate(session_key)  # the working copy goes back to what the store holds
            raise ToolError(refusal, error_class="permanent")

        async def upload(name: str) -> None:
            found = await asyncio.to_thread(_read_local, home, name)
            if found is None:  # gone meanwhile: the next persist deletes its key
                return
            stat, data = found
            try:
                answer = await self._call(
                    name, lambda s3: s3.put_object(Bucket=self.bucket, Key=prefix + name, Body=data)
                )
            except _KeyRefusedError as exc:  # a name the store cannot hold: skipped, the others are saved
                if (prefix, name) not in self._refused:
                    self._remember_refused(prefix, name)
                    logger.warning("a workspace file was not saved (the store refused its key): %s", exc)
                return
            manifest[name] = Synced(_etag(answer.get("ETag")), stat.size, stat.mtime_ns)

        try:
            await asyncio.gather(*(upload(name) for name in changed))
            for start in range(0, len(removed), _DELETE_BATCH):
                batch = removed[start : start + _DELETE_BATCH]
                objects = {"Objects": [{"Key": prefix + name} for name in batch], "Quiet": True}
                await self._call("a deletion", partial(self._delete, objects))
                for name in batch:
                    manifest.pop(name, None)
        finally:
            await asyncio.to_thread(save_manifest, where, manifest)
        self.workspaces.elsewhere[home.resolve()] = others

    def _remember_refused(self, prefix: str, name: str) -> None:
        if len(self._refused) >= _REFUSED_KEPT:
            self._refused.clear()
        self._refused.add((prefix, name))

    def _storable(self, local: dict[str, LocalFile], prefix: str) -> dict[str, LocalFile]:
        """The files whose names can be keys under ``prefix``; the others are logged once each and never sent."""
        kept: dict[str, LocalFile] = {}
        for name, found in local.items():
            if remote_name(name, prefix) is not None:
                kept[name] = found
            elif (prefix, name) not in self._refused:
                self._remember_refused(prefix, name)
                logger.warning("a workspace file was not saved: its name cannot be a key (control character or length)")
        return kept

    async def _delete(self, objects: dict[str, Any], s3: Any) -> Any:
        return await s3.delete_objects(Bucket=self.bucket, Delete=objects)

    def _over_quota(self, files: int, size: int, others: int) -> str | None:
        quotas = self.quotas
        if files > quotas.session_files:
            return (
                f"the session workspace would hold {files} files, over the most of {quotas.session_files}: "
                "nothing was saved; write into existing files"
            )
        if size > quotas.session_bytes:
            return (
                f"the session workspace would hold {size} bytes, over the {quotas.session_bytes}-byte quota: "
                "nothing was saved; write less, or replace files"
            )
        if others + size > quotas.tenant_bytes:
            return (
                f"this tenant's workspaces would hold {others + size} bytes, over the {quotas.tenant_bytes}-byte "
                "quota: nothing was saved; write less, or replace files"
            )
        return None

    async def read(self, session_key: str, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        """Up to ``limit + 1`` bytes of ``path`` from the store (never from a working copy)."""
        try:
            name = check_relative_path(path)
        except ValueError as exc:
            raise ToolError(str(exc), error_class="validation") from None
        key = self._session_prefix(session_key) + name
        return await self._call("a read", lambda s3: self._get(s3, key, limit))

    async def delete(self, session_key: str) -> None:
        """Delete every key of the session, its working copy here and what this worker last synced of it."""
        client = await self._client()
        prefix = self._session_prefix(session_key)
        async with _store_errors("a deletion"):
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            async for page in pages:
                keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
                if keys:
                    await client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
        await asyncio.to_thread(self.workspaces.remove, self.path(session_key))
        with contextlib.suppress(OSError):
            manifest_path(self.root, session_key).unlink()

    async def delete_tenant(self, tenant: str) -> int:
        """Delete every object under the tenant's prefix (sessions Redis no longer knows of too) and its working copies.

        Returns the objects deleted.
        """
        client = await self._client()
        prefix = self._tenant_prefix(f"{tenant}/-")
        deleted = 0
        async with _store_errors("a deletion"):
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            async for page in pages:
                keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
                if keys:
                    await client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
                    deleted += len(keys)
        home = tenant_dir(self.root, f"{tenant}/-")
        await asyncio.to_thread(shutil.rmtree, home, ignore_errors=True)
        return deleted

    async def aclose(self) -> None:
        """Close the S3 client (if one was opened)."""
        if self._exit is not None:
            stack, self._exit, self._s3 = self._exit, None, None
            await stack.aclose()


def build_workspace_store(
    root: Path, spaces: WorkspaceSettings, workspaces: Workspaces | None = None
) -> WorkspaceStore:
    """The store ``SWITCHBOARD_WORKSPACES__BACKEND`` names, working under ``root`` (``Settings.workspace_path``).

    Args:
        root: The workspaces' directory (of the working copies, for ``s3``).
        spaces: ``SWITCHBOARD_WORKSPACES__*`` (``Settings.workspaces``).
        workspaces: The quotas' bookkeeping the tools write through (default: one from ``spaces``).

    Raises:
        ConfigError: ``s3`` without a bucket, or with a bad prefix.
    """
    if workspaces is None:
        mib = 2**20
        workspaces = Workspaces(
            root, Quotas(spaces.session_quota_mb * mib, spaces.tenant_quota_mb * mib, spaces.total_quota_mb * mib)
        )
    backend = spaces.backend
    if backend == "local":
        return LocalWorkspaces(root, workspaces)
    if backend == "s3":
        s3 = spaces.s3
        return S3Workspaces(
            root,
            bucket=s3.bucket,
            prefix=s3.prefix,
            endpoint_url=s3.endpoint_url,
            region=s3.region,
            access_key_id=s3.access_key_id.get_secret_value() if s3.access_key_id else None,
            secret_access_key=s3.secret_access_key.get_secret_value() if s3.secret_access_key else None,
            addressing_style=s3.addressing_style,
            workspaces=workspaces,
            concurrency=s3.concurrency,
        )
    assert_never(backend)
