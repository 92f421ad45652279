"""#46: `export --format kubernetes` and `--format dynamo` validate against the real schemas: Kubernetes' own types
with kubernetes-validate (Kubernetes' JSON schemas), the LeaderWorkerSet and DynamoGraphDeployment against the
openAPIV3Schema of their upstream CRDs (tuner/export/schemas/README.md names the commits). No cluster here: the
manifests are schema-validated, not applied."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tuner.backends.vllm import default_envs_dir
from tuner.deployment import Deployment, parse_deployment
from tuner.export import FORMATS, RecipeContext, dynamo_object, export_deployment, kubernetes_objects
from tuner.operating_point import RouterChoice

SCHEMAS = Path(__file__).resolve().parents[1] / "tuner" / "export" / "schemas"
K8S_VERSION = "1.33"
CRDS = {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_v1.json",
        ("nvidia.com/v1alpha1", "DynamoGraphDeployment"): "nvidia.com_v1alpha1_dynamographdeployment.json"}
CTX = RecipeContext(model_path="/srv/models/qwen3", model_name="qwen3", gpu="gb300", gpus_per_host=4, isl=8192,
                    osl=1024, vllm_version="0.32.0",
                    router=RouterChoice(policy="cache_aware", reason="the trace re-sends prefixes"))
DEPLOYMENTS = {
    "pd, TP over two hosts": "1P:TP4DP2+EP,1D:TEP8",  # prefill DP over hosts, decode TP over two hosts: LWS
    "aggregated replicas on one host each": "2x:TP4",
    "pd on one host each": "2P:TP2,1D:TP4",
}


def _validate(obj: dict) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        schema = json.loads((SCHEMAS / CRDS[key]).read_text())
        errors = list(jsonschema.Draft7Validator(schema).iter_errors(obj))
        assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("text", DEPLOYMENTS.values(), ids=DEPLOYMENTS.keys())
def test_kubernetes_manifests_validate(text: str) -> None:
    deployment = parse_deployment(text)
    objects = kubernetes_objects(deployment, CTX)
    for obj in objects:
        _validate(obj)
    kinds = [o["kind"] for o in objects]
    multi_host = [g for g in deployment.groups if g.topology.num_gpus > CTX.gpus_per_host]
    assert kinds.count("LeaderWorkerSet") == len(multi_host)
    assert kinds.count("Deployment") == len(deployment.groups) - len(multi_host) + 1  # + the router
    router = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    script = router["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "--policy cache_aware" in script and "--service-discovery" in script and "vllm-router==0.1.17" in script
    for obj in objects:
        for pod in _pods(obj):
            container = pod["spec"]["containers"][0]
            assert container["image"] == "vllm/vllm-openai:v0.32.0"
            assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
            assert {"name": "model", "hostPath": {"path": "${MODEL_DIR}", "type": "Directory"}} in \
                pod["spec"]["volumes"]
    # the text is the same objects, loadable
    docs = [d for d in yaml.safe_load_all(export_deployment(deployment, "kubernetes", CTX)) if d]
    assert docs == objects


def _pods(obj: dict) -> list[dict]:
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"], lwt["workerTemplate"]]
    if obj["kind"] == "Deployment" and not obj["metadata"]["name"].endswith("-router"):
        return [obj["spec"]["template"]]
    return []


def test_a_multi_host_instance_is_one_leader_worker_set_pointing_at_its_leader() -> None:
    deployment = parse_deployment("1P:TP4DP2+EP,1D:TEP8")
    lws = {o["metadata"]["name"]: o for o in kubernetes_objects(deployment, CTX) if o["kind"] == "LeaderWorkerSet"}
    decode = next(o for name, o in lws.items() if name.endswith("-decode"))["spec"]["leaderWorkerTemplate"]
    assert decode["size"] == 2
    leader = decode["leaderTemplate"]["spec"]["containers"][0]["args"]
    worker = decode["workerTemplate"]["spec"]["containers"][0]["args"]
    assert leader[leader.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert worker[worker.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)" and "--headless" in worker
    assert "--port" in leader and "--port" not in worker
    prefill = next(o for name, o in lws.items() if name.endswith("-prefill"))["spec"]["leaderWorkerTemplate"]
    container = prefill["workerTemplate"]["spec"]["containers"][0]
    shell = [*container["command"], *container["args"]]
    assert shell[:2] == ["sh", "-c"] and "--data-parallel-start-rank $$((LWS_WORKER_INDEX * 1))" in shell[2]
    env = {e["name"]: e for e in decode["leaderTemplate"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["UCX_CUDA_IPC_ENABLE_MNNVL"]["value"] == "y"  # the plan's NIXL/UCX settings on GB300


def test_the_schemas_catch_mistakes() -> None:
    deployment = parse_deployment("1P:TP4DP2+EP,1D:TEP8")
    objects = kubernetes_objects(deployment, CTX)
    lws = copy.deepcopy(next(o for o in objects if o["kind"] == "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    with pytest.raises(AssertionError, match="size"):
        _validate(lws)
    service = copy.deepcopy(next(o for o in objects if o["kind"] == "Service"))
    service["spec"]["ports"][0]["prot"] = 8000
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(service)
    dgd = dynamo_object(deployment, CTX)
    dgd["spec"]["backendFramework"] = "vllm-openai"
    with pytest.raises(AssertionError, match="backendFramework"):
        _validate(dgd)


@pytest.mark.parametrize("text", DEPLOYMENTS.values(), ids=DEPLOYMENTS.keys())
def test_dynamo_graph_validates(text: str) -> None:
    deployment: Deployment = parse_deployment(text)
    obj = dynamo_object(deployment, CTX)
    _validate(obj)
    services = obj["spec"]["services"]
    assert services["Frontend"]["envs"] == [{"name": "DYN_ROUTER_MODE", "value": "kv"}]
    workers = {k: v for k, v in services.items() if k != "Frontend"}
    assert len(workers) == len(deployment.groups)
    for name, service in workers.items():
        args = service["extraPodSpec"]["mainContainer"]["args"]
        assert ("--is-prefill-worker" in args) == (name == "VllmPrefillWorker")
        assert "--kv-transfer-config" not in args and "--max-num-seqs" in args  # dynamo.vllm sets the connector
    yaml.safe_load(export_deployment(deployment, "dynamo", CTX))


def test_every_format_exports(tmp_path: Path) -> None:
    deployment = parse_deployment("1P:TP4,1D:TP4")
    for fmt in FORMATS:
        assert export_deployment(deployment, fmt, CTX)


ROUTER_PYTHON = default_envs_dir() / "router" / "bin" / "python"


@pytest.mark.skipif(not ROUTER_PYTHON.exists(), reason="the vllm-router venv is missing: `topotune setup-cpu-vllm`")
@pytest.mark.parametrize("text", ["1P:TP4DP2+EP,1D:TEP8", "2x:TP4"])
def test_vllm_routers_own_parser_reads_the_router_command(text: str) -> None:
    """The router container's command, parsed by vllm-router 0.1.17's parse_router_args (not by us)."""
    objects = kubernetes_objects(parse_deployment(text), CTX)
    router = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    argv = shlex.split(router["spec"]["template"]["spec"]["containers"][0]["command"][-1].split(" && exec ", 1)[1])
    code = ("import json, sys; from vllm_router.launch_router import parse_router_args; "
            "a = parse_router_args(sys.argv[1:]); print(json.dumps({'policy': a.policy, 'sd': a.service_discovery, "
            "'sel': a.selector, 'p': a.prefill_selector, 'd': a.decode_selector, 'pd': a.vllm_pd_disaggregation, "
            "'port': a.service_discovery_port}))")
    done = subprocess.run([str(ROUTER_PYTHON), "-c", code, *argv[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed["policy"] == "cache_aware" and parsed["sd"] and parsed["port"] == 8000
    role_selectors = [parsed["p"], parsed["d"]] if parsed["pd"] else [parsed["sel"]]
    for selector in role_selectors:
        assert selector["topotune.io/serving"] == "true" and len(selector) == 3


@pytest.mark.parametrize("text", DEPLOYMENTS.values(), ids=DEPLOYMENTS.keys())
def test_compose_export_matches_the_compose_specification(text: str) -> None:
    """The exported compose file against the compose specification's JSON schema (the one docker-compose.yml is
    checked with): the image pinned to the plan's vLLM, the weights from $MODEL_DIR at an absolute default."""
    schema = json.loads((Path(__file__).parent / "api" / "data" / "compose-spec.schema.json").read_text())
    compose = yaml.safe_load(export_deployment(parse_deployment(text), "compose", CTX))
    errors = list(jsonschema.Draft201909Validator(schema).iter_errors(compose))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    for service in compose["services"].values():
        assert not service["image"].endswith(":latest")
        for volume in service.get("volumes", []):
            assert volume.startswith("${MODEL_DIR:-/") and volume.endswith(":/models/qwen3:ro")
