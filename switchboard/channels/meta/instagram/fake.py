"""The fake Send API in its Instagram flavour, for ``switchboard run``'s built-in fake and ``simulate instagram``.

The same server as :mod:`switchboard.channels.meta.messaging.fake.platform` (``FakeMessenger("instagram")``): text
limited to 1,000
UTF-8 bytes, deliveries with ``object: instagram`` and the fake's Instagram account id as ``entry[].id``.
"""

from __future__ import annotations

import secrets

from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.fake.payloads import IG_ACCOUNT_ID
from switchboard.channels.meta.messaging.fake.platform import FakeMessenger, sim_details, sim_replies, sim_request
from switchboard.channels.registry import FakePlatform, Simulation

__all__ = ["SIMULATION"]


async def _sim_start(settings: InstagramSettings) -> tuple[InstagramSettings, FakePlatform]:
    fake = FakeMessenger("instagram")
    await fake.start()
    block = InstagramSettings(
        access_token="IGfake" + secrets.token_hex(12),
        app_secret=secrets.token_hex(16),
        verify_token=secrets.token_hex(8),
        graph_base_url=fake.graph_url,
        account_id=IG_ACCOUNT_ID,
    )
    return block, fake


def _sim_details(settings: InstagramSettings) -> dict[str, str]:
    return sim_details(settings, settings.account_id or IG_ACCOUNT_ID)


SIMULATION: Simulation[InstagramSettings] = Simulation(
    start=_sim_start, details=_sim_details, request=sim_request("instagram", 1_000_000_000_000_000), replies=sim_replies
)
"""How ``switchboard run`` fakes Instagram without credentials, and how ``switchboard simulate instagram`` talks
to it."""
