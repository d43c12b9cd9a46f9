"""Online fitting on the executor. The benchmark is
``autotune.benchmarks.executor_online``; ``python bench/executor_online.py --help`` says
how to run it."""

import sys

from autotune.benchmarks.executor_online import main

if __name__ == "__main__":
    sys.exit(main())
