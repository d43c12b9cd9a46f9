"""Uneven batch shares on testbed machines of different speeds (CPU quotas): even shares,
shares by the known speeds and shares balanced while training. The benchmark is
``autotune.benchmarks.hetero_shares``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.hetero_shares import main

if __name__ == "__main__":
    sys.exit(main())
