"""A screenshot of the dashboard on a live daemon. The benchmark is
``autotune.benchmarks.dashboard_screenshot``; ``python bench/dashboard_screenshot.py
--help`` says how to run it."""

import sys

from autotune.benchmarks.dashboard_screenshot import main

if __name__ == "__main__":
    sys.exit(main())
