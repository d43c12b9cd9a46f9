"""Does the executor report the throughput a job really has? A task is timed from outside
the executor and compared with what the executor reports. The benchmark is
``autotune.benchmarks.task_throughput``; ``python bench/task_throughput.py --help`` says
how to run it."""

import sys

from autotune.benchmarks.task_throughput import main

if __name__ == "__main__":
    sys.exit(main())
