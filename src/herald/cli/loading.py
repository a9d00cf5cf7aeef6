"""The configuration as a command needs it, its problems on stderr.

`load` refuses an invalid configuration (validate, run, broker, publish). `load_lenient` leaves invalid files out:
each problem of another file is a warning on stderr, and only the subscription's own file (or herald.yaml) being
invalid stops the command (the read-outs, suspend/activate, retransmit). `load_herald_yaml` stops only on
herald.yaml (oauth, maintain). Stopping is `SystemExit(2)`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from herald.config import ConfigError, HeraldConfig, LoadResult, Subscription, load_config, load_config_lenient


def load(conf: str) -> HeraldConfig:
    try:
        return load_config(Path(conf))
    except ConfigError as error:
        refuse(conf, error)


def refuse(conf: str, error: ConfigError) -> NoReturn:
    print(f"invalid configuration in {conf}:", file=sys.stderr)
    for problem in error.problems:
        print(f"  {problem}", file=sys.stderr)
    raise SystemExit(2) from None


def load_herald_yaml(conf: str) -> HeraldConfig:
    """The configuration for a command that needs only herald.yaml: the other files' problems go unsaid."""
    try:
        return load_config_lenient(Path(conf)).config
    except ConfigError as error:
        refuse(conf, error)


def load_lenient(conf: str, subscription_id: str) -> tuple[HeraldConfig, Subscription]:
    """The configuration without its invalid files, and the subscription asked for.

    Each problem of another file is printed as `warning: <file>: <key>: <message>`; when the subscription's own
    file is invalid (or herald.yaml is), its problems are printed and the command exits 2."""
    try:
        result: LoadResult = load_config_lenient(Path(conf))
    except ConfigError as error:
        refuse(conf, error)
    own = result.invalid_file_of(subscription_id)
    own_problems = result.problems_in(own) if own is not None else []
    for problem in result.problems:
        if problem not in own_problems:
            print(f"warning: {problem}", file=sys.stderr)
    if own is not None:
        print(f"{subscription_id}: left out of the configuration, {result.config.shown(own)} is invalid:",
              file=sys.stderr)
        for problem in own_problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2)
    return result.config, subscription_of(result.config, subscription_id)


def subscription_of(config: HeraldConfig, subscription_id: str) -> Subscription:
    try:
        return config.subscription(subscription_id)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        raise SystemExit(2) from None
