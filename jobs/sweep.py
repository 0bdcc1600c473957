"""Sweep job for ``ray job submit --working-dir . -- python jobs/sweep.py --config tune_configs/<name>.yaml``.

Same arguments as ``d3ray sweep``; inside a submitted job it joins the job's cluster. The sweep's
``storage_path`` (and ``runs_dir``) should be absolute or URIs: the job runs in a copy of the
working dir, which is not kept.
"""

import os
import sys

from d3ray.cli import main

if __name__ == "__main__":
    argv = ["sweep", *sys.argv[1:]]
    if os.environ.get("RAY_JOB_ID") or os.environ.get("RAY_ADDRESS"):
        argv.append("--ray.address=auto")
    sys.exit(main(argv))
