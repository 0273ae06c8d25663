"""The batch-size ladder of `mmcurate probe`: training steps of the configured model and
precision on synthetic batches (compute and memory do not depend on the pixels) of growing
size, each rung's peak memory and step time, until one runs out of memory.

On CUDA the rungs run in this process: the peak is torch.cuda.max_memory_allocated, a rung
that raises torch.cuda.OutOfMemoryError ends the ladder and the memory is freed; with
`probe.max_memory` the process may use only that much of the device
(torch.cuda.set_per_process_memory_fraction). On the CPU they run in a child process (spawned),
so that even the kernel's out-of-memory kill ends only the child: the peak is the child's peak
resident set (VmHWM, reset before each rung through /proc/self/clear_refs) less what it held
once the model was built (Python, torch and the weights: `baseline_bytes`), and
`probe.max_memory` caps the child's address space (RLIMIT_AS) at its size then plus the cap:
an allocation past the cap really fails (torch raises, or the child dies), and the parent
records the rung as `oom`. (Address space grows at least as fast as resident memory, so the
cap bites at or a little before that much resident growth.)
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import resource
import time
import traceback
from typing import Any

import torch
from mmcurate.trainer.config import ProbeConfig, TrainConfig
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.step import Learner, build_learner, guarded_step

log = logging.getLogger("mmcurate.trainer.probe.run")
CAPTION = "a photo of a cat sitting on a wooden table next to a cup of coffee"


def image_size(learner: Learner) -> tuple[int, int]:
    size = getattr(learner.core.visual, "image_size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)


class RungError(RuntimeError):
    """A rung whose synthetic batch could not even be made (too large for torch's sizes or
    for memory): recorded like a rung out of memory, ending the ladder."""


def synthetic_batch(learner: Learner, tokenizer: Any, batch_size: int) -> Batch:
    """Normalized random images and one tokenized caption repeated, on the device; RungError
    when torch cannot make them."""
    height, width = image_size(learner)
    try:
        images = torch.randn(batch_size, 3, height, width, device=learner.device)
        tokens = tokenizer([CAPTION]).to(learner.device).repeat(batch_size, 1)
    # Why these: sizes past int64 are a TypeError, storage overflow a RuntimeError.
    except (RuntimeError, MemoryError, TypeError, ValueError, OverflowError) as err:
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        raise RungError(f"no batch of {batch_size}: {type(err).__name__}: {first}") from None
    return Batch(images, tokens, [str(i) for i in range(batch_size)])


def proc_status(field: str) -> int:
    """A /proc/self/status memory field (VmHWM, VmRSS, VmSize) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)


def peak_memory(device: torch.device, baseline: int) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return proc_status("VmHWM") - baseline


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError | MemoryError | RungError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("memory" in text or "alloc" in text)


def rung(
    learner: Learner, tokenizer: Any, batch_size: int, steps: int, baseline: int = 0
) -> dict[str, Any]:
    """One warm-up step and `steps` timed ones at `batch_size`: the peak memory over all of
    them (the optimizer's state included) and the mean step time."""
    reset_peak(learner.device)
    batch = synthetic_batch(learner, tokenizer, batch_size)
    guarded_step(learner, [batch])
    sync(learner.device)
    start = time.perf_counter()
    for _ in range(steps):
        guarded_step(learner, [batch])
    sync(learner.device)
    step_s = (time.perf_counter() - start) / steps
    return {
        "batch_size": batch_size,
        "status": "ok",
        "peak_memory_bytes": peak_memory(learner.device, baseline),
        "step_s": step_s,
        "samples_per_s": batch_size / step_s,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(learner: Learner) -> None:
    learner.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if learner.device.type == "cuda":
        torch.cuda.empty_cache()


def climb(
    learner: Learner, tokenizer: Any, probe: ProbeConfig, report: Any, baseline: int = 0
) -> None:
    """Run the rungs in order, `report(result)` each; the first out-of-memory one ends it."""
    for size in probe.batch_sizes:
        try:
            report(rung(learner, tokenizer, size, probe.steps, baseline))
        except (RuntimeError, MemoryError) as err:
            if not is_out_of_memory(err):
                raise
            message = str(err).splitlines()[0][:200]
            free(learner)
            report({"batch_size": size, "status": "oom", "error": message})
            return


def ladder_here(cfg: TrainConfig, device: torch.device) -> list[dict[str, Any]]:
    """The ladder in this process (CUDA)."""
    learner, (_, tokenizer) = build_learner(cfg, Dist(device=device), 1000)
    cap = cfg.probe.max_memory_bytes
    if cap and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0), device)
    results: list[dict[str, Any]] = []
    climb(learner, tokenizer, cfg.probe, results.append)
    del learner
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return results


def child_main(tree: dict[str, Any], threads: int, conn: Any) -> None:
    """The ladder in a spawned child (CPU): each rung's result sent as it comes."""
    try:
        torch.set_num_threads(threads)
        cfg = TrainConfig.model_validate(tree)
        learner, (_, tokenizer) = build_learner(cfg, Dist(), 1000)
        guarded_step(learner, [synthetic_batch(learner, tokenizer, 2)])  # thread pools up
        cap = cfg.probe.max_memory_bytes
        baseline = proc_status("VmRSS")
        if cap:
            limit = proc_status("VmSize") + cap
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        conn.send({"baseline_bytes": baseline})
        climb(learner, tokenizer, cfg.probe, conn.send, baseline)
        conn.send({"done": True})
    except Exception as err:  # reported to the parent, which survives it
        last = traceback.format_exception_only(err)[-1].strip()
        conn.send({"failed": last[:500], "traceback": traceback.format_exc(limit=3)[-2000:]})
    finally:
        conn.close()


def ladder_in_child(cfg: TrainConfig) -> tuple[list[dict[str, Any]], int | None]:
    """The ladder in a spawned child process (CPU); (rungs, the child's resident memory
    once the model was built). A child that dies mid-rung (killed for memory) makes that
    rung `oom`."""
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe(duplex=False)
    child = context.Process(
        target=child_main, args=(cfg.model_dump(), torch.get_num_threads(), there), daemon=True
    )
    child.start()
    there.close()
    results: list[dict[str, Any]] = []
    baseline, finished = None, False
    while True:
        try:
            message = here.recv()
        except EOFError:
            break
        if "failed" in message:
            log.debug("probe: the ladder's process failed:\n%s", message.get("traceback"))
            raise RuntimeError(f"probe: the ladder failed: {message['failed']}")
        finished = finished or "done" in message
        baseline = message.get("baseline_bytes", baseline)
        if "batch_size" in message:
            results.append(message)
    child.join()
    if baseline is None:
        raise RuntimeError(
            f"probe: the ladder's process ended before it began (exit code {child.exitcode})"
        )
    left = [s for s in cfg.probe.batch_sizes if s not in {r["batch_size"] for r in results}]
    if not finished and left and not any(r["status"] == "oom" for r in results):
        error = f"the rung's process died (exit code {child.exitcode}): out of memory"
        results.append({"batch_size": left[0], "status": "oom", "error": error})
    return results, baseline
