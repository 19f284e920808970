"""Sandboxes for shell commands and skill scripts, chosen at start-up from what the host supports.

Detection (:mod:`~switchboard.sandbox.detect`) picks bubblewrap + seccomp, Landlock + seccomp, or the weak floor the
operator must allow (once per process: :mod:`switchboard.cli.sandbox`); :mod:`~switchboard.sandbox.runner` runs one
command in a fresh sandbox with limits. ``docs/ARCHITECTURE.md`` §7.
"""

__all__: list[str] = []
