"""What measuring a job's training quality costs. The benchmark is
``autotune.benchmarks.quality_overhead``; ``python bench/quality_overhead.py --help``
says how to run it."""

import sys

from autotune.benchmarks.quality_overhead import main

if __name__ == "__main__":
    sys.exit(main())
