"""Node loss, end to end. The benchmark is ``autotune.benchmarks.recovery``; ``python
bench/recovery.py --help`` says how to run it."""

import sys

from autotune.benchmarks.recovery import main

if __name__ == "__main__":
    sys.exit(main())
