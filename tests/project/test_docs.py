"""Every option of every config model (build, each stage, train) is named in docs/."""

from pathlib import Path

from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.registry import all_stages
from mmcurate.trainer.config import TrainConfig
from pydantic import BaseModel

DOCS = Path(__file__).resolve().parents[2] / "docs"


def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of a model's settable fields, nested models expanded."""
    names = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names += leaves(kind, f"{prefix}{name}.")
        else:
            names.append(prefix + name)
    return names


def test_every_build_and_train_option_has_a_row():
    text = (DOCS / "configuration.md").read_text()
    missing = [n for n in leaves(BuildConfig) + leaves(TrainConfig) if f"| `{n}` |" not in text]
    assert not missing, missing


def test_every_stage_option_is_in_its_stage_row():
    rows = {
        line.split("`")[1]: line
        for line in (DOCS / "configuration.md").read_text().splitlines()
        if line.startswith("| `")
    }
    missing = []
    for name, stage in sorted(all_stages().items()):
        row = rows.get(name, "")
        for option in leaves(stage.Options):
            if f"`{option}`" not in row:
                missing.append(f"{name}.{option}")
    assert not missing, missing
