"""avropath filters: Hermes' AvroPathPredicate syntax and its reference semantics (no Spark here).

Path syntax (Hermes: `strip(path, ".").split("\\.")`): leading and trailing dots are stripped, the rest is split
on '.', and each segment is

- `name`: the field `name` of a record (or the key `name` of a map),
- `name[N]` (N >= 0): element N of the array field `name`,
- `name[*]`: every element of the array field `name`; the rest of the path is applied to each element and the
  results are flattened.

`parse_segments` is strict where Hermes silently never matches: an empty segment (`a..b`), a segment that starts
with '[' (`a.[1]`, which Hermes reads as a field literally named "[1]", so it could only ever compare as "null"),
any other use of brackets (`a[1][2]`, `a[x]`, `a[]`, `a[-1]`) and an index above 2^31-1 (Hermes'
`Integer.valueOf` throws on it) raise FilterError when the config loads.

Selection (Hermes' `select`, verified against its source; see /work/research/hermes.md section 2):

- walking stops as soon as the current value is not a record/map; if segments remain, the selection is EMPTY
  (a missing field or a null part-way along the path, or a step into a scalar or an array, never matches);
- at the end of the path a missing field, a null, or an index past the end of the array is the string "null"
  (so matcher `null` matches it);
- `name[..]` on a value that is not an array (missing, null, a record, a scalar) selects nothing, even at the end;
- `name[*]`: an empty array selects nothing; a null element compares as "null" when the path ends there and is
  skipped when segments remain.

The selected values compare as text, the way Spark renders the JSON Herald decodes an Avro record into
(herald.avro.convert.to_json): strings raw, enums by symbol, ints/longs in decimal, doubles as Java's
`Double.toString` (`100.0`, `1.0E-5`), booleans `true`/`false`, nested records, maps and arrays as compact JSON,
bytes/fixed as ISO-8859-1 strings, decimals as plain decimal strings. `select_texts` evaluates a decoded record
(the dicts/lists fastavro returns, decoded with `plain_schema`) or that JSON text, with the same answers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from herald.avro.convert import METADATA_FIELD, plain_value
from herald.filters.rules import FilterError
from herald.filters.values import INVALID, parse_json, value_text

NULL_TEXT = "null"
MAX_INDEX = 2**31 - 1
SYNTAX = "segments separated by '.', each `name`, `name[N]` (N >= 0) or `name[*]`, e.g. '.user.addresses[*].city'"


@dataclass(frozen=True)
class Segment:
    """One dot-separated part of an avropath: a field name, optionally with an array selector."""

    name: str
    selector: int | str | None = None  # None: the field itself; an int N: `name[N]`; "*": `name[*]`

    @property
    def array(self) -> bool:
        return self.selector is not None

    def __str__(self) -> str:
        return self.name if self.selector is None else f"{self.name}[{self.selector}]"


_SEGMENT = re.compile(r"(?P<name>[^\[\]]+)(?:\[(?P<index>\*|[0-9]+)\])?")
_NEGATIVE = re.compile(r"[^\[\]]+\[\s*-\s*[0-9]+\s*\]")


@functools.lru_cache(maxsize=1024)
def parse_segments(path: str) -> tuple[Segment, ...]:
    """Parse an avropath; raise FilterError naming the path and the segment when it is invalid."""
    if not isinstance(path, str) or not path.strip("."):
        raise FilterError("an avropath filter needs a non-empty 'path', e.g. '.user.addresses[*].city'")
    segments = []
    for segment in path.strip(".").split("."):
        segments.append(_parse_segment(path, segment))
    return tuple(segments)


def _parse_segment(path: str, segment: str) -> Segment:
    def error(reason: str) -> FilterError:
        return FilterError(f"avropath {path!r}: {reason}. An avropath is {SYNTAX}")

    if not segment:
        raise error("empty segment (two dots in a row)")
    if segment.startswith("["):
        raise error(
            f"segment {segment!r} has no field name. An array selector belongs to the array field's own segment "
            f"('addresses[1]', not 'addresses.[1]'); Hermes would look up a field literally named {segment!r}, "
            "which no Avro record has, so the rule could only ever compare the string \"null\""
        )
    match = _SEGMENT.fullmatch(segment)
    if match is None:
        if _NEGATIVE.fullmatch(segment):
            raise error(f"negative index in {segment!r}: only [N] with N >= 0 and [*] select array elements")
        raise error(
            f"bad array selector in {segment!r}: a segment takes at most one [N] or [*], right after the field "
            "name, and a field name cannot contain '[' or ']'"
        )
    index = match.group("index")
    if index is None:
        return Segment(segment)
    if index == "*":
        return Segment(match.group("name"), "*")
    if int(index) > MAX_INDEX:
        raise error(f"index {index} in {segment!r} is larger than {MAX_INDEX} (Hermes fails on it)")
    return Segment(match.group("name"), int(index))


def render(segments: Sequence[Segment]) -> str:
    """Canonical text of a parsed path: '.a.b[0].c[*]'."""
    return "." + ".".join(str(segment) for segment in segments)


# ------------------------------------------------------------------------------------------ reference semantics


def select(segments: Sequence[Segment], root) -> list:
    """The values Hermes' AvroPathPredicate selects from `root` (dicts are records or maps, lists are arrays);
    None stands for "null" (missing field, null value or index out of range at the end of the path)."""
    return _select(segments, 0, root)


def _select(segments: Sequence[Segment], position: int, current) -> list:
    while position < len(segments) and isinstance(current, dict):
        segment = segments[position]
        position += 1
        current = current.get(segment.name)
        if segment.selector is None:
            continue
        if not isinstance(current, list):
            return []
        if segment.selector == "*":
            return [value for item in current for value in _select(segments, position, item)]
        current = current[segment.selector] if segment.selector < len(current) else None
    return [] if position < len(segments) else [current]


def select_texts(segments: Sequence[Segment], value) -> list[str]:
    """The texts an avropath rule compares for one message value: a decoded Avro record (dict, as fastavro's
    reader returns it with `plain_schema`), or the JSON text Herald converts it to (str or bytes).
    Anything else (None, invalid JSON) selects nothing."""
    if isinstance(value, dict):
        if METADATA_FIELD in value:  # to_json drops Hermes' envelope, so filters do not see it either
            value = {key: item for key, item in value.items() if key != METADATA_FIELD}
        values = [plain_value(item) for item in select(segments, value)]
    else:
        document = parse_json(value) if value is not None else INVALID
        if document is INVALID:
            return []
        values = select(segments, document)
    texts = [value_text(item) for item in values]
    return [NULL_TEXT if text is None else text for text in texts]
