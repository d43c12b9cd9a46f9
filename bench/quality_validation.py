"""Steps to a target loss under each compression and precision setting against what the
statistical efficiency predicts. The benchmark is ``autotune.benchmarks.
quality_validation``; ``python bench/quality_validation.py --help`` says how to run it."""

import sys

from autotune.benchmarks.quality_validation import main

if __name__ == "__main__":
    sys.exit(main())
