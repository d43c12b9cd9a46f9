"""What the executor costs on top of PyTorch. The benchmark is
``autotune.benchmarks.executor_overhead``; ``python bench/executor_overhead.py --help``
says how to run it."""

import sys

from autotune.benchmarks.executor_overhead import main

if __name__ == "__main__":
    sys.exit(main())
