"""Sandboxes for shell commands and skill scripts, chosen at start-up from what the host supports.

- :mod:`~switchboard.sandbox.detect`: which kind works here (bubblewrap + seccomp, Landlock + seccomp, or the weak
  floor the operator must allow), probed with a real command; :mod:`~switchboard.cli.sandbox` does it once
  per process from ``SWITCHBOARD_SANDBOX__*``.
- :mod:`~switchboard.sandbox.runner`: one command in a fresh sandbox over a workspace, with limits
  (:mod:`~switchboard.sandbox.limits`), its output captured head and tail (:mod:`~switchboard.sandbox.capture`),
  its process group killed on timeout.
- :mod:`~switchboard.sandbox.bwrap`, :mod:`~switchboard.sandbox.confine`, :mod:`~switchboard.sandbox.seccomp`:
  the bubblewrap command line, the Landlock launcher and the seccomp filter they load;
  :mod:`~switchboard.sandbox.landlock`: each Landlock command's ruleset, made in the worker.
- :mod:`~switchboard.sandbox.bridge`: TCP-to-unix-socket bridge to the host's egress proxy, inside the sandbox.

See docs/ARCHITECTURE.md §7.
"""

__all__: list[str] = []
