"""configs/cluster.yaml (docs/scale.md): valid for `ray up` by Ray's own cluster-config schema,
and every resource the cluster build config asks for exists in some node type."""

import json
from pathlib import Path

import jsonschema
import ray
import yaml
from mmcurate.pipeline.config import load_build_config
from mmcurate.stages.registry import build_stages

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "configs" / "cluster.yaml"
BUILD = REPO / "configs" / "laion_cluster.yaml"


def node_resources() -> dict[str, dict[str, float]]:
    nodes = yaml.safe_load(CLUSTER.read_text())["available_node_types"]
    return {name: node.get("resources", {}) for name, node in nodes.items()}


def requested_resources(config_path: Path) -> set[str]:
    """What a build of this config asks Ray for: a CPU per partition task; a GPU per actor of a
    model stage with `num_gpus` > 0; any custom `resources` a stage or `ray` names."""
    cfg = load_build_config(config_path)
    wanted = {"CPU"}
    for stage in build_stages(cfg.stages):
        options = stage.options
        if getattr(options, "num_gpus", None):
            wanted.add("GPU")
        wanted |= set(getattr(options, "resources", None) or {})
    wanted |= set(getattr(cfg.ray, "resources", None) or {})
    return wanted


def test_cluster_yaml_is_valid_for_ray_up():
    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    schema = json.loads(schema_path.read_text())
    config = yaml.safe_load(CLUSTER.read_text())
    jsonschema.validate(config, schema)  # raises on the first violation
    assert config["head_node_type"] in config["available_node_types"]


def test_every_resource_the_build_asks_for_exists_in_a_node_type():
    wanted = requested_resources(BUILD)
    assert {"CPU", "GPU"} <= wanted  # partition tasks and clip_score's GPU actors
    nodes = node_resources()
    for resource in wanted:
        holders = [name for name, res in nodes.items() if res.get(resource, 0) > 0]
        assert holders, f"no node type of configs/cluster.yaml has {resource}"
    build = load_build_config(BUILD)
    gpus = max(getattr(s.options, "num_gpus", 0) or 0 for s in build_stages(build.stages))
    assert gpus <= max(res.get("GPU", 0) for res in nodes.values())  # one actor fits a node
    assert nodes["head"].get("CPU") == 0  # the driver's node runs no partition task
