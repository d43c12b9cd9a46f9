"""The learned policy against Pollux, each workload held out of its training. The benchmark is
``autotune.benchmarks.pollux_learned``; ``python bench/pollux_learned.py --help`` says how to run
it."""

import sys

from autotune.benchmarks.pollux_learned import main

if __name__ == "__main__":
    sys.exit(main())
