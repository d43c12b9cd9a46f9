"""Placement quality and speed of the Planner on the Alibaba GPU cluster trace v2023. The
benchmark is ``autotune.benchmarks.plan_alibaba``; ``python bench/plan_alibaba.py
--help`` says how to run it."""

import sys

from autotune.benchmarks.plan_alibaba import main

if __name__ == "__main__":
    sys.exit(main())
