"""``SWITCHBOARD_WORKSPACES__*``: where session workspaces are kept, their quotas, and the tool threads.

Defined here, with the stores that read it, and a field of :class:`switchboard.settings.Settings`
(docs/ARCHITECTURE.md §7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["WorkspaceS3Settings", "WorkspaceSettings"]


class WorkspaceS3Settings(BaseModel):
    """``SWITCHBOARD_WORKSPACES__S3__*``: the bucket session workspaces are kept in when the backend is ``s3``."""

    model_config = ConfigDict(extra="forbid")

    bucket: str = ""
    """The bucket (it must exist)."""
    prefix: str = ""
    """Keys start with it (``<prefix>/t-<tenant digest>/<session digest>/<path>``)."""
    endpoint_url: str | None = None
    """The S3 API's address: MinIO, Cloudflare R2, Ceph… (unset: AWS)."""
    region: str | None = None
    """The bucket's region (unset: ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, botocore's chain)."""
    access_key_id: SecretStr | None = None
    """With ``secret_access_key``; unset: the standard AWS chain (``AWS_ACCESS_KEY_ID``…, profiles, roles)."""
    secret_access_key: SecretStr | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """``path`` for most self-hosted servers."""
    concurrency: int = Field(8, ge=1)
    """Transfers in flight at once while one workspace is synced."""


class WorkspaceSettings(BaseModel):
    """``SWITCHBOARD_WORKSPACES__*``: where session workspaces are kept, their quotas, and the tool threads."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "s3"] = "local"
    """``local``: a directory (one host, or a shared volume at the same path on every host); ``s3``: a bucket,
    worked on in local copies under ``root``."""
    root: Path | None = None
    """Local directory of the workspaces (``local``) or of the working copies (``s3``); unset:
    ``<data dir>/workspaces``. Relative to the working directory."""
    s3: WorkspaceS3Settings = Field(default_factory=WorkspaceS3Settings)
    session_quota_mb: int = Field(100, ge=1)
    """Most one session's workspace may hold."""
    tenant_quota_mb: int = Field(1000, ge=1)
    """Most all the workspaces of one tenant may hold together."""
    total_quota_mb: int = Field(10_000, ge=1)
    """Most every workspace under the data directory may hold together."""
    tool_threads: int = Field(16, ge=1)
    """Threads for blocking tool work (file tools), for every session of a worker together."""
    threads_per_session: int = Field(2, ge=1)
    """Most of those threads one session may hold at once."""
