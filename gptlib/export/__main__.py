"""``python -m gptlib.export``: see :mod:`gptlib.export.cli`."""

import sys

from .cli import main

sys.exit(main())
