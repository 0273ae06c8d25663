"""The whole-table phase B: the oracle partitioned decisions are checked against."""

import pyarrow as pa
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.stages.base import DROP, DROP_STAGE


def oracle(table: pa.Table, stages) -> dict[tuple[int, int], tuple]:
    """The whole-table phase B: first live key wins, then each stage's decide() in turn."""
    table = table.sort_by([("__part__", "ascending"), ("__index__", "ascending")])
    drops, labels = table[DROP].to_pylist(), table[DROP_STAGE].to_pylist()
    kept = [None] * table.num_rows
    seen = set()
    for i, key in enumerate(table["__key__"].to_pylist()):
        if drops[i] is None:
            if key in seen:
                drops[i], labels[i] = "duplicate_key", "source"
            seen.add(key)
    keys = table["__key__"].to_pylist()
    for stage in (s for s in stages if s.is_global):
        current = table.set_column(
            table.column_names.index(DROP), DROP, pa.array(drops, pa.string())
        )
        decided = stage.decide(current, LocalRunner())
        for i, key in enumerate(keys):
            if key in decided and drops[i] is None:
                drops[i], kept[i] = decided[key]
                labels[i] = stage.label
    where = zip(table["__part__"].to_pylist(), table["__index__"].to_pylist(), strict=True)
    return {w: (d, s, k) for w, d, s, k in zip(where, drops, labels, kept, strict=True)}
