"""The operator console at ``/console``: sign-in, the page, and its JSON API over :mod:`switchboard.control`.

Modules: :mod:`.config` (settings, importable without aiohttp), :mod:`.passwords` (Argon2),
:mod:`.auth` (sign-in sessions, throttling, CSRF, the proxy header), :mod:`.routes` (the page and the API),
:mod:`.hashcli` (``switchboard console hash-password``).
"""

__all__: list[str] = []
