"""The Sia-compatible mode against Sia's own simulator. The benchmark is
``autotune.benchmarks.sia_compat``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.sia_compat import main

if __name__ == "__main__":
    sys.exit(main())
