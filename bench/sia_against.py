"""autotune's policies against Sia, in Sia's world. The benchmark is
``autotune.benchmarks.sia_against``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.sia_against import main

if __name__ == "__main__":
    sys.exit(main())
