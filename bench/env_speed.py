"""Environment steps per second on one core, random actions. The benchmark is
``autotune.benchmarks.env_speed``; ``python bench/env_speed.py --help`` says how to run
it."""

import sys

from autotune.benchmarks.env_speed import main

if __name__ == "__main__":
    sys.exit(main())
