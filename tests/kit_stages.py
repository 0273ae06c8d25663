"""Stage test inputs: JPEG bytes, image-caption batches, a decoded image, labelled captions."""

import io
from pathlib import Path

from mmcurate.pipeline.sources.samples import empty_batch
from PIL import Image

DATA = Path(__file__).parent / "data" / "captions_multilingual.tsv"


def jpeg(size=(300, 200), color=(200, 30, 30), mode="RGB", fmt="JPEG", **save) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, color).save(out, fmt, **save)
    return out.getvalue()


def batch_of(images: list[bytes | None], captions: list[str | None] | None = None) -> dict:
    batch = empty_batch()
    for i, data in enumerate(images):
        batch["__key__"].append(f"k{i:03d}")
        for col in batch:
            if col != "__key__":
                batch[col].append(None)
        batch["jpg"][-1] = data
        batch["txt"][-1] = captions[i] if captions else "a caption here"
    return batch


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def labelled() -> list[tuple[str, str]]:
    """(language, caption) rows of the labelled set."""
    rows = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            _, language, caption = line.split("\t")
            rows.append((language, caption))
    return rows
