"""``python -m d3ray`` is ``d3ray``."""

import sys

from d3ray.cli import main

sys.exit(main())
