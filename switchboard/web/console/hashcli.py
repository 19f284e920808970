"""``switchboard console hash-password``: make the Argon2 hash an operator's ``password_hash`` holds.

The password is read from the terminal without echo (asked twice), or from standard input when it is not a terminal
(one line, e.g. from a password manager); never from the command line, where other users see it in ``ps``.
"""

from __future__ import annotations

import getpass
import sys
from typing import TextIO

from switchboard.web.console.passwords import hash_password

__all__ = ["hash_password_command"]


def hash_password_command(stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Read a password, print its hash (and the YAML to put it in); returns the exit code."""
    source = stdin or sys.stdin
    out = stdout or sys.stdout
    if source.isatty():
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Again: "):
            print("switchboard: the two passwords differ; nothing printed", file=sys.stderr)
            return 1
    else:
        password = source.readline().rstrip("\r\n")
    try:
        hashed = hash_password(password)
    except ValueError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 1
    print(hashed, file=out)
    if source.isatty():
        print(
            "\nAdd it to the YAML file:\n\nconsole:\n  operators:\n    - name: <name>\n"
            f'      password_hash: "{hashed}"\n      tenants: [default]',
            file=sys.stderr,
        )
    return 0
