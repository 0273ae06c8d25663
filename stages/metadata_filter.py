"""metadata_filter: keep samples whose numeric metadata pass conditions such as LAION's
`punsafe < 0.1`, `pwatermark < 0.8`, `similarity >= 0.28`.

A condition is `<field> <op> <number>`, op one of < <= > >= == !=, parsed by a regular
expression (never eval). The field is a column of the sample (`clip_score`, `concept_*`,
`language_confidence`) or a key of its json (where a `urls` source puts every extra column
of a LAION parquet). Numbers and numeric strings count; drops: `missing_<field>` (absent,
null or NaN; `missing: keep` lets such samples through), `non_numeric_<field>` (text,
booleans, lists), `metadata_<field>` (the condition fails). Conditions apply in order.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from mmcurate.core.formats import sample_meta
from mmcurate.stages.base import Columns, Stage, StageOptions, register
from pydantic import Field, field_validator

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
CONDITION = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*"
    r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)


class Condition(NamedTuple):
    field: str
    op: str
    value: float

    def holds(self, number: float) -> bool:
        return OPERATORS[self.op](number, self.value)


def parse_condition(text: str) -> Condition:
    """`"punsafe < 0.1"` -> Condition; ValueError naming the text when it does not parse."""
    match = CONDITION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not `<field> <op> <number>` (op: < <= > >= == !=)")
    return Condition(match.group(1), match.group(2), float(match.group(3)))


class MetadataFilterOptions(StageOptions):
    where: tuple[str, ...] = Field(..., min_length=1, description='e.g. ["punsafe < 0.1"]')
    missing: Literal["drop", "keep"] = Field("drop", description="samples without the field")

    @field_validator("where")
    @classmethod
    def _parse(cls, where: tuple[str, ...]) -> tuple[str, ...]:
        for text in where:
            parse_condition(text)
        return where


def as_number(value: Any) -> float | None | str:
    """A finite float; None when missing (None, NaN, empty); "non_numeric" otherwise
    (infinities and integers too large for a float included)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return "non_numeric"
    if isinstance(value, str):
        if not value.strip() or value.strip().lower() in {"nan", "null", "none"}:
            return None
    elif not isinstance(value, int | float):
        return "non_numeric"
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return "non_numeric"
    if math.isnan(number):
        return None
    return number if math.isfinite(number) else "non_numeric"


def condition_reason(value: Any, cond: Condition, missing: str) -> str | None:
    number = as_number(value)
    if number is None:
        return None if missing == "keep" else f"missing_{cond.field}"
    if isinstance(number, str):
        return f"non_numeric_{cond.field}"
    return None if cond.holds(number) else f"metadata_{cond.field}"


@register
class MetadataFilter(Stage):
    name = "metadata_filter"
    Options = MetadataFilterOptions

    @property
    def consumes(self) -> frozenset[str]:
        return frozenset(parse_condition(text).field for text in self.options.where)

    def setup(self) -> None:
        self.conditions = [parse_condition(text) for text in self.options.where]

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        metas = batch.get("json") or [None] * size
        reasons: list[str | None] = [None] * size
        for i in range(size):
            meta = sample_meta(metas[i])
            for cond in self.conditions:
                column = batch.get(cond.field)
                value = column[i] if column is not None else meta.get(cond.field)
                reason = condition_reason(value, cond, self.options.missing)
                if reason is not None:
                    reasons[i] = reason
                    break
        return batch, reasons
