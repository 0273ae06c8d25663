"""Synthetic LAION-like URL lists (for tests and bench/source_read.py): the nine columns of a
LAION metadata part (URL, TEXT, WIDTH, HEIGHT, similarity, punsafe, pwatermark, LICENSE, NSFW),
with nulls, written as parquet with chosen row groups, or as csv / gzipped csv.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

WORDS = (
    "photo of a red old new small large wooden modern vintage dog cat house car street beach "
    "mountain city night sunset portrait woman man child table chair flower garden kitchen "
    "poster logo vector illustration stock image white black blue green"
).split()
LICENSES = ["?", "?", "?", "?", "?", "?", "https://creativecommons.org/licenses/by/4.0/"]
NSFW = ["UNLIKELY", "UNLIKELY", "UNLIKELY", "UNLIKELY", "UNSURE", "NSFW"]


def laion_like_table(rows: int, url_base: str = "http://127.0.0.1:9", seed: int = 0) -> pa.Table:
    """`rows` rows; URLs are `<url_base>/img/<row>-<token>.jpg`; some cells null."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 2**40, rows)
    words = np.asarray(WORDS)[rng.integers(0, len(WORDS), (rows, 12))]
    lengths = rng.integers(3, 13, rows)
    text = [" ".join(w[:n]) for w, n in zip(words, lengths, strict=True)]
    text = [None if i % 97 == 13 else t for i, t in enumerate(text)]
    width = rng.integers(64, 4096, rows)
    height = rng.integers(64, 4096, rows)
    return pa.table(
        {
            "URL": [
                f"{url_base}/img/{i}-{t:x}/{t * 7919 % 10**12:012d}.jpg?s={t % 9973}"
                for i, t in enumerate(tokens)
            ],
            "TEXT": pa.array(text, pa.string()),
            "WIDTH": pa.array(width, mask=np.arange(rows) % 53 == 7),
            "HEIGHT": pa.array(height, mask=np.arange(rows) % 53 == 7),
            "similarity": rng.uniform(0.28, 0.45, rows),
            "punsafe": pa.array(rng.uniform(0, 1, rows).astype(np.float32)),
            "pwatermark": pa.array(
                rng.uniform(0, 1, rows).astype(np.float32), mask=np.arange(rows) % 31 == 5
            ),
            "LICENSE": np.asarray(LICENSES)[rng.integers(0, len(LICENSES), rows)],
            "NSFW": np.asarray(NSFW)[rng.integers(0, len(NSFW), rows)],
        }
    )


def write_parquet_list(table: pa.Table, path: str | Path, row_group_rows: int) -> None:
    pq.write_table(table, str(path), row_group_size=row_group_rows)


def write_csv_list(table: pa.Table, path: str | Path) -> None:
    """csv, or gzipped csv when the name ends in `.gz`."""
    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink)
    data = sink.getvalue().to_pybytes()
    Path(path).write_bytes(gzip.compress(data, 6) if str(path).endswith(".gz") else data)
