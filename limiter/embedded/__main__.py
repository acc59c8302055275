"""``python -m limiter.embedded [--cluster] [--unix-socket] [--port N]``."""

import sys

from .cli import main

sys.exit(main())
