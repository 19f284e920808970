"""Connector packs: prebuilt integrations an operator switches on per agent (``docs/connectors.md``)."""

from switchboard.core.connectors.expand import Expansion, expand_connectors, expand_pack
from switchboard.core.connectors.pack import ConnectorPack, PackSetting, load_packs

__all__ = ["ConnectorPack", "Expansion", "PackSetting", "expand_connectors", "expand_pack", "load_packs"]
