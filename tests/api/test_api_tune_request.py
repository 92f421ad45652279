"""The service stores a study's TuneRequest (typed, JSON), not an options dict: the backend is built by the same
builder as the CLI's (a vllm study on the CPU space plans vllm-cpu), and rows stored as options dicts still load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _support.paths import REPO

from api.config import ApiSettings
from api.db import make_engine, make_session_factory, upgrade
from api.errors import FieldError
from api.models import StudyRecord, StudyStatus
from api.schemas import StudyCreate
from api.service import create_study
from tuner.backends import SimulatedConfig, VllmConfig, make_backend
from tuner.space import load_space
from tuner.tune import SlaOverride, TuneRequest

TINY_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1024, "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "max_position_embeddings": 4096, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


@pytest.fixture
def sessions(sqlite_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(sqlite_url)
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def tiny(model_store: Path) -> str:
    (model_store / "tiny-qwen3").mkdir()
    (model_store / "tiny-qwen3" / "config.json").write_text(json.dumps(TINY_QWEN3))
    return "tiny-qwen3"


def test_a_vllm_study_on_the_cpu_space_plans_the_cpu_device(sessions, make_settings, sqlite_url: str,  # type: ignore[no-untyped-def]
                                                             tiny: str) -> None:
    """Before, only the CLI set device=cpu: a vllm study posted with cpu-tiny.yaml planned CUDA."""
    settings: ApiSettings = make_settings(sqlite_url)
    with sessions() as session:
        record = create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml",
                                                             backend="vllm", trials=1, phases=["decode"],
                                                             constraints={"max_itl_ms": 80}))
        study_id = record.id
    with sessions() as session:  # read back from the database: the stored request, typed
        stored = session.get(StudyRecord, study_id)
        assert stored is not None
        request = stored.tune_request
        assert stored.request_json["backend"] == {"kind": "vllm", "device": "cpu", "settings": {}}
    assert request.backend == VllmConfig(device="cpu")
    assert request.phases == ("decode",) and stored.phases == ["decode"]
    assert request.sla.model_dump() == {"max_itl_ms": 80.0}  # only what the body gave
    assert request.constrained_space.constraints.max_itl_ms == 80.0
    assert request.constrained_space.constraints.percentile == "p50"  # the space's own, kept
    backend = make_backend(request.backend.kind, **request.backend.options())  # what the runner's executor builds
    assert backend.settings.device == "cpu" and "VLLM_TARGET_DEVICE" in backend.settings.vllm_env  # type: ignore[attr-defined]


def test_a_row_stored_as_an_options_dict_still_loads(sessions) -> None:  # type: ignore[no-untyped-def]
    space = load_space(REPO / "search_spaces" / "cpu-tiny.yaml")
    space_json = json.loads(space.model_dump_json())
    with sessions() as session:
        simulated = StudyRecord(campaign="old-sim", model_name="m", model_path="/models/m", space=space_json,
                                space_name=space.name, backend="simulated", trials_per_phase=5, sampler="random",
                                seed=3, warm_start=False, status=StudyStatus.SUCCEEDED, resumes=0,
                                request_json={"noise": 0.05, "delay_s": 0.5, "phases": ["decode"],
                                              "retry_risks": True})
        vllm = StudyRecord(campaign="old-vllm", model_name="m", model_path="/models/m", space=space_json,
                           space_name=space.name, backend="vllm", trials_per_phase=2, sampler="auto", seed=0,
                           warm_start=True, status=StudyStatus.SUCCEEDED, resumes=0, request_json={})
        session.add_all([simulated, vllm])
        session.commit()
        ids = simulated.id, vllm.id
    with sessions() as session:
        old_sim, old_vllm = (session.get(StudyRecord, i).tune_request for i in ids)  # type: ignore[union-attr]
    assert old_sim.backend == SimulatedConfig(noise=0.05, delay_s=0.5)
    assert (old_sim.phases, old_sim.retry_risks, old_sim.trials, old_sim.seed, old_sim.warm_start) == \
        (("decode",), True, 5, 3, False)
    assert old_vllm.backend == VllmConfig(device="cpu")  # its CPU cluster plans vllm-cpu now
    assert old_vllm.phases is None and old_vllm.retry_risks is False


def test_the_sla_override_stores_what_was_given_and_lifts_with_none() -> None:
    space = load_space(REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml")
    assert space.constraints.max_ttft_ms is not None
    request = TuneRequest(model_path="/m", space=space, sla=SlaOverride(max_ttft_ms=None, percentile="p99"))
    again = TuneRequest.model_validate_json(request.model_dump_json())
    assert again.sla.model_dump() == {"max_ttft_ms": None, "percentile": "p99"}
    lifted = again.constrained_space.constraints
    assert lifted.max_ttft_ms is None and lifted.percentile == "p99"
    assert lifted.max_itl_ms == space.constraints.max_itl_ms  # not given: the space's, kept


def test_allowed_roots_keep_the_services_own_spaces(sessions, make_settings, sqlite_url: str, model_store: Path,  # type: ignore[no-untyped-def]
                                                   tiny: str, tmp_path: Path) -> None:
    """TOPOTUNE_ALLOWED_ROOTS set to the model store alone used to refuse the spaces the new-study form offers."""
    settings: ApiSettings = make_settings(sqlite_url, allowed_roots=[model_store])
    assert settings.default_space.parent in settings.space_roots
    assert settings.default_space.parent not in settings.allowed_roots  # models and traces stay confined
    with sessions() as session:
        record = create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml",
                                                             trials=1))
        assert record.space_name == "cpu-tiny"
        outside = tmp_path / "elsewhere.yaml"
        outside.write_text((REPO / "search_spaces" / "cpu-tiny.yaml").read_text())
        with pytest.raises(FieldError) as refused:
            create_study(session, settings, StudyCreate(model_path=tiny, space_path=str(outside), trials=1))
        assert refused.value.kind == "path_not_allowed"


def test_a_study_request_may_replace_the_spaces_workload(sessions, make_settings, sqlite_url: str,  # type: ignore[no-untyped-def]
                                                         model_store: Path, tiny: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "examples" / "traces" / "chat-multiturn.jsonl", traces / "chat.jsonl")
    settings: ApiSettings = make_settings(sqlite_url, allowed_roots=[model_store, REPO / "search_spaces", traces])
    with sessions() as session:
        fixed = create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml", trials=1,
                                                            workload={"isl": 100, "osl": 20}))
        assert fixed.tune_request.constrained_space.traffic.isl == 100
        assert fixed.space["phases"]["prefill"]["workload"] == {"isl": 128, "osl": 2}  # the phase's own stays
        traced = create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml", trials=1,
                                                             workload={"trace": str(traces / "chat.jsonl")}))
        assert traced.tune_request.constrained_space.traffic.trace.requests == 202  # type: ignore[union-attr]
        with pytest.raises(FieldError) as outside:
            create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml", trials=1,
                                                        workload={"trace": "/etc/passwd"}))
        assert outside.value.loc == ("body", "workload", "trace") and outside.value.kind == "path_not_allowed"
        with pytest.raises(FieldError) as bad:
            create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml", trials=1,
                                                        workload={"isl": 0, "osl": 20}))
        assert bad.value.loc[:3] == ("body", "workload", "isl"), bad.value.loc


def test_the_forms_trace_summary(make_settings, sqlite_url: str, client_for, model_store: Path) -> None:  # type: ignore[no-untyped-def]
    client = client_for(make_settings(sqlite_url, allowed_roots=[model_store, REPO / "examples"]))
    trace = REPO / "examples" / "traces" / "chat-multiturn.jsonl"
    summary = client.get("/ui/traces/summary", params={"path": str(trace)}).json()
    assert summary["requests"] == 202 and summary["arrival_rps"] == pytest.approx(1.2, abs=0.01)
    assert 0.5 < summary["prefix_reuse"] < 0.9
    refused = client.get("/ui/traces/summary", params={"path": "/etc/passwd"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "path"]


def test_a_study_refused_on_resume_names_the_body_s_fields(sessions, make_settings, sqlite_url: str,  # type: ignore[no-untyped-def]
                                                          tiny: str) -> None:
    """The library's resume refusal (other bounds than the stored study's) names its request fields; the service
    shows them as the body names them (`constraints.max_itl_ms`), as the CLI shows its flags."""
    import optuna

    from api.metrics import ServiceMetrics
    from api.runner import StudyRunner
    from tuner.study import open_storage
    from tuner.study._trial_record import CampaignMeta

    settings: ApiSettings = make_settings(sqlite_url, executor="local")
    with sessions() as session:
        record = create_study(session, settings, StudyCreate(model_path=tiny, space_path="cpu-tiny.yaml", trials=1,
                                                             phases=["decode"], constraints={"max_itl_ms": 80}))
        study_id, campaign, space = record.id, record.campaign, dict(record.space)
    # the same campaign already stored under another ITL bound (in seconds where milliseconds are meant)
    stored = optuna.create_study(study_name=f"{campaign}/decode", storage=open_storage(settings.database_url),
                                 directions=["maximize", "maximize"])
    CampaignMeta.new(phase="decode", model="tiny", model_path=str(record.model_path), gpu=space["cluster"]["gpu"],
                     space={**space, "constraints": {**space["constraints"], "max_itl_ms": 0.05}},
                     backend="simulated", sampler="random", seed=0, trials=1).write(stored)
    StudyRunner(settings, sessions, ServiceMetrics(sessions, settings.database_url))._run(study_id)
    with sessions() as session:
        failed = session.get(StudyRecord, study_id)
        assert failed is not None and failed.status is StudyStatus.FAILED
        assert failed.error is not None and failed.error.startswith("constraints.max_itl_ms: ")
        assert "the study's constraints.max_itl_ms (0.05)" in failed.error and "sla." not in failed.error
