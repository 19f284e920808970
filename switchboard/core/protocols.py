"""Whether an object implements an optional protocol, answered once per class.

``isinstance`` against a ``runtime_checkable`` protocol looks every member up again on each call; the hot path asks
the same questions of the same few classes for every message (is this sink a status sink, this store an approval
store). A class that has every member itself conforms for all its instances, so that answer is kept; one that lacks
some may still get them per instance, so it is asked each time.
"""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar

from typing_extensions import get_protocol_members

__all__ = ["conforms"]

P = TypeVar("P")

_BY_CLASS: dict[tuple[type, type], bool] = {}


def conforms(obj: object, protocol: type[P]) -> TypeGuard[P]:
    """``isinstance(obj, protocol)`` for a ``runtime_checkable`` protocol, remembered per class when it holds."""
    key = (type(obj), protocol)
    if _BY_CLASS.get(key):
        return True
    ok = isinstance(obj, protocol)
    if ok and all(hasattr(key[0], name) for name in _members(protocol)):
        _BY_CLASS[key] = True
    return ok


def _members(protocol: type[Any]) -> frozenset[str]:
    return frozenset(get_protocol_members(protocol))
