"""Connector packs: prebuilt integrations an operator switches on per agent (the packs' data and their servers)."""
