"""JSON values as filters see them: the document parsed the way Spark's parser reads it, and each selected
value rendered as the text a matcher compares (strings unquoted, everything else as compact JSON written the way
Spark's Jackson writes it, numbers as Java doubles). Plain Python, shared by the jsonpath and avropath reference
evaluators."""

from __future__ import annotations

import json
import math
from decimal import Decimal


class _Invalid:
    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid()

_DECODER = json.JSONDecoder(parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))


def parse_json(text: str | bytes | bytearray | memoryview | None):
    """The first JSON value in `text` (trailing text ignored, like Spark's Jackson parser), or INVALID."""
    if text is None:
        return INVALID
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", errors="replace")
    text = text.lstrip(" \t\r\n")
    try:
        return _DECODER.raw_decode(text)[0]
    except (ValueError, RecursionError):
        return INVALID


def java_double(value: float) -> str:
    """Java's `Double.toString` (shortest digits): 100.0, 1.5, 1.0E-5, 1.23456789E7, -0.0, Infinity."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    decimal = Decimal(repr(abs(value))).normalize()
    digits = "".join(map(str, decimal.as_tuple().digits))
    exponent = decimal.as_tuple().exponent  # value = digits * 10**exponent
    if 1e-3 <= abs(value) < 1e7:
        if exponent >= 0:
            return f"{sign}{digits}{'0' * exponent}.0"
        point = len(digits) + exponent
        if point > 0:
            return f"{sign}{digits[:point]}.{digits[point:]}"
        return f"{sign}0.{'0' * -point}{digits}"
    scientific = len(digits) + exponent - 1
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{scientific}"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _quote(text: str) -> str:
    out = ['"']
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def json_text(value) -> str:
    """Compact JSON as Jackson writes it (no spaces, Java doubles, upper-case \\uXXXX escapes)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, list):
        return "[" + ",".join(json_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_quote(str(key)) + ":" + json_text(item) for key, item in value.items()) + "}"
    return _quote(str(value))


def value_text(value) -> str | None:
    """How a selected value is compared: strings unquoted, everything else as compact JSON; None for JSON null."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json_text(value)
