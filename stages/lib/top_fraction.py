"""`keep_top_fraction` for the stages that write a score (clip_score, aesthetic_score): keep
exactly ceil(fraction x N) of the N live rows by the score, highest first, then smallest key.
The build runs it distributed (`decide_plan` -> TopFraction, pipeline/decide/top_fraction.py);
`top_fraction_decisions` is the same decision over one table."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.mapreduce import Runner
from mmcurate.stages.lib.decisions import TopFraction, top_count
from mmcurate.stages.lib.dedupe_common import Decisions, live_rows

TOP_REASON = "below_top_fraction"  # clip_score's; other score stages name their own


class KeepsTopFraction:
    """`keep_top_fraction` for a stage that writes a score column: the global decision keeping
    exactly the top share of the live rows by `top_column`, the rest dropped as `top_reason`
    (listed before the stage's base class, so these override Stage's defaults)."""

    top_column = "clip_score"
    top_reason = TOP_REASON
    options: Any

    def decides(self) -> bool:
        return self.options.keep_top_fraction is not None

    def decide_plan(self) -> TopFraction | None:
        fraction = self.options.keep_top_fraction
        if fraction is None:
            return None
        return TopFraction(self.top_column, fraction, self.top_reason)

    def decide(self, signatures: pa.Table, runner: Runner | None = None) -> Decisions:
        """The whole-table form of the top fraction (the build runs `decide_plan`'s)."""
        fraction = self.options.keep_top_fraction
        live = live_rows(signatures, self.top_column)
        if fraction is None or not live.num_rows:
            return {}
        return top_fraction_decisions(live, fraction, self.top_column, self.top_reason)


def top_fraction_decisions(
    live: pa.Table, fraction: float, column: str = "clip_score", reason: str = TOP_REASON
) -> Decisions:
    """Keep exactly ceil(fraction x N) by `column`: highest score first, then smallest key
    (any score column: aesthetic_score uses it too)."""
    keep = top_count(fraction, live.num_rows)
    order = pc.sort_indices(
        live.select([column, "__key__"]),
        sort_keys=[(column, "descending"), ("__key__", "ascending")],
    )
    dropped = pc.take(live["__key__"], order[keep:]).to_pylist()
    return {key: (reason, None) for key in dropped}
