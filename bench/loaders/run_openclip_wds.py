"""Competitor: open_clip's own WebDataset training pipeline (open_clip_train.data.get_wds_dataset).

Runs in bench/.venv-openclip (open_clip_train pins webdataset<=0.2.86). The Namespace carries
what open_clip_train.main's parser would for a local `--dataset-type webdataset` run with the
default (non-resampled) sampling; the loop does what its train loop does per epoch.

    bench/.venv-openclip/bin/python bench/loaders/run_openclip_wds.py --shards DIR --work DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def main() -> None:
    args = common.parse_args("openclip_wds")
    if args.remote:
        raise SystemExit("openclip_wds: --remote not supported by this runner yet")
    from open_clip_train.data import get_wds_dataset

    preprocess, tokenizer = common.transform(args.model)
    shards = common.shard_paths(args.shards)
    samples = sum(1 for s in shards for _ in common.iter_tar_samples(s))  # as --train-num-samples
    oc_args = argparse.Namespace(
        train_data="::".join(shards),
        val_data=None,
        dataset_type="webdataset",
        train_num_samples=samples,
        val_num_samples=None,
        dataset_resampled=False,
        train_data_upsampling_factors=None,
        batch_size=args.batch_size,
        workers=args.workers,
        world_size=1,
        rank=0,
        distributed=False,
        seed=args.seed,
    )
    state = {}

    def make_loader():
        state["data"] = get_wds_dataset(
            oc_args, preprocess, is_train=True, epoch=0, floor=False, tokenizer=tokenizer
        )
        return state["data"].dataloader

    result = common.measure(
        args,
        make_loader,
        set_epoch=lambda epoch: state["data"].set_epoch(epoch),
        packages=("webdataset",),
    )
    common.emit(result)


if __name__ == "__main__":
    main()
