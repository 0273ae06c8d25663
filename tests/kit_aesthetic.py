"""aesthetic_score test pieces: LAION-style heads with seeded random weights, saved as files."""

import torch
from safetensors.torch import save_file

TINY = {"model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}


class MLP(torch.nn.Module):
    """LAION improved-aesthetic-predictor's MLP, as published (input 64 for the tiny CLIP)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(dim, 1024),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(1024, 128),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(128, 64),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(64, 16),
            torch.nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def random_head(kind: str) -> torch.nn.Module:
    torch.manual_seed(7)
    head = MLP(64) if kind == "mlp" else torch.nn.Linear(64, 1)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(4.0)  # scores spread over a few units, as trained heads' do
    return head.eval()


def save_head(head: torch.nn.Module, folder, suffix: str) -> str:
    path = str(folder / f"head{suffix}")
    state = {k: v.contiguous() for k, v in head.state_dict().items()}
    if suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save(state, path)
    return path
