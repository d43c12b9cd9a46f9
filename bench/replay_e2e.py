"""Learning from logged runs, end to end, through the command line, timed. The benchmark is
``autotune.benchmarks.replay_e2e``; ``python bench/replay_e2e.py --help`` says how to
run it."""

import sys

from autotune.benchmarks.replay_e2e import main

if __name__ == "__main__":
    sys.exit(main())
