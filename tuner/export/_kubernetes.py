"""Kubernetes manifests of an operating point, from the same launch plan a trial runs.

vLLM's own multi-host pattern (docs/deployment/frameworks/lws.md): one LeaderWorkerSet per multi-host instance
group (the leader pod runs node rank 0 and serves HTTP, each worker pod one more node, `--headless`, pointing at
the leader through LWS's LWS_LEADER_ADDRESS / LWS_WORKER_INDEX variables); a Deployment for instances that fit one
host; a Service per role; vllm-router as a Deployment that finds the serving pods by label
(`--service-discovery`, which needs a ServiceAccount allowed to list and watch pods) with the policy the operating
point chose. GPUs are requested as `nvidia.com/gpu`; PD pods get the NIXL side channel on their pod IP, the UCX
variables of the plan and IPC_LOCK (RDMA memory registration).

`to_dynamo` writes the reference campaign's serving stack instead: one DynamoGraphDeployment (Dynamo's operator,
nvidia.com/v1alpha1) with a Frontend and a `dynamo.vllm` worker service per role.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.deployment import Deployment, InstanceGroup
from tuner.export._recipes import (
    MODEL_DIR_VARIABLE,
    VLLM_ROUTER_VERSION,
    RecipeContext,
    _plan,
    container_model_path,
    dump_yaml,
    dump_yaml_all,
    is_local_path,
    serve_flags,
)
from tuner.router import RouterPolicy
from tuner.topology import Role

SERVE_PORT = 8000
ROUTER_PORT = 8000
NIXL_SIDE_CHANNEL_PORT = 5600
LABEL = "topotune.io"
# Dynamo's vLLM runtime image (it bundles its own vLLM); the reference campaign ran Dynamo 1.2 as its PD frontend
# (/work/shared/docs/reference-deployment.md).
DYNAMO_RUNTIME_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.2.0"
# Per-process values the pods set themselves (the device plugin picks the GPUs; each pod has its own ports).
_POD_OWN_ENV = {"CUDA_VISIBLE_DEVICES", "VLLM_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"}


def _name(text: str) -> str:
    """A DNS-1123 name."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50] or "topotune"


def _role_name(role: Role) -> str:
    return {"prefill": "prefill", "decode": "decode", "both": "serve"}[role.value]


def _first_instance(plan_processes: list, role: Role) -> list:
    """The processes of the group's first instance (one per host), node rank order."""
    first = min(p.instance for p in plan_processes if p.role == role.value)
    return [p for p in plan_processes if p.role == role.value and p.instance == first]


def _generic_argv(argv: tuple[str, ...], leader_host: str, node_rank: int) -> list[str]:
    """One node's argv for any instance of the group: the leader's address and this pod's node rank as LWS gives
    them, the HTTP port fixed (every pod has its own IP)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        value = out[i + 1]
        if arg in ("--master-addr", "--data-parallel-address") and value == leader_host:
            out[i + 1] = "$(LWS_LEADER_ADDRESS)"
        elif arg == "--node-rank" and node_rank > 0:
            out[i + 1] = "$(LWS_WORKER_INDEX)"
        elif arg == "--port":
            out[i + 1] = str(SERVE_PORT)
    return out


def _start_rank_shell(argv: list[str]) -> list[str]:
    """A DP worker host's --data-parallel-start-rank is its index times the ranks per host: a shell computes it
    (`$$` is the kubelet's escape for `$`; `$(LWS_...)` the kubelet expands itself)."""
    if "--data-parallel-start-rank" not in argv:
        return argv
    local = int(argv[argv.index("--data-parallel-size-local") + 1])
    i = argv.index("--data-parallel-start-rank")
    words = [a if a.startswith("$(") else _quote(a) for a in argv[:i]]
    words += ["--data-parallel-start-rank", f"$$((LWS_WORKER_INDEX * {local}))", *(_quote(a) for a in argv[i + 2:])]
    return ["sh", "-c", "exec " + " ".join(words)]


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _env(proc_env: dict[str, str], disaggregated: bool) -> list[dict]:
    env = [{"name": k, "value": v} for k, v in sorted(proc_env.items()) if k not in _POD_OWN_ENV]
    if disaggregated:
        env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]
    return env


def _volumes(ctx: RecipeContext) -> tuple[list[dict], list[dict]]:
    """The weights from $MODEL_DIR on every node (hostPath; envsubst fills it) and a RAM-backed /dev/shm."""
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if is_local_path(ctx.model_path):
        volumes.append({"name": "model", "hostPath": {"path": f"${{{MODEL_DIR_VARIABLE}}}", "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": container_model_path(ctx), "readOnly": True})
    return volumes, mounts


def _container(name: str, image: str, argv: list[str], env: list[dict], gpus: int, mounts: list[dict], *,
               serves: bool, rdma: bool) -> dict:
    container: dict = {"name": name, "image": image, "command": argv[:1], "args": argv[1:], "env": env,
                       "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
                       "volumeMounts": mounts}
    if serves:
        container["ports"] = [{"name": "http", "containerPort": SERVE_PORT}]
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": SERVE_PORT}, "periodSeconds": 10,
                                       "failureThreshold": 3}
        container["startupProbe"] = {"httpGet": {"path": "/health", "port": SERVE_PORT}, "periodSeconds": 10,
                                     "failureThreshold": 180}  # weights loading and CUDA graphs: up to 30 min
    if rdma:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return container


def _group_manifests(group: InstanceGroup, processes: list, ctx: RecipeContext, base: str,
                     disaggregated: bool) -> list[dict]:
    role = _role_name(group.role)
    name = f"{base}-{role}"
    nodes = _first_instance(processes, group.role)
    leader_host = nodes[0].host
    labels = {f"{LABEL}/deployment": base, f"{LABEL}/role": role}
    volumes, mounts = _volumes(ctx)
    serving_labels = {**labels, f"{LABEL}/serving": "true"}

    def pod(node_rank: int, serving: bool) -> dict:
        proc = nodes[node_rank]
        argv = _generic_argv(proc.argv, leader_host, node_rank)
        if node_rank > 0:
            argv = _start_rank_shell(argv)
        gpus = len(proc.env.get("CUDA_VISIBLE_DEVICES", "").split(",")) if proc.env.get("CUDA_VISIBLE_DEVICES") \
            else 1
        return {"metadata": {"labels": serving_labels if serving else labels},
                "spec": {"containers": [_container("vllm", ctx.image, argv, _env(proc.env, disaggregated), gpus,
                                                   mounts, serves=serving, rdma=disaggregated)],
                         "volumes": volumes}}

    if len(nodes) == 1:
        template = pod(0, True)
        return [{"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": name, "labels": labels},
                 "spec": {"replicas": group.count, "selector": {"matchLabels": labels}, "template": template}}]
    return [{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": {"name": name, "labels": labels},
             "spec": {"replicas": group.count, "startupPolicy": "LeaderCreated",
                      "leaderWorkerTemplate": {"size": len(nodes), "restartPolicy": "RecreateGroupOnPodRestart",
                                               "leaderTemplate": pod(0, True), "workerTemplate": pod(1, False)}}}]


def _router_manifests(ctx: RecipeContext, base: str, deployment: Deployment) -> list[dict]:
    """vllm-router with the operating point's policy, finding the serving pods by label; its RBAC and Service."""
    name = f"{base}-router"
    labels = {f"{LABEL}/deployment": base, f"{LABEL}/role": "router"}

    def selector(role: str) -> list[str]:  # vllm-router reads space-separated key=value items
        return [f"{LABEL}/deployment={base}", f"{LABEL}/role={role}", f"{LABEL}/serving=true"]

    argv = ["vllm-router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--service-discovery",
            "--service-discovery-port", str(SERVE_PORT)]
    if deployment.is_disaggregated:
        argv += ["--vllm-pd-disaggregation", "--prefill-selector", *selector("prefill"),
                 "--decode-selector", *selector("decode")]
    else:
        argv += ["--selector", *selector("serve")]
    argv += ["--policy", ctx.router.policy]
    script = f"pip install --no-cache-dir vllm-router=={VLLM_ROUTER_VERSION} && exec " + " ".join(
        _quote(a) for a in argv)
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "labels": labels},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": name, "containers": [{
                 "name": "router", "image": "python:3.12-slim", "command": ["sh", "-c", script],
                 "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": ROUTER_PORT}, "periodSeconds": 10}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": ROUTER_PORT}]}},
    ]


def kubernetes_objects(deployment: Deployment, ctx: RecipeContext) -> list[dict]:
    """The manifests as objects (what the schemas are checked on)."""
    inside = container_model_path(ctx)
    from dataclasses import replace

    plan = _plan(deployment, replace(ctx, model_path=inside, model=ctx.model_spec))
    base = _name(f"{ctx.model_name}-{'pd' if deployment.is_disaggregated else 'agg'}")
    objects: list[dict] = []
    processes = list(plan.servers)
    for group in deployment.groups_in_launch_order:
        objects += _group_manifests(group, processes, ctx, base, deployment.is_disaggregated)
        role = _role_name(group.role)
        labels = {f"{LABEL}/deployment": base, f"{LABEL}/role": role}
        objects.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{base}-{role}",
                                                                            "labels": labels},
                        "spec": {"selector": {**labels, f"{LABEL}/serving": "true"},
                                 "ports": [{"name": "http", "port": SERVE_PORT, "targetPort": SERVE_PORT}]}})
    if plan.fronts:
        objects += _router_manifests(ctx, base, deployment)
    return objects


def to_kubernetes(deployment: Deployment, ctx: RecipeContext) -> str:
    objects = kubernetes_objects(deployment, ctx)
    local = is_local_path(ctx.model_path)
    header = [f"# {deployment.name} on {deployment.num_gpus} x {ctx.gpu}: Kubernetes manifests generated by "
              f"topotune; image {ctx.image}.", ctx.verified_line()]
    if local:
        header.append(f"# The weights: a folder at the same path on every GPU node, e.g.\n#   {MODEL_DIR_VARIABLE}="
                      f"/models/{Path(ctx.model_path).name} envsubst '${MODEL_DIR_VARIABLE}' < THIS.yaml | "
                      "kubectl apply -f -")
    if any(o["kind"] == "LeaderWorkerSet" for o in objects):
        header.append("# Multi-host instances are LeaderWorkerSets: install LWS first (kubernetes-sigs/lws).")
    if deployment.is_disaggregated:
        header.append("# PD: NIXL moves KV between pods over UCX; give the pods your cluster's RDMA device "
                      "(its device plugin's resource, e.g. rdma/ib) for InfiniBand/RoCE.")
    if objects[-1]["kind"] == "Service" and objects[-1]["metadata"]["name"].endswith("-router"):
        header.append(f"# Router policy {ctx.router.policy}: {ctx.router.reason}.")
    return "\n".join(header) + "\n---\n" + dump_yaml_all(objects)


# -- Dynamo ------------------------------------------------------------------------------------------------

# Flags dynamo.vllm sets from its own graph (the connector and its role, ports, the API server).
_DYNAMO_OWN = {"--kv-transfer-config", "--host", "--port", "--headless", "--nnodes", "--node-rank", "--master-addr",
               "--master-port", "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-size-local",
               "--data-parallel-start-rank"}


def _engine_args(argv: tuple[str, ...]) -> list[str]:
    """The vLLM engine flags of a plan's process without what dynamo.vllm sets itself."""
    start = argv.index("serve")
    out = ["--model", argv[start + 1]]
    for flag, value in serve_flags(argv[start + 2:]):
        if flag not in _DYNAMO_OWN:
            out += [flag] if value is None else [flag, value]
    return out


def dynamo_object(deployment: Deployment, ctx: RecipeContext) -> dict:
    inside = container_model_path(ctx)
    from dataclasses import replace

    plan = _plan(deployment, replace(ctx, model_path=inside, model=ctx.model_spec))
    base = _name(f"{ctx.model_name}-{'disagg' if deployment.is_disaggregated else 'agg'}")
    volumes, mounts = _volumes(ctx)
    prefix_aware = ctx.router.policy in (RouterPolicy.CACHE_AWARE, RouterPolicy.CONSISTENT_HASH,
                                            RouterPolicy.KV_AWARE)
    router_mode = "kv" if prefix_aware else "round-robin"  # Dynamo's DYN_ROUTER_MODE values
    services: dict[str, dict] = {"Frontend": {
        "dynamoNamespace": base, "componentType": "frontend", "replicas": 1,
        "envs": [{"name": "DYN_ROUTER_MODE", "value": router_mode}],
        "extraPodSpec": {"mainContainer": {"image": DYNAMO_RUNTIME_IMAGE, "command": ["python3", "-m",
                                                                                     "dynamo.frontend"],
                                           "args": ["--http-port", str(SERVE_PORT)]}}}}
    for group in deployment.groups_in_launch_order:
        nodes = _first_instance(list(plan.servers), group.role)
        args = _engine_args(nodes[0].argv)
        if group.role is Role.PREFILL:
            args.append("--is-prefill-worker")
        gpus_per_node = group.topology.num_gpus // len(nodes)
        service: dict = {
            "dynamoNamespace": base, "componentType": "worker", "replicas": group.count,
            "resources": {"limits": {"gpu": str(gpus_per_node)}, "requests": {"gpu": str(gpus_per_node)}},
            "envs": [{"name": k, "value": v} for k, v in sorted(nodes[0].env.items()) if k not in _POD_OWN_ENV],
            "extraPodSpec": {"mainContainer": {"image": DYNAMO_RUNTIME_IMAGE, "command": ["python3", "-m",
                                                                                        "dynamo.vllm"],
                                               "args": args, "volumeMounts": mounts}, "volumes": volumes}}
        if len(nodes) > 1:
            service["multinode"] = {"nodeCount": len(nodes)}
        services[{"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker", "both": "VllmWorker"}[
            group.role.value]] = service
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": base}, "spec": {"backendFramework": "vllm", "services": services}}


def to_dynamo(deployment: Deployment, ctx: RecipeContext) -> str:
    obj = dynamo_object(deployment, ctx)
    header = [f"# {deployment.name} on {deployment.num_gpus} x {ctx.gpu} as a Dynamo graph (the reference "
              f"campaign's serving stack), generated by topotune; runtime {DYNAMO_RUNTIME_IMAGE} (its own vLLM; "
              f"the plan targeted vLLM {ctx.vllm_version or 'newest checked'}).", ctx.verified_line(),
              f"# Frontend routing {obj['spec']['services']['Frontend']['envs'][0]['value']} (from the router policy "
              f"{ctx.router.policy}: {ctx.router.reason})."]
    if is_local_path(ctx.model_path):
        header.append(f"# The weights: {MODEL_DIR_VARIABLE}=/path/to/{Path(ctx.model_path).name} envsubst "
                      f"'${MODEL_DIR_VARIABLE}' < THIS.yaml | kubectl apply -f -")
    return "\n".join(header) + "\n" + dump_yaml(obj)
