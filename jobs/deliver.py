"""spark-submit entry point, the same as `herald run`:

    spark-submit --master local[2] jobs/deliver.py --conf conf [--once] [--subscription ID ...]

On a cluster, install Herald on the driver and executors (a wheel, or `--py-files`); Spark's kafka connector
and Delta jars are used when they are on the classpath (`--packages`).
"""

import sys

from herald.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
