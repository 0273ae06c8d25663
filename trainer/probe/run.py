"""`mmcurate probe CONFIG.yaml [--set ...] [--out FILE.json]` (also `python -m
mmcurate.trainer.probe`): which batch size fits, and how many GPUs and CPU cores a target needs.

For the train config's model, precision and data it measures
1. the batch-size ladder (trainer/probe/ladder.py): peak memory and step time per rung, until
   a rung runs out of memory (which the probe survives);
2. the loader: samples/s of one core (in this process, one decode thread, CPU time) and of
   the configured `data.workers` (per worker);
3. the data-wait share of `probe.loop_steps` real training steps at the configured
   `data.batch_size` and `data.workers` (the trainer's stall meter);
then prints a table and the recommendation (trainer/probe/sizing.py, docs/sizing.md), and writes
everything as JSON with `--out` (`recommendation` holds the advice).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

import torch
from mmcurate.core.config_io import ConfigError, add_overrides, one_line
from mmcurate.core.manifest import ManifestError
from mmcurate.trainer.config import ProbeConfig, TrainConfig, load_train_config
from mmcurate.trainer.data.dataset import make_loader
from mmcurate.trainer.data.prefetch import DevicePrefetcher, timed
from mmcurate.trainer.dist.world import Dist
from mmcurate.trainer.probe.ladder import ladder_here, ladder_in_child
from mmcurate.trainer.probe.sizing import recommend
from mmcurate.trainer.run_log import Meter
from mmcurate.trainer.step import build_learner, guarded_step
from mmcurate.trainer.train_data import make_dataset, make_training_loader, read_sources

log = logging.getLogger("mmcurate.trainer.probe.run")  # also when run as __main__
GIB = 2**30


def loader_rate(cfg: TrainConfig, preprocess: Any, tokenizer: Any, workers: int) -> dict:
    """Samples/s of the loader alone over `probe.loader_batches` batches after the first
    (workers starting up); `workers` 0: in this process with one decode thread, also per
    CPU-second."""
    place = Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if workers == 0:
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"decode_threads": 1})})
    dataset = make_dataset(cfg, read_sources(cfg), place, preprocess, tokenizer)
    dataset.set_epoch(0, None)  # endless: a small set repeats
    batches = iter(make_loader(dataset, workers, hold=2 if workers else None))
    try:
        next(batches)
        wall, cpu = time.perf_counter(), time.process_time()
        samples = sum(len(next(batches).keys) for _ in range(cfg.probe.loader_batches))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        getattr(batches, "close", lambda: None)()
    return {"samples": samples, "wall_s": wall, "cpu_s": cpu, "samples_per_s": samples / wall}


def measure_loader(cfg: TrainConfig, preprocess: Any, tokenizer: Any) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core
    try:
        one = loader_rate(cfg, preprocess, tokenizer, 0)
    finally:
        torch.set_num_threads(threads)
    workers = cfg.data.workers
    many = loader_rate(cfg, preprocess, tokenizer, workers) if workers else one
    return {
        "batch_size": cfg.data.batch_size,
        "samples_per_s_per_core": one["samples"] / max(one["cpu_s"], 1e-9),
        "samples_per_s_one_process": one["samples_per_s"],
        "workers": workers,
        "samples_per_s": many["samples_per_s"],
        "samples_per_s_per_worker": many["samples_per_s"] / max(workers, 1),
    }


def measure_wait(cfg: TrainConfig, device: torch.device) -> dict[str, Any]:
    """The share of step time spent waiting for data, over `probe.loop_steps` real steps at
    the configured batch size and workers (the first step, the workers' start, not counted)."""
    place = Dist(device=device)
    learner, (preprocess, tokenizer) = build_learner(cfg, place, 1000)
    dataset = make_dataset(cfg, read_sources(cfg), place, preprocess, tokenizer)
    dataset.set_epoch(0, None)
    loader = iter(make_training_loader(cfg, dataset, place))  # the loader training uses
    meter, steps = Meter(), 0
    try:
        batches = timed(iter(DevicePrefetcher(loader, device, dataset.transform)), meter)
        guarded_step(learner, [next(batches)])
        meter.wait_s, tick = 0.0, time.perf_counter()
        for batch in batches:
            guarded_step(learner, [batch])
            steps += 1
            if steps == cfg.probe.loop_steps:
                break
        meter.total_s = time.perf_counter() - tick
    finally:
        getattr(loader, "close", lambda: None)()
    return {
        "batch_size": cfg.data.batch_size,
        "workers": cfg.data.workers,
        "steps": steps,
        "data_wait_frac": min(meter.wait_s / meter.total_s, 1.0) if meter.total_s else 0.0,
        "samples_per_s": steps * cfg.data.batch_size / meter.total_s if meter.total_s else 0.0,
    }


def device_facts(probe: ProbeConfig, device: torch.device) -> dict[str, Any]:
    """The device, its memory (the capacity the recommendation fits into) and this
    machine's CPU cores per device."""
    cap = probe.max_memory_bytes
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, total, count = props.name, props.total_memory, torch.cuda.device_count()
    else:  # what is free for training: the ladder's peaks are beyond its child's baseline
        name, total, count = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), 1
    cores = len(os.sched_getaffinity(0))
    return {
        "device": str(device),
        "name": name,
        "memory_bytes": total,
        "max_memory_bytes": cap,
        "capacity_bytes": min(cap, total) if cap else total,
        "devices": count,
        "cpu_cores": cores,
        "cpu_cores_per_device": cores / count,
    }


def probe(cfg: TrainConfig) -> dict[str, Any]:
    """Everything `mmcurate probe` measures and recommends, as one JSON-able dict."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    facts = device_facts(cfg.probe, device)
    log.info("probe: batch-size ladder on %s", facts["name"])
    if device.type == "cuda":
        ladder, baseline = ladder_here(cfg, device), None
    else:
        ladder, baseline = ladder_in_child(cfg)
    facts["baseline_bytes"] = baseline  # CPU: the child's resident memory with the model
    log.info("probe: loader rates")
    _, (preprocess, tokenizer) = build_learner(cfg, Dist(), 1000)  # on the CPU: transforms only
    loader = measure_loader(cfg, preprocess, tokenizer)
    log.info("probe: data-wait share of %d real steps", cfg.probe.loop_steps)
    wait = measure_wait(cfg, device)
    advice = recommend(
        ladder, loader, facts["capacity_bytes"], cfg.probe, facts["cpu_cores_per_device"]
    )
    return {
        "model": cfg.model.name,
        "precision": cfg.run.precision if device.type == "cuda" else "fp32",
        "machine": facts,
        "ladder": ladder,
        "loader": loader,
        "data_wait": wait,
        "recommendation": advice,
    }


def table(report: dict[str, Any]) -> str:
    """The human summary: the ladder, the loader, the recommendation."""
    facts, loader, wait = report["machine"], report["loader"], report["data_wait"]
    lines = [
        f"probe: {report['model']} ({report['precision']}) on {facts['name']}",
        f"{'batch':>7} {'status':>6} {'peak GiB':>9} {'step s':>8} {'samples/s':>10}",
    ]
    for r in report["ladder"]:
        if r["status"] == "ok":
            peak = r["peak_memory_bytes"] / GIB
            row = f"{peak:9.2f} {r['step_s']:8.3f} {r['samples_per_s']:10.1f}"
        else:
            row = f"  {r['error'][:60]}"
        lines.append(f"{r['batch_size']:>7} {r['status']:>6} {row}")
    lines += [
        f"loader: {loader['samples_per_s_per_core']:.1f} samples/s per core, "
        f"{loader['samples_per_s_per_worker']:.1f} per worker ({loader['workers']} workers: "
        f"{loader['samples_per_s']:.1f})",
        f"data wait: {wait['data_wait_frac']:.0%} of {wait['steps']} steps at batch "
        f"{wait['batch_size']} with {wait['workers']} workers",
    ]
    advice = report["recommendation"]
    if advice.get("batch_size_per_gpu") is None:
        return "\n".join([*lines, f"recommendation: none ({advice['reason']})"])
    here = advice["this_machine"]
    lines += [
        f"recommendation: {advice['gpus']} GPU(s) x batch {advice['batch_size_per_gpu']} "
        f"(global {advice['global_batch']}; at most {advice['max_batch_size_per_gpu']} fits), "
        f"{advice['workers_per_gpu']} loader workers and {advice['cpu_cores_per_gpu']} CPU cores "
        f"per GPU, ~{advice['expected_samples_per_s']:.0f} samples/s",
        f"  this machine: {here['cpu_cores_per_device']:g} cores per device feed "
        f"~{here['loader_samples_per_s_per_device']:.0f} samples/s: expected data wait "
        f"{here['expected_data_wait_frac']:.0%}",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mmcurate probe", description="Measure batch sizes, memory and loader speed."
    )
    parser.add_argument("config", help="train config YAML (model, precision, data)")
    add_overrides(parser)
    parser.add_argument("--out", help="write the measurements and recommendation as JSON")
    parser.add_argument("--target-global-batch", type=int, help="probe.target_global_batch")
    parser.add_argument("--target-samples-per-s", type=float, help="probe.target_samples_per_s")
    parser.add_argument("--max-memory", help="probe.max_memory, e.g. 2GiB")
    return parser.parse_args(argv)


def overrides(args: argparse.Namespace) -> list[str]:
    extra = list(args.overrides)
    for flag in ("target_global_batch", "target_samples_per_s", "max_memory"):
        if getattr(args, flag) is not None:
            extra.append(f"probe.{flag}={getattr(args, flag)}")
    return extra


def main(argv: list[str] | None = None) -> int:
    """0 on success; 2 on a bad config, an unreadable manifest or an unwritable --out; 1 when
    probing fails (one line on stderr)."""
    try:
        args = parse_args(argv)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 2
    # Our progress lines at INFO; libraries (open_clip logs to the root logger) at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("mmcurate.trainer").setLevel(logging.INFO)
    from mmcurate.trainer.eval.evaluate import check_out, write_out

    try:
        cfg = load_train_config(args.config, overrides(args))
        if args.out is not None:
            check_out(args.out, cfg.storage_options)  # before probing, not after it
        read_sources(cfg)  # fail fast on the data
        report = probe(cfg)
    except (ConfigError, ManifestError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # the ladder's process failed, a device error: one line
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 1
    print(table(report))
    if args.out is not None and not write_out(args.out, report, cfg.storage_options):
        return 2
    return 0
