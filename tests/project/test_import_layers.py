"""The module graph of core/, stages/, trainer/ and pipeline/: no import cycles, no upward imports.

Every import counts, at any depth: lazy imports inside functions and `TYPE_CHECKING` blocks
too, since a cycle hidden behind a lazy import is still two modules that cannot be understood
(or moved) apart. The layers (docs/architecture.md):

    core  <-  stages, trainer  <-  pipeline

`core` imports none of the others; `stages` imports only `core`; `trainer` imports only
`core` (it does not import `stages` today, and must not: the loader and the training loop stay
free of the build's stages); `pipeline` may import all.
tests/project/test_architecture.py checks the same rule per package; this test names the module
that breaks it, and finds cycles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "stages", "trainer", "pipeline")
ALLOWED = {
    "core": {"core"},
    "stages": {"core", "stages"},
    "trainer": {"core", "trainer"},
    "pipeline": {"core", "stages", "trainer", "pipeline"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` is, or the nearest package above it that is one."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names one import statement loads; `from a import b` gives `a.b` (a module, or
    a name in `a`, which resolve() turns back into `a`)."""
    if isinstance(node, ast.Import):
        return [alias.name.removeprefix("mmcurate.") for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = (node.module or "").removeprefix("mmcurate.")
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (itself aside)."""
    modules = project_modules()
    graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in imported_names(node, module, is_package):
                target = resolve(name, modules)
                if target and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit); components of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a readable path."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    return component


def test_no_import_cycles():
    graph = import_graph()
    cycles = [" -> ".join(one_cycle(graph, c)) for c in strongly_connected(graph)]
    assert cycles == [], "module import cycles:\n" + "\n".join(cycles)


def test_no_upward_imports():
    upward = [
        f"{module} imports {target}"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if target.split(".")[0] not in ALLOWED[module.split(".")[0]]
    ]
    assert upward == [], "imports that reach up a layer:\n" + "\n".join(upward)


# What each sub-package may import besides itself (its docstring says the same): the parts of
# a layer stay layered too. pipeline's root (build, phases, cli, demo) and trainer.probe, the
# commands over everything, are not listed.
SUBPACKAGE_ALLOWED = {
    "pipeline.runtime": {"core", "stages", "pipeline.config"},
    "pipeline.sources": {"core", "stages", "pipeline.config"},
    "pipeline.output": {
        "core",
        "stages",
        "pipeline.config",
        "pipeline.sources",
        "pipeline.runtime",
    },
    "pipeline.decide": {"core", "stages", "pipeline.config", "pipeline.output", "pipeline.runtime"},
    "pipeline.report": {"core", "stages", "pipeline.output"},
    "trainer.data": {"core", "trainer.run_log"},
    "trainer.dist": {"core"},
    "trainer.eval": {
        *("core", "trainer.config", "trainer.units", "trainer.models", "trainer.precision"),
        *("trainer.data", "trainer.dist"),
    },
    "trainer.health": {
        *("core", "trainer.config", "trainer.step", "trainer.loop_state", "trainer.resume"),
        "trainer.checkpoint",
        *("trainer.data", "trainer.dist"),
    },
}


def part_of(module: str) -> str:
    """`pipeline.output.shards` -> `pipeline.output`; `pipeline.build` stays; `core.x` -> core."""
    parts = module.split(".")
    if parts[0] in ("core", "stages"):
        return parts[0]
    return ".".join(parts[:2])


def test_sub_packages_import_only_what_their_docstring_allows():
    wrong = [
        f"{module} imports {target}"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if part_of(module) in SUBPACKAGE_ALLOWED
        and part_of(target) != part_of(module)
        and part_of(target) not in SUBPACKAGE_ALLOWED[part_of(module)]
    ]
    assert wrong == [], "imports a sub-package does not allow:\n" + "\n".join(wrong)


def test_every_sub_package_says_what_it_owns_and_may_import():
    for package in SUBPACKAGE_ALLOWED:
        doc = ast.get_docstring(
            ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
        )
        assert doc and "May import" in doc, package


def test_the_checker_finds_cycles_and_relative_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    tree = ast.parse("from . import layout\nfrom ..core import storage\n")
    first, second = tree.body
    assert imported_names(first, "pipeline.output.shards", False) == ["pipeline.output.layout"]
    assert imported_names(second, "pipeline.output.shards", False) == ["pipeline.core.storage"]
    layout = "pipeline.output.layout"
    assert resolve(f"{layout}.ShardPlanner", project_modules()) == layout
