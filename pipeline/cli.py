"""`mmcurate build | train | eval | probe | report | demo | remove | retry | append | sweep`
(also `python -m mmcurate ...`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from mmcurate.core.config_io import (
    ConfigError,
    add_overrides,
    add_storage_options,
    parse_storage_options,
)
from mmcurate.core.spill import SpillError

if TYPE_CHECKING:
    from mmcurate.pipeline.config import BuildConfig

TRAINER_COMMANDS = ("train", "eval", "probe")  # parsed by their own modules, not here
# Commands on a finished build and the sweep: each module's `main(argv) -> int` parses its own
# arguments, as the trainer's commands do.
OWN_PARSER_COMMANDS = {
    "remove": ("mmcurate.pipeline.maintain.remove", "take samples out of a finished build"),
    "retry": ("mmcurate.pipeline.maintain.retry", "fetch again what failed for transient reasons"),
    "append": ("mmcurate.pipeline.maintain.append", "add new input to a finished build"),
    "sweep": ("mmcurate.pipeline.sweep.run", "choose filters and mixtures by proxy training"),
}
PASS_THROUGH = (*TRAINER_COMMANDS, *OWN_PARSER_COMMANDS)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="mmcurate", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a dataset from a YAML config")
    build.add_argument("config")
    add_overrides(build)
    build.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous mmcurate build at output.path (only the files it wrote)",
    )
    build.add_argument(
        "--allow-other-files",
        action="store_true",
        help="write into an output.path that holds other files (never deleted or overwritten)",
    )
    build.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    # train, eval, probe: listed here for `mmcurate --help`; main() hands their arguments to
    # their own parsers unparsed.
    train = sub.add_parser("train", help="train a CLIP model on built shards")
    train.add_argument("args", nargs=argparse.REMAINDER)
    evaluate = sub.add_parser("eval", help="evaluate a CLIP model: retrieval and zero-shot")
    evaluate.add_argument("args", nargs=argparse.REMAINDER)
    probe = sub.add_parser("probe", help="batch sizes, memory, loader speed: how many GPUs")
    probe.add_argument("args", nargs=argparse.REMAINDER)
    report = sub.add_parser("report", help="render <output>/report.html again")
    report.add_argument("output", help="a build's output folder (any fsspec URL)")
    add_storage_options(report)
    for name, (_, text) in OWN_PARSER_COMMANDS.items():
        sub.add_parser(name, help=text).add_argument("args", nargs=argparse.REMAINDER)
    demo = sub.add_parser("demo", help="the embedded end-to-end demo (no network, no GPU)")
    demo.add_argument("--out", default="demo-output", help="folder for everything it makes")
    demo.add_argument("--samples", type=int, default=500)
    demo.add_argument("--steps", type=int, default=40, help="training steps")
    return top


def trainer_command(name: str, argv: list[str]) -> int:
    """`mmcurate train|eval|probe ARGS`: ARGS go unchanged to that command's own parser, so
    it is exactly `python -m mmcurate.trainer ...` (help, option order, `--export A B` included)."""
    if name == "train":
        from mmcurate.trainer.cli import main as train_main

        return train_main(argv)
    if name == "eval":
        from mmcurate.trainer.eval.evaluate import main as eval_main

        return eval_main(argv)
    from mmcurate.trainer.probe.run import main as probe_main

    return probe_main(argv)


def own_parser_command(name: str, argv: list[str]) -> int:
    """`mmcurate remove|retry|append|sweep ARGS`: the module's own `main(ARGS)`."""
    import importlib

    module = importlib.import_module(OWN_PARSER_COMMANDS[name][0])
    return module.main(argv)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = None if words[:1] and words[0] in PASS_THROUGH else parser().parse_args(argv)
    # Our own progress lines at INFO; libraries (open_clip logs to the root logger) at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for name in ("mmcurate", "trainer"):
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        if args is None and words[0] in OWN_PARSER_COMMANDS:
            return own_parser_command(words[0], words[1:])
        if args is None:
            return trainer_command(words[0], words[1:])
        if args.command == "build":
            return build_command(args, exit_when_done=argv is None)
        if args.command == "report":
            return report_command(args.output, args.storage_options)
        from mmcurate.pipeline.demo import run_demo

        return run_demo(args.out, samples=args.samples, steps=args.steps)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SpillError as err:  # the machine's disk, not the input: one line, then rerun
        print(f"error: {getattr(err, 'cause', err)}", file=sys.stderr)
        return 1


def report_command(output: str, storage_options: str) -> int:
    """`mmcurate report OUTPUT`: report.html rendered again; a folder without a build or
    bad `--storage-options` is a one-line ConfigError."""
    from mmcurate.core.redaction import redact_text
    from mmcurate.pipeline.report.page import render_report

    options = parse_storage_options(storage_options)
    try:
        print(render_report(output, options))
    except FileNotFoundError as err:
        missing = redact_text(str(err.filename or err))
        raise ConfigError(f"{redact_text(output)}: no build here ({missing} not found)") from None
    return 0


def build_command(args: argparse.Namespace, exit_when_done: bool = False) -> int:
    """`mmcurate build`. `exit_when_done` (the command's own process): once the manifest is
    committed and the summary printed, a build on the local runtime exits at once, without
    the interpreter's teardown (nothing is left to lose; docs/benchmarks/fixed_cost.md)."""
    from mmcurate.core.redaction import redact_text
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import load_build_config
    from mmcurate.pipeline.runtime.session import prestart

    if exit_when_done:
        from mmcurate.core.pandas_probe import skip_pandas_probe

        skip_pandas_probe()
    overrides = list(args.overrides) + (["output.overwrite=true"] if args.overwrite else [])
    overrides += ["output.allow_other_files=true"] if args.allow_other_files else []
    cfg = load_build_config(args.config, overrides)
    runtime = prestart(cfg)  # the runtime starts while the build plans
    local = runtime.kind == "local"
    try:
        manifest = run_build(cfg, progress=not args.no_progress, runtime=runtime)
    finally:
        runtime.close()
    print_summary(cfg)
    print(
        json.dumps(
            {
                "output": redact_text(cfg.output.path),
                "samples": manifest["samples"],
                "shards": len(manifest["shards"]),
            }
        )
    )
    if exit_when_done and local:
        sys.stdout.flush()
        sys.stderr.flush()
        remove_multiprocessing_temp()
        os._exit(0)
    return 0


def remove_multiprocessing_temp() -> None:
    """multiprocessing's own temp folder (/tmp/pymp-*: the media index's socket, the
    forkserver's), which its exit handler removes, and `os._exit` skips."""
    import multiprocessing
    import shutil

    folder = multiprocessing.current_process()._config.get("tempdir")
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def print_summary(cfg: BuildConfig) -> None:
    """The stage table and phase times at the end of a build (stats.json, read back)."""
    from mmcurate.core.redaction import redact_text
    from mmcurate.core.storage import filesystem, join
    from mmcurate.pipeline.output.stats import stage_table

    fs, root = filesystem(cfg.output.path, cfg.storage_options)
    stats = json.loads(fs.cat_file(join(root, "stats.json")))
    phases = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in stats["phases"].items())
    report = redact_text(join(cfg.output.path, "report.html"))
    print(f"{stage_table(stats)}\n  phases: {phases}\n  report: {report}")


if __name__ == "__main__":
    sys.exit(main())
