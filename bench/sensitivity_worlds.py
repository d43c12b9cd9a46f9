"""What jobs' drawn compression sensitivities change for each policy. The benchmark is
``autotune.benchmarks.sensitivity_worlds``; ``python bench/sensitivity_worlds.py --help``
says how to run it."""

import sys

from autotune.benchmarks.sensitivity_worlds import main

if __name__ == "__main__":
    sys.exit(main())
