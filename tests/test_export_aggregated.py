"""An aggregated deployment (replicas serving prefill and decode together) exports in every format."""

from __future__ import annotations

import yaml

from tuner.deployment import Deployment
from tuner.export import FORMATS, RecipeContext, export_deployment
from tuner.topology import Role, Topology

CTX = RecipeContext(model_path="/models/m", model_name="m", gpu="gb300", gpus_per_host=4, isl=8192, osl=1024,
                    concurrency=(16, 64))


def test_aggregated_replicas_export_without_kv_transfer() -> None:
    deployment = Deployment.single(Topology.parse("TP4", mtp=1, role=Role.BOTH), count=2)
    assert deployment.name == "2x(TP4 MTP1)" and not deployment.is_disaggregated
    texts = {fmt: export_deployment(deployment, fmt, CTX) for fmt in FORMATS}
    for fmt, text in texts.items():
        assert "kv_producer" not in text and "kv_consumer" not in text, fmt
    assert texts["vllm"].count("--tensor-parallel-size 4") == 2  # one command per replica
    compose = yaml.safe_load(texts["compose"])
    assert sum(1 for s in compose["services"].values() if s["labels"]["topotune.role"] == "both") == 2
    recipe = yaml.safe_load(texts["srt-slurm"].split("\n", 1)[1])
    assert recipe["resources"]["prefill_workers"] == 0 and recipe["resources"]["decode_workers"] == 2
    assert recipe["backend"]["vllm_config"]["decode"]["speculative-config"]["num_speculative_tokens"] == 1
