"""The filters of every subscription of a topic evaluated in one projection (`with_targets`).

A topic's cost is paid once, whatever the number of subscriptions (docs/design.md §2). The distinct rules of
all the rule sets are compiled together, into helper columns computed once per row and conditions that read them:

1. helper columns, in a first projection: one `from_json` for the union of every member-name path (`$.a.b`,
   `$['a']`; their schemas merged in a `MemberTrie`; a path that conflicts with it goes to the next trie, a parse
   of its own); one typed `from_json` per distinct wildcard schema; one `from_json` per group of avropath paths
   whose shapes merge; one `get_json_object` per other definite path; the values of each header name; one
   pandas UDF per Python-evaluated rule;
2. a condition per distinct rule, over the helpers; a condition that several sets share becomes a boolean column
   of a second projection, evaluated once per row;
3. `targets`: `array_remove(array(CASE WHEN <set 0 passes> THEN 0 ELSE -1 END, ...), -1)`, each set's
   conditions AND-ed cheapest first (Spark's AND stops at the first false): computed booleans, then tests of
   one value (equality for a literal matcher before a regex), then tests over arrays, then higher-order
   functions.

Spark's CollapseProject does not inline an expensive expression that the projection above reads more than once,
so each parse stays one expression per row (tests/integration/test_filter_targets.py checks the optimized plan).
The targets projection is nondeterministic for Spark (see _MINUS_ONE): no filter is pushed through it, so rows
are best filtered before `with_targets`, and a filter on the targets reads them as computed. The helper columns
are dropped from the result.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from herald.filters import check_rule
from herald.filters.avropath_sql import avropath_condition, shape_groups, shape_parse
from herald.filters.compile import check_column_names, python_udf_column
from herald.filters.jsonpath import native_path, parse_jsonpath
from herald.filters.jsonpath_sql import (
    MemberTrie,
    definite_value,
    header_values,
    member_names,
    member_value,
    typed_condition,
    typed_parse,
)
from herald.filters.regex import literal
from herald.filters.rules import FilterRule
from herald.filters.sql import Names, column_ref, ident, matched, schema_lit, strategy_match

# Evaluation order of a set's conditions, cheapest first (a set's guard before them all).
_GUARD, _COMPUTED, _LITERAL, _REGEX, _ARRAY, _LAMBDAS = range(-1, 5)

# The -1 that array_remove drops, computed so that the targets projection stands on its own:
# - without generated code (a higher-order function): Spark then compiles the projection expression by expression,
#   into small methods. Whole-stage code generation would make it one Java method, which with tens of rule sets
#   passes HotSpot's limit for JIT compilation (8,000 bytes of bytecode) and runs interpreted: measured 4x slower
#   with 50 sets of two rules;
# - nondeterministic (over spark_partition_id()): the optimizer then neither pushes a filter on the targets below
#   the projection nor inlines the targets into a projection above, either of which would evaluate conditions,
#   and parses read inside higher-order functions, more than once per row.
_MINUS_ONE = "aggregate(array(spark_partition_id()), -1, (acc, x) -> acc)"


@dataclass(frozen=True)
class _Condition:
    cost: int
    sql: str  # boolean, never null


class _Helpers:
    """The helper columns of one projection: one per distinct SQL text, one per Python-evaluated rule."""

    def __init__(self, taken: Sequence[str]):
        self._taken = {name.lower() for name in taken}  # Spark resolves column names case-insensitively
        self.sql: dict[str, str] = {}  # SQL -> column name
        self.udfs: dict[FilterRule, str] = {}  # rule -> column name

    def fresh(self) -> str:
        """A column name the DataFrame does not have."""
        name = next(name for name in (f"__herald_filter_{i}" for i in itertools.count()) if name not in self._taken)
        self._taken.add(name)
        return name

    def of(self, sql: str) -> str:
        """A reference to the helper column computing `sql`."""
        if sql not in self.sql:
            self.sql[sql] = self.fresh()
        return ident(self.sql[sql])

    def udf(self, rule: FilterRule) -> str:
        """A reference to the boolean helper column evaluating `rule` in Python."""
        if rule not in self.udfs:
            self.udfs[rule] = self.fresh()
        return ident(self.udfs[rule])

    def columns(self, value_col: str) -> list[Column]:
        return ([F.expr(sql).alias(name) for sql, name in self.sql.items()]
                + [python_udf_column(rule, F.col(value_col)).alias(name) for rule, name in self.udfs.items()])

    def names(self) -> list[str]:
        return [*self.sql.values(), *self.udfs.values()]


def _value_test(value: str, matcher: str) -> _Condition:
    return _Condition(_LITERAL if literal(matcher) is not None else _REGEX, matched(value, matcher))


def _member_parses(text: str, paths: Sequence[tuple[str, ...]]) -> list[str]:
    """The parse each member-name path reads: a path joins the first trie it does not conflict with."""
    tries: list[MemberTrie] = []
    placed = []
    for path_names in paths:
        trie = next((trie for trie in tries if trie.insert(path_names)), None)
        if trie is None:
            trie = MemberTrie()
            trie.insert(path_names)
            tries.append(trie)
        placed.append(trie)
    return [f"from_json({text}, {schema_lit(trie.ddl())})" for trie in placed]


def _conditions(rules: Sequence[FilterRule], helpers: _Helpers, value: str, headers: str) -> dict[FilterRule,
                                                                                                    _Condition]:
    """The condition of every (distinct, valid) rule, registering the helper columns it reads."""
    names = Names()
    text = f"cast({value} as string)"
    out: dict[FilterRule, _Condition] = {}
    for shape, group in shape_groups([rule for rule in rules if rule.type == "avropath"]):
        root = helpers.of(shape_parse(text, shape))
        for rule in group:
            out[rule] = _Condition(_LAMBDAS, avropath_condition(names, root, text, rule))
    members: list[tuple[FilterRule, tuple[str, ...]]] = []
    for rule in rules:
        if rule.type == "header":
            values = helpers.of(header_values(Names(), rule.header, headers))  # own names: one helper per header
            out[rule] = _Condition(_ARRAY, strategy_match(names, values, rule.matcher, rule.strategy))
        if rule.type != "jsonpath":
            continue
        path = parse_jsonpath(rule.path)
        if not native_path(path):
            out[rule] = _Condition(_COMPUTED, helpers.udf(rule))
        elif member_names(path.steps) is not None:
            members.append((rule, member_names(path.steps)))
        elif path.definite:
            out[rule] = _value_test(helpers.of(definite_value(text, path.steps)), rule.matcher)
        else:
            root = helpers.of(typed_parse(text, path.steps))
            out[rule] = _Condition(_LAMBDAS, typed_condition(names, root, text, path.steps, rule.matcher,
                                                             rule.strategy))
    parses = _member_parses(text, [path_names for _, path_names in members])
    for (rule, path_names), parse in zip(members, parses):
        out[rule] = _value_test(member_value(helpers.of(parse), path_names), rule.matcher)
    return out


def _targets_sql(sets: Sequence[Sequence[_Condition]], values: Sequence[int]) -> str:
    if not sets:
        return "cast(array() as array<int>)"
    items = []
    for value, conditions in zip(values, sets):
        ordered = sorted(conditions, key=lambda condition: condition.cost)  # stable: declaration order
        passes = " AND ".join(f"({condition.sql})" for condition in ordered)
        items.append(f"CASE WHEN {passes} THEN {int(value)} ELSE -1 END" if passes else str(int(value)))
    return f"array_remove(array({', '.join(items)}), {_MINUS_ONE})"


def with_targets(df: DataFrame, rule_sets: Sequence[Sequence[FilterRule]], value_col: str, headers_col: str,
                 name: str = "targets", guards: Sequence[str] | None = None,
                 values: Sequence[int] | None = None) -> DataFrame:
    """df plus an array<int> column `name` (never null): in ascending order, the indices i of the rule sets
    whose rules ALL pass for the row (an empty rule set passes every row).

    `value_col` and `headers_col` are column names, as for herald.filters.filter_column: the JSON text (binary
    or string; for an AVRO topic, the JSON text its records are decoded into, which avropath rules read) and the
    Kafka headers. For every set, the answer equals `filter_column(rule_set, value_col, headers_col)`; the JSON
    is parsed once per row for all of them (module docs). Spark pushes no filter through the result's targets
    projection: filter rows before, not after. Raises FilterError for an invalid rule.

    Several topics' subscriptions in one projection (`herald.engine.round.projection.project_topics`): `guards` gives
    each set a SQL condition that must hold too, tested before its rules (say `topic = 'orders'`), and `values`
    the number a set puts in the targets instead of its index (its place among its topic's subscriptions). Sets
    whose guards never hold together may share values; the sets of one guard come in ascending values."""
    check_column_names(value_col, headers_col)
    rule_sets = [list(rules or ()) for rules in rule_sets]
    guards = list(guards) if guards is not None else [None] * len(rule_sets)
    values = list(values) if values is not None else list(range(len(rule_sets)))
    if len(guards) != len(rule_sets) or len(values) != len(rule_sets):
        raise ValueError(f"{len(rule_sets)} rule sets, {len(guards)} guards and {len(values)} values")
    distinct = list(dict.fromkeys(rule for rules in rule_sets for rule in rules))
    for rule in distinct:
        check_rule(rule)
    helpers = _Helpers([*df.columns, name])
    condition_of = _conditions(distinct, helpers, column_ref(value_col), column_ref(headers_col))
    sets = [([_Condition(_GUARD, guard)] if guard is not None else [])
            + list(dict.fromkeys(condition_of[rule] for rule in rules)) for guard, rules in zip(guards, rule_sets)]
    frame = df.select("*", *helpers.columns(value_col))

    uses = Counter(condition for conditions in sets for condition in conditions)
    shared = {condition: helpers.fresh() for condition, count in uses.items()
              if count > 1 and condition.cost != _COMPUTED}
    if shared:
        frame = frame.select("*", *[F.expr(condition.sql).alias(column) for condition, column in shared.items()])
    computed = {condition: _Condition(_COMPUTED, ident(column)) for condition, column in shared.items()}
    targets = F.expr(_targets_sql([[computed.get(condition, condition) for condition in conditions]
                                   for conditions in sets], values))
    return frame.withColumn(name, targets).drop(*helpers.names(), *shared.values())
