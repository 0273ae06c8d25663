"""The driver in bounded memory (issue 37): planning a URL list streams it, the report reads a
bounded prefix of the first shard. Each step runs in a fresh subprocess
(tests/driver_memory_child.py) that measures the peak PSS of its process tree above idle,
idle being after the same step ran once on a tiny input (imports done).

Figures (this 2-core machine; `python tests/driver_memory_child.py plan LIST WARM`):
planning a 1M-row jsonl (81 MB) whose `n` turns from int to string at row 900,000: before
823 MB above idle in 11.4 s, after 22-25 MB in 7.3-7.7 s; the same gzipped: 855 MB, 7.5 s ->
21 MB, 3.3 s; as csv (75 MB): 223 MB -> 26-31 MB. The report of a shard holding a 1 GiB
picture and a 1 GiB mp4: 3.2 GB above idle in 12.9 s -> under 0.1 MB in 0.01 s.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
CHILD = str(REPO / "tests" / "driver_memory_child.py")


def measured(step: str, path: Path, warm: Path) -> dict:
    result = subprocess.run(
        [sys.executable, CHILD, step, str(path), str(warm)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_jsonl(path: Path, rows: int, change: int) -> None:
    """url, caption and `n`: an int up to row `change`, a string from there."""
    with path.open("w") as out:
        for start in range(0, rows, 100_000):
            out.write(
                "".join(
                    f'{{"url": "http://127.0.0.1/{i}.jpg", "caption": "a photo {i}", '
                    f'"n": {i if i < change else json.dumps(f"v{i}")}}}\n'
                    for i in range(start, min(rows, start + 100_000))
                )
            )


def write_csv(path: Path, rows: int, change: int) -> None:
    with path.open("w") as out:
        out.write("url,caption,n\n")
        for start in range(0, rows, 100_000):
            out.write(
                "".join(
                    f"http://127.0.0.1/{i}.jpg,a photo {i},{i if i < change else f'v{i}'}\n"
                    for i in range(start, min(rows, start + 100_000))
                )
            )


def test_planning_a_million_row_csv_whose_column_changes_type_holds_under_64_mib(tmp_path):
    big, warm = tmp_path / "big.csv", tmp_path / "warm.csv"
    write_csv(big, 1_000_000, 900_000)
    write_csv(warm, 3_000, 2_000)
    facts = measured("plan", big, warm)
    assert facts["rows"] == 1_000_000 and facts["reads"] == ["bytes"]
    assert facts["above"] < 64 * MIB, facts


@pytest.mark.slow
def test_planning_a_million_row_jsonl_whose_column_changes_type_holds_under_64_mib(tmp_path):
    big, warm = tmp_path / "big.jsonl", tmp_path / "warm.jsonl"
    write_jsonl(big, 1_000_000, 900_000)
    write_jsonl(warm, 3_000, 2_000)
    facts = measured("plan", big, warm)
    assert facts["rows"] == 1_000_000 and facts["parts"] == 100
    assert facts["reads"] == ["bytes"]  # one line a row: byte ranges, as before
    assert facts["above"] < 64 * MIB, facts


def write_shard(path: Path, members: list[tuple[str, bytes | int]]) -> int:
    """A ustar tar of (name, data) members; an int is a member of that many zero bytes, left
    as a hole in a sparse file (a 1 GiB member costs no disk)."""
    with path.open("wb") as out:
        for name, data in members:
            size = data if isinstance(data, int) else len(data)
            info = tarfile.TarInfo(name)
            info.size = size
            out.write(info.tobuf(format=tarfile.USTAR_FORMAT))
            if isinstance(data, int):
                out.seek(size, io.SEEK_CUR)
            else:
                out.write(data)
            out.seek(-size % tarfile.BLOCKSIZE, io.SEEK_CUR)
        out.write(b"\0" * 2 * tarfile.BLOCKSIZE)
        return out.tell()


def jpeg(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), color).save(out, "JPEG")
    return out.getvalue()


def output_folder(root: Path, big: int) -> Path:
    """A build's output as render_report reads it: shard 0 holds small samples around two
    of `big` bytes (an mp4 beside its frame, and a jpg)."""
    root.mkdir()
    members: list[tuple[str, bytes | int]] = []
    for index in range(4):
        members += [(f"{index:03d}.jpg", jpeg((60 * index, 90, 30))), (f"{index:03d}.txt", b"hi")]
    members += [("video.mp4", big), ("video.000.jpg", jpeg((1, 2, 3))), ("video.txt", b"clip")]
    members += [("huge.jpg", big), ("huge.txt", b"too big to show")]
    size = write_shard(root / "shard-000000.tar", members)
    keys = ["000", "001", "002", "003", "video", "huge"]
    shard = {"name": "shard-000000.tar", "samples": len(keys), "bytes": size, "sha256": ""}
    config = {"source": {"path": str(root)}, "stages": []}
    manifest = {"format": "mmcurate/1", "samples": 6, "shards": [shard], "config": config}
    (root / "manifest.json").write_text(json.dumps(manifest))
    stage = {"name": "decode_image", "in": 6, "out": 6, "dropped": {}}
    stats = {"stages": [stage], "samples_in": 6, "samples_out": 6}
    (root / "stats.json").write_text(json.dumps(stats))
    (root / "signatures").mkdir()
    pq.write_table(pa.table({"key": keys}), root / "signatures" / "part-000000.parquet")
    return root


def test_the_report_of_a_shard_holding_a_1_gib_member_stays_under_100_mib(tmp_path):
    big = output_folder(tmp_path / "big", 1 << 30)
    warm = output_folder(tmp_path / "warm", 1 << 10)
    facts = measured("report", big, warm)
    assert facts["above"] < 100 * MIB, facts
    page = (big / "report.html").read_text()
    # the small samples and the video's frame are shown; the 1 GiB picture is not
    assert page.count("data:image/jpeg;base64,") == 5
    assert "too big to show" not in page and "clip" in page
