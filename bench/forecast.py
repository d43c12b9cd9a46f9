"""The demand forecaster on the Helios virtual clusters it was not trained on. The
benchmark is ``autotune.benchmarks.forecast``; ``python bench/forecast.py --help`` says
how to run it."""

import sys

from autotune.benchmarks.forecast import main

if __name__ == "__main__":
    sys.exit(main())
