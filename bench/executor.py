"""Throughput of gpt-char through the executor under precision maps and layouts. The benchmark is
``autotune.benchmarks.executor``; ``python bench/executor.py --help`` says how to run it."""

import sys

from autotune.benchmarks.executor import main

if __name__ == "__main__":
    sys.exit(main())
