"""Planner decision-round time by cluster size. The benchmark is
``autotune.benchmarks.planner_scale``; ``python bench/planner_scale.py --help`` says how
to run it."""

import sys

from autotune.benchmarks.planner_scale import main

if __name__ == "__main__":
    sys.exit(main())
