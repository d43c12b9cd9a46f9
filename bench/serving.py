"""Latency of the learned policy per decision round, on one CPU core. The benchmark is
``autotune.benchmarks.serving``; ``python bench/serving.py --help`` says how to run it."""

import sys

from autotune.benchmarks.serving import main

if __name__ == "__main__":
    sys.exit(main())
