"""One job across GPU models against one model per job, in the simulated cluster. The
benchmark is ``autotune.benchmarks.mixed_models``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.mixed_models import main

if __name__ == "__main__":
    sys.exit(main())
