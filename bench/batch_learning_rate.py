"""Steps to a target loss at a larger batch, at the task's learning rate and at the rate
scaled by the batch's gain, against the performance model. The benchmark is
``autotune.benchmarks.batch_learning_rate``; ``python bench/batch_learning_rate.py
--help`` says how to run it."""

import sys

from autotune.benchmarks.batch_learning_rate import main

if __name__ == "__main__":
    sys.exit(main())
