"""The package layering (docs/architecture.md): core <- stages, trainer <- pipeline.

`core` holds the formats and shared foundations and imports none of the others; `stages` and
`trainer` import only `core` (and themselves); `pipeline` orchestrates and may import all. Also
the size limits the code keeps: files <= 400 lines, functions <= 50 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "stages", "trainer", "pipeline")
ALLOWED = {
    "core": {"core"},
    "stages": {"core", "stages"},
    "trainer": {"core", "trainer"},
    "pipeline": {"core", "stages", "trainer", "pipeline"},
}


def absolute_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in a module, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def imported_packages(path: Path) -> set[str]:
    """Top-level project packages a module imports (lazy imports inside functions included)."""
    names = [n.removeprefix("mmcurate.") for _, n in absolute_imports(path)]
    return {n.split(".")[0] for n in names if n.split(".")[0] in PACKAGES}


def bare_imports(path: Path) -> list[str]:
    """Imports of a part by its bare name (`from core.x import y`): installed, the parts exist
    only as `mmcurate.core` ..., and a second import path would load every module (and the
    stage registry) twice."""
    return [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for line, name in absolute_imports(path)
        if name.split(".")[0] in PACKAGES
    ]


# Code in strings too (scripts that tests and benches run with `python -c`), not in `quotes`.
BARE_TEXT = re.compile(r"(?<![`\w.])(?:from|import) (?:core|pipeline|stages|trainer)\.[a-z_]")


def test_every_import_of_a_part_goes_through_mmcurate():
    files = [
        p for folder in ("mmcurate", *PACKAGES, "tests", "bench") for p in python_files(folder)
    ]
    assert len(files) > 300
    assert [line for path in files for line in bare_imports(path)] == []
    in_text = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in files
        for match in BARE_TEXT.finditer(path.read_text())
    ]
    assert in_text == []


def python_files(package: str) -> list[Path]:
    """The project's own files: not those of a hidden folder (bench/.venv-*, a tool's venv)."""
    found = (ROOT / package).rglob("*.py")
    return sorted(p for p in found if not any(x[0] == "." for x in p.relative_to(ROOT).parts))


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_their_layer(package):
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) - ALLOWED[package])
        for path in python_files(package)
    }
    assert {k: v for k, v in wrong.items() if v} == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_size_limits(package):
    too_long = []
    for path in python_files(package):
        text = path.read_text()
        if text.count("\n") > 400:
            too_long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 50:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.name}: {length} lines")
    assert too_long == []


def test_no_stage_imports_another_stage():
    """What two stages share lives in stages/lib (or stages/base), never in one of them: a
    stage used as a library by another is changed for one and breaks the other."""
    stages = {p.stem for p in (ROOT / "stages").glob("*.py")} - {"__init__", "base", "registry"}
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / "stages").glob("*.py"))
        for line, name in absolute_imports(path)
        if name.removeprefix("mmcurate.").startswith("stages.")
        and name.removeprefix("mmcurate.stages.").split(".")[0] in stages
        and name.rsplit(".", 1)[-1] != path.stem
    ]
    assert wrong == []


# An import of a test module, in code or in a script's text: `from tests.<area>.test_x import`,
# `import tests.<area>.test_x`, `from tests.<area> import test_x`.
TEST_MODULE_IMPORT = re.compile(
    r"(?<![`\w.])(?:(?:from|import) tests\.(?:\w+\.)*test_\w*"
    r"|from tests(?:\.\w+)* import \(?\s*test_)"
)


def test_no_file_imports_a_test_module():
    """What test files share lives in the kit (tests/conftest.py, tests/kit_*.py, ...), which
    bench imports too: pytest loads a test file by its bare name, so an import as tests.<area>.
    loads it a second time, and a change to one test file breaks others that never ran it."""
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for folder in ("tests", "bench")
        for path in python_files(folder)
        for match in TEST_MODULE_IMPORT.finditer(path.read_text())
    ]
    assert found == []
