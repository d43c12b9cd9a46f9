"""A cluster of real machines on one host. The tool is ``autotune.benchmarks.testbed``;
``python bench/testbed.py --help`` says how to use it."""

import sys

from autotune.benchmarks.testbed import main

if __name__ == "__main__":
    sys.exit(main())
