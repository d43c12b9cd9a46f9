"""Time to a target loss on the testbed, plain DDP against each knob, the grid and the
policies the daemon serves. The benchmark is ``autotune.benchmarks.time_to_target``;
``--help`` says how to use it."""

import sys

from autotune.benchmarks.time_to_target import main

if __name__ == "__main__":
    sys.exit(main())
