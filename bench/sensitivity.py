"""Compression sensitivity over real tasks, fitted as the simulated cluster draws it. The
benchmark is ``autotune.benchmarks.sensitivity``; ``python bench/sensitivity.py --help``
says how to run it."""

import sys

from autotune.benchmarks.sensitivity import main

if __name__ == "__main__":
    sys.exit(main())
