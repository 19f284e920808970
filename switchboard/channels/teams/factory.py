"""① and ⑤ for Microsoft Teams: Bot Framework activities in, proactive Bot Connector messages out.

Every activity's token is checked before it is read (:mod:`~switchboard.channels.teams.auth`). A verified activity is
acknowledged (202) once durably queued and answered later as a proactive message: the Connector gives up after
about 15 seconds and sends again, and the re-send is dropped by its dedup key, so the user gets one answer however
long the agent runs. That is why the Agents SDK's ``CloudAdapter.process``, which runs the turn inside the request,
is not used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchboard.channels.registry import BuildContext, ChannelFactory
from switchboard.channels.teams.settings import TeamsSettings
from switchboard.settings.channels import secure_endpoint

if TYPE_CHECKING:
    from switchboard.channels.teams.adapter import TeamsChannel

__all__ = ["FACTORY", "problems"]


def problems(settings: TeamsSettings) -> list[str]:
    """What keeps an account from working, and how to fix it (``switchboard check``)."""
    found = []
    if not settings.app_id:
        found.append(
            "no app id: set SWITCHBOARD_TEAMS__APP_ID (Azure Bot → Configuration → Microsoft App ID); every "
            "activity is refused until it is set"
        )
    if settings.app_password is None:
        found.append(
            "no app password: set SWITCHBOARD_TEAMS__APP_PASSWORD (the app registration's client secret); "
            "activities are accepted but no reply can be sent"
        )
    for name, value in (
        ("OPENID_METADATA_URL", settings.openid_metadata_url),
        ("LOGIN_BASE_URL", settings.login_base_url),
    ):
        if not secure_endpoint(value):
            found.append(f"SWITCHBOARD_TEAMS__{name} must be an https:// URL (got {value[:80]!r})")
    if settings.tenant_id is not None and not settings.tenant_id.strip():
        found.append("SWITCHBOARD_TEAMS__TENANT_ID is empty: set the tenant id (single-tenant bot) or unset it")
    return found


def _build(settings: TeamsSettings, context: BuildContext) -> TeamsChannel:
    from switchboard.channels.teams.adapter import TeamsChannel  # the Agents SDK loads only where Teams is used

    return TeamsChannel(
        settings,
        account=context.account,
        require_mention=context.require_mention,
        groups=context.groups,
        agent=context.agent,
        tenant=context.tenant,
    )


FACTORY: ChannelFactory[TeamsSettings] = ChannelFactory(
    name="teams",
    settings=TeamsSettings,
    build=_build,
    problems=problems,
    fake="switchboard.channels.teams.fake.platform",
)
"""Teams in the channel table."""
