"""The node-local shard cache: one download per shard across processes, a byte limit, sha256
checks, and the trainer reading through it."""

import hashlib
import multiprocessing
import os

import pytest
from mmcurate.trainer.data.cache import ShardCache, ShardCorrupt

SHARD_BYTES = 200_000


def make_shards(s3, bucket, n):
    """n shards of random bytes on the S3 server; returns [(url, sha256, size)]."""
    fs = s3.filesystem()
    shards = []
    for i in range(n):
        data = os.urandom(SHARD_BYTES)
        fs.pipe(f"{bucket}/cache/shard-{i:03d}.tar", data)
        shards.append(
            (f"s3://{bucket}/cache/shard-{i:03d}.tar", hashlib.sha256(data).hexdigest(), len(data))
        )
    return shards


def read_all(folder, limit, storage_options, shards, offset, queue):
    """One 'loader worker': read every shard (starting at `offset`), check its bytes."""
    cache = ShardCache(folder, limit, storage_options)
    peak = 0
    for url, sha, size in shards[offset:] + shards[:offset]:
        with cache.open(url, sha, size) as f:
            assert hashlib.sha256(f.read()).hexdigest() == sha
        peak = max(peak, cache.used_bytes())
    queue.put((cache.counters(), peak))


def run_workers(tmp_path, s3, shards, workers, limit):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=read_all,
            args=(tmp_path / "cache", limit, s3.storage_options, shards, i % 2, queue),
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def test_concurrent_workers_download_each_shard_once(s3, s3_bucket, tmp_path):
    shards = make_shards(s3, s3_bucket, 6)
    results = run_workers(tmp_path, s3, shards, workers=4, limit=10**9)
    assert sum(c["misses"] for c, _ in results) == 6  # one download per shard for the node
    assert sum(c["hits"] for c, _ in results) == 4 * 6 - 6
    assert len(list((tmp_path / "cache").glob("*.tar"))) == 6


def test_cache_stays_within_its_limit_plus_one_shard(s3, s3_bucket, tmp_path):
    shards = make_shards(s3, s3_bucket, 8)
    limit = int(2.5 * SHARD_BYTES)
    results = run_workers(tmp_path, s3, shards, workers=2, limit=limit)
    assert max(peak for _, peak in results) <= limit + SHARD_BYTES
    assert sum(c["evictions"] for c, _ in results) > 0


def test_a_shard_that_never_matches_its_sha256_is_an_error(s3, s3_bucket, tmp_path):
    url, _, size = make_shards(s3, s3_bucket, 1)[0]
    cache = ShardCache(tmp_path / "cache", 10**9, s3.storage_options)
    with pytest.raises(ShardCorrupt, match="sha256"), cache.open(url, "0" * 64, size):
        pass
    assert not list((tmp_path / "cache").glob("*.tar")) and not list(
        (tmp_path / "cache").glob(".*tmp*")
    )
    assert cache.misses == 0


def test_a_failed_download_leaves_no_temporary_file(s3, s3_bucket, tmp_path):
    cache = ShardCache(tmp_path / "cache", 10**9, s3.storage_options)
    with pytest.raises(FileNotFoundError), cache.open(f"s3://{s3_bucket}/no/such.tar", None, 1):
        pass
    assert not [p.name for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]
