"""The study engine on the simulated backend: fronts, screening, reproducibility, resume, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE, REPO
from optuna.trial import TrialState

from tuner.backends import Backend, SimulatedBackend, TrialRequest, TrialResult
from tuner.errors import ConfigError
from tuner.executors import LocalExecutor
from tuner.hardware import get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import load_model
from tuner.space import load_space, parse_space
from tuner.study import Campaign, TuneOptions, list_campaigns, load_campaign, open_storage

MODEL = REFERENCE_MODEL
SPACE = REFERENCE_SPACE


class RecordingBackend(Backend):
    """The real simulated backend, plus a log of every request it was sent."""

    name = "recording"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.requests: list[TrialRequest] = []

    def run(self, request: TrialRequest) -> TrialResult:
        self.requests.append(request)
        return self.inner.run(request)


def _campaign(storage_url: str, tmp_path: Path, backend: Backend, **options: object) -> Campaign:
    space = options.pop("space", None) or load_space(SPACE)
    return Campaign(model_path=str(MODEL), space=space, backend_name="simulated",  # type: ignore[arg-type]
                    executor=LocalExecutor(backend, max_parallel=int(options.pop("parallel", 1))),  # type: ignore[call-overload]
                    storage_url=storage_url, options=TuneOptions(**options), artifacts_dir=tmp_path / "artifacts")


def test_campaign_reaches_a_front_and_screens_before_launch(storage_url: str, tmp_path: Path) -> None:
    backend = RecordingBackend(SimulatedBackend(noise=0.05))
    result = _campaign(storage_url, tmp_path, backend, trials=6, sampler="tpe").run()
    assert set(result.phases) == {"prefill", "decode"}
    for pr in result.phases.values():
        assert pr.launched == 6
        assert pr.front, pr.phase
        assert all(p.feasible for p in pr.front)
        assert len(pr.points) > pr.launched  # every concurrency level of a trial is stored
    assert result.composed_front and result.composition_error is None
    # nothing that the memory model rejects was ever sent to the backend
    model, gpu = load_model(MODEL), get_gpu("gb300")
    assert len(backend.requests) == 12
    for request in backend.requests:
        topo = request.deployment.groups[0].topology
        fits = compute_memory(model, gpu, topo, MemoryInputs(isl=request.workload.isl, osl=request.workload.osl))
        assert fits.fits, topo.label()
    # and the screened-out configs are stored as infeasible, with the reason
    storage = open_storage(storage_url)
    decode = optuna.load_study(study_name=result.phases["decode"].study_name, storage=storage)
    screened = [t for t in decode.trials if t.user_attrs.get("kind") == "screened"]
    for t in screened:
        assert t.state == TrialState.COMPLETE and t.constraints["feasibility"] > 0 and t.user_attrs["reason"]


def test_infeasible_space_is_screened_not_launched(tmp_path: Path) -> None:
    head, decode = SPACE.read_text().split("\n  decode:\n", 1)
    decode = decode.replace("tp: [1, 2, 4, 8, 16]", "tp: [1, 2]", 1).replace("dp: [1, 2, 4, 8]", "dp: [1, 2]", 1)
    text = head + "\n  decode:\n" + decode
    space = parse_space(text, "small.yaml")
    backend = RecordingBackend(SimulatedBackend())
    # TP<=2 x DP<=2 of a 1.3 TB model never fits on GB300: the decode phase may launch nothing
    campaign = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                        executor=LocalExecutor(backend), storage_url=f"sqlite:///{tmp_path / 's.db'}",
                        options=TuneOptions(trials=3, sampler="random", max_screened_per_trial=5),
                        artifacts_dir=tmp_path, phases=("decode",))
    result = campaign.run()
    assert backend.requests == []
    assert result.phases["decode"].launched == 0
    assert result.phases["decode"].counts.get("infeasible", 0) > 0


@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_same_seed_same_trials(tmp_path: Path, sampler: str) -> None:
    # 3 prefill levels instead of 8: each level past the first is stored as one more Optuna trial (most of this
    # test's time), and the sampler still sees a trial's extra levels
    text = SPACE.read_text().replace("concurrency: [1, 2, 4, 8, 16, 32, 64, 128]", "concurrency: [1, 8, 64]", 1)
    assert "concurrency: [1, 8, 64]" in text
    space = parse_space(text, SPACE.name)

    def sequence(db: str) -> list[dict]:
        c = _campaign(f"sqlite:///{tmp_path / db}", tmp_path, SimulatedBackend(noise=0.05), trials=10,
                      sampler=sampler, seed=7, warm_start=False, space=space)
        c.phases = ("prefill",)
        c.run()
        study = optuna.load_study(study_name=c.phase_study_name("prefill"), storage=open_storage(
            f"sqlite:///{tmp_path / db}"))
        return [t.params for t in study.trials if t.user_attrs.get("kind") in ("sampled", "screened")]

    first, second = sequence("a.db"), sequence("b.db")
    assert len(first) >= 10 and first == second


_DRIVER = """
import sys
from pathlib import Path
from tuner.backends import SimulatedBackend
from tuner.executors import LocalExecutor
from tuner.space import load_space
from tuner.study import Campaign, TuneOptions
Campaign(model_path=sys.argv[1], space=load_space(sys.argv[2]), backend_name="simulated",
         executor=LocalExecutor(SimulatedBackend(delay_s=1.0), max_parallel=2), storage_url=sys.argv[3],
         options=TuneOptions(trials=6, sampler="tpe", heartbeat_s=0.5), artifacts_dir=Path(sys.argv[4]),
         phases=("prefill",)).run()
"""


def test_resume_after_a_killed_driver_loses_no_trial(storage_url: str, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(MODEL), str(SPACE), storage_url, str(tmp_path)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    storage = open_storage(storage_url)
    deadline = time.monotonic() + 120
    running = []
    while time.monotonic() < deadline:  # kill it while trials are in flight, after some completed
        time.sleep(0.3)
        try:
            study = optuna.load_study(study_name=_study_name(), storage=storage)
        except KeyError:
            continue
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.user_attrs.get("kind") == "sampled" and t.state == TrialState.COMPLETE]
        running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("kind") == "sampled"]
        if len(done) >= 2 and running:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # what the dead driver left RUNNING, read after the kill: a trial seen running above may have completed
    # between that read and the signal (seen once on a loaded machine)
    running = [t for t in optuna.load_study(study_name=_study_name(), storage=storage).get_trials(deepcopy=False)
               if t.state == TrialState.RUNNING and t.user_attrs.get("kind") == "sampled"]
    assert running, "the driver never had trials in flight"
    killed = {t.number: t.params for t in running}

    c = _campaign(storage_url, tmp_path, SimulatedBackend(), trials=6, sampler="tpe", heartbeat_s=0.5)
    c.phases = ("prefill",)
    c.run()
    study = optuna.load_study(study_name=_study_name(), storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    launched = [t for t in trials if t.user_attrs.get("kind") == "sampled" and t.state == TrialState.COMPLETE]
    assert len(launched) == 6
    for number, params in killed.items():
        dead = trials[number]
        assert dead.state == TrialState.FAIL and dead.user_attrs.get("status") == "reclaimed"
        # its config ran again after the restart (same params, a later trial)
        assert any(t.params == params and t.number > number for t in launched), number


def _study_name() -> str:
    return "qwen3.8-2.4t-a95b-nvfp4@gb300/8192x1024/prefill"


def test_results_survive_reload(storage_url: str, tmp_path: Path) -> None:
    _campaign(storage_url, tmp_path, SimulatedBackend(), trials=4, sampler="random").run()
    result, space, meta = load_campaign(storage_url, "qwen3.8-2.4t-a95b-nvfp4@gb300/8192x1024")
    assert meta.model_path == str(MODEL) and space.name == "gb300-nvl72-8k1k"
    assert result.phases["decode"].front
    listed = list_campaigns(storage_url)
    assert [c.name for c in listed] == ["qwen3.8-2.4t-a95b-nvfp4@gb300/8192x1024"]
    assert listed[0].launched == 8 and listed[0].running == 0


@pytest.mark.parametrize(("text", "needles"), [
    ("name: x\ncluster: {gpu: gb300, num_gpus: 8}\nworkload: {isl: 8, osl: 8\n", ["line", "YAML"]),
    ("name: x\ncluster: {gpu: gb300, num_gpus: 8}\nworkload: {isl: 8, osl: 8}\nphases:\n  decode:\n"
     "    concurrency: [1]\n    tpp: [1]\n", [":7:", "phases.decode.tpp", "unknown parameter", "allowed: tp"]),
    ("name: x\ncluster: {gpu: gb300, num_gpus: 8}\nworkload: {isl: 8, osl: 8}\nphases:\n  decode:\n"
     "    concurrency: [1]\n    gpu_memory_utilization: [1.5]\n", [":7:", "gpu_memory_utilization", "(0, 1]"]),
    ("name: x\ncluster: {gpu: gb300, num_gpus: 8}\nworkload: {isl: 8}\nphases:\n  decode:\n"
     "    concurrency: [1]\n", [":3:", "workload", "give osl (tokens), output_tokens (a distribution) or trace"]),
])
def test_malformed_spaces_name_line_and_field(text: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_space(text, "space.yaml")
    message = err.value.user_message()
    for needle in needles:
        assert needle in message, message


def test_space_empty_after_constraints_says_why() -> None:
    space = parse_space("name: x\ncluster: {gpu: gb300, num_gpus: 4}\nworkload: {isl: 8, osl: 8}\nphases:\n"
                        "  decode:\n    tp: [3]\n    concurrency: [1]\n", "s.yaml")
    with pytest.raises(ConfigError, match=r"no valid configuration.*attention heads"):
        space.expand("decode", load_model(MODEL))


def test_unreachable_storage_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="--storage"):
        open_storage("postgresql+psycopg://nobody@127.0.0.1:1/none")


def test_aggregated_phase_runs_beside_pd(storage_url: str, tmp_path: Path) -> None:
    """An aggregated phase (one instance, role both) is a study of its own; PD still composes from the others."""
    space = load_space(REPO / "search_spaces" / "gb300-nvl72-8k1k-agg-vs-pd.yaml")
    backend = RecordingBackend(SimulatedBackend())
    campaign = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                        executor=LocalExecutor(backend, max_parallel=1), storage_url=storage_url,
                        options=TuneOptions(trials=3, sampler="random", seed=1), artifacts_dir=tmp_path / "a")
    result = campaign.run()
    assert set(result.phases) == {"prefill", "decode", "aggregated"}
    agg = [r for r in backend.requests if r.deployment.groups[0].role.value == "both"]
    assert agg and all(r.workload.isl == 8192 and r.workload.osl == 1024 for r in agg)
    assert result.phases["aggregated"].front
    assert result.composed_front and result.composition_error is None
    reloaded, _, _ = load_campaign(storage_url, campaign.name + "/aggregated")
    assert set(reloaded.phases) == {"aggregated"}


def test_only_an_aggregated_phase_names_why_nothing_composes(tmp_path: Path) -> None:
    text = (REPO / "search_spaces" / "gb300-nvl72-8k1k-agg-vs-pd.yaml").read_text()
    space = parse_space(text.split("  prefill:")[0] + "  aggregated:" + text.split("  aggregated:")[1])
    assert set(space.phases) == {"aggregated"}
    topo = space.expand("aggregated", load_model(MODEL))[0]
    assert topo.role.value == "both"
    storage = f"sqlite:///{tmp_path / 's.db'}"
    result = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                      executor=LocalExecutor(SimulatedBackend(), max_parallel=1), storage_url=storage,
                      options=TuneOptions(trials=2, sampler="random", seed=0), artifacts_dir=tmp_path / "a").run()
    assert result.composition_error and "no prefill + decode" in result.composition_error


_CAMPAIGN_PAIRS = """
name: campaign-pairs
cluster: {gpu: gb300, num_gpus: 72, gpus_per_host: 4%s}
workload: {isl: 8192, osl: 1024}
phases:
  prefill:
    workload: {isl: 8192, osl: 2}
    tp: [2, 4]
    dp: [2, 4]
    ep: [true]
    max_num_seqs: [64]
    concurrency: [8, 64]
  decode:
    tp: [4, 8]
    dp: [1, 4]
    ep: [true]
    mtp: [3]
    max_num_seqs: [256]
    concurrency: [64, 256]
"""


@pytest.mark.parametrize("version", ["", ", vllm_version: 0.21.0"])
def test_hybrid_pd_pairs_only_what_the_targeted_vllm_accepts(tmp_path: Path, version: str) -> None:
    """The composition goes through the launch plans' pairing check (issue 38). The reference model's block size
    follows TP (MTP 3: TP2 2,176-token blocks in 128-token kernel blocks, TP4 1,088 in 64, TP8 576 in 64), so on
    vLLM 0.32 prefill TP4 feeds decode TP2 (17 physical blocks per logical on both sides, 128 a multiple of 64)
    but TP2 never feeds TP4 (block_size_ratio) and TP4 never TP8 (prefix caching); on 0.21 NIXL transfers no GDN
    state at all, so nothing is composed and the reason says why."""
    space = parse_space(_CAMPAIGN_PAIRS.replace("tp: [4, 8]", "tp: [2, 4, 8]") % version)
    campaign = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(noise=0.0)), storage_url=f"sqlite:///{tmp_path}/s.db",
                        options=TuneOptions(trials=8, sampler="random", seed=3), artifacts_dir=tmp_path)
    result = campaign.run()
    if version:
        assert not result.composed and "hybrid_family" in (result.composition_error or "")
        return
    assert result.composed, result.composition_error
    pairs = {(p.prefill_topology.tp, p.decode_topology.tp) for p in result.composed}
    assert (4, 2) in pairs and not pairs & {(2, 4), (4, 8), (2, 8)}, pairs
    assert all(p.prefill_topology.mtp == p.decode_topology.mtp == 3 for p in result.composed)  # MTP both sides


def test_a_budget_beyond_the_space_stops_once_every_config_is_measured(tmp_path: Path) -> None:
    """4 configs per phase and a budget of 8: each config is launched once, then the phase ends instead of asking
    the sampler again and again for configs it can only repeat (it used to store ~200 duplicates per phase)."""
    storage = f"sqlite:///{tmp_path}/s.db"
    campaign = Campaign(model_path=str(MODEL), space=parse_space(_CAMPAIGN_PAIRS % ""), backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(noise=0.0)), storage_url=storage,
                        options=TuneOptions(trials=8, sampler="random", seed=3), artifacts_dir=tmp_path)
    result = campaign.run()
    space, model, gpu = parse_space(_CAMPAIGN_PAIRS % ""), load_model(MODEL), get_gpu("gb300")
    for phase in ("prefill", "decode"):
        w = space.phase_workload(phase)
        fitting = [t for t in space.expand(phase, model)
                   if compute_memory(model, gpu, t, MemoryInputs(isl=w.isl, osl=w.osl)).fits]
        assert 2 < len(fitting) < 8  # the budget is beyond the space
        study = optuna.load_study(study_name=result.phases[phase].study_name, storage=storage)
        launched = [t for t in study.get_trials() if t.user_attrs.get("kind") == "sampled"]
        assert len({tuple(sorted(t.params.items())) for t in launched}) == len(launched) == len(fitting)
        assert len(study.get_trials()) < 4 * 8, len(study.get_trials())  # asks stop with the space


def test_every_phase_has_objectives_and_axes() -> None:
    from tuner.space import ALL_PHASES
    from tuner.study import PHASE_AXES, PHASE_METRICS

    assert set(ALL_PHASES) <= set(PHASE_METRICS) and set(ALL_PHASES) <= set(PHASE_AXES)


_SMALL_CLUSTER = """
name: small-cluster
cluster: {gpu: gb300, num_gpus: 16, gpus_per_host: 4}
workload: {isl: 8192, osl: 1024}
phases:
  prefill:
    workload: {isl: 8192, osl: 2}
    tp: [2, 4]
    dp: [2, 4, 8]
    ep: [true]
    max_num_seqs: [16, 64]
    concurrency: [8, 64]
"""


def test_a_rejected_proposal_is_repaired_with_a_config_that_launches(tmp_path: Path) -> None:
    """TP2 x DP2 does not fit in memory and TP4 x DP8 needs 32 GPUs of a 16-GPU cluster: a proposal the screen
    rejects (or of a config already measured) is told as it is and replaced by the nearest config that can run
    here, never by another that screening rejects."""
    space = parse_space(_SMALL_CLUSTER)
    campaign = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(noise=0.0)), storage_url=f"sqlite:///{tmp_path}/s.db",
                        options=TuneOptions(trials=8, sampler="random", seed=1, warm_start=False),
                        artifacts_dir=tmp_path)
    result = campaign.run()
    study = optuna.load_study(study_name=result.phases["prefill"].study_name, storage=f"sqlite:///{tmp_path}/s.db")
    repairs = [t for t in study.trials if t.user_attrs.get("repaired_from") is not None]
    assert repairs, "the random sampler proposed nothing to repair"
    assert all(t.user_attrs.get("kind") == "sampled" for t in repairs), [
        (t.params, t.user_attrs.get("kind"), t.user_attrs.get("reason")) for t in repairs]
    screened = [t for t in study.trials if t.user_attrs.get("kind") == "screened"]
    assert screened and all(t.user_attrs.get("repaired_from") is None for t in screened)
    assert {r.user_attrs["repaired_from"] for r in repairs} <= {t.number for t in study.trials}


def test_a_resume_under_other_bounds_names_the_request_fields_not_a_face_s() -> None:
    """The library's refusal names its fields (`sla.max_itl_ms`, `storage`): the CLI shows them as flags, the API
    as body fields (tests/cli/test_tune_cli.py, tests/api/test_api_tune_request.py); never a flag of its own."""
    import json

    from tuner.study._runner import check_same_sla
    from tuner.study._trial_record import CampaignMeta

    space = load_space(SPACE)
    stored = json.loads(space.model_dump_json())
    stored["constraints"]["max_itl_ms"] = 0.05  # an ITL in seconds where milliseconds are meant
    meta = CampaignMeta.new(phase="decode", model="m", model_path=str(MODEL), gpu="gb300", space=stored,
                            backend="simulated", sampler="random", seed=0, trials=1)
    with pytest.raises(ConfigError) as err:
        check_same_sla(meta, space, "m@gb300/8192x1024/decode")
    assert err.value.field == "sla.max_itl_ms"
    assert "`sla.max_itl_ms`" in (err.value.fix or "") and "`storage`" in (err.value.fix or "")
    assert "--" not in str(err.value)


def test_a_new_users_small_study_of_the_reference_space_composes_a_pd_front(tmp_path: Path) -> None:
    """`topotune tune` of the reference space with 6 trials and --parallel 4: the prefill study's front held TP8
    only and the decode study, not warm-started (vLLM pairs TP1 with TP2, so the old "equal TP only" check said
    no), measured TP2/TP4: nothing paired (hybrid_prefix_caching_blocks). The decode warm start now seeds the
    prefill front's TP, which pairs."""
    result = _campaign(f"sqlite:///{tmp_path}/s.db", tmp_path, SimulatedBackend(), trials=6, parallel=4).run()
    prefill_tps = {p.deployment.groups[0].topology.tp for p in result.phases["prefill"].front}
    decode_tps = {p.deployment.groups[0].topology.tp for p in result.phases["decode"].points if p.feasible}
    assert prefill_tps & decode_tps, (prefill_tps, decode_tps)  # an equal TP measured on both sides
    assert result.composed_front, result.composition_error
