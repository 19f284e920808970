"""``python -m switchboard.connectors.email``: the email MCP server over stdio, configured by ``EMAIL_*``."""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError

from switchboard.connectors.email.server import build_server
from switchboard.connectors.email.settings import MailSettings


def main() -> int:
    """Serve until stdin closes; 2 when the settings are incomplete (said on stderr, never a value)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = MailSettings()  # read from the environment
    except ValidationError as err:
        problems = "; ".join(f"EMAIL_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in err.errors())
        print(f"switchboard email connector: {problems}", file=sys.stderr)
        return 2
    build_server(settings).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
