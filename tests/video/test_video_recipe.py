"""docs/recipes.md's video training loop runs as printed against a small real build."""

import re
from pathlib import Path

import torch

import mmcurate
from tests.kit_video import clip_build

RECIPES = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"


def video_recipe() -> str:
    """The python block of the "Video windows for your own training loop" section."""
    text = RECIPES.read_text()
    section = text[text.index("## Video windows for your own training loop") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_docs_video_loop_trains_and_checkpoints_a_resumable_loader(tmp_path, monkeypatch):
    clips = [(12 + i, (64, 48) if i % 2 else (48, 64)) for i in range(6)]
    clip_build(tmp_path, clips, shard_max_samples=3, out="video-clips")
    code = video_recipe()
    assert '"video-clips/manifest.json"' in code and "loader.step % 100 == 0" in code
    # As printed but for the checkpoint's period (the small build has a few batches a run).
    code = code.replace("loader.step % 100 == 0", "loader.step % 2 == 0")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, str(RECIPES), "exec"), scope)  # noqa: S102 - the recipe's own code
    loader = scope["loader"]
    assert loader.step == 2 * len(loader) and loader.step >= 4
    state = torch.load(tmp_path / "ckpt.pt")["loader"]
    assert state["step"] % 2 == 0 and state["step"] >= 2
    again = mmcurate.video_loader(
        "video-clips/manifest.json",
        4,
        16,
        workers=0,
        schedule=[{"step": 0, "size": "256x144", "frames": 8}, {"step": 1000, "frames": 16}],
    )
    again.load_state_dict(state)  # the same plan: the restart the recipe's comment describes
    assert again.step == state["step"]
