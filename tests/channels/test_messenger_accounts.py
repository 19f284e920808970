"""Which account a delivery belongs to (Page / Instagram account ids, learnt with ``GET /me`` when unset), and
what ``switchboard check`` says about a Messenger or Instagram account."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from switchboard.channels.base import RawRequest
from switchboard.channels.meta.instagram.adapter import InstagramChannel
from switchboard.channels.meta.instagram.adapter import problems as instagram_problems
from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.fake.payloads import (
    IG_ACCOUNT_ID,
    PAGE_ID,
    make_delivery,
    sign_delivery,
    text_item,
)
from switchboard.channels.meta.messaging.fake.platform import FakeMessenger
from switchboard.channels.meta.messenger.adapter import MessengerChannel
from switchboard.channels.meta.messenger.adapter import problems as messenger_problems
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.meta.webhook import UNCLAIMED_PREFIX
from switchboard.channels.registry import BuildContext
from switchboard.errors import SignatureError

SECRET = "app-secret-one"
TOKEN = "EAAGaccountstoken"


@pytest.fixture
async def fake() -> AsyncIterator[FakeMessenger]:
    async with FakeMessenger("messenger", token=TOKEN) as server:
        yield server


def delivery_to(page: str, kind: str = "page", secret: str = SECRET) -> RawRequest:
    item = text_item("hi", user="24000000000000001", account=page)
    body, headers = sign_delivery(make_delivery(kind, [(page, [item])]), secret)  # type: ignore[arg-type]
    return RawRequest("POST", "/webhooks/messenger", headers, {}, body)


async def accounts_of(channel: MessengerChannel | InstagramChannel, request: RawRequest) -> list[str]:
    await channel.verify(request)
    return [m.conversation.account for m in (await channel.receive(request)).messages]


async def test_the_page_id_is_learnt_with_get_me_when_unset(fake: FakeMessenger) -> None:
    settings = MessengerSettings(page_access_token=TOKEN, app_secret=SECRET, graph_base_url=fake.graph_url)
    channel = MessengerChannel(settings, BuildContext(account="shop"))
    try:
        # before the look-up, the app secret vouches for the page: its messages are the account's own
        assert await accounts_of(channel, delivery_to("106000000000777")) == ["shop"]
        await channel.start()
        assert await accounts_of(channel, delivery_to(PAGE_ID)) == ["shop"]
        assert await accounts_of(channel, delivery_to("106000000000777")) == [UNCLAIMED_PREFIX + "106000000000777"]
    finally:
        await channel.aclose()


async def test_the_instagram_account_id_is_learnt_too() -> None:
    async with FakeMessenger("instagram", token=TOKEN) as fake:
        settings = InstagramSettings(access_token=TOKEN, app_secret=SECRET, graph_base_url=fake.graph_url)
        channel = InstagramChannel(settings)
        try:
            await channel.start()
            assert await accounts_of(channel, delivery_to(IG_ACCOUNT_ID, "instagram")) == ["default"]
            other = delivery_to("17841400000000999", "instagram")
            assert await accounts_of(channel, other) == [UNCLAIMED_PREFIX + "17841400000000999"]
        finally:
            await channel.aclose()


def test_instagram_asks_each_login_flavour_for_the_id_its_webhooks_carry() -> None:
    channel = InstagramChannel(InstagramSettings(access_token=TOKEN, app_secret=SECRET))
    assert channel.id_query("https://graph.instagram.com/v23.0") == "me?fields=user_id"
    assert channel.id_in({"id": "9990001", "user_id": IG_ACCOUNT_ID}) == IG_ACCOUNT_ID  # not the app-scoped id
    assert channel.id_query("https://graph.facebook.com/v23.0") == "me?fields=instagram_business_account"
    linked = {"id": PAGE_ID, "instagram_business_account": {"id": IG_ACCOUNT_ID}}
    assert channel.id_in(linked) == IG_ACCOUNT_ID  # not the Page's id
    assert channel.id_in({"id": PAGE_ID}) is None  # a Page without a linked account names nothing


async def test_a_page_of_another_app_is_never_routed_to(fake: FakeMessenger) -> None:
    """A YAML account with another app secret is not claimed by this app's webhook."""
    own = MessengerSettings(page_access_token=TOKEN, app_secret=SECRET, page_id="1", graph_base_url=fake.graph_url)
    same_app = MessengerSettings(page_access_token="t2", app_secret=SECRET, page_id="2")
    other_app = MessengerSettings(page_access_token="t3", app_secret="another-app", page_id="3")
    context = BuildContext(accounts={"default": own, "same": same_app, "other": other_app})
    channel = MessengerChannel(own, context)
    assert await accounts_of(channel, delivery_to("2")) == ["same"]
    assert await accounts_of(channel, delivery_to("3")) == [UNCLAIMED_PREFIX + "3"]
    with pytest.raises(SignatureError):
        await channel.verify(delivery_to("3", secret="another-app"))


async def test_a_sibling_page_without_an_id_is_looked_up_for_the_shared_url(fake: FakeMessenger) -> None:
    """A YAML Page with no ``page_id`` still gets its messages when they arrive at the default account's URL."""
    fake.state.accounts["EAAGsibling"] = "106000000000555"
    own = MessengerSettings(page_access_token=TOKEN, app_secret=SECRET, page_id=PAGE_ID, graph_base_url=fake.graph_url)
    sibling = MessengerSettings(page_access_token="EAAGsibling", app_secret=SECRET, graph_base_url=fake.graph_url)
    stranger = MessengerSettings(page_access_token="EAAGstranger", app_secret="other", graph_base_url=fake.graph_url)
    context = BuildContext(accounts={"default": own, "sibling": sibling, "stranger": stranger})
    channel = MessengerChannel(own, context)
    try:
        unclaimed = [UNCLAIMED_PREFIX + "106000000000555"]
        assert await accounts_of(channel, delivery_to("106000000000555")) == unclaimed
        await channel.start()
        assert await accounts_of(channel, delivery_to("106000000000555")) == ["sibling"]
        looked_up = [c for c in fake.calls if c.path.endswith("/me")]
        assert len(looked_up) == 1  # the stranger (another app) is not looked up; the own id is configured
    finally:
        await channel.aclose()


def test_check_says_what_is_missing() -> None:
    bare = messenger_problems(MessengerSettings(page_access_token="EAAG"))
    assert any("SWITCHBOARD_MESSENGER__APP_SECRET" in p for p in bare)
    assert any("SWITCHBOARD_MESSENGER__VERIFY_TOKEN" in p for p in bare)
    complete = MessengerSettings(page_access_token="EAAG", app_secret="s", verify_token="v", page_id="106")
    assert messenger_problems(complete) == []
    assert any("page_id" in p for p in messenger_problems(complete.model_copy(update={"page_id": "my-page"})))
    insecure = complete.model_copy(update={"graph_base_url": "http://graph.example/v23.0"})
    assert any("GRAPH_BASE_URL" in p for p in messenger_problems(insecure))
    ig = instagram_problems(InstagramSettings(access_token="IG"))
    assert any("SWITCHBOARD_INSTAGRAM__APP_SECRET" in p for p in ig)
    assert any("SWITCHBOARD_INSTAGRAM__VERIFY_TOKEN" in p for p in ig)
    assert instagram_problems(InstagramSettings(access_token="IG", app_secret="s", verify_token="v")) == []


async def test_without_an_app_secret_every_delivery_is_refused_with_403() -> None:
    channel = MessengerChannel(MessengerSettings(page_access_token=TOKEN))
    with pytest.raises(SignatureError) as refused:
        await channel.verify(delivery_to(PAGE_ID))
    assert refused.value.status == 403 and "APP_SECRET" in str(refused.value)
