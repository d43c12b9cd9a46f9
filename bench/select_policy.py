"""Pick the checkpoint to ship from a training run, on training-distribution episodes only.
The benchmark is ``autotune.benchmarks.select_policy``; ``python bench/select_policy.py
--help`` says how to run it."""

import sys

from autotune.benchmarks.select_policy import main

if __name__ == "__main__":
    sys.exit(main())
