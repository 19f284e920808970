"""Egress: the one host-side way out for sandboxes and tools (allowlists, SSRF checks, caps, secrets at egress).

Import the submodules you need (:mod:`~switchboard.egress.proxy`, :mod:`~switchboard.egress.client`); this
package imports nothing at start-up, so web and worker processes that never open a sandbox do not pay for it.
See docs/ARCHITECTURE.md §7.
"""

__all__: list[str] = []
