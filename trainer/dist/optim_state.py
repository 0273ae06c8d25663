"""An optimizer's state in the two forms a checkpoint file holds it: by position (torch's own
`optimizer.state_dict()`, its parameters numbered 0, 1, ... across the param groups: what
strategy ddp and optim.zero write) and by parameter name (the FQNs that
torch.distributed.checkpoint's get/set_optimizer_state_dict use: what a sharded model loads).

A resume converts what was saved to the form its own optimizer loads, so a checkpoint
written by any strategy on any number of ranks resumes under any other (the parameters of a
group matched by their order, which param_groups in trainer/step.py fixes for a model name).
"""

from __future__ import annotations

from typing import Any

import torch
from mmcurate.core.config_io import ConfigError


def parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """Each param group's parameter names (FQNs of the unwrapped `model`), in the optimizer's
    order. ZeroRedundancyOptimizer's param_groups hold every rank's parameters."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def saved_groups(saved: dict[str, Any], names: list[list[str]]) -> list[dict[str, Any]]:
    """The saved param groups, checked against this optimizer's: the same number of groups
    and of parameters in each (else another model or other frozen parts wrote them)."""
    groups = saved.get("param_groups", [])
    sizes = [len(group["params"]) for group in groups]
    if sizes != [len(group) for group in names]:
        raise ConfigError(
            "run.resume: the checkpoint's optimizer holds param groups of "
            f"{sizes} parameters, this model's {[len(g) for g in names]} (another model.name "
            "or other frozen parts wrote it)"
        )
    return groups


def by_name(saved: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    """`saved` (either form) keyed by parameter name, as set_optimizer_state_dict loads it."""
    groups, state = [], {}
    for group, fqns in zip(saved_groups(saved, names), names, strict=True):
        for key, fqn in zip(group["params"], fqns, strict=True):
            if key in saved["state"]:
                state[fqn] = saved["state"][key]
        groups.append(group | {"params": list(fqns)})
    return {"state": state, "param_groups": groups}


def by_position(saved: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    """`saved` (either form) keyed by position, as optimizer.load_state_dict loads it."""
    groups, state, index = [], {}, 0
    for group in saved_groups(saved, names):
        ids = list(range(index, index + len(group["params"])))
        for key, position in zip(group["params"], ids, strict=True):
            if key in saved["state"]:
                state[position] = saved["state"][key]
        groups.append(group | {"params": ids})
        index += len(ids)
    return {"state": state, "param_groups": groups}
