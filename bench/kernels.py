"""Speed of the kernels against their plain-torch counterparts. The benchmark is
``autotune.benchmarks.kernels``; ``python bench/kernels.py --help`` says how to run it."""

import sys

from autotune.benchmarks.kernels import main

if __name__ == "__main__":
    sys.exit(main())
