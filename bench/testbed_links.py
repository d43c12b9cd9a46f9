"""All-reduce and training steps across testbed machines against the bandwidth bound.
The benchmark is ``autotune.benchmarks.testbed_links``; ``--help`` says how to use it."""

import sys

from autotune.benchmarks.testbed_links import main

if __name__ == "__main__":
    sys.exit(main())
