"""API latency under load while the daemon ticks. The benchmark is
``autotune.benchmarks.api_latency``; ``python bench/api_latency.py --help`` says how to
run it."""

import sys

from autotune.benchmarks.api_latency import main

if __name__ == "__main__":
    sys.exit(main())
