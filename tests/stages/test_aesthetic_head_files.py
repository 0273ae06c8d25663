"""Aesthetic head files as users hand them in (issue 45): bf16 safetensors, a checkpoint
with `epoch` beside the tensors, one nested state dict, load and score as the plain head;
every other content, and a head that yields NaN or inf, fails the config check in one line
that never advises turning off torch's weights_only."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.registry import build_stage
from safetensors.torch import save_file

from tests.kit_aesthetic import TINY, random_head

SPEC = {"name": "aesthetic_score", **TINY}


def state(kind: str = "linear") -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in random_head(kind).state_dict().items()}


def torch_file(folder, name: str, content) -> str:
    torch.save(content, folder / name)
    return str(folder / name)


def bytes_file(folder, name: str, data: bytes) -> str:
    (folder / name).write_bytes(data)
    return str(folder / name)


def bf16_safetensors(folder) -> str:
    save_file({k: v.bfloat16() for k, v in state("mlp").items()}, folder / "bf16.safetensors")
    return str(folder / "bf16.safetensors")


ACCEPTED = {
    "bf16 safetensors": (bf16_safetensors, "mlp", 2e-2),
    "fp16 pth": (
        lambda d: torch_file(d, "h.pth", {k: v.half() for k, v in state().items()}),
        "linear",
        2e-2,
    ),
    "epoch beside": (lambda d: torch_file(d, "e.pth", {**state(), "epoch": 3}), "linear", 1e-4),
    "nested model": (lambda d: torch_file(d, "n.pth", {"model": state("mlp")}), "mlp", 1e-4),
    "checkpoint": (
        lambda d: torch_file(d, "c.pth", {"model": state(), "optimizer": {"lr": 1}, "epoch": 3}),
        "linear",
        1e-4,
    ),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_files_users_hand_in_load_as_the_plain_head(tmp_path, case):
    make, kind, tolerance = ACCEPTED[case]
    stage = build_stage({**SPEC, "weights": make(tmp_path)})
    stage.check()
    stage.setup()
    vectors = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with torch.no_grad():
        expected = random_head(kind)(torch.from_numpy(vectors)).squeeze(1).numpy()
    np.testing.assert_allclose(stage.head.score(vectors), expected, rtol=tolerance, atol=tolerance)


def nan_head(d):
    return torch_file(
        d, "nan.pth", {"weight": torch.full((1, 64), float("nan")), "bias": torch.zeros(1)}
    )


def inf_bias(d):
    return torch_file(
        d, "inf.pth", {"weight": torch.ones(1, 64), "bias": torch.tensor([float("inf")])}
    )


def overflowing(d):  # finite weights whose scores overflow float32
    return torch_file(d, "big.pth", {"weight": torch.full((1, 64), 3e38), "bias": torch.zeros(1)})


class NotTensors:
    pass


REFUSED = {
    "nan weights": (nan_head, "NaN or inf"),
    "inf bias": (inf_bias, "NaN or inf"),
    "overflow": (overflowing, "non-finite scores"),
    "random bytes": (
        lambda d: bytes_file(d, "r.pth", os.urandom(512)),
        "not a PyTorch weights file",
    ),
    "empty": (lambda d: bytes_file(d, "e.pth", b""), "not a PyTorch weights file"),
    "plain pickle": (
        lambda d: bytes_file(d, "p.pth", pickle.dumps({"weight": NotTensors()})),
        "not a PyTorch weights file",
    ),
    "whole module": (lambda d: torch_file(d, "m.pth", torch.nn.Linear(64, 1)), "state_dict()"),
    "a list": (lambda d: torch_file(d, "l.pth", [1, 2]), "not a state dict"),
    "a string weight": (
        lambda d: torch_file(d, "s.pth", {"weight": "abc", "bias": 1}),
        "not a tensor",
    ),
    "two nested": (
        lambda d: torch_file(d, "t.pth", {"a": state(), "b": state()}),
        "several nested dicts",
    ),
    "no tensors": (lambda d: torch_file(d, "z.pth", {"epoch": 3}), "no tensors"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_wrong_content_is_one_config_line(tmp_path, case):
    make, message = REFUSED[case]
    stage = build_stage({**SPEC, "weights": make(tmp_path)})
    with pytest.raises(ConfigError) as err:
        stage.check()
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("stages.0.weights: ")
    assert "weights_only" not in text
