"""``switchboard eval``: scenario files, their runner and result comparison (``docs/evals.md``)."""
