"""Tiresias in the Pollux-compatible world against Pollux's own simulator. The benchmark is
``autotune.benchmarks.pollux_compat``; ``python bench/pollux_compat.py --help`` says how to run
it."""

import sys

from autotune.benchmarks.pollux_compat import main

if __name__ == "__main__":
    sys.exit(main())
