"""Competitor: MosaicML Streaming. Shards -> MDS (JPEG bytes kept as-is) -> StreamingDataset.

The conversion (MDSWriter, one process) runs once per --work folder and is timed apart from the
loader. The dataset subclass decodes with PIL and applies the same open_clip transform and
tokenizer in __getitem__; a plain torch DataLoader batches it (shuffle is the dataset's own).

    bench/.venv-loaders/bin/python bench/loaders/run_streaming.py --shards DIR --work DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def convert(shards: list[str], out: Path) -> None:
    from streaming import MDSWriter

    columns = {"jpg": "bytes", "txt": "str"}
    with MDSWriter(out=str(out), columns=columns, compression=None, size_limit="64mb") as writer:
        for shard in shards:
            for _, sample in common.iter_tar_samples(shard):
                writer.write({"jpg": sample["jpg"], "txt": sample["txt"].decode("utf-8")})


def main() -> None:
    args = common.parse_args("streaming")
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    class ClipMDS(StreamingDataset):
        def __init__(self, sample, **kwargs):
            super().__init__(**kwargs)
            self.sample = sample

        def __getitem__(self, index):
            obj = super().__getitem__(index)
            return self.sample(obj["jpg"], obj["txt"])

    preprocess, tokenizer = common.transform(args.model)
    work = Path(args.work) / "streaming"
    work.mkdir(parents=True, exist_ok=True)
    convert_s = None
    if args.remote:
        # The MDS folder must already be uploaded under --remote; local is an empty cache.
        os.environ["S3_ENDPOINT_URL"] = args.endpoint or ""
        local, remote = work / "cache", args.remote
        import shutil

        shutil.rmtree(local, ignore_errors=True)
    else:
        mds = work / "mds"
        convert_s = common.timed_conversion(
            work / "convert.json", lambda: convert(common.shard_paths(args.shards), mds)
        )
        local, remote = mds, None
    clean_stale_shared_memory()

    def make_loader():
        dataset = ClipMDS(
            common.Sample(preprocess, tokenizer),
            local=str(local),
            remote=remote,
            shuffle=True,
            shuffle_seed=args.seed,
            batch_size=args.batch_size,
        )
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=args.batch_size,
            num_workers=args.workers,
            drop_last=True,
            persistent_workers=args.workers > 0,
        )

    result = common.measure(
        args, make_loader, convert_s=convert_s, packages=("mosaicml-streaming",)
    )
    common.emit(result)


if __name__ == "__main__":
    main()
