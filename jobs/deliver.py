"""spark-submit entry point, the same as `herald run`:

    spark-submit --master local[2] jobs/deliver.py --conf conf [--once] [--subscription ID ...]

On a cluster, Herald must be importable on the driver and the executors: install its wheel (`make dist`) with
its dependencies, or install the dependencies and ship it with `--py-files dist/herald-*.zip` (the wheel as a
.zip, which Spark puts on the executors' path too; README, "On a cluster"). Spark's
kafka connector and Delta jars are used when they are on the classpath (`--packages`, or `--jars` with the files
`herald jars fetch` caches); Herald then adds Delta's SQL extension and catalog to the session (`herald.session`).
The first line on stderr says which Herald runs and where it was loaded from; the first log lines which Kafka
source and table engine `auto` picked.
"""

import sys

import herald
from herald.cli import main

if __name__ == "__main__":
    print(f"herald {herald.__version__} from {herald.__file__}", file=sys.stderr, flush=True)
    sys.exit(main(["run", *sys.argv[1:]]))
