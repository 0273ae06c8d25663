"""Competitor: LitData. Shards -> litdata.optimize chunks (raw JPEG bytes + caption) ->
litdata.StreamingDataset (transform: PIL decode + open_clip transform + tokenizer) ->
litdata.StreamingDataLoader.

The conversion runs once per --work folder (with --workers processes) and is timed apart.

    bench/.venv-loaders/bin/python bench/loaders/run_litdata.py --shards DIR --work DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def shard_samples(shard: str):
    """optimize's fn: one input (a tar shard) -> its samples, JPEG bytes untouched."""
    for _, sample in common.iter_tar_samples(shard):
        yield {"jpg": sample["jpg"], "txt": sample["txt"].decode("utf-8")}


class Transform:
    def __init__(self, sample):
        self.sample = sample

    def __call__(self, item):
        return self.sample(item["jpg"], item["txt"])


def main() -> None:
    args = common.parse_args("litdata")
    if args.remote:
        raise SystemExit("litdata: --remote mode not implemented yet")
    import litdata

    preprocess, tokenizer = common.transform(args.model)
    work = Path(args.work) / "litdata"
    work.mkdir(parents=True, exist_ok=True)
    convert_s = None
    storage_options = None
    if args.remote:
        # The optimized folder must already be uploaded under --remote; start from an empty cache.
        input_dir, cache_dir = args.remote, work / "cache"
        shutil.rmtree(cache_dir, ignore_errors=True)
        storage_options = {"endpoint_url": args.endpoint} if args.endpoint else None
    else:
        out = work / "optimized"

        def convert():
            shutil.rmtree(out, ignore_errors=True)
            litdata.optimize(
                fn=shard_samples,
                inputs=common.shard_paths(args.shards),
                output_dir=str(out),
                chunk_bytes="64MB",
                num_workers=args.workers,
                mode="overwrite",
                verbose=False,
            )

        convert_s = common.timed_conversion(work / "convert.json", convert)
        input_dir, cache_dir = str(out), None

    def make_loader():
        dataset = litdata.StreamingDataset(
            input_dir=input_dir,
            cache_dir=str(cache_dir) if cache_dir else None,
            shuffle=True,
            drop_last=True,
            seed=args.seed,
            storage_options=storage_options,
            transform=Transform(common.Sample(preprocess, tokenizer)),
        )
        return litdata.StreamingDataLoader(
            dataset, batch_size=args.batch_size, num_workers=args.workers
        )

    result = common.measure(args, make_loader, convert_s=convert_s, packages=("litdata",))
    common.emit(result)


if __name__ == "__main__":
    main()
