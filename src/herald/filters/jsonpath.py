"""JSONPath parsing into a small IR of steps.

The IR has three steps, which is what Hermes' filters use in practice and what Spark can evaluate natively:

- `Field(name)`: the member `name` of an object (`.name`, `['name']`, `["name"]`)
- `Index(n)`: element n (n >= 0) of an array (`[n]`)
- `Wildcard()`: every element of an array OR every value of an object (`[*]` and `.*`, as Jayway does)

A path outside that subset (recursive descent `..`, filter expressions `[?(...)]`, slices, negative indexes,
unions, functions) is still accepted when jsonpath-ng's extended parser can read it; it is then evaluated in
Python (`JsonPath.steps is None`). A path neither can read raises FilterError.

avropath filters (`.user.addresses[*].city`) have their own syntax and selection rules: herald.filters.avropath.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from herald.filters.rules import FilterError

NATIVE_SYNTAX = "$, .name, ['name'], [\"name\"], [n] (n >= 0), [*] and .*"


@dataclass(frozen=True)
class Field:
    name: str


@dataclass(frozen=True)
class Index:
    index: int


@dataclass(frozen=True)
class Wildcard:
    pass


Step = Field | Index | Wildcard


@dataclass(frozen=True)
class JsonPath:
    """A parsed path. `steps` is None when only jsonpath-ng (in Python) can evaluate it; then `reason` says why."""

    source: str
    steps: tuple[Step, ...] | None
    reason: str | None = None

    @property
    def definite(self) -> bool:
        """True when the path selects at most one value (no wildcard)."""
        return self.steps is not None and not any(isinstance(step, Wildcard) for step in self.steps)


# Characters that end a dotted member name (Jayway stops at space, '.', '[' and '('; we also refuse the ones
# that only make sense in other JSONPath constructs, so such paths go to jsonpath-ng instead).
_NAME_STOP = set(" \t\r\n.[]()'\"*?,")


class _Unsupported(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def normalise(path: str) -> str:
    """Jayway accepts paths without the root: `a.b` means `$.a.b` and `[0]` means `$[0]`."""
    text = path.strip()
    if text.startswith("$"):
        return text
    if text.startswith("["):
        return "$" + text
    if text.startswith("."):
        return "$" + text
    return "$." + text


@functools.lru_cache(maxsize=1024)
def parse_jsonpath(path: str) -> JsonPath:
    """Parse `path`; raise FilterError naming the path when neither the native subset nor jsonpath-ng can read it."""
    if not isinstance(path, str) or not path.strip():
        raise FilterError("a jsonpath filter needs a non-empty 'path', e.g. '$.user.country'")
    text = normalise(path)
    try:
        return JsonPath(path, _parse_native(text))
    except _Unsupported as unsupported:
        reason = unsupported.reason
    try:
        _jsonpath_ng(text)
    except Exception as error:  # noqa: BLE001 - jsonpath-ng raises several exception types
        raise FilterError(
            f"jsonpath {path!r} cannot be parsed ({reason}; jsonpath-ng: {error}). Supported natively by Spark: "
            f"{NATIVE_SYNTAX}; other JSONPath that jsonpath-ng accepts (recursive descent '..', filter "
            "expressions [?(...)], slices, negative indexes, unions) is evaluated in Python"
        ) from None
    return JsonPath(path, None, reason)


@functools.lru_cache(maxsize=1024)
def _jsonpath_ng(text: str):
    from jsonpath_ng.ext import parse

    return parse(text)


def compiled_jsonpath_ng(path: JsonPath):
    """The jsonpath-ng expression for a path outside the native subset (cached per process)."""
    return _jsonpath_ng(normalise(path.source))


def _parse_native(text: str) -> tuple[Step, ...]:
    assert text.startswith("$")
    steps: list[Step] = []
    i, n = 1, len(text)
    while i < n:
        char = text[i]
        if char == ".":
            if i + 1 < n and text[i + 1] == ".":
                raise _Unsupported("recursive descent '..' is not supported by Spark")
            if i + 1 < n and text[i + 1] == "*":
                steps.append(Wildcard())
                i += 2
                continue
            j = i + 1
            while j < n and text[j] not in _NAME_STOP:
                j += 1
            name = text[i + 1 : j]
            if not name:
                raise _Unsupported(f"unexpected {text[j:j + 1] or 'end of path'!r} after '.' at offset {i}")
            if j < n and text[j] == "(":
                raise _Unsupported(f"function call {name}() is not supported by Spark")
            steps.append(Field(name))
            i = j
        elif char == "[":
            step, i = _parse_bracket(text, i)
            steps.append(step)
        else:
            raise _Unsupported(f"unexpected {char!r} at offset {i}")
    return tuple(steps)


_INDEX = re.compile(r"\[(\d+)\]")


def _parse_bracket(text: str, i: int) -> tuple[Step, int]:
    rest = text[i:]
    if rest.startswith("[*]"):
        return Wildcard(), i + 3
    match = _INDEX.match(rest)
    if match:
        return Index(int(match.group(1))), i + match.end()
    if rest[1:2] in ("'", '"'):
        quote = rest[1]
        name_chars: list[str] = []
        j = i + 2
        while j < len(text):
            char = text[j]
            if char == "\\" and j + 1 < len(text) and text[j + 1] in (quote, "\\"):
                name_chars.append(text[j + 1])
                j += 2
                continue
            if char == quote:
                break
            name_chars.append(char)
            j += 1
        else:
            raise _Unsupported("unterminated quoted name")
        if text[j + 1 : j + 2] == "]":
            return Field("".join(name_chars)), j + 2
        if text[j + 1 : j + 2] == ",":
            raise _Unsupported("unions ['a','b'] are not supported by Spark")
        raise _Unsupported(f"expected ']' after the quoted name at offset {j + 1}")
    inner = rest[1 : rest.find("]")] if "]" in rest else rest[1:]
    if inner.startswith("?"):
        raise _Unsupported("filter expressions [?(...)] are not supported by Spark")
    if ":" in inner:
        raise _Unsupported("array slices [a:b] are not supported by Spark")
    if inner.lstrip().startswith("-"):
        raise _Unsupported("negative indexes are not supported by Spark")
    if "," in inner:
        raise _Unsupported("unions [a,b] are not supported by Spark")
    raise _Unsupported(f"unsupported bracket expression {('[' + inner + ']')!r}")


def spark_path(steps: tuple[Step, ...] | list[Step]) -> str | None:
    """The same steps as a path for Spark's `get_json_object`, or None when Spark's path parser cannot spell a
    member name (measured: it reads `.name` up to the next '.' or '[', and `['name']` up to the next quote)."""
    out = ["$"]
    for step in steps:
        if isinstance(step, Index):
            out.append(f"[{step.index}]")
        elif isinstance(step, Wildcard):
            return None  # get_json_object's wildcard output is ambiguous; the compiler never asks for it
        else:
            name = step.name
            if not name:
                return None
            if "." not in name and "[" not in name and not name.startswith("*") and name.strip() == name:
                out.append("." + name)
            elif "'" not in name and name.strip() == name:
                out.append(f"['{name}']")
            else:
                return None
    return "".join(out)


def spark_expressible(steps: tuple[Step, ...]) -> bool:
    """True when every member name in `steps` can be spelled in a get_json_object path."""
    return all(spark_path([step]) is not None for step in steps if isinstance(step, Field))


def native_path(path: JsonPath) -> bool:
    """True when the path compiles to Spark expressions (otherwise it is evaluated in Python)."""
    return path.steps is not None and spark_expressible(path.steps)


def render(steps: tuple[Step, ...]) -> str:
    """Canonical JSONPath text of the steps (for messages and tests)."""
    out = ["$"]
    for step in steps:
        if isinstance(step, Field):
            escaped = step.name.replace("\\", "\\\\").replace("'", "\\'")
            out.append(f"['{escaped}']")
        elif isinstance(step, Index):
            out.append(f"[{step.index}]")
        else:
            out.append("[*]")
    return "".join(out)
