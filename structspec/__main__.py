"""``python -m structspec``: the ``structspec`` command."""

from structspec.tools.cli import main

raise SystemExit(main())
