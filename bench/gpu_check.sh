#!/usr/bin/env bash
# GPU check for one H200 (the `device` tool's machine), under 9 minutes: CLIP scoring
# throughput from shards, decode included, mmcurate's clip_score parts vs a plain open_clip
# loop, for ViT-B-32 and ViT-L-14, with GPU utilisation (one table); then ViT-B-32 training
# from the same shards with mmcurate's trainer, CPU decode and gpu_decode: samples/s and
# data_wait_frac (bench/gpu_train.py, one JSON line each).
#
# The device has PyTorch, Pillow, numpy, pyarrow, scikit-image and nvidia-ml-py but no
# network: carry open_clip and pydantic as wheels. Once, here, in the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl open_clip_torch ftfy wcwidth pydantic \
#     pydantic_core annotated_types typing_inspection fsspec pyyaml tqdm
# then run with the device tool: command `bash bench/gpu_check.sh`, carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
shards=$(mktemp -d)
python3 - "$shards" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "bench")
from photos import make_photos
from core.tario import write_tar
folder = Path(sys.argv[1])
make_photos(folder / "photos", 4096, captions=True)
files = sorted((folder / "photos").glob("*.jpg"))
for shard in range(8):
    rows = [{"__key__": f.stem, "jpg": f.read_bytes(), "txt": f.with_suffix(".txt").read_text()}
            for f in files[shard::8]]
    with open(folder / f"shard-{shard:06d}.tar", "wb") as out:
        write_tar(rows, out)
PY
timeout 150 python3 bench/gpu_train.py --shards "$shards" | tee "${OUT:-/tmp}/gpu_check.txt"
timeout 380 python3 bench/gpu_check.py --shards "$shards" | tee -a "${OUT:-/tmp}/gpu_check.txt"
