"""aesthetic_score: the LAION aesthetic predictor (a head over the CLIP image embedding).

The head (stages/lib/aesthetic_head.py: v1 linear or v2 MLP, folded into one linear map) comes
from a local .pth or .safetensors file; nothing is downloaded. The embedding is L2-normalised
first. When a `clip_score` with the same `model` and `pretrained` runs before this stage, its
`embedding` column is reused (no second pass through the model: the head is a dot product);
otherwise the stage encodes the images itself with the same model code as clip_score, in the
task on CPU or on the build's actor pool (`num_gpus`, `concurrency`). A video's embedding is
the normalised mean of its frames'. Writes `aesthetic_score` (also into `<key>.json`, with
`aesthetic_model`); `min_score` drops per sample, `keep_top_fraction` keeps exactly
ceil(f x N) of the N scored samples, by score, ties to the smaller key (a global decision).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from mmcurate.core.config_io import ConfigError
from mmcurate.core.formats import with_fields
from mmcurate.stages.base import Columns, ModelOptions, ModelStage, Stage, register
from mmcurate.stages.lib.aesthetic_head import AestheticHead, load_head
from mmcurate.stages.lib.picture_batches import (
    mean_per_sample,
    picture_batches,
    picture_bytes,
    prepared,
)
from mmcurate.stages.lib.top_fraction import KeepsTopFraction
from pydantic import Field

TOP_REASON = "below_aesthetic_top_fraction"


class AestheticScoreOptions(ModelOptions):
    weights: str = Field(description="local .pth or .safetensors of a LAION aesthetic head")
    model: str = "ViT-L-14"
    pretrained: str | None = "openai"
    min_score: float | None = Field(None, description="drop below (LAION: 4.5, 5, 6, 6.25, 6.5)")
    keep_top_fraction: float | None = Field(None, gt=0, le=1)
    batch_size: int = Field(64, ge=1)
    reuse_embeddings: bool = Field(
        True, description="use an earlier clip_score's embeddings of the same model"
    )


@register
class AestheticScore(KeepsTopFraction, ModelStage):
    name = "aesthetic_score"
    Options = AestheticScoreOptions
    produces = frozenset({"aesthetic_score"})
    is_global = True  # keep_top_fraction; also keeps it after a clip_score listed before it
    shared = False  # set by registry.build_stages: an earlier clip_score embeds with our model
    top_column, top_reason = "aesthetic_score", TOP_REASON

    def share_embeddings(self, earlier: list[Stage]) -> None:
        """Reuse the `embedding` of an earlier stage with this model; then no pool is needed."""
        opts: AestheticScoreOptions = self.options
        self.shared = opts.reuse_embeddings and any(
            "embedding" in s.produces
            and (getattr(s.options, "model", None), getattr(s.options, "pretrained", None))
            == (opts.model, opts.pretrained)
            for s in earlier
        )
        self.uses_model_pool = not self.shared

    def models(self) -> list[dict[str, str]]:
        opts = self.options
        head = self.model_record("LAION aesthetic head", "mmcurate", os.path.basename(opts.weights))
        if self.shared:  # the embeddings are an earlier clip_score's, which lists its model
            return [head]
        return [self.model_record(opts.model, "open_clip_torch", str(opts.pretrained)), head]

    def check(self) -> None:
        where = f"stages.{self.index}"
        try:
            head = load_head(self.options.weights)
        except ValueError as err:
            raise ConfigError(f"{where}.weights: {err}") from None
        dim = embedding_dim(self.options.model)
        if dim is not None and dim != head.dim:
            raise ConfigError(
                f"{where}.weights: the head reads {head.dim}-dim embeddings, "
                f"{self.options.model} makes {dim}-dim ones"
            )
        if not self.shared:  # a shared model is checked by the stage that runs it
            from mmcurate.stages.lib.clip_model import check_model

            check_model(self.options.model, self.options.pretrained, where)

    def setup(self) -> None:
        self.head: AestheticHead = load_head(self.options.weights)
        opts = self.options
        self.model_name = f"{os.path.basename(opts.weights)} on {opts.model}/{opts.pretrained}"

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        reasons: list[str | None] = [None] * size
        vectors: dict[int, np.ndarray] = {}
        given = batch.get("embedding") if self.shared else None
        for i in range(size):
            if given is not None and given[i] is not None:
                vectors[i] = np.asarray(given[i], np.float32)
        todo = [i for i in range(size) if i not in vectors]
        vectors |= self.embed(batch, todo, reasons)
        column = batch.setdefault("aesthetic_score", [None] * size)
        metas = list(batch.get("json") or [None] * size)
        rows = sorted(vectors)
        scores = self.head.score(np.stack([vectors[i] for i in rows])) if rows else []
        low = self.options.min_score
        for i, value in zip(rows, scores, strict=True):
            column[i] = round(float(value), 6)
            fields = {"aesthetic_score": column[i], "aesthetic_model": self.model_name}
            metas[i] = with_fields(metas[i], fields)
            if low is not None and column[i] < low:
                reasons[i] = "low_aesthetic_score"
        batch["json"] = metas
        return batch, reasons

    def embed(self, batch: Columns, rows: list[int], reasons: list) -> dict[int, np.ndarray]:
        """Normalised image embeddings of `rows` through the model (reasons set for those
        that have no usable picture)."""
        media: dict[int, list[bytes]] = {}
        for i in rows:
            pictures = picture_bytes(batch, i)
            if isinstance(pictures, str):
                reasons[i] = pictures
            else:
                media[i] = pictures
        if not media:
            return {}
        encoder = self.encoder or self.local_model()
        good = prepared(encoder, media, reasons)
        found: dict[int, np.ndarray] = {}
        for chunk in picture_batches(good, self.options.batch_size):
            image, _ = encoder.encode(np.stack([p for _, frames in chunk for p in frames]), None)
            image = mean_per_sample(image, [len(frames) for _, frames in chunk])
            found |= {i: vector for (i, _), vector in zip(chunk, image, strict=True)}
        return found

    def local_model(self) -> Any:
        from mmcurate.stages.lib.clip_model import cached_model

        opts = self.options
        return cached_model(opts.model, opts.pretrained, opts.device, opts.precision)


def embedding_dim(model: str) -> int | None:
    """The image embedding size of an open_clip model by name (None where its config is not
    known without loading it: hf-hub and local folders)."""
    import open_clip
    from mmcurate.core.model_configs import register as register_configs

    register_configs()
    config = open_clip.get_model_config(model)
    return None if config is None else config.get("embed_dim")
