"""Chaos tests: docs/ARCHITECTURE.md §3 invariants 1–4 and 8 proven with real worker processes (issue #2 item 10)."""
