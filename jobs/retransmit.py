"""spark-submit entry point for a retransmission, the same as `herald retransmit`:

    spark-submit jobs/retransmit.py --conf conf group.topic.name --date -6h [--dry-run] [--json]

It moves the subscription's position (a small Delta write, no Spark job); a running delivery job picks the
move up within streaming.configPollMs.
"""

import sys

from herald.cli import main

if __name__ == "__main__":
    sys.exit(main(["retransmit", *sys.argv[1:]]))
