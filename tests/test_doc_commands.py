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
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEMO = "~/.cache/mmcurate/demo"

# Run in this order (later ones use what earlier ones made), each checked by `check` below.
RUN = [
    '.venv/bin/python -c "from pathlib import Path; from pipeline.demo_data import '
    "make_demo_images; make_demo_images(Path('~/.cache/mmcurate/demo/images').expanduser())\"",
    ".venv/bin/mmcurate build configs/demo.yaml",
    ".venv/bin/mmcurate build configs/demo.yaml --overwrite",
    ".venv/bin/mmcurate build configs/demo.yaml --no-progress",
    ".venv/bin/mmcurate build configs/demo.yaml --set output.path=s3://bucket/run1 "
    "--set output.shard_max_samples=5000",
    f".venv/bin/mmcurate report {DEMO}/build",
    ".venv/bin/mmcurate train configs/train_clip.yaml --set run.max_steps=20",
    "make demo",
]

PRETRAINED = "downloads pretrained ViT-B-32 weights (laion2b_s34b_b79k); tests download nothing"
ELSEWHERE = {
    "make test": "what CI runs (.ci/run); from a test it would run the suite inside itself",
    ".venv/bin/mmcurate demo --out demo-output": "`make demo` runs this same command (demo-output"
    " is --out's default); run above",
    ".venv/bin/mmcurate build configs/laion_ingest.yaml --set source.path=laion-part-00000.parquet"
    " --set source.url_column=URL --set source.caption_column=TEXT": "downloads images from the"
    " internet; a loopback server is refused by the private-address guard the config keeps on"
    " (tests/test_ingest.py covers the ingest from a loopback server)",
    ".venv/bin/mmcurate build configs/laion_ingest.yaml --set source.path=laion-part-00000.parquet"
    " --set source.url_column=URL --set source.caption_column=TEXT --set output.path=laion-256": (
        "as the README's laion_ingest command"
    ),
    ".venv/bin/mmcurate build configs/laion_dedupe.yaml --set source.path='laion-256/*.tar'": (
        PRETRAINED
    ),
    ".venv/bin/mmcurate build configs/laion_dedupe.yaml --set source.path='laion-256/*.tar'"
    " --set output.path=laion-256-dedup": PRETRAINED,
    ".venv/bin/mmcurate build configs/video_frames.yaml --set source.path=my-videos": PRETRAINED,
    ".venv/bin/mmcurate build configs/video_frames.yaml --set source.path=my-videos"
    " --set output.path=video-clips": PRETRAINED,
    ".venv/bin/mmcurate train configs/train_clip.yaml --set data.manifest=laion-256-dedup/"
    "manifest.json --set model.name=ViT-B-32 --set run.output=runs/b32": "trains on the LAION"
    " recipe's output (which needs the internet) and ViT-B-32 for 100 steps: a GPU job",
    ".venv/bin/torchrun --nproc-per-node=8 -m trainer configs/train_clip.yaml --set data.manifest="
    "s3://bucket/laion-256-dedup/manifest.json --set model.name=ViT-B-32 --set data.cache_dir="
    "/nvme/mmcurate-cache --set data.cache_limit=500GB --set run.output=runs/b32 --set "
    "run.checkpoint_every=1000 --set run.precision=bf16": "8 GPUs; tests/test_loader.py runs"
    " torchrun with 2 CPU ranks",
    "source .venv/bin/activate": "part of the Ray cluster recipe below",
    "ray start --head --dashboard-host=127.0.0.1": "the Ray recipe: tests/test_ray_job.py starts a"
    " head with token auth and submits build and train jobs to it",
    "export RAY_AUTH_MODE=token": "the Ray recipe (tests/test_ray_job.py)",
    "ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m pipeline build "
    "configs/demo.yaml": "the Ray recipe (tests/test_ray_job.py submits it to its own head)",
    "ray stop": "stops every Ray process of the user by name, this test session's included",
    "export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...": "placeholders for your keys",
    "export GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json": "a placeholder for your key file",
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
    assert not set(RUN) & set(ELSEWHERE)
    assert documented - set(RUN) - set(ELSEWHERE) == set(), "documented but not listed here"
    assert (set(RUN) | set(ELSEWHERE)) - documented == set(), "listed here but not documented"


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
    """Where the commands run: the repository's .venv and configs linked in, Makefile and
    pyproject.toml copied and dated before .venv's install stamp (so `make` does not
    reinstall). Outputs (runs/, demo-output/) land here, not in the repository."""
    stamp = REPO / ".venv" / ".installed"
    if not stamp.exists():
        pytest.fail("run `make install` first: the documented commands use .venv")
    root = tmp_path / "checkout"
    root.mkdir()
    for name in (".venv", "configs"):
        (root / name).symlink_to(REPO / name)
    before = stamp.stat().st_mtime - 1
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
        os.utime(root / name, (before, before))
    return root


def test_documented_commands_run_as_written(user_env, s3, checkout):
    home = Path(user_env["HOME"])
    for command in RUN:
        result = subprocess.run(
            command,
            shell=True,
            cwd=checkout,
            env=user_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        output = (result.stdout + result.stderr)[-3000:]
        assert result.returncode == 0, f"{command}\n{output}"
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
    elif command == "make demo":
        assert (checkout / "demo-output/report.html").stat().st_size > 10_000
