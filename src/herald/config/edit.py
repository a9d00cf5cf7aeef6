"""Editing a subscription's YAML file in place (`herald suspend` / `herald activate`): one key changed, the rest of
the file (comments, order, layout) kept as it is.

Only that file is written, and it must be valid before and after the edit: otherwise it is put back as it was
and `EditRefused` lists the problems. A running `herald run` applies the change within `configPollMs`.
"""

from __future__ import annotations

import re
from pathlib import Path

from herald.config.loader import ConfigError, HeraldConfig, load_config_lenient

_STATE_LINE = re.compile(r"^state:[ \t]*\S+[ \t]*(#.*)?$", re.MULTILINE)


class EditRefused(ValueError):
    """The edited file would not be valid (or no longer names the subscription); it was left as it was."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        super().__init__(f"{path}: the edit was refused")
        self.path = path
        self.problems = problems


def with_state(text: str, state: str) -> str:
    """`text` (a subscription's YAML) with its top-level `state:` set to `state` (a trailing comment kept), or
    the key added at the end."""
    if _STATE_LINE.search(text):
        return _STATE_LINE.sub(lambda m: f"state: {state}" + (f"  {m.group(1)}" if m.group(1) else ""), text, count=1)
    return text.rstrip("\n") + f"\nstate: {state}\n"


def set_state(conf_dir: Path | str, config: HeraldConfig, subscription_id: str, state: str) -> HeraldConfig:
    """Set the subscription's `state` (ACTIVE or SUSPENDED) in its file; returns the configuration after the edit.
    Raises `EditRefused` (the file put back) or `ConfigError` (herald.yaml is invalid now; the file put back)."""
    path = config.files[subscription_id]
    original = path.read_text(encoding="utf-8")
    path.write_text(with_state(original, state), encoding="utf-8")
    try:
        after = load_config_lenient(Path(conf_dir))
    except ConfigError:  # herald.yaml changed meanwhile
        path.write_text(original, encoding="utf-8")
        raise
    edited = next((s for s in after.config.subscriptions if after.config.files.get(s.id) == path), None)
    if edited is None or edited.id != subscription_id or edited.state != state:
        path.write_text(original, encoding="utf-8")
        raise EditRefused(path, after.problems_in(path))
    return after.config
