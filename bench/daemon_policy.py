"""The daemon on its defaults, run to the end. The benchmark is
``autotune.benchmarks.daemon_policy``; ``python bench/daemon_policy.py --help`` says how
to run it."""

import sys

from autotune.benchmarks.daemon_policy import main

if __name__ == "__main__":
    sys.exit(main())
