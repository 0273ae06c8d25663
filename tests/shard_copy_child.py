"""Child of tests/core/test_storage_peak.py: writes a candidate of one big member to S3 through
open_atomic (streamed), then a shard of it through write_shard, and prints the peak PSS of its
process tree above idle for each, as JSON. argv: storage options (JSON), bucket, MiB."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmcurate.core.atomic import open_atomic, write_parquet
from mmcurate.core.storage import filesystem
from mmcurate.pipeline.output.shard_format import ShardSpec
from mmcurate.pipeline.output.shard_metadata import candidate_metadata
from mmcurate.pipeline.output.shards import write_shard

from bench.memwatch import PeakMemory, tree_pss  # noqa: E402

BLOCK = hashlib.sha256(b"x").digest() * (1 << 15)  # 1 MiB, incompressible enough


def main() -> None:
    options, bucket, mib = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    fs, path = filesystem(f"s3://{bucket}/work/candidates/part-000000.tar", options)
    fs.ls(bucket)  # the client, its session and threads exist before idle is measured
    meta = candidate_metadata([{"__key__": "k", "txt": "a caption", "json": None}])
    write_parquet(meta, f"s3://{bucket}/work/candidates/part-000000.parquet", options)
    idle = tree_pss()
    digest = hashlib.sha256()
    with PeakMemory(interval=0.005) as upload, open_atomic(fs, path) as out:
        for i in range(mib):
            data = bytes([i % 256]) + BLOCK[1:]
            out.write(data)
            digest.update(data)
    digest.update(b"\0" * 1024)  # the shard's closing blocks
    spec = ShardSpec("shard-000000.tar", 1, parts=((0, [("k", 0, mib << 20)]),))
    with PeakMemory(interval=0.005) as copy:
        entry = write_shard(spec, f"s3://{bucket}/work/candidates", f"s3://{bucket}/out", options)
    peaks = {"upload": upload.bytes - idle, "copy": copy.bytes - idle}
    print(json.dumps(peaks | entry | {"expected_sha256": digest.hexdigest()}))


if __name__ == "__main__":
    main()
