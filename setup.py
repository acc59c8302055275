"""Build the optional C hot path of LocalLimiter.check (limiter/_speedups.c).

Everything else is declared in pyproject.toml. The extension is optional: where no
C compiler is available the install still succeeds and LocalLimiter runs its pure
Python path, which gives the same answers (``limiter.speedups_available()`` tells).
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so the doubles match the pure function,
# the Lua scripts and Redis bit for bit.
_ARGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]

setup(ext_modules=[Extension("limiter._speedups", ["limiter/_speedups.c"], optional=True, extra_compile_args=_ARGS)])
