"""Every shell command in README.md and docs/*.md, run exactly as written (issue 9).

Each documented command is either in RUN, which this test runs in that order in a scratch
folder laid out like a fresh clone, or in ELSEWHERE with the reason it cannot run here. A
command added to the docs, or changed, fails
`test_every_documented_command_is_run_or_has_a_reason` until it is listed. The environment
stands in for the user's machine: HOME is a scratch folder (for `~/.cache`), and `s3://` goes
to the session's SeaweedFS (AWS_ENDPOINT_URL and keys).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.pipeline.demo_data import iter_samples, make_demo_images
from mmcurate.pipeline.video_data import encode_video

from tests.http_corpus import Corpus

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEMO = "~/.cache/mmcurate/demo"

# Run in this order (later ones use what earlier ones made), each checked by `check` below.
RUN = [
    '.venv/bin/python -c "from pathlib import Path; from mmcurate.pipeline.demo_data import '
    "make_demo_images; make_demo_images(Path('~/.cache/mmcurate/demo/images').expanduser())\"",
    ".venv/bin/mmcurate build configs/demo.yaml",
    ".venv/bin/mmcurate build configs/demo.yaml --overwrite",
    ".venv/bin/mmcurate build configs/demo.yaml --no-progress",
    ".venv/bin/mmcurate build configs/demo.yaml --set output.path=s3://bucket/run1 "
    "--set output.shard_max_samples=5000",
    f".venv/bin/mmcurate report {DEMO}/build",
    ".venv/bin/mmcurate train configs/train_clip.yaml --set run.max_steps=20",
    ".venv/bin/mmcurate eval configs/eval.yaml --out eval.json",
    "make demo",
]

# docs/recipes.md and the README's recipe lines, in the order they build on each other; run by
# `test_recipe_commands_run_as_written` on the inputs a user would have (see `recipe_inputs`).
RECIPES = [
    ".venv/bin/mmcurate build configs/laion_dedupe.yaml --set source.path='laion-256/*.tar'",
    ".venv/bin/mmcurate build configs/laion_dedupe.yaml --set source.path='laion-256/*.tar'"
    " --set output.path=laion-256-dedup",
    ".venv/bin/mmcurate train configs/train_clip.yaml --set data.manifest=laion-256-dedup/"
    "manifest.json --set model.name=ViT-B-32 --set run.max_steps=null --set run.epochs=1"
    " --set run.output=runs/b32",
    ".venv/bin/mmcurate build configs/video_frames.yaml --set source.path=my-videos",
    ".venv/bin/mmcurate build configs/video_frames.yaml --set source.path=my-videos"
    " --set output.path=video-clips",
]
# docs/recipes.md's Ray cluster recipe: one shell, run by `test_ray_recipe_runs_as_written`.
RAY_RECIPE = [
    "source .venv/bin/activate",
    "ray get-auth-token --generate > /dev/null",
    "export RAY_AUTH_MODE=token",
    "ray start --head --dashboard-host=127.0.0.1",
    "ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m mmcurate build "
    "configs/demo.yaml",
    "ray stop",
]
NO_TOKEN_REQUEST = (
    'python -c "import urllib.request, urllib.error\n'
    "try: urllib.request.urlopen('http://127.0.0.1:8265/api/version')\n"
    "except urllib.error.HTTPError as e: print('without the token:', e.code)\""
)
LAION_INGEST = (
    ".venv/bin/mmcurate build configs/laion_ingest.yaml --set source.path=laion-part-00000.parquet"
    " --set source.url_column=URL --set source.caption_column=TEXT"
)
INTERNET = (
    "downloads images from the internet; `recipe_inputs` runs it on a loopback server, with the"
    " one --set the private-address guard needs for that (stages.0.allow_private_addresses)"
)
CLUSTER = "starts (or uses, or stops) a Ray cluster on AWS: an account, nodes, money"
ELSEWHERE = {
    "make test": "what CI runs (.ci/run); from a test it would run the suite inside itself",
    ".venv/bin/mmcurate demo --out demo-output": "what `make demo` runs, as written; run above",
    LAION_INGEST: INTERNET,
    f"{LAION_INGEST} --set output.path=laion-256": INTERNET,
    ".venv/bin/torchrun --nproc-per-node=8 -m mmcurate.trainer configs/train_clip.yaml "
    "--set data.manifest=s3://bucket/laion-256-dedup/manifest.json --set model.name=ViT-B-32 "
    "--set data.cache_dir=/nvme/mmcurate-cache --set data.cache_limit=500GB "
    "--set run.output=s3://bucket/runs/b32 --set run.checkpoint_every=1000 "
    "--set run.precision=bf16": "8 GPUs; tests/trainer/test_loader.py runs torchrun"
    " with 2 CPU ranks",
    ".venv/bin/mmcurate probe configs/train_clip.yaml --set model.name=ViT-B-32 --set "
    "run.precision=bf16 --target-global-batch 4096 --out probe.json": "ViT-B-32's ladder on a"
    " GPU (bench/gpu_check.sh probe); tests/trainer/test_probe.py runs mmcurate probe"
    " on mmcurate-tiny",
    f".venv/bin/mmcurate remove {DEMO}/build --keys takedown.txt": "needs the user's list of"
    " keys; tests/maintain/test_remove.py runs mmcurate remove on real builds"
    " (each selector, kill -9)",
    "export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...": "placeholders for your keys",
    "export GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json": "a placeholder for your key file",
    # docs/scale.md: a Ray cluster on AWS (tests/project/test_cluster_yaml.py checks
    # configs/cluster.yaml against Ray's own schema and the build config's resources against
    # its node types)
    "ray up -y configs/cluster.yaml": CLUSTER,
    "ray rsync-down configs/cluster.yaml '~/.ray/auth_token' ~/.ray/auth_token": CLUSTER,
    "ray dashboard configs/cluster.yaml": CLUSTER,
    "RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . -- "
    "python -m mmcurate build configs/laion_cluster.yaml --set "
    "'source.path=s3://bucket/laion400m-meta/part-00000-*.parquet' --set "
    "output.path=s3://bucket/laion400m-256/part-00000": CLUSTER
    + "; tests/runtime/test_ray_job.py submits a build to a local Ray head",
    "ray down -y configs/cluster.yaml": CLUSTER,
    # docs/sizing.md: the 4-GPU ViT-B/32 run (issue 41)
    "torchrun --standalone --nproc-per-node=4 --max-restarts=3 -m mmcurate.trainer "
    "configs/train_b32_4gpu.yaml --set data.manifest=s3://bucket/laion/manifest.json --set "
    "alerts.webhook=https://hooks.example.com/...": "4 GPUs and a webhook;"
    " tests/trainer/test_fsdp.py kills a rank under torchrun --max-restarts with 2 CPU ranks",
    "ray job submit --working-dir . -- python -m mmcurate.trainer configs/train_b32_4gpu.yaml "
    "--set launch.mode=ray --set launch.workers=4 --set launch.gpus_per_worker=1 --set "
    "launch.cpus_per_worker=10 --set launch.max_failures=3 --set "
    "data.manifest=s3://bucket/laion/manifest.json": "a 4-GPU Ray cluster;"
    " tests/trainer/test_ray_restart.py restarts 2 CPU workers under Ray Train,"
    " tests/trainer/test_fsdp.py checks the config",
}


def documented_commands() -> list[str]:
    """Each command of each ```bash block: continuations joined, comments and runs of spaces
    dropped."""
    commands = []
    for path in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+#\s.*$", "", line).strip()
                if command:
                    commands.append(" ".join(command.split()))
    return commands


def test_every_documented_command_is_run_or_has_a_reason():
    documented = set(documented_commands())
    assert documented, "no ```bash blocks found"
    run = set(RUN) | set(RECIPES) | set(RAY_RECIPE)
    assert not run & set(ELSEWHERE)
    assert documented - run - set(ELSEWHERE) == set(), "documented but not listed here"
    assert (run | set(ELSEWHERE)) - documented == set(), "listed here but not documented"


@pytest.fixture
def user_env(tmp_path, s3) -> dict[str, str]:
    """A user's shell: their own HOME, S3 keys and endpoint in the environment, no Ray
    running (each build starts a local one, whose workers inherit this environment)."""
    s3.make_bucket("bucket")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, **s3.env(), "HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture
def checkout(tmp_path) -> Path:
    """Where the commands run: the repository's tracked files copied, as a fresh clone has
    them, and its .venv linked in. Makefile and pyproject.toml are dated before .venv's install
    stamp (so `make` does not reinstall). Outputs (runs/, demo-output/, ...) land here."""
    stamp = REPO / ".venv" / ".installed"
    if not stamp.exists():
        pytest.fail("run `make install` first: the documented commands use .venv")
    root = tmp_path / "checkout"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, tracked):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    (root / ".venv").symlink_to(REPO / ".venv")
    before = stamp.stat().st_mtime - 1
    for name in ("Makefile", "pyproject.toml"):
        os.utime(root / name, (before, before))
    return root


def run_documented(command: str, checkout: Path, env: dict[str, str]) -> str:
    """Runs `command` as a user's shell would; returns its output, failing on a non-zero exit.
    Past its time limit the shell's process group, started here, is killed by its id."""
    shell = subprocess.Popen(
        command,
        shell=True,
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        output, _ = shell.communicate()
        pytest.fail(f"{command}: still running after 900 s\n{output[-3000:]}")
    assert shell.returncode == 0, f"{command}\n{output[-3000:]}"
    return output


def test_documented_commands_run_as_written(user_env, s3, checkout):
    home = Path(user_env["HOME"])
    for command in RUN:
        run_documented(command, checkout, user_env)
        check(command, home, s3, checkout)


def check(command: str, home: Path, s3, checkout: Path) -> None:
    """What each command should have left behind."""
    build = home / ".cache/mmcurate/demo/build"
    if "make_demo_images" in command:
        assert len(list((home / ".cache/mmcurate/demo/images").glob("*.jpg"))) >= 100
    elif command.endswith("s3://bucket/run1 --set output.shard_max_samples=5000"):
        manifest = json.loads(s3.filesystem().cat_file("bucket/run1/manifest.json"))
        assert manifest["samples"] > 0 and len(manifest["shards"]) == 1
    elif "build configs/demo.yaml" in command:
        manifest = json.loads((build / "manifest.json").read_text())
        assert manifest["samples"] > 0 and len(manifest["shards"]) > 1
    elif command.startswith(".venv/bin/mmcurate report"):
        assert (build / "report.html").stat().st_size > 10_000
    elif command.startswith(".venv/bin/mmcurate train"):
        summary = json.loads((checkout / "runs/train_clip/summary.json").read_text())
        assert summary["steps"] == 20
    elif command.startswith(".venv/bin/mmcurate eval"):
        result = json.loads((checkout / "eval.json").read_text())
        assert result["model"]["step"] == 20
        assert 0 <= result["metrics"]["image_retrieval_recall@1"] <= 1
        assert result["tasks"]["retrieval"]["samples"] > 0
    elif command == "make demo":
        assert (checkout / "demo-output/report.html").stat().st_size > 10_000


@pytest.fixture
def recipe_inputs(user_env, checkout) -> dict[str, str]:
    """What a user has before the recipes: `laion-256/`, made by the LAION ingest command (from a
    loopback server here), a `my-videos/` folder, and ViT-B-32 weights in the Hugging Face cache.
    The weights are random (tests download nothing), so CLIP scores are near 0. Returns the
    environment, with the hub offline as a guarantee."""
    env = {**user_env, "HF_HUB_OFFLINE": "1"}
    cache_vit_b32_weights(Path(env["HOME"]) / ".cache/huggingface/hub")
    corpus = Corpus().start()
    try:
        serve_laion_part(corpus, checkout / "laion-part-00000.parquet", n=160)
        guard_off = "--set stages.0.allow_private_addresses=true"  # loopback is private
        run_documented(f"{LAION_INGEST} --set output.path=laion-256 {guard_off}", checkout, env)
    finally:
        corpus.stop()
    videos = checkout / "my-videos"
    videos.mkdir()
    for i in range(3):  # 8 s at 24 fps, scenes of 3, 3 and 2 s
        (videos / f"video_{i}.mp4").write_bytes(encode_video(192, 24, cuts=(72, 144)))
        (videos / f"video_{i}.txt").write_text(f"a moving gradient, take {i}")
    return env


def cache_vit_b32_weights(hub: Path) -> None:
    """Random ViT-B-32 weights where open_clip looks for `laion2b_s34b_b79k` in the HF cache."""
    import open_clip
    import safetensors.torch
    import torch

    repo = hub / "models--laion--CLIP-ViT-B-32-laion2B-s34B-b79K"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs/main").write_text(revision)
    (repo / "snapshots" / revision).mkdir(parents=True)
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32")
    state = {name: tensor.half().contiguous() for name, tensor in model.state_dict().items()}
    snapshot = repo / "snapshots" / revision
    safetensors.torch.save_file(state, snapshot / "open_clip_model.safetensors")


def serve_laion_part(corpus: Corpus, path: Path, n: int) -> None:
    """A LAION-style parquet (URL, TEXT) of `n` photos on `corpus`, and two dead links."""
    urls, texts = [], []
    for sample in iter_samples(n, seed=7):
        urls.append(corpus.serve(f"/{sample.key}.{sample.ext}", sample.data))
        texts.append(sample.caption)
    urls += [f"{corpus.base}/gone.jpg", f"{corpus.base}/status/500"]
    texts += ["a photo that is gone", "a server error"]
    pq.write_table(pa.table({"URL": urls, "TEXT": texts}), path)


def test_recipe_commands_run_as_written(recipe_inputs, checkout):
    env = recipe_inputs
    ingested = json.loads((checkout / "laion-256/manifest.json").read_text())
    assert ingested["samples"] == 160
    outputs = [run_documented(command, checkout, env) for command in RECIPES]

    dedup = checkout / "laion-256-dedup"
    stats = json.loads((dedup / "stats.json").read_text())
    manifest = json.loads((dedup / "manifest.json").read_text())
    assert [stage["name"] for stage in stats["stages"]][-3:] == [
        "exact_dedupe",
        "near_dedupe",
        "semantic_dedupe",
    ]
    assert stats["samples_in"] == 160 and manifest["samples"] == stats["samples_out"] >= 32
    assert "nothing to do" in outputs[1]  # the same build again: output.path is the default

    summary = json.loads((checkout / "runs/b32/summary.json").read_text())
    assert summary["steps"] == manifest["samples"] // 32  # one epoch of batch 32
    assert (checkout / f"runs/b32/checkpoints/step-{summary['steps']}.pt").is_file()

    clips = json.loads((checkout / "video-clips/stats.json").read_text())
    by_name = {stage["name"]: stage for stage in clips["stages"]}
    assert by_name["clip_split"]["out"] == 9  # 3 videos x 3 scenes
    assert by_name["video_frames"]["out"] == 9
    assert by_name["clip_score"]["dropped"] == {"low_clip_score": 9}  # random weights score ~0
    assert "nothing to do" in outputs[4]


def test_ray_recipe_runs_as_written(user_env, checkout):
    """The recipe's five lines in one shell, in new network and process namespaces: loopback is
    the only network there, so Ray can only use 127.0.0.1 and its default ports are free, and
    `ray stop`, which stops Ray processes by name, sees only the recipe's. Whatever is left
    ends with the namespace."""
    home = Path(user_env["HOME"])
    make_demo_images(home / ".cache/mmcurate/demo/images", n=40, exact_copies=2, broken=1)
    ray_tmp = tempfile.mkdtemp(prefix="rayrecipe-", dir="/tmp")  # short: unix socket paths
    env = {**user_env, "RAY_TMPDIR": ray_tmp}  # not /tmp/ray, which the session's Ray uses
    # The recipe's lines in order; before `ray stop`, one line of the test's own: a request
    # without the token must be refused (401).
    script = "\n".join(["set -e", *RAY_RECIPE[:-1], NO_TOKEN_REQUEST, RAY_RECIPE[-1]])
    inside = f"ip link set lo up && exec bash -c {shlex.quote(script)}"
    # --kill-child: if this shell is killed, the namespace and all in it go too.
    namespaces = "unshare --user --map-root-user --net --pid --fork --mount-proc --kill-child"
    try:
        output = run_documented(f"{namespaces} bash -c {shlex.quote(inside)}", checkout, env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert "succeeded" in output and "without the token: 401" in output
    build = home / ".cache/mmcurate/demo/build"
    stats = json.loads((build / "stats.json").read_text())
    manifest = json.loads((build / "manifest.json").read_text())
    assert stats["samples_in"] == 43 and manifest["samples"] == stats["samples_out"] > 0
