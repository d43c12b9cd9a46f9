"""Leader fail-over with Ray jobs training, and the Ray head killed, on the testbed.
The benchmark is ``autotune.benchmarks.testbed_failover``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.testbed_failover import main

if __name__ == "__main__":
    sys.exit(main())
