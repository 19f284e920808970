"""The operator console at ``/console``: sign-in, the page, and its JSON API over :mod:`switchboard.control`.

Modules: :mod:`.passwords` (Argon2), :mod:`.auth` (sign-in sessions, throttling, CSRF, the proxy header),
:mod:`.routes` (the page and sign-in), :mod:`.api` (the JSON API), :mod:`.hashcli` (``switchboard console
hash-password``); its settings are :mod:`switchboard.settings.console`.
"""

__all__: list[str] = []
