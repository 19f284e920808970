"""Allow ``python -m switchboard``."""

from switchboard.cli import main

raise SystemExit(main())
