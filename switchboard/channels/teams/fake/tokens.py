"""The fake Bot Framework's signing key and the activities it sends: what the real Bot Connector posts to a bot.

:class:`SigningKey` is a local RSA key published as a JWK (``kid``, ``endorsements: ["msteams"]``) by the fake's
OpenID metadata; :meth:`SigningKey.mint` makes the Bearer token the Connector sends with an activity (``iss``
``https://api.botframework.com``, ``aud`` the app id, ``serviceurl`` the activity's ``serviceUrl``), with any claim
or header changed or removed for the attack tests. :func:`make_activity` builds the activities themselves.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

__all__ = [
    "BOT_ID_PREFIX",
    "ISSUER",
    "TENANT",
    "SigningKey",
    "make_activity",
    "mention",
]

ISSUER = "https://api.botframework.com"
BOT_ID_PREFIX = "28:"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
_ids = itertools.count(1_700_000_000_000)


class SigningKey:
    """An RSA key the fake publishes, and tokens signed with it.

    Args:
        kid: The key id the JWK and the tokens carry.
        endorsements: The channels the key is endorsed for (``None``: the JWK has no ``endorsements``).
        pem: An existing private key (PKCS#8 PEM) to load instead of generating one.
    """

    def __init__(self, kid: str | None = None, *, endorsements: list[str] | None = None, pem: str | None = None):
        if pem is not None:
            loaded = serialization.load_pem_private_key(pem.encode(), password=None)
            if not isinstance(loaded, rsa.RSAPrivateKey):
                raise ValueError("not an RSA private key")
            self.private = loaded
        else:
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = kid or secrets.token_hex(8)
        self.endorsements = ["msteams"] if endorsements is None else endorsements

    @property
    def pem(self) -> str:
        """The private key as PKCS#8 PEM (what ``switchboard simulate`` keeps to sign requests)."""
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    @property
    def public_pem(self) -> bytes:
        """The public key as PEM (what an HS256 forgery uses as its "secret")."""
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def jwk(self) -> dict[str, Any]:
        """The public key as the Bot Framework publishes it."""
        found: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        found.update({"kid": self.kid, "use": "sig"})
        if self.endorsements:
            found["endorsements"] = list(self.endorsements)
        return found

    def mint(self, app_id: str, service_url: str, *, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        """A Connector token for ``app_id`` and ``service_url``; ``claims`` override (``None`` removes a claim)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": ISSUER,
            "aud": app_id,
            "serviceurl": service_url,
            "nbf": now - 10,
            "exp": now + 3600,
            "iat": now - 10,
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.private, algorithm="RS256", headers={"kid": self.kid, **(headers or {})})

    def authorization(self, app_id: str, service_url: str, **claims: Any) -> dict[str, str]:
        """The request headers of an activity posted with a fresh token."""
        token = self.mint(app_id, service_url, **claims)
        return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def mention(bot_id: str, name: str = "Switchboard") -> dict[str, Any]:
    """The ``mention`` entity Teams adds when a user @mentions the bot."""
    return {"type": "mention", "text": f"<at>{name}</at>", "mentioned": {"id": bot_id, "name": name}}


def make_activity(
    text: str,
    *,
    service_url: str,
    app_id: str,
    conversation: str = "a:1personal-chat",
    conversation_type: str = "personal",
    activity_type: str = "message",
    activity_id: str | None = None,
    mentioned: bool = False,
    user: str = "29:1user-aad",
    **fields: Any,
) -> dict[str, Any]:
    """An activity as the Bot Connector posts it (``fields`` are added or override, in wire names)."""
    bot = BOT_ID_PREFIX + app_id
    activity: dict[str, Any] = {
        "type": activity_type,
        "id": activity_id or str(next(_ids)),
        "timestamp": "2026-12-01T19:30:00.000Z",
        "serviceUrl": service_url,
        "channelId": "msteams",
        "from": {"id": user, "name": "Ada Lovelace", "aadObjectId": "00000000-aaaa-4bbb-8ccc-000000000001"},
        "conversation": {"id": conversation, "conversationType": conversation_type, "tenantId": TENANT},
        "recipient": {"id": bot, "name": "Switchboard"},
        "text": (f"<at>Switchboard</at> {text}" if mentioned else text),
        "textFormat": "plain",
        "entities": [mention(bot)] if mentioned else [],
        "channelData": {"tenant": {"id": TENANT}},
    }
    if conversation_type != "personal":
        activity["conversation"]["isGroup"] = True
    activity.update(fields)
    return activity
