"""A month of the daemon's history in a database. The benchmark is
``autotune.benchmarks.history``; ``python bench/history.py --help`` says how to run it."""

import sys

from autotune.benchmarks.history import main

if __name__ == "__main__":
    sys.exit(main())
