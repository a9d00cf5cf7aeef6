"""The filter rule a subscription declares, and the error raised when one is invalid or unsupported."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_TYPES = ("jsonpath", "avropath", "header")
STRATEGIES = ("all", "any")


class FilterError(ValueError):
    """A filter that is invalid or cannot be evaluated; the message says what is wrong and what is supported."""


@dataclass(frozen=True)
class FilterRule:
    """One Hermes filter (`MessageFilterSpecification`): plain data, picklable, safe to ship to executors.

    `matcher` is a Java regular expression that must match the WHOLE selected value (Java `Matcher.matches()`).
    `matching_strategy` ("all" or "any", any case) applies when the path selects several values.
    """

    type: str  # "jsonpath" | "avropath" | "header"
    matcher: str
    path: str | None = None
    header: str | None = None
    matching_strategy: str = "all"

    @property
    def strategy(self) -> str:
        """The matching strategy, lower-cased; "all" when unset."""
        return (self.matching_strategy or "all").strip().lower()


def validate_basics(rule: FilterRule) -> None:
    """Checks every rule needs, whatever its type: type, strategy, and the field its type requires."""
    if not isinstance(rule, FilterRule):
        raise FilterError(f"expected a FilterRule, got {type(rule).__name__}")
    if rule.type not in SUPPORTED_TYPES:
        raise FilterError(f"unknown filter type {rule.type!r} (supported: {', '.join(SUPPORTED_TYPES)})")
    if rule.strategy not in STRATEGIES:
        raise FilterError(f"matchingStrategy {rule.matching_strategy!r} is not supported (use 'all' or 'any')")
    if not isinstance(rule.matcher, str):
        raise FilterError("a filter needs a 'matcher' (a Java regular expression that must match the whole value)")
    if rule.type == "jsonpath" and (not isinstance(rule.path, str) or not rule.path.strip()):
        raise FilterError("a jsonpath filter needs a non-empty 'path', e.g. '$.user.country'")
    if rule.type == "avropath" and (not isinstance(rule.path, str) or not rule.path.strip(".")):
        raise FilterError("an avropath filter needs a non-empty 'path', e.g. '.user.addresses[*].city'")
    if rule.type == "header" and (not isinstance(rule.header, str) or not rule.header):
        raise FilterError("a header filter needs 'header': the Kafka record header name (exact, case-sensitive)")
