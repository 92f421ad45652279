"""/ui/clusters: per cluster key, each learnt factor against its default (moved %, from how many trials and models),
the fit's errors (held out only when asked), the largest per-layout offsets and the known launch risks; the same
figures as GET /v1/clusters."""

from __future__ import annotations

import math
import re

from _support.truth_runs import measured_runs

from tuner.cluster import ClusterKey, ClusterStore, GuardCheck, GuardVerdict, StoredFailure
from tuner.hardware import get_gpu
from tuner.topology import Topology
from tuner.trial_status import TrialStatus

RISKY = Topology(tp=4, dp=2, ep=True, dbo=True)


def _rows(page: str, table_class: str) -> list[str]:
    table = re.search(rf'<table class="{table_class}">(.*?)</table>', page, re.S)
    assert table, f"no table {table_class}"
    return re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(1), re.S)[1:]  # without the header


def _cells(row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_cluster_page_shows_what_the_store_learnt(database_url, make_settings, client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(make_settings(database_url))
    empty = client.get("/ui/clusters")
    assert empty.status_code == 200 and 'id="no-clusters"' in empty.text
    assert 'href="/ui/clusters"' in client.get("/ui").text  # the nav and the studies list link it

    store = ClusterStore(database_url)
    key = ClusterKey.of(get_gpu("gb300"), None, "lab")
    for run in measured_runs("qwen3-235b-a22b", 10) + measured_runs("minimax-m2", 10):
        store.record_run(key, run)
    store.record_failure(key, StoredFailure(model_name="minimax-m2", topology=RISKY, status=TrialStatus.CRASHED,
                                            reason="NCCL error: unhandled system error", study="s/decode"))
    store.record_failure(key, StoredFailure(model_name="minimax-m2", topology=Topology(tp=8),
                                            status=TrialStatus.OOM, reason="out of memory", study="s/decode"))
    (want,) = client.get("/v1/clusters").json()["clusters"]

    page = client.get("/ui/clusters").text
    assert 'id="cluster-lab"' in page and f'<span class="runs">{want["runs"]}</span> trials of 2 model(s)' in page
    factors = {_cells(r)[0]: _cells(r) for r in _rows(page, "factors")}
    assert set(factors) == set(want["factors"]) and factors
    for name, f in want["factors"].items():
        _, default, learnt, moved, runs, models = factors[name]
        assert (default, learnt) == (f"{f['default']:.4g}", f"{f['learnt']:.4g}")
        assert moved == f"{f['moved_pct']:+.1f}%" and (int(runs), int(models)) == (f["runs"], f["models"])
        assert 1 <= int(runs) <= want["runs"] and 1 <= int(models) <= 2
    assert any(abs(f["moved_pct"]) > 1 for f in want["factors"].values())  # the truth is not the defaults

    # the fit's in-sample errors; held out only when asked (it costs one more fit per model)
    (in_sample,) = _rows(page, "errors")
    assert _cells(in_sample)[1:] == [f"{100 * want['error_in_sample']['default']:.1f}%",
                                     f"{100 * want['error_in_sample']['fitted']:.1f}%"]
    assert 'class="held-out"' not in page and 'id="held-out-on"' in page

    offsets = _rows(page, "offsets")
    total = len(want["layout_offsets"])
    assert len(offsets) == min(30, total) and f"largest of {total}" in page
    top = max(want["layout_offsets"], key=lambda o: max(abs(o["log_throughput"]), abs(o["log_user_speed"])))
    assert _cells(offsets[0])[2:4] == [f"{math.exp(top['log_throughput']):.3f}",
                                       f"{math.exp(top['log_user_speed']):.3f}"]

    risks = [_cells(r) for r in _rows(page, "risks")]
    assert risks == [[RISKY.label(), "crashed", "minimax-m2", "NCCL error: unhandled system error"]]  # OOM: the model's

    # kernel factors per group of kernel kinds, and the transfer guard's verdicts (none until a study started here)
    kernel = [_cells(r) for r in _rows(page, "kernel-factors")]
    assert {(c[0], c[1]) for c in kernel} == {(f["factor"], f["transfers_to"]) for f in want["kernel_factors"]}
    assert "no study has started from this cluster's knowledge yet" in page
    verdict = GuardVerdict("gpt-oss-120b", 3, 0.19, 0.07, 0.08, (GuardCheck("hbm_efficiency", 0.19, 0.08, False),))
    store.record_guard(key, "gpt-oss-120b", "g/decode", verdict.as_json())
    (guard,) = [_cells(r) for r in _rows(client.get("/ui/clusters").text, "guards")]
    assert guard == ["gpt-oss-120b", "g/decode", "3", "19.0%", "7.0%", "8.0%", "fell back: hbm_efficiency"]

    held = client.get("/ui/clusters?held_out=true").text
    (row,) = [r for r in _rows(held, "errors") if "held out" in r]
    cells = _cells(row)
    assert cells[0] == "held out (leave-one-model-out, 2 models)"
    assert all(c.endswith("%") for c in cells[1:])


def test_a_cluster_whose_gpu_left_the_catalog_is_listed_with_its_error(sqlite_url, make_settings, client_for
                                                                        ) -> None:  # type: ignore[no-untyped-def]
    client = client_for(make_settings(sqlite_url))
    store = ClusterStore(sqlite_url)
    gone = ClusterKey("old", "no-such-gpu", "nvlink8+infiniband", "unknown", "hopper")
    store.record_failure(gone, StoredFailure(model_name="m", topology=Topology(tp=2), status=TrialStatus.CRASHED,
                                             reason="x", study="s/decode"))
    page = client.get("/ui/clusters")
    assert page.status_code == 200
    assert re.search(r'id="cluster-old".*class="bad cluster-error">cannot learn this cluster: .*no-such-gpu',
                     page.text, re.S)
