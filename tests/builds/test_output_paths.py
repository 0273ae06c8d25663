"""Output paths that used to slip past the output-safety rules (adversarial review):

- glob characters in output.path: s3fs expands them when deleting (an --overwrite of `ds?`
  deleted the shards of a sibling build `ds1`) and `fs.glob` when resuming (a rerun took a
  sibling's finished shards for its own and committed a manifest of files it did not have);
- `s3://bucket//prefix`, `.` and `..` parts: SeaweedFS folds `a//b` into `a/b` while the
  build's own listing of `a//b` comes back empty, so foreign files were overwritten unseen;
- a store's empty-folder marker, listed as a file of the folder's own name, made a reserved
  folder (`signatures/`) look foreign after an --overwrite emptied it: the output was stuck;
- an output that cannot be written (a dangling link, a read-only folder) ended in a
  traceback instead of one line.
"""

import pytest
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.core.storage import files_in
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig

from tests.kit_builds import config


def build_config(out: str, source: str = "/tmp/in") -> dict:
    return {"source": {"kind": "images", "path": source}, "output": {"path": out}}


@pytest.mark.parametrize(
    "out",
    ["/data/ds?", "/data/ds[v2]", "/data/*", "s3://b/out[1]", "s3://b/gq/ds?", "gs://b/a*b"],
)
def test_glob_characters_in_the_output_path_are_a_config_error(out):
    with pytest.raises(ConfigError) as err:
        validate(BuildConfig, build_config(out))
    assert str(err.value).startswith("output.path:") and "glob characters" in str(err.value)


@pytest.mark.parametrize(
    "out", ["s3://b//users", "s3://b/x/../dd", "s3://b/./dd", "s3://b/a//b/", "gs://b/x/."]
)
def test_empty_dot_and_dotdot_parts_of_a_store_path_are_a_config_error(out):
    with pytest.raises(ConfigError) as err:
        validate(BuildConfig, build_config(out))
    assert str(err.value).startswith("output.path:") and "'..' part" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("out", ["s3://b/out/", "s3://b", "s3://b/", "/data/x/../out"])
def test_ordinary_paths_stay_valid(out):
    assert validate(BuildConfig, build_config(out)).output.path.rstrip("/")


def test_a_reserved_folder_emptied_on_a_store_does_not_lock_the_output(
    ray_session, s3, s3_bucket, image_folder
):
    """A build with clip_score publishes embeddings/; an --overwrite by a build without it
    empties the folder, and SeaweedFS keeps the folder's marker. The next --overwrite was
    refused ('holds embeddings, which no mmcurate build wrote'), --allow-other-files or not."""
    source, opts = image_folder(n=6), s3.storage_options
    out = f"s3://{s3_bucket}/out"
    scored = config(source, out, storage_options=opts)
    clip = {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}
    scored = BuildConfig.model_validate(scored.model_dump() | {"stages": [clip]})
    run_build(scored, False)
    fs = s3.filesystem()
    assert fs.find(f"{s3_bucket}/out/embeddings")
    plain = config(source, out, storage_options=opts, overwrite=True)
    run_build(plain, False)
    again = config(source, out, storage_options=opts, overwrite=True, shard_max_samples=2)
    assert run_build(again, False)["samples"] == 6
    fs.invalidate_cache()
    assert not files_in(fs, f"{s3_bucket}/out/embeddings")  # at most the store's folder marker


def test_an_output_path_that_is_a_dangling_link_is_one_line(tmp_path, image_folder):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError) as err:
        run_build(config(image_folder(n=2), link), False)
    assert str(err.value).startswith(f"output.path: {link}: cannot write there")
    assert not (tmp_path / "gone").exists()
