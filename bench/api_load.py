"""Open-loop load on the daemon's API over a long history. The benchmark is
``autotune.benchmarks.api_load``; ``python bench/api_load.py --help`` says how to run
it."""

import sys

from autotune.benchmarks.api_load import main

if __name__ == "__main__":
    sys.exit(main())
