"""Memory a pipeline-parallel rank holds, for pp 1, 2 and 4, on a GPT of 8+ blocks. The
benchmark is ``autotune.benchmarks.pipeline_memory``; ``python bench/pipeline_memory.py
--help`` says how to run it."""

import sys

from autotune.benchmarks.pipeline_memory import main

if __name__ == "__main__":
    sys.exit(main())
