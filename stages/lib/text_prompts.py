"""Zero-shot concept scores from CLIP embeddings clip_score already computed: for a concept
with prompts (the concept) and `against` prompts (its absence), the probability of the
concept is the softmax over image-prompt cosines x 100 (CLIP's logit scale), summed over
the concept's prompts. LAION's punsafe and pwatermark are scores of this kind (theirs come
from small classifiers on the same embeddings); here they are columns `concept_<name>`.
"""

from __future__ import annotations

import numpy as np
from mmcurate.core.config_io import Strict
from pydantic import Field, model_validator

LOGIT_SCALE = 100.0

PRESETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "watermark": (
        (
            "a photo with a watermark",
            "an image with a watermark logo over it",
            "a stock photo covered by watermark text",
        ),
        ("a photo", "a clean photo", "an image without any text"),
    ),
    "nsfw": (
        ("an explicit nude photo", "a pornographic image", "sexual content, nsfw"),
        ("a safe for work photo", "a photo of everyday life", "a family friendly image"),
    ),
    "text": (
        ("an image with a lot of text", "a screenshot of a document", "a page of printed text"),
        ("a photo of a scene", "a photo of an object", "a natural photo without text"),
    ),
}


class ConceptOptions(Strict):
    """One concept: prompt sets (a built-in set when its name is a preset), drop thresholds."""

    prompts: tuple[str, ...] | None = Field(None, description="the concept; None: preset")
    against: tuple[str, ...] | None = Field(None, description="its absence; None: preset")
    max: float | None = Field(None, ge=0, le=1, description="drop above: concept_<name>")
    min: float | None = Field(None, ge=0, le=1, description="drop below: concept_<name>")

    @model_validator(mode="after")
    def _sets(self) -> ConceptOptions:
        for field in ("prompts", "against"):
            value = getattr(self, field)
            if value is not None and not value:
                raise ValueError(f"{field}: give at least one prompt")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}: nothing would pass")
        return self


def prompt_sets(name: str, concept: ConceptOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The concept's prompts and against-prompts, presets filling what the config leaves out;
    ValueError when neither says."""
    preset = PRESETS.get(name)
    prompts = concept.prompts or (preset[0] if preset else None)
    against = concept.against or (preset[1] if preset else None)
    if not prompts or not against:
        raise ValueError(
            f"concept {name!r} has no built-in prompts ({', '.join(PRESETS)}): "
            "give `prompts` and `against`"
        )
    return prompts, against


def concept_probability(images: np.ndarray, prompts: np.ndarray, n_positive: int) -> np.ndarray:
    """[N, D] normalized images, [P, D] normalized prompt embeddings (the concept's first)
    -> [N] probability of the concept."""
    logits = LOGIT_SCALE * images.astype(np.float32) @ prompts.astype(np.float32).T
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights[:, :n_positive].sum(axis=1) / weights.sum(axis=1)
