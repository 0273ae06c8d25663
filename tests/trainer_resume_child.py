"""Checkpoints of every strategy resumed under every strategy, for
tests/trainer/test_trainer_resume_matrix.py. Run as `python tests/trainer_resume_child.py STEPS OUT
MANIFEST` on one process (no process group) or under torchrun on several ranks; STEPS is
`write`, `read` or `write,read`.

write: for each strategy (ddp, ddp with optim.zero, fsdp) two training steps, then the
checkpoint as `mmcurate train` saves it, into OUT/<strategy>-w<world>/, beside each rank's
Adam `exp_avg` per parameter (whole tensors: the reference a resume must restore).
read: every checkpoint under OUT resumed with each strategy through the trainer's own
previous_checkpoint + restore_state; the weights and Adam state compared with what was saved,
then one more step. One JSON row per (writer, reader) in OUT/results-w<world>-rank<r>.jsonl.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.checkpoint import load_checkpoint
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.dist.fsdp import is_zero, weights_and_optimizer
from mmcurate.trainer.dist.world import Dist, barrier, leave, setup_distributed
from mmcurate.trainer.loop_state import LoopState
from mmcurate.trainer.resume import (
    previous_checkpoint,
    restore_state,
    save_shards,
    save_state,
)
from mmcurate.trainer.step import Learner, build_learner, guarded_step
from torch.distributed.tensor import DTensor

STRATEGIES = {"ddp": ("ddp", False), "zero": ("ddp", True), "fsdp": ("fsdp", False)}
SAMPLES = 80  # the manifest's (the loader layout a checkpoint records)


def config(manifest: str, output: Path, name: str, resume: bool = False) -> TrainConfig:
    strategy, zero = STRATEGIES[name]
    return TrainConfig.model_validate(
        {
            "data": {"manifest": manifest, "batch_size": 4, "workers": 0},
            "optim": {"lr": 1e-3, "warmup_steps": 1, "zero": zero},
            "strategy": strategy,
            "run": {"output": str(output), "max_steps": 10, "resume": resume},
        }
    )


def step(learner: Learner, tokenizer, place: Dist, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed * 10 + place.rank)
    images = torch.rand(4, 3, 64, 64, generator=generator)
    tokens = tokenizer([f"a photo of thing {i}" for i in range(4)])
    guarded_step(learner, [Batch(images, tokens, [f"k{i}" for i in range(4)])])


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered (a collective call: every rank makes it, in the same order)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()


def moments(learner: Learner) -> dict[str, torch.Tensor]:
    """{name: exp_avg} of the parameters whose Adam state this rank holds."""
    state = learner.optimizer.optim.state if is_zero(learner.optimizer) else learner.optimizer.state
    return {
        name: whole(state[p]["exp_avg"]).clone()
        for name, p in learner.core.named_parameters()
        if p in state
    }


def write(out: Path, manifest: str, place: Dist) -> None:
    for name in STRATEGIES:
        folder = out / f"{name}-w{place.world}"
        cfg = config(manifest, folder, name)
        torch.manual_seed(0)
        learner, (_, tokenizer) = build_learner(cfg, place, 10)
        for seed in (1, 2):
            step(learner, tokenizer, place, seed)
        held = moments(learner)
        gathered = weights_and_optimizer(learner)
        shards = save_shards(learner, cfg, 2)
        if place.rank == 0:
            state = LoopState(step=2, batches_in_epoch=2, samples_seen=8 * place.world)
            save_state(learner, state, cfg, place.world, SAMPLES, None, gathered, shards)
        folder.mkdir(parents=True, exist_ok=True)  # rank 0 may not have made it yet
        torch.save(held, folder / f"moments-rank{place.rank}.pt")
        barrier(place)


def check(learner: Learner, folder: Path) -> str | None:
    """What differs between `learner` and the checkpoint written into `folder`, or None."""
    saved = load_checkpoint(str(folder / "checkpoints" / "step-2.pt"))["model"]
    for name, p in learner.core.named_parameters():
        if not torch.equal(whole(p), saved[name]):
            return f"weight {name} differs"
    reference = {}
    for path in folder.glob("moments-rank*.pt"):
        reference |= torch.load(path, weights_only=True)
    decay = [group["weight_decay"] for group in learner.optimizer.param_groups]
    if decay != [0.0, 0.1]:  # step.param_groups' settings, restored with the state
        return f"weight decay {decay}"
    held = moments(learner)
    if not held:
        return "no Adam state restored"
    for name, value in held.items():
        if not torch.allclose(value, reference[name], atol=1e-7):
            return f"exp_avg of {name} differs"
    return None


def read(out: Path, manifest: str, place: Dist) -> None:
    rows = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        for name in STRATEGIES:
            cfg = config(manifest, folder, name, resume=True)
            torch.manual_seed(7)  # other initial weights: the resume must replace them
            learner, (_, tokenizer) = build_learner(cfg, place, 10)
            row = {"writer": folder.name, "reader": f"{name}-w{place.world}", "rank": place.rank}
            try:
                path = previous_checkpoint(cfg, str(folder), place)
                state = restore_state(learner, path, cfg, place.world, SAMPLES)
            except ConfigError as err:
                rows.append(row | {"refused": str(err)})
                continue
            problem = check(learner, folder) or (None if state.step == 2 else f"step {state.step}")
            step(learner, tokenizer, place, 3)  # and it trains on
            rows.append(row | {"problem": problem, "ok": problem is None})
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (out / f"results-w{place.world}-rank{place.rank}.jsonl").write_text(lines)


def main() -> None:
    steps, out, manifest = sys.argv[1].split(","), Path(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    place = setup_distributed()
    if "write" in steps:
        write(out, manifest, place)
    if "read" in steps:
        read(out, manifest, place)
    leave(place)


if __name__ == "__main__":
    main()
