"""``python -m limiter.embedded [--cluster [--replicas N] | --sentinel] [--tls DIR] [--unix-socket] [--port N]``."""

import sys

from .cli import main

sys.exit(main())
