"""The fake Send API in its Instagram flavour, for ``switchboard run``'s built-in fake and ``simulate instagram``.

The same server as :mod:`switchboard.channels.meta.messaging.fake.platform` (``FakeMessenger("instagram")``): text
limited to 1,000
UTF-8 bytes, deliveries with ``object: instagram`` and the fake's Instagram account id as ``entry[].id``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.fake.payloads import IG_ACCOUNT_ID, make_delivery, sign_delivery, text_item
from switchboard.channels.meta.messaging.fake.platform import FakeMessenger, sim_replies
from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation

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
    secret = settings.app_secret.get_secret_value() if settings.app_secret else ""
    return {
        "fake_url": settings.graph_base_url.rsplit("/", 1)[0],
        "app_secret": secret,
        "account_id": settings.account_id or IG_ACCOUNT_ID,
    }


def _sim_request(details: Mapping[str, str], text: str) -> SampleRequest:
    user = str(1_000_000_000_000_000 + secrets.randbelow(10**15))
    item = text_item(text, user=user, account=details["account_id"])
    delivery = make_delivery("instagram", [(details["account_id"], [item])])
    body, headers = sign_delivery(delivery, details["app_secret"])
    return SampleRequest(body=body, headers=headers, conversation=user)


SIMULATION: Simulation[InstagramSettings] = Simulation(
    start=_sim_start, details=_sim_details, request=_sim_request, replies=sim_replies
)
"""How ``switchboard run`` fakes Instagram without credentials, and how ``switchboard simulate instagram`` talks
to it."""
