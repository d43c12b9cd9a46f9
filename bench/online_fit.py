"""Online per-job fitting on Pollux's traces. The benchmark is
``autotune.benchmarks.online_fit``; ``python bench/online_fit.py --help`` says how to run it."""

import sys

from autotune.benchmarks.online_fit import main

if __name__ == "__main__":
    sys.exit(main())
