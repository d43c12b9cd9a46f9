"""fp16 that overflows, with and without autotune's numerical health. The benchmark is
``autotune.benchmarks.precision_guard``; ``python bench/precision_guard.py --help`` says
how to run it."""

import sys

from autotune.benchmarks.precision_guard import main

if __name__ == "__main__":
    sys.exit(main())
