"""Competitor: a plain webdataset 1.x pipeline, written the way its README recommends.

bench/.venv-loaders/bin/python bench/loaders/run_wds1.py --shards DIR --work DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


class Tokenize:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str):
        return self.tokenizer(text)[0]


def main() -> None:
    args = common.parse_args("webdataset")
    import webdataset as wds

    preprocess, tokenizer = common.transform(args.model)
    if args.remote:
        raise SystemExit("webdataset: --remote mode not implemented yet")
    urls = common.shard_paths(args.shards)

    def make_loader():
        dataset = (
            wds.WebDataset(
                urls,
                shardshuffle=100,
                seed=args.seed,
                nodesplitter=wds.split_by_node,
                workersplitter=wds.split_by_worker,
            )
            .shuffle(1000)
            .decode("pil")
            .to_tuple("jpg;png", "txt")
            .map_tuple(preprocess, Tokenize(tokenizer))
            .batched(args.batch_size, partial=False)
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=args.workers)

    common.emit(common.measure(args, make_loader, packages=("webdataset",)))


if __name__ == "__main__":
    main()
