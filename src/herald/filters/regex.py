"""Java regular expressions (Hermes matchers) checked and evaluated with Python's `re`.

Native filters run the matcher in the JVM (Spark's `rlike` is `java.util.regex`), so Python only *validates*
it there. Paths evaluated in Python (the fallback, and the reference evaluator the tests use) need a Python
pattern; the common Java-only spellings are translated:

- named groups `(?<name>...)` and `\\k<name>`; quoting `\\Q...\\E`; `\\z`, `\\Z`, `\\h`, `\\R`
- the POSIX classes `\\p{Alpha}`, `\\p{Digit}`, `\\p{Punct}`, ... (ASCII, as in Java)

Unicode property classes such as `\\p{L}` and class intersections `[a-z&&[^e]]` have no Python `re` spelling:
they are accepted for native paths (validated with a stand-in) and refused for Python-evaluated ones.
Patterns compile with `re.ASCII`, since Java's `\\w`, `\\d`, `\\s`, `\\b` and `(?i)` are ASCII by default.
"""

from __future__ import annotations

import functools
import re

from herald.filters.rules import FilterError

_POSIX = {
    "Lower": "a-z",
    "Upper": "A-Z",
    "ASCII": "\\x00-\\x7f",
    "Alpha": "a-zA-Z",
    "Digit": "0-9",
    "Alnum": "a-zA-Z0-9",
    "Punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~").replace("\\ ", " "),
    "Graph": "\\x21-\\x7e",
    "Print": "\\x20-\\x7e",
    "Blank": " \\t",
    "Cntrl": "\\x00-\\x1f\\x7f",
    "XDigit": "0-9a-fA-F",
    "Space": " \\t\\n\\x0b\\f\\r",
    "javaLowerCase": "a-z",
    "javaUpperCase": "A-Z",
}
_HSPACE = " \\t\\xa0\\u1680\\u180e\\u2000-\\u200a\\u202f\\u205f\\u3000"
_LINEBREAK = "(?:\\r\\n|[\\n\\x0b\\x0c\\r\\x85\\u2028\\u2029])"


def translate(pattern: str) -> tuple[str, list[str]]:
    """Java pattern -> (Python pattern, Java-only constructs found). Java-only constructs are replaced by a
    stand-in that keeps the pattern's structure, so the result still compiles for validation."""
    out: list[str] = []
    java_only: list[str] = []
    in_class = False
    class_start = 0
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt == "Q":
                end = pattern.find("\\E", i + 2)
                literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                out.append(re.escape(literal))
                i = n if end < 0 else end + 2
                continue
            if nxt in "pP":
                if i + 2 < n and pattern[i + 2] == "{":
                    end = pattern.find("}", i + 3)
                    if end < 0:
                        raise FilterError(f"matcher {pattern!r}: unterminated \\{nxt}{{...}} class")
                    name, after = pattern[i + 3 : end], end + 1
                else:
                    name, after = pattern[i + 2 : i + 3], i + 3
                name = name[2:] if name.startswith("Is") and name[2:] in _POSIX else name
                body = _POSIX.get(name)
                if body is None:
                    java_only.append(pattern[i:after])
                    out.append("a" if in_class else "(?:.)")
                elif in_class and nxt == "p":
                    out.append(body)
                elif in_class:
                    java_only.append(pattern[i:after])
                    out.append("a")
                else:
                    out.append(("[^" if nxt == "P" else "[") + body + "]")
                i = after
                continue
            if nxt == "k" and i + 2 < n and pattern[i + 2] == "<":
                end = pattern.find(">", i + 3)
                if end > 0:
                    out.append(f"(?P={pattern[i + 3:end]})")
                    i = end + 1
                    continue
            if nxt == "z" and not in_class:
                out.append("\\Z")
            elif nxt == "Z" and not in_class:
                out.append("(?=\\n?\\Z)")
            elif nxt == "h":
                out.append(_HSPACE if in_class else f"[{_HSPACE}]")
            elif nxt == "H" and not in_class:
                out.append(f"[^{_HSPACE}]")
            elif nxt == "R" and not in_class:
                out.append(_LINEBREAK)
            elif nxt == "e":
                out.append("\\x1b")
            elif nxt in "GX" and not in_class:
                java_only.append("\\" + nxt)
                out.append("(?:)")
            else:
                out.append(char + nxt)
            i += 2
            continue
        if in_class:
            if char == "[" or pattern.startswith("&&", i):
                java_only.append("character class union/intersection "
                                 + pattern[class_start : pattern.find("]", i) + 1])
                out.append("\\[" if char == "[" else "&")
                i += 1 if char == "[" else 2
                continue
            if char == "]":
                in_class = False
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            class_start = i
            out.append(char)
            # a ']' right after '[' or '[^' is a literal in both dialects
            if pattern.startswith("]", i + 1):
                out.append("\\]")
                i += 2
                continue
            if pattern.startswith("^]", i + 1):
                out.append("^\\]")
                i += 3
                continue
            i += 1
            continue
        if pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
            continue
        out.append(char)
        i += 1
    return "".join(out), java_only


def check_matcher(matcher: str) -> list[str]:
    """Raise FilterError when `matcher` is not a valid regular expression; return its Java-only constructs."""
    if not isinstance(matcher, str):
        raise FilterError("a filter needs a 'matcher' (a Java regular expression that must match the whole value)")
    python_pattern, java_only = translate(matcher)
    try:
        re.compile(python_pattern, re.ASCII)
    except re.error as error:
        raise FilterError(
            f"matcher {matcher!r} is not a valid regular expression: {error} (matchers are Java regular "
            "expressions that must match the whole value; they are checked with Python's re)"
        ) from None
    return java_only


@functools.lru_cache(maxsize=1024)
def python_pattern(matcher: str) -> re.Pattern:
    """The compiled Python pattern for a Java matcher; FilterError when it needs Java-only syntax."""
    java_only = check_matcher(matcher)
    if java_only:
        raise FilterError(
            f"matcher {matcher!r} uses Java-only regex syntax ({', '.join(java_only)}) that Python's re cannot "
            "evaluate; that is fine for paths Spark evaluates natively, not for paths evaluated in Python"
        )
    return re.compile(translate(matcher)[0], re.ASCII)


def spark_pattern(matcher: str) -> str:
    """The matcher for Spark's `rlike` (Java `find()`), anchored so that it must match the whole value.
    `\\z` rather than `$`: Java's `$` also matches before a final line terminator."""
    return f"^(?:{matcher})\\z"


_META = set("\\^$.|?*+()[]{}")


def literal(matcher: str) -> str | None:
    """The one text a Java matcher matches as a whole value, when it is a plain literal (no metacharacter once
    `\\.`-style escapes of ASCII punctuation and `\\Q...\\E` quotes are read); None otherwise. Such a matcher
    compiles to an equality test, which is much cheaper than a regex per row. A text holding U+FFFD is never
    taken: `rlike` decodes invalid UTF-8 to it, so only the regex gives the same answer on such bytes."""
    out: list[str] = []
    i, n = 0, len(matcher)
    while i < n:
        char = matcher[i]
        if char == "\\":
            nxt = matcher[i + 1 : i + 2]
            if nxt == "Q":
                end = matcher.find("\\E", i + 2)
                out.append(matcher[i + 2 :] if end < 0 else matcher[i + 2 : end])
                i = n if end < 0 else end + 2
                continue
            if not nxt or not nxt.isascii() or nxt.isalnum():
                return None  # \d, \n, \1, \p{..}, ...: a class, a control character or a back reference
            out.append(nxt)
            i += 2
            continue
        if char in _META:
            return None
        out.append(char)
        i += 1
    text = "".join(out)
    return None if "\ufffd" in text else text
