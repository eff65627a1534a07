"""``python -m star_haiku_xmap.plan``: ``star-engine plan`` without the CLI."""

import sys

from .command import main

sys.exit(main())
