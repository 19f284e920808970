"""Connector packs shipped with Switchboard: their files (``packs/<pack>.yaml``) and the servers some of them run.

The loader is :mod:`switchboard.core.connectors`; ``docs/connectors.md`` describes each pack.
"""

__all__: list[str] = []
