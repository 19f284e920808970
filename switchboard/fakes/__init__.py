"""Fake third-party APIs for tests and demos: small aiohttp applications speaking the real wire shapes.

The connector packs' APIs are played here (``calendar_api``, ``issues_api``); each records the requests it got and
runs on its own for a demo (``python -m switchboard.fakes.issues_api --tls-dir DIR``).
"""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["localhost_tls"]


def localhost_tls(folder: Path) -> ssl.SSLContext:
    """A server context for ``localhost`` signed by a CA kept in ``folder`` (egress trusts its ``ca.pem`` when told).

    The CA's path is printed for ``SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE``.
    """
    from switchboard.egress.ca import DeploymentCA

    ca = DeploymentCA.load_or_create(folder)
    cert, key = ca.issue("localhost")
    (folder / "localhost.pem").write_bytes(cert + key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "localhost.pem")
    print(f"trust its CA: SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE={ca.cert_path}")
    return context
