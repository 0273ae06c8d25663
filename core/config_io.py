"""YAML loading with `--set a.b=c` overrides, and one-line config errors.

Shared by `mmcurate build` and `mmcurate train`: both read a YAML file, apply overrides, and
validate the result with a pydantic model whose fields forbid unknown keys.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """The base of every config model (build, train, eval, stage options): unknown keys are
    errors and values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A configuration problem, reported to the user as one line."""


RAY_BUILTIN_RESOURCES = {"cpu", "gpu", "memory", "object_store_memory"}


def checked_resources(resources: dict[str, float]) -> dict[str, float]:
    """Custom Ray resources as Ray accepts them: named (CPU and GPU have their own options),
    each amount at least 0.0001 (Ray's resolution)."""
    for name, amount in resources.items():
        if name.lower() in RAY_BUILTIN_RESOURCES:
            raise ValueError(f"{name!r} is not a custom resource (use num_cpus / num_gpus)")
        if not amount >= 1e-4:
            raise ValueError(f"{name}: needs an amount of at least 0.0001, not {amount}")
    return resources


def add_overrides(parser: argparse.ArgumentParser, example: str = "") -> None:
    """The `--set KEY.PATH=VALUE` option every mmcurate command takes (repeatable)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value (repeatable)" + (f", e.g. --set {example}" * bool(example)),
    )


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """Split `a.b.0.c=value` into a key path and a YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    dotted, raw = text.split("=", 1)
    if not dotted or any(part == "" for part in dotted.split(".")):
        raise ConfigError(f"--set {text!r}: empty key")
    path: list[str | int] = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw  # not YAML: keep the literal string
    return path, value


def apply_override(tree: dict, path: list[str | int], value: Any) -> None:
    """Set `value` at `path` inside nested dicts/lists, creating dicts as needed."""
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        where = ".".join(str(p) for p in path[: i + 1])
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise ConfigError(f"--set {where}: no such list item")
            node = node[part]
        else:
            node = node.setdefault(str(part), {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {where}: is a value, not a section")
    last = path[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last >= len(node):
            raise ConfigError(f"--set {'.'.join(map(str, path))}: no such list item")
        node[last] = value
    else:
        node[str(last)] = value


def load_yaml(path: str | Path, overrides: list[str] | None = None) -> dict:
    """Read a YAML mapping from `path` and apply `--set` overrides in order."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    for text in overrides or []:
        apply_override(tree, *parse_override(text))
    return tree


def one_line(err: Exception) -> str:
    """An error's message on one line (what the commands print after `error:`)."""
    return " ".join(str(err).split())


def describe_validation_error(err: ValidationError, prefix: str = "") -> str:
    """The first pydantic error as `key.path: message` on one line."""
    first = err.errors()[0]
    inner = first.get("ctx", {}).get("error")
    if isinstance(inner, ConfigError):  # raised by a nested validator, already one line
        return str(inner)
    where = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "") or "config"
    if first["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    if first["type"] == "missing":
        return f"{where}: required key is missing"
    return f"{where}: {first['msg'].removeprefix('Value error, ')}"


def validate(model: type[M], tree: dict) -> M:
    """Validate `tree` as `model`, raising ConfigError with one line on failure."""
    try:
        return model.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None
