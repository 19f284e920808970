"""Allow ``python -m switchboard``."""

from switchboard.cli.main import main

raise SystemExit(main())
