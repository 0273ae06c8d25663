"""Source-level drop reasons, read without Ray: vanished files and damaged tars."""

from pipeline.config import SourceConfig
from pipeline.sources import plan_source, read_partition
from stages.base import DROP


def rows(batch: dict) -> list[dict]:
    return [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def test_file_gone_between_listing_and_reading_is_read_error(image_folder):
    folder = image_folder(n=4)
    parts = plan_source(SourceConfig(kind="images", path=str(folder)), {})
    victim = sorted(folder.glob("*.jpg"))[1]
    victim.unlink()
    got = {r["__key__"]: r[DROP] for r in rows(read_partition(parts[0], {}))}
    assert got[victim.stem] == "read_error"
    assert sum(reason is None for reason in got.values()) == 3


def test_truncated_tar_keeps_samples_before_the_damage(tar_shards, tmp_path):
    source = tar_shards(n_shards=1, per_shard=6)
    tar = next(source.glob("*.tar"))
    data = tar.read_bytes()
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(data[: len(data) // 2])
    parts = plan_source(SourceConfig(kind="webdataset", path=str(damaged)), {})
    got = rows(read_partition(parts[0], {}))
    assert 0 < sum(r[DROP] is None for r in got) < 6  # the samples before the cut survive
    assert got[-1]["__key__"] == "damaged_tar_damaged"
    assert got[-1][DROP].startswith("corrupt_tar:")
