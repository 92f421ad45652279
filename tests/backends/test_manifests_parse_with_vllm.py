"""#46: the vLLM command lines inside the Kubernetes manifests (leader and worker pods) and the engine flags of the
Dynamo workers are parsed by vLLM's own parser and EngineArgs in the CPU venv, as the plans are
(test_plans_parse_with_vllm.py): the manifests carry no flag vLLM would refuse."""

from __future__ import annotations

import shlex

import pytest
from _support.cpu_vllm import needs_envs

from tuner.backends.vllm import default_envs_dir
from tuner.backends.vllm._argv_check import run_check
from tuner.deployment import parse_deployment
from tuner.export import RecipeContext, dynamo_object, kubernetes_objects

pytestmark = [pytest.mark.slow, needs_envs]

CTX = RecipeContext(model_path="/srv/models/m", model_name="m", gpu="gb300", gpus_per_host=4, isl=8192, osl=1024,
                    vllm_version="0.32.0")
DEPLOYMENTS = ("1P:TP4DP2+EP,1D:TEP8", "2x:TP4", "1P:TP2,1D:DEP8", "TP8")
LWS_VALUES = {"$(LWS_LEADER_ADDRESS)": "10.0.0.1", "$(LWS_WORKER_INDEX)": "1", "$$((LWS_WORKER_INDEX * 2))": "2",
              "$$((LWS_WORKER_INDEX * 1))": "1", "$$((LWS_WORKER_INDEX * 4))": "4"}


def _vllm_argv(container: dict) -> list[str]:
    argv = [*container["command"], *container["args"]]
    if argv[:2] == ["sh", "-c"]:  # what the kubelet and the shell make of it on worker 1
        text = argv[2].removeprefix("exec ")
        for variable, value in LWS_VALUES.items():
            text = text.replace(variable, value)
        argv = shlex.split(text)
    argv = [LWS_VALUES.get(a, a) for a in argv]
    return argv[argv.index("serve") + 1:]


def test_manifest_argvs_parse_with_vllms_own_parser() -> None:
    items = []
    for text in DEPLOYMENTS:
        deployment = parse_deployment(text)
        for obj in kubernetes_objects(deployment, CTX):
            templates = []
            if obj["kind"] == "LeaderWorkerSet":
                lwt = obj["spec"]["leaderWorkerTemplate"]
                templates = [("leader", lwt["leaderTemplate"]), ("worker", lwt["workerTemplate"])]
            elif obj["kind"] == "Deployment" and not obj["metadata"]["name"].endswith("-router"):
                templates = [("pod", obj["spec"]["template"])]
            for kind, template in templates:
                container = template["spec"]["containers"][0]
                env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
                items.append({"name": f"{text} {obj['metadata']['name']} {kind}", "argv": _vllm_argv(container),
                              "env": env})
        for name, service in dynamo_object(deployment, CTX)["spec"]["services"].items():
            if name == "Frontend":
                continue
            args = [a for a in service["extraPodSpec"]["mainContainer"]["args"] if a != "--is-prefill-worker"]
            model = args[args.index("--model") + 1]
            argv = [model, *args[:args.index("--model")], *args[args.index("--model") + 2:]]
            items.append({"name": f"{text} dynamo {name}", "argv": argv, "env": {}})
    assert len(items) >= 10 and any("--headless" in i["argv"] for i in items)
    results = run_check(str(default_envs_dir() / "vllm" / "bin" / "python"), "vllm", items)
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed[:3]
