"""`BuildRun`: one run of a build as its phases see it, passed down instead of long argument
tuples and module state."""

from __future__ import annotations

from dataclasses import dataclass

from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.claim import Claim
from mmcurate.pipeline.runtime.session import Runtime
from mmcurate.stages.base import Stage


@dataclass(frozen=True)
class BuildRun:
    """The config, its stages, the claim on output.path, the runtime the tasks run on (the
    local pool or Ray: pipeline/runtime/session.py) and whether progress bars show."""

    cfg: BuildConfig
    stages: list[Stage]
    claim: Claim
    runtime: Runtime
    progress: bool = False
