"""The performance model calibrated from six configurations measured on the testbed,
predicting the others. The benchmark is ``autotune.benchmarks.model_on_links``;
``--help`` says how to use it."""

import sys

from autotune.benchmarks.model_on_links import main

if __name__ == "__main__":
    sys.exit(main())
