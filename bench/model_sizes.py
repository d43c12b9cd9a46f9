"""What the catalog's real model sizes cost to train. The benchmark is
``autotune.benchmarks.model_sizes``; ``python bench/model_sizes.py --help`` says how to run it."""

import sys

from autotune.benchmarks.model_sizes import main

if __name__ == "__main__":
    sys.exit(main())
