"""``python -m control_plane.cli``: the ``shadowlimit`` command."""

import sys

from . import main

sys.exit(main())
