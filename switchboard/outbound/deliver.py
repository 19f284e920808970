"""⑤ The worker's :class:`Deliverer` over channel adapters, and workspace files for sends.

Each action goes to the adapter of its conversation's ``(channel, account)``; the outbox around it owns idempotency,
parts and shared rate limits. :class:`ClassifiedDeliverer` turns whatever a channel's send raises into a
:class:`~switchboard.errors.DeliveryError`, so one bad send is retried and dead-lettered like any refused one instead
of failing the turn again and again.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Protocol

from redis.exceptions import RedisError

from switchboard.channels.base import Capabilities, Channel, FileData, Receipt, SendContext
from switchboard.channels.registry import PerConversation
from switchboard.core.actions import Action
from switchboard.core.messages import ConversationRef
from switchboard.core.protocols import conforms
from switchboard.core.tools.builtin.files import resolve_in_workspace
from switchboard.core.workspaces.disk import workspace_for
from switchboard.core.workspaces.safepaths import UnsafePathError, read_inside
from switchboard.core.workspaces.store import WorkspaceStore
from switchboard.errors import DeliveryError, FencedWriteError, ToolError

__all__ = [
    "MAX_SEND_FILE_BYTES",
    "NO_CHANNEL",
    "ChannelDeliverer",
    "ChannelRegistry",
    "ClassifiedDeliverer",
    "Deliverer",
    "read_stored_file",
    "read_workspace_file",
]

logger = logging.getLogger(__name__)

ChannelRegistry = Mapping[tuple[str, str], Channel] | Callable[[ConversationRef], Channel | None]

NO_CHANNEL = Capabilities(max_text=4096)
"""What a conversation without an adapter in this process can show: nothing streams, nothing is typed."""

MAX_SEND_FILE_BYTES = 2 * 2**30
"""The largest workspace file read for sending (every platform's own cap is far below; the channel checks it)."""


def _read(workspace: Path, path: Path) -> bytes:
    return read_inside(workspace, path, limit=MAX_SEND_FILE_BYTES + 1)  # no link followed, no FIFO waited on


async def read_workspace_file(root: Path | None, session: str, path: str, conversation: ConversationRef) -> FileData:
    """Read ``path`` (relative to ``session``'s workspace under ``root``) for a channel to send.

    Raises:
        DeliveryError: no workspace root here, an absolute path or one that leaves the workspace (also through a
            symlink), no such file, or a file too large (``retryable=False``).
    """
    channel = conversation.channel
    if root is None:
        raise DeliveryError("this worker has no workspace root to send files from", channel=channel, retryable=False)
    workspace = workspace_for(root, session)
    try:
        target = resolve_in_workspace(workspace, path, create=False)
    except ToolError as exc:
        raise DeliveryError(f"cannot send {path!r}: {exc}", channel=channel, retryable=False) from None
    try:
        data = await asyncio.to_thread(_read, workspace, target)
    except UnsafePathError:
        raise DeliveryError(
            f"cannot send {path!r}: a symlink or no regular file", channel=channel, retryable=False
        ) from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise DeliveryError(f"cannot send {path!r}: no such file", channel=channel, retryable=False) from None
    except OSError as exc:
        raise DeliveryError(f"cannot send {path!r}: {exc.strerror}", channel=channel, retryable=False) from None
    if len(data) > MAX_SEND_FILE_BYTES:
        raise DeliveryError(f"cannot send {path!r}: the file is too large", channel=channel, retryable=False)
    name = PurePosixPath(path).name
    return FileData(name=name, data=data, mime_type=mimetypes.guess_type(name)[0])


async def read_stored_file(store: WorkspaceStore, session: str, path: str, conversation: ConversationRef) -> FileData:
    """Read ``path`` (relative to ``session``'s workspace) from the workspace store, for a channel to send.

    Raises:
        DeliveryError: an absolute path or one that leaves the workspace, no such file, a file too large, or the
            store could not be reached (``retryable=False`` but for the last).
    """
    channel = conversation.channel
    try:
        data = await store.read(session, path, MAX_SEND_FILE_BYTES)
    except ToolError as exc:
        raise DeliveryError(f"cannot send {path!r}: {exc}", channel=channel, retryable=False) from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise DeliveryError(f"cannot send {path!r}: no such file", channel=channel, retryable=False) from None
    except OSError as exc:
        raise DeliveryError(f"cannot send {path!r}: {exc.strerror or exc}", channel=channel) from None
    if len(data) > MAX_SEND_FILE_BYTES:
        raise DeliveryError(f"cannot send {path!r}: the file is too large", channel=channel, retryable=False)
    name = PurePosixPath(path).name
    return FileData(name=name, data=data, mime_type=mimetypes.guess_type(name)[0])


class Deliverer(Protocol):
    """Carries send actions to the conversation's channel (the web tier's channel registry, or a test's recorder)."""

    def capabilities(self, conversation: ConversationRef) -> Capabilities:
        """What the conversation's channel can show (how replies stream, typing, rates)."""

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Perform one action; raises ``DeliveryError`` / ``RateLimitedError``."""


class ChannelDeliverer:
    """Delivers actions through the channel adapter registered for each conversation."""

    def __init__(self, channels: ChannelRegistry) -> None:
        """Route through ``channels``.

        Args:
            channels: ``(channel, account) → adapter`` (what the web tier keeps in ``app[CHANNELS]``), or a
                function that finds the adapter for a conversation.
        """
        if callable(channels):
            self._find = channels
        else:
            registry = channels
            self._find = lambda conv: registry.get((conv.channel, conv.account))

    def _channel(self, conversation: ConversationRef) -> Channel:
        channel = self._find(conversation)
        if channel is None:
            raise DeliveryError(
                f"no adapter for {conversation.channel}/{conversation.account}",
                channel=conversation.channel,
                retryable=False,
            )
        return channel

    def capabilities(self, conversation: ConversationRef) -> Capabilities:
        """What the conversation's channel can show (:data:`NO_CHANNEL` when it has no adapter here)."""
        channel = self._find(conversation)
        if channel is None:
            return NO_CHANNEL
        if conforms(channel, PerConversation):  # Telegram: drafts in private chats, edits in groups
            return channel.capabilities_for(conversation)
        return channel.capabilities

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Perform ``action`` on the conversation's channel.

        Raises:
            DeliveryError: no adapter for the conversation, or the platform refused the send.
            RateLimitedError: the platform asked to wait (the outbox retries the send).
        """
        return await self._channel(conversation).perform(action, conversation, send)


class ClassifiedDeliverer:
    """A deliverer whose sends fail only with :class:`DeliveryError`, whatever the channel underneath raises.

    An unexpected exception of a channel's send (a ``ValueError`` from the HTTP client on a URL it cannot use, a
    bug in an adapter) becomes a retryable ``DeliveryError`` naming the channel and the exception's type (not its
    text, which may quote a URL's credentials); its traceback goes to the log. Passed through unchanged: the lease
    passing to another epoch (``FencedWriteError``) and the queue's own Redis failing (``RedisError``), which the
    drain handles itself, and cancellation.
    """

    def __init__(self, inner: Deliverer) -> None:
        self.inner = inner

    def capabilities(self, conversation: ConversationRef) -> Capabilities:
        """What the conversation's channel can show."""
        return self.inner.capabilities(conversation)

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Perform ``action`` through the inner deliverer.

        Raises:
            DeliveryError: the send failed, for whatever reason (``RateLimitedError`` when the platform asked to
                wait).
            FencedWriteError: the session's lease passed to another worker.
        """
        try:
            return await self.inner.perform(action, conversation, send)
        except (DeliveryError, FencedWriteError, RedisError):
            raise
        except Exception as exc:
            channel = conversation.channel
            logger.warning("%s send of %s failed unexpectedly", channel, action.kind, exc_info=True)
            raise DeliveryError(
                f"{channel}: the send failed unexpectedly ({type(exc).__name__})", channel=channel
            ) from exc
