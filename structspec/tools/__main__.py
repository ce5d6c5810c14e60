"""``python -m structspec.tools``: the same as the ``structspec`` console script."""

from structspec.tools.cli import main

raise SystemExit(main())
