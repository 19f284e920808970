"""Fake third-party APIs for tests and demos: small aiohttp applications speaking the real wire shapes.

The connector packs' APIs are played here (``calendar_api``, ``issues_api``); each records the requests it got.
"""

__all__: list[str] = []
