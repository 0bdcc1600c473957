"""Comparison job for ``ray job submit --working-dir . -- python jobs/compare.py --config ...``.

Same arguments as ``d3ray compare``; inside a submitted job it joins the job's cluster.
"""

import os
import sys

from d3ray.cli import main

if __name__ == "__main__":
    argv = ["compare", *sys.argv[1:]]
    if os.environ.get("RAY_JOB_ID") or os.environ.get("RAY_ADDRESS"):
        argv.append("--ray.address=auto")
    sys.exit(main(argv))
