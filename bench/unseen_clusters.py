"""The learned policy on clusters it never trained on, against rules. The benchmark is
``autotune.benchmarks.unseen_clusters``; ``python bench/unseen_clusters.py --help`` says
how to run it."""

import sys

from autotune.benchmarks.unseen_clusters import main

if __name__ == "__main__":
    sys.exit(main())
