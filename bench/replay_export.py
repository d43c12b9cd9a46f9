"""How fast ``autotune replay export`` turns logged rounds into Parquet. The benchmark is
``autotune.benchmarks.replay_export``; ``python bench/replay_export.py --help`` says how
to run it."""

import sys

from autotune.benchmarks.replay_export import main

if __name__ == "__main__":
    sys.exit(main())
