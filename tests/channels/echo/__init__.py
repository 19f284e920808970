"""A text-only test channel written the way a new channel is: this folder plus one line in the channel table.

``settings.py`` (its block, ``SWITCHBOARD_ECHO__*``), ``adapter.py`` (the adapter), ``factory.py`` (``FACTORY``),
``fake.py`` (its platform's fake API and ``SIMULATION``) and ``payloads/`` (sample webhook bodies). Tests register
it with ``CHANNEL_MODULES["echo"] = "tests.channels.echo.factory"`` and touch nothing else.
"""
