"""autotune's learned policy against Sia, each workload held out of its training. The benchmark is
``autotune.benchmarks.sia_learned``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.sia_learned import main

if __name__ == "__main__":
    sys.exit(main())
