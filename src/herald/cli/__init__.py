"""The `herald` command: run, validate, read the tables, manage the local broker, publish, demo.

Commands that only read tables (undelivered, metrics, offsets) or validate never start Spark: the handlers import
what does the work inside themselves. `validate` and `run` refuse an invalid configuration. The read-only
commands and suspend/activate load it leniently: each problem of another file is a warning on stderr, and they
answer for every valid subscription.

    parser.py     the sub-commands and their options, one function a group
    operating.py  validate, run, suspend/activate, retransmit, maintain
    reading.py    undelivered, metrics, trace, offsets, oauth providers
    priority.py   unpin, priority (priority groups)
    local.py      broker, publish, demo, jars, schema
    discovering.py  endpoints (discovered sets)
    loading.py    the configuration as a command needs it (strict or lenient), problems on stderr
    output.py     aligned rows, JSON, ISO-8601 times

A handler takes the parsed arguments and returns the exit code; it stays thin, calling the one function that
does the work. A new command goes in the module of its group (a new group, e.g. priority groups and endpoint
discovery, gets a module of its own and a function in parser.py that declares its commands).

`main` returns the exit code (pip's `herald` script passes it to `sys.exit`); `databricks_main` raises it, for
Databricks' python_wheel_task, which calls the entry point's function itself and ignores what it returns.
"""

from __future__ import annotations

import sys

from herald import logs
from herald.cli.parser import build_parser, join_relative_dates


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(join_relative_dates(sys.argv[1:] if argv is None else argv))
    logs.configure(args.verbose)
    return args.handler(args)


def databricks_main(argv: list[str] | None = None) -> None:
    """`herald-databricks`: the `herald` command for hosts that call an entry point's function themselves and
    judge the run by what it raises, not by what it returns (Databricks' `python_wheel_task`, the bundle's task).
    A non-zero exit code is raised as `SystemExit(code)`, so that the run fails; 0 returns normally. The first
    line on stderr names the Herald version and where it was loaded from, as `jobs/deliver.py` does."""
    import herald

    print(f"herald {herald.__version__} from {herald.__file__}", file=sys.stderr, flush=True)
    code = main(argv)
    if code:
        raise SystemExit(code)
