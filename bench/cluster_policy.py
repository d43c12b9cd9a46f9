"""A policy for one's own cluster on the testbed: describe, calibrate, train. The
benchmark is ``autotune.benchmarks.cluster_policy``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.cluster_policy import main

if __name__ == "__main__":
    sys.exit(main())
