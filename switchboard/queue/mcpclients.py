"""The MCP clients of ``switchboard mcp serve``: one bearer token each, stored only as its SHA-256, one tenant each.

``switchboard mcp clients add NAME --tenant T`` makes the token and prints it once; Redis keeps the client under the
token's hash (a lookup by hash leaks nothing through timing, as for the web chat's tokens) and in its tenant's list.
"""

from __future__ import annotations

import hmac
import json
import re
import time
from dataclasses import dataclass
from typing import Final

import redis.asyncio as aioredis

from switchboard.queue.keys import GlobalKeys

__all__ = ["CLIENT_NAME_PATTERN", "McpClient", "McpClientStore"]

CLIENT_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,39}$"
"""An MCP client's name: it is part of its conversations' ids and of what it signs (``mcp:<name>``)."""
_HASH: Final = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class McpClient:
    """One MCP client: who it is and which tenant's agents it reaches."""

    name: str
    tenant: str
    sha256: str
    created_at: float


class McpClientStore:
    """Add, find, list and remove MCP clients in Redis."""

    def __init__(self, redis: aioredis.Redis, keys: GlobalKeys | None = None) -> None:
        """Use ``redis`` (owned by the caller)."""
        self._redis = redis
        self._keys = keys or GlobalKeys()

    async def add(self, tenant: str, name: str, sha256: str) -> McpClient:
        """Register a client with its token's hash.

        Raises:
            ValueError: a bad name or hash, or the tenant already has a client of that name.
        """
        if not re.match(CLIENT_NAME_PATTERN, name):
            raise ValueError(f"client name {name!r}: use 1-40 of a-z 0-9 _ - (starting with a letter or digit)")
        if not _HASH.match(sha256):
            raise ValueError("the token hash must be 64 lower-case hex digits")
        client = McpClient(name=name, tenant=tenant, sha256=sha256, created_at=time.time())
        if not await self._redis.hsetnx(self._keys.mcp_clients(tenant), name, sha256):
            raise ValueError(f"tenant {tenant!r} already has an MCP client {name!r}: remove it first")
        record = {"name": name, "tenant": tenant, "sha256": sha256, "created_at": client.created_at}
        await self._redis.set(self._keys.mcp_client(sha256), json.dumps(record))
        return client

    async def find(self, sha256: str) -> McpClient | None:
        """The client whose token has this hash, or ``None`` (the stored hash is compared in constant time too)."""
        raw = await self._redis.get(self._keys.mcp_client(sha256))
        if raw is None:
            return None
        record = json.loads(raw)
        if not hmac.compare_digest(str(record["sha256"]), sha256):
            return None
        return McpClient(
            name=record["name"], tenant=record["tenant"], sha256=record["sha256"], created_at=record["created_at"]
        )

    async def of_tenant(self, tenant: str) -> list[McpClient]:
        """The tenant's clients, by name."""
        found: list[McpClient] = []
        for name, sha256 in sorted((await self._redis.hgetall(self._keys.mcp_clients(tenant))).items()):
            client = await self.find(_text(sha256))
            if client is not None:
                found.append(client)
            else:
                found.append(McpClient(name=_text(name), tenant=tenant, sha256=_text(sha256), created_at=0.0))
        return found

    async def remove(self, tenant: str, name: str) -> bool:
        """Revoke a client's token at once; ``False`` when the tenant has no such client."""
        sha256 = await self._redis.hget(self._keys.mcp_clients(tenant), name)
        if sha256 is None:
            return False
        # Two steps (the token and the tenant's index are in different slots on a cluster): the token first, so it
        # stops working at once. A crash between leaves an index entry naming a deleted token: it admits nothing
        # (find reads the token's own record), of_tenant lists it with created_at 0, and removing it again ends it.
        await self._redis.delete(self._keys.mcp_client(_text(sha256)))
        await self._redis.hdel(self._keys.mcp_clients(tenant), name)
        return True


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
