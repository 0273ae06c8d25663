"""YAML loading with `--set a.b=c` overrides, and one-line config errors.

Shared by `mmcurate build` and `mmcurate train`: both read a YAML file, apply overrides, and
validate the result with a pydantic model whose fields forbid unknown keys.
"""

from __future__ import annotations

import argparse
import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)
ASCII_INDEX = re.compile(r"[0-9]+\Z")  # a list position in a `--set` key path


class Strict(BaseModel):
    """The base of every config model (build, train, eval, stage options): unknown keys are
    errors and values are frozen."""

    # No NaN or infinity: `min_score: .nan` would silently turn a filter off, `lr: .inf`
    # would train NaNs; no option here needs either.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ConfigError(ValueError):
    """A configuration problem, reported to the user as one line."""


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, but a key given twice in one mapping is an error (SafeLoader keeps
    the last one silently, so half of a config could be ignored)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()  # mapping nodes whose keys were checked

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Checked before merge keys (`<<: *base`) are flattened in: an explicit key may
        # override a merged one. Every mapping passes here before it is constructed.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: set[Any] = set()
            merges = 0
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    merges += 1
                    if merges > 1:  # PyYAML would keep the first and drop the rest
                        line = key_node.start_mark.line + 1
                        raise ConfigError(
                            f"key '<<' appears twice (line {line}); merge several as <<: [*a, *b]"
                        )
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # unhashable: SafeConstructor reports it
                    continue
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise ConfigError(f"key {key!r} appears twice (line {line})")
                seen.add(key)
        super().flatten_mapping(node)


def parse_yaml(text: str) -> Any:
    """`text` as YAML (StrictLoader). Raises ConfigError for a repeated key, yaml.YAMLError
    or ValueError when it does not parse (a date such as 2001-02-30 is a ValueError)."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: builds plain data only
    except RecursionError:
        raise ConfigError("nested too deeply") from None


def check_acyclic(tree: Any, root: str = "") -> None:
    """ConfigError naming the key (under `root`) of a list or mapping that contains itself
    (`&a {x: *a}`): such a tree makes every later walk over it loop or crash."""
    done: set[int] = set()  # shared anchors are walked once (no exponential blow-up)
    stack: list[tuple[Any, str, bool]] = [(tree, root, False)]
    open_ids: set[int] = set()  # containers on the current path from the root
    while stack:
        node, where, leaving = stack.pop()
        if leaving:
            open_ids.discard(id(node))
            done.add(id(node))
            continue
        if not isinstance(node, dict | list) or id(node) in done:
            continue
        if id(node) in open_ids:
            raise ConfigError(f"{where or 'top level'}: refers to itself (a YAML anchor cycle)")
        open_ids.add(id(node))
        stack.append((node, where, True))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            stack.append((child, f"{where}.{key}" if where else str(key), False))


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


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are one ConfigError line (the command prints `error: ...` and
    exits 2, as for a bad config) instead of a usage block; --help still prints and exits 0."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message} (see {self.prog} --help)")


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """`--storage-options JSON`: fsspec options for a command that reads a build's folder."""
    parser.add_argument(
        "--storage-options", default="{}", help="fsspec options as JSON (default: environment)"
    )


def parse_storage_options(text: str) -> dict[str, Any]:
    """`--storage-options` parsed: a JSON object, else a one-line ConfigError."""
    import json

    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--storage-options: not JSON: {err.msg} (char {err.pos})") from None
    if not isinstance(options, dict):
        raise ConfigError('--storage-options: expected a JSON object such as {"anon": true}')
    return options


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
    # ASCII digits only: str.isdigit() is also true for '²', which int() refuses.
    path: list[str | int] = [int(p) if ASCII_INDEX.match(p) else p for p in dotted.split(".")]
    try:
        value = parse_yaml(raw) if raw != "" else ""
    except ConfigError as err:  # a repeated key
        raise ConfigError(f"--set {dotted}: {err}") from None
    except (yaml.YAMLError, ValueError):
        value = raw  # not YAML: keep the literal string
    check_acyclic(value, f"--set {dotted}")
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


def read_config_text(path: str | Path) -> str:
    """The text of the config file `path`; ConfigError with one line when it cannot be read."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file")
    if not file.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None


def load_yaml(path: str | Path | Mapping[str, Any], overrides: list[str] | None = None) -> dict:
    """Read a YAML mapping from `path` (or take a config tree already in memory: a copy,
    so overrides never change the caller's) and apply `--set` overrides in order."""
    if isinstance(path, Mapping):
        tree, path = copy.deepcopy(dict(path)), "config"
        check_acyclic(tree)
    else:
        tree = read_yaml_tree(path)
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    for text in overrides or []:
        apply_override(tree, *parse_override(text))
    return tree


def read_yaml_tree(path: str | Path) -> Any:
    text = read_config_text(path)
    try:
        tree = parse_yaml(text) or {}
        check_acyclic(tree)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    except (yaml.YAMLError, ValueError) as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
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
