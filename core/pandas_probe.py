"""pyarrow's pandas probe, skipped in the build command's own process.

pyarrow imports pandas (~0.27 s) the first time it is handed a Python list, only to ask whether
the list is a pandas object. `skip_pandas_probe` lets that probe find no pandas, so pyarrow
answers "not pandas" without importing it. pyarrow imports pandas again on any call that needs
it (`to_pandas`, `from_pandas`), and from then on treats pandas objects and values as usual.

One more thing depends on it: pyarrow turns nanosecond timestamps and durations into pandas
`Timestamp`/`Timedelta` when it knows pandas, else into datetime/timedelta (and raises on
sub-microsecond values). `pandas_for_nanoseconds` restores pyarrow's pandas before a user's
table with such columns becomes Python values, so sample JSON is the same however a build runs.
"""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa


class _NoPandas:
    """A meta path finder that makes `import pandas` fail (around one probe only)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ImportError("pandas is skipped for pyarrow's first-list probe")


def skip_pandas_probe() -> None:
    """For the build command's own process only: build code never hands pyarrow pandas objects,
    while a library caller's code might (until its first `to_pandas`, a Series would be read
    as a plain sequence)."""
    if "pandas" in sys.modules:
        return
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(blocker)


def pandas_for_nanoseconds(schema: pa.Schema) -> None:
    """Call before turning a user's table into Python values (`to_pylist`): when a column
    holds nanosecond timestamps or durations (nested ones too), pyarrow gets its pandas back
    first, as in a process that never skipped the probe."""
    if any("[ns" in str(field.type) for field in schema):
        pa.array([0]).to_pandas()  # a call that needs pandas: pyarrow imports it again
