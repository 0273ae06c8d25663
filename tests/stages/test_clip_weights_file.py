"""`pretrained:` as a local file: an mmcurate checkpoint loads its weights, a .safetensors file
of open_clip weights loads through open_clip, and a pickle that would run code as it loads is
never run (it is not read with torch's `weights_only=False`)."""

from __future__ import annotations

import pytest
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.lib.clip_model import load_open_clip, local_weights


class RunsCode:
    """Unpickling this would create `path` (what an attacker's file would do instead)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def tiny_state() -> dict:
    model, _, _ = load_open_clip("mmcurate-tiny", None, "cpu")
    return {name: value.clone() for name, value in model.state_dict().items()}


def test_a_pickle_that_runs_code_is_not_run(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"format": "x", "payload": RunsCode(str(marker))}, path)
    assert local_weights(str(path)) is None
    assert not marker.exists()
    with pytest.raises(ConfigError):  # open_clip refuses it too, in one line
        load_open_clip("mmcurate-tiny", str(path), "cpu")
    assert not marker.exists()


def test_safetensors_weights_load(tmp_path):
    from safetensors.torch import save_file

    state = {name: value + 1 for name, value in tiny_state().items()}
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    assert local_weights(str(path)) is None  # not ours: open_clip reads it
    model, _, _ = load_open_clip("mmcurate-tiny", str(path), "cpu")
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
