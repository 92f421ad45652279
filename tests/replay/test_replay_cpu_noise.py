"""The noise views of benchmarks/replay_cpu_validation.py (`floor`, `noise`): vLLM's runs against the median of its
other runs, and the replay against the median of the files. Synthetic files with known noise, where what each view
returns can be worked out by hand, and the stored quiet runs (no fit: these stay fast)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from _support.benchmarks import load_benchmark


def _bench():
    return load_benchmark("replay_cpu_validation")


RATES = (5.0, 10.0, 15.0, 20.0)


def _truth(rate: float) -> dict[str, float]:
    return {"ttft_p50": 10.0 + rate, "ttft_p90": 20.0 + 3 * rate, "itl_p50": 3.0, "itl_p90": 4.0 + rate / 10,
            "hit_share": 0.5, "gap_mean": 3.0, "preemptions": rate / 2}


def _loops(bench, name: str, factor: float, *, predicted: float | None = None, rates=RATES):
    """A file whose every latency is the truth times `factor` at each rate (and the replay's, times `predicted`)."""

    def figures(rate: float, f: float) -> dict[str, float]:
        t = _truth(rate)
        return {k: v * f if k in (*bench.FIT_METRICS, "gap_mean") else v for k, v in t.items()}

    return bench.OpenLoops(name, tuple(rates), tuple((r, figures(r, factor)) for r in rates),
                           tuple((r, figures(r, predicted)) for r in rates) if predicted else ())


def test_median_of_others_on_files_with_known_noise_is_what_the_medians_give() -> None:
    """Three files at 0.9, 1.0 and 1.1 times the truth: the middle one is predicted exactly by the median of the
    other two (their mean), the high one by 0.95 (|0.95 / 1.1 - 1| = 13.6%), the low one by 1.05 (16.7%), at every
    rate, for every latency; the hit share and the onset (equal in all three) by 0."""
    bench = _bench()
    loops = [_loops(bench, name, f) for name, f in (("low", 0.9), ("mid", 1.0), ("high", 1.1))]
    errors, onsets, covered = bench.median_of_others(loops)
    assert len(covered) == 3 * len(RATES)
    for k in bench.FIT_METRICS:
        assert sorted(errors[k]) == pytest.approx(sorted([0.0] * 4 + [1 - 0.95 / 1.1] * 4
                                                         + [1.05 / 0.9 - 1] * 4)), k
    assert errors["hit_share"] == [0.0] * 12
    assert all(m == pytest.approx(p) for m, p in onsets) and onsets[0][0] == pytest.approx(6.0)


def test_median_of_others_needs_two_others_spanning_the_rate() -> None:
    """A run is predicted only where two other files span its rate: the low file's 5 req/s (the others start at 10)
    and the others' runs past 15 req/s (the low file stops there) are left out."""
    bench = _bench()
    loops = [_loops(bench, "low", 1.0, rates=(5.0, 10.0, 15.0)), _loops(bench, "a", 1.0, rates=(10.0, 20.0)),
             _loops(bench, "b", 1.0, rates=(10.0, 20.0))]
    covered = bench.median_of_others(loops)[2]
    assert covered == {("low", 10.0), ("low", 15.0), ("a", 10.0), ("b", 10.0)}


def test_the_median_of_the_files_takes_out_their_noise_and_keeps_the_replays_bias() -> None:
    """Files at 0.9, 1.0, 1.1 times the truth, the replay at 1.2 times it for each: against single runs the replay
    is off by 9-33%; against the median of the files by exactly 20% at every grid point. A replay that predicts
    each file's own figures is off by 0 against their median."""
    bench = _bench()
    loops = [_loops(bench, name, f, predicted=1.2) for name, f in (("low", 0.9), ("mid", 1.0), ("high", 1.1))]
    grid = bench.common_grid(loops, 3)
    assert grid == list(RATES)
    rows, errors = bench.against_median(loops, grid)
    for k in bench.FIT_METRICS:
        assert errors[k] == pytest.approx([0.2] * len(RATES)), k
    per_run = bench._replay_per_run(loops)[0]
    assert min(per_run["ttft_p50"]) == pytest.approx(1.2 / 1.1 - 1)
    assert max(per_run["ttft_p50"]) == pytest.approx(1.2 / 0.9 - 1)
    exact = [_loops(bench, name, f, predicted=f) for name, f in (("low", 0.9), ("mid", 1.0), ("high", 1.1))]
    assert all(e == pytest.approx(0.0) for v in bench.against_median(exact, grid)[1].values() for e in v)
    assert rows[0].files == 3 and rows[0].measured["ttft_p50"] == pytest.approx(15.0)


def test_split_half_of_two_fast_and_two_slow_files() -> None:
    """Files at 0.9, 0.9, 1.1, 1.1 times the truth: of the three splits, the two that mix them agree exactly; the one
    that puts the slow pair against the fast one differs by 1.1 / 0.9 - 1 one way and 1 - 0.9 / 1.1 the other."""
    bench = _bench()
    loops = [_loops(bench, name, f) for name, f in (("a", 0.9), ("b", 0.9), ("c", 1.1), ("d", 1.1))]
    errors, onsets = bench.split_half(loops, list(RATES))
    assert len(errors["ttft_p90"]) == 3 * 2 * len(RATES) and len(onsets) == 6
    assert sorted(errors["ttft_p90"]) == pytest.approx(sorted([0.0] * 16 + [1.1 / 0.9 - 1] * 4
                                                              + [1 - 0.9 / 1.1] * 4))


def test_median_of_others_of_identical_stored_files_is_each_files_own_figure(tmp_path) -> None:
    """The stored quiet run three times over (as three files): every open-loop run is predicted by its own figures,
    at its rate and at its share of the closed loop's rate; and `_linear`, the views' interpolation, is
    `_interpolated`'s (what `repeat` uses) between a stored file's runs."""
    bench = _bench()
    data = json.loads(bench.QUIET[0].read_text())
    for axis in bench.NOISE_AXES:
        loops = [bench.open_loops(name, data, axis) for name in ("a", "b", "c")]
        errors, onsets, covered = bench.median_of_others(loops)
        assert len(covered) == 3 * len(loops[0].measured)
        assert all(e == pytest.approx(0.0, abs=1e-12) for v in errors.values() for e in v), axis
        assert all(m == p for m, p in onsets)
    opened = [r for r in data["runs"] if r["kind"] == "open"]
    loops = bench.open_loops("a", data)
    for (r0, _), (r1, _) in itertools.pairwise(loops.measured):
        at = 0.3 * r0 + 0.7 * r1
        expected = bench._interpolated(opened, at).values
        got = bench._linear(loops.measured, at)
        assert {k: got[k] for k in expected} == pytest.approx(expected), at
    assert bench._linear(loops.measured, loops.measured[0][0] - 0.01) is None


def test_common_grid_of_the_stored_quiet_runs_stays_inside_what_they_measured() -> None:
    """The grid in rate: every point an offered rate some file measured, inside every file's range (all files) or
    at least three (`--min-files 3`, more points), or (`--even`) evenly spaced over the same span; in share of the
    closed loop's rate: RATE_SHARES."""
    bench = _bench()
    loops = [bench.open_loops(p.name, json.loads(p.read_text())) for p in bench.QUIET]
    measured = {x for o in loops for x, _ in o.measured}
    everyone, three = bench.common_grid(loops, len(loops)), bench.common_grid(loops, 3)
    assert set(everyone) <= set(three) <= measured and len(three) > len(everyone) > 0
    for x in everyone:
        assert all(o.measured[0][0] <= x <= o.measured[-1][0] for o in loops), x
    even = bench.common_grid(loops, len(loops), even=5)
    assert even[0] == everyone[0] and even[-1] == pytest.approx(everyone[-1]) and len(even) == 5
    assert all(b - a == pytest.approx(even[1] - even[0]) for a, b in itertools.pairwise(even))
    shares = [bench.open_loops(p.name, json.loads(p.read_text()), "share_of_closed") for p in bench.QUIET]
    assert bench.common_grid(shares, len(shares)) == list(bench.RATE_SHARES)


def test_noise_reads_a_stored_fit_and_predicts_each_open_loop_run_with_it(tmp_path) -> None:
    """`noise --fits`: a calibration stored under a file's key is the one its open loops are replayed with (no fit:
    the replay's figures are `_predicted` under it, run by run), and a file whose closed loops differ has another
    key; `--one-fit` refuses files measured on different servers, naming the field."""
    bench = _bench()
    data = json.loads(bench.QUIET[0].read_text())
    perf, dep, workload = bench._setup(data, tmp_path)
    stored = perf.calibration.model_copy(update={"step_overhead_ms": 2.5, "request_overhead_ms": 4.0})
    fits = tmp_path / "fits.json"
    fits.write_text(json.dumps({bench._fit_key([data]): stored.model_dump(mode="json")}))
    loops = bench.predicted_loops({"a": data}, fits=fits)[0]
    model = perf.with_calibration(stored)
    runs = sorted((r for r in data["runs"] if r["kind"] == "open"), key=lambda r: r["rate_rps"])
    for run, (rate, predicted) in zip(runs, loops.predicted, strict=True):
        assert rate == run["rate_rps"]
        assert predicted == bench._predicted(bench._predict(model, dep, workload, run))
    other = json.loads(bench.QUIET[1].read_text())
    assert bench._fit_key([other]) != bench._fit_key([data])
    with pytest.raises(SystemExit, match="flags"):
        bench.predicted_loops({"a": data, "b": {**other, "flags": {**other["flags"], "max_num_seqs": 8}}},
                              one_fit=True, fits=fits)


def test_a_stored_fit_is_keyed_by_the_code_that_fits_it(tmp_path, monkeypatch) -> None:
    """`noise --fits` keeps calibrations across runs, so its key holds the code a fit runs: a change of this file's
    fitting functions or settings, or of a tuner package the fit imports (the replay, the perf model, the GPU
    catalog), gives another key, and a change of a view beside the fit, or of a package the fit does not import, or
    of where the checkout stands, does not."""
    import shutil

    bench = _bench()
    data = json.loads(bench.QUIET[0].read_text())
    key = bench._fit_key([data])

    def unchanged() -> bool:
        return bench._fit_key([data]) == key

    def edited(text: str) -> str:  # the same code, one line longer
        return text + "\n# edited\n"

    for name, value in (("_residuals", lambda perf, dep, workload, runs: []), ("CORE_SHARE", 0.5),
                        ("ENGINE_WEIGHT", 0.0), ("noise_figures", lambda label, errors, onsets: {})):
        with monkeypatch.context() as m:
            m.setattr(bench, name, value)
            assert unchanged() == (name == "noise_figures"), name
    copy = tmp_path / "tuner"
    shutil.copytree(bench.REPO / "tuner", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bench, "TUNER", copy, raising=False)
    assert unchanged()
    for part, fitted in (("replay/_engine.py", True), ("perf/_roofline.py", True), ("hardware/gpus.yaml", True),
                         ("workload/_trace.py", True), ("topology.py", True), ("cli/__init__.py", False)):
        original = (copy / part).read_text()
        (copy / part).write_text(edited(original))
        assert unchanged() != fitted, part
        (copy / part).write_text(original)


def test_error_split_puts_a_bias_in_the_shared_part_and_noise_in_the_file_to_file_part() -> None:
    """A replay 1.2 times each file's own figures: all of its log error is shared by the files (log 1.2, less no
    noise), none file to file. A replay at the truth for files at 0.9, 1.0, 1.1 times it: the file-to-file part is
    the files' own scatter, and what the files share is about no more than a 3-file mean's noise."""
    import math

    bench = _bench()
    biased = [_loops(bench, name, f, predicted=1.2 * f) for name, f in (("low", 0.9), ("mid", 1.0), ("high", 1.1))]
    split = bench.error_split(biased, list(RATES))
    for k in bench.FIT_METRICS:
        assert split[k]["shared"] == pytest.approx(math.log(1.2)) and split[k]["file_to_file"] == pytest.approx(0.0)
        assert split[k]["shared_less_noise"] == pytest.approx(math.log(1.2))
        assert split[k]["file_share"] == pytest.approx(0.0, abs=1e-12)
    noisy = [_loops(bench, name, f, predicted=1.0) for name, f in (("low", 0.9), ("mid", 1.0), ("high", 1.1))]
    split = bench.error_split(noisy, list(RATES))["ttft_p50"]
    assert split["file_to_file"] == pytest.approx(split["measured_scatter"]) and split["file_to_file"] > 0.09
    assert split["shared_less_noise"] == 0.0 and split["file_share"] == 1.0


def test_other_fits_of_two_copies_of_a_file_are_its_own_fit(tmp_path) -> None:
    """`other_fits` replays each file with the other's calibration: for two copies of one file (one key, one stored
    fit) that is each copy's own fit, so its errors are the own-fit ones twice over."""
    bench = _bench()
    data = json.loads(bench.QUIET[0].read_text())
    perf = bench._setup(data, tmp_path)[0]
    stored = perf.calibration.model_copy(update={"step_overhead_ms": 3.0, "request_overhead_ms": 5.0})
    fits = tmp_path / "fits.json"
    fits.write_text(json.dumps({bench._fit_key([data]): stored.model_dump(mode="json")}))
    sets = {"a": data, "b": data}
    own, own_onsets = bench._replay_per_run(bench.predicted_loops(sets, fits=fits))
    errors, onsets = bench.other_fits(sets, fits)
    for k in bench.FIT_METRICS:
        assert sorted(errors[k]) == pytest.approx(sorted(own[k])) and len(errors[k]) == 12, k
    assert onsets == own_onsets


def _counted_run(kind: str, decodes_a_step: float, gap_ms: float, concurrency: int | None = None) -> dict:
    """A run whose vLLM counters give `decodes_a_step` decode tokens per engine step and a mean gap of `gap_ms`."""
    steps, gaps = 1000.0, 1000.0 * decodes_a_step
    run = {"kind": kind, "counters": {"iteration_tokens_total_count": steps, "inter_token_latency_seconds_count": gaps,
                                      "inter_token_latency_seconds_sum": gaps * gap_ms / 1000}}
    return run | ({"concurrency": concurrency} if concurrency else {})


def test_closed_loop_steps_are_held_against_open_loops_at_the_same_decode_batch(tmp_path) -> None:
    """`steps`: open loops at 1 and 3 decodes a step (2 and 4 ms gaps); a closed loop at 2 decodes with a 3.6 ms gap is
    x1.2 the open loops' 3 ms there; one at 5 decodes (past every open loop) is left out, not extrapolated."""
    bench = _bench()
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [
        _counted_run("open", 1.0, 2.0), _counted_run("open", 3.0, 4.0),
        _counted_run("closed", 2.0, 3.6, concurrency=2), _counted_run("closed", 5.0, 9.0, concurrency=8)]}))
    assert bench.decode_batch_gap(_counted_run("open", 2.5, 3.5)) == pytest.approx((2.5, 3.5))
    assert bench.closed_open_steps([path]) == {"vllm": pytest.approx([1.2])}


def test_the_replays_decode_batch_of_one_request_alone(dense, h200) -> None:
    """`steps --replay` reads the replay as `decode_batch_gap` reads vLLM: one request of 200 tokens alone is one
    prefill step (its first token) and 199 decode steps, so 199 decode tokens over 200 steps, and the gap is the
    decode step's."""
    from tuner.deployment import parse_deployment
    from tuner.perf import RooflineModel
    from tuner.replay import ArrivalProcess, ReplayPlan, replay
    from tuner.workload import Workload

    report = replay(RooflineModel(dense, h200), ReplayPlan(
        deployment=parse_deployment("TP8"), workload=Workload.model_validate({"isl": 2000, "osl": 200}),
        arrival=ArrivalProcess("closed", concurrency=1), num_requests=1))
    batch, gap_ms = _bench().replay_decode_batch_gap(report)
    assert batch == pytest.approx(199 / 200)
    assert gap_ms == pytest.approx(report.itl_ms.p50, rel=0.02)


def _fixed_point(c: float, k: float) -> float:
    """d = c + k / d: a decode time whose share beside another request depends on its own length."""
    d = c
    for _ in range(200):
        d = c + k / d
    return d


def test_decode_events_gives_back_the_costs_the_decode_times_were_made_of() -> None:
    """`events`: decode times made of a 2.5 ms step, 0.2 ms a step per request decoding beside, and 6 / 4 / 3 ms per
    other request's send / first token / end inside the decode; groups far apart, each laid out so the terms vary
    apart (a send alone, a send and a first token, all three, an end alone, a request wholly beside another): the
    regression gives each cost back."""
    bench = _bench()
    step, beside, send, first, end = 2.5, 0.2, 6.0, 4.0, 3.0
    rows = []  # (sent, first token, last token, output tokens)
    for group, gaps in enumerate((30.0, 45.0, 60.0)):
        t = 100_000.0 * group
        rows.append((t, t + 10, t + 10 + step * gaps, gaps + 1))  # alone
        t += 20_000
        d = step * gaps + send  # another's send inside, its first token after this one's end
        rows += [(t, t + 10, t + 10 + d, gaps + 1), (t + 10 + d - 1, t + 20 + d, t + 20 + d + step * 20, 21)]
        t += 20_000
        # another sent 5 ms and first token 15 ms into this one's decode, ending after it
        d = _fixed_point(step * gaps + beside * gaps + send + first, -beside * gaps * 15)
        rows.append((t - 10, t, t + d, gaps + 1))
        other = gaps + 20
        d_other = _fixed_point(step * other + end, beside * other * (d - 15))
        rows.append((t + 5, t + 15, t + 15 + d_other, other + 1))
        assert t + 15 + d_other > t + d
        t += 20_000
        # another wholly inside this one's decode: sent, first token and end inside it
        inner = step * 11 + beside * 11
        d = _fixed_point(step * gaps + send + first + end, beside * gaps * inner)
        rows += [(t - 10, t, t + d, gaps + 1), (t + 5, t + 10, t + 10 + inner, 12)]
    coef, se = bench.decode_events(np.array(rows))
    assert coef == pytest.approx([step, beside, send, first, end], abs=1e-6)
    assert np.all(se < 1e-6)


def test_lone_decode_splits_a_closed_loops_decode_times_into_per_gap_and_per_request() -> None:
    bench = _bench()
    gaps = np.array([15.0, 30.0, 45.0, 63.0])
    assert bench.lone_decode(3.2 * gaps + 4.0, gaps) == pytest.approx((3.2, 4.0))


def test_vllm_requests_are_sent_when_the_rescaled_trace_schedules_them() -> None:
    """AIPerf's records matched to trace rows by (input, output) length, sent at the trace's time rescaled to the run's
    rate (`_rescaled`: 3 rows over 2 s at 2 req/s -> x0.5); a length pair two rows share is left out."""
    bench = _bench()
    trace = [{"timestamp": 0.0, "input_length": 100, "output_length": 10},
             {"timestamp": 1000.0, "input_length": 200, "output_length": 20},
             {"timestamp": 2000.0, "input_length": 300, "output_length": 30},
             {"timestamp": 3000.0, "input_length": 300, "output_length": 30}]
    records = [{"input_sequence_length": n, "output_sequence_length": n // 10, "time_to_first_token": 5.0,
                "request_latency": 50.0 + n} for n in (200, 300, 100)]
    times = bench.vllm_request_times({"trace": trace}, {"rate_rps": 2.0, "requests": records})
    # (4 - 1) / 2 req/s = 1.5 s over a 3 s trace: x0.5
    assert times.tolist() == [[500.0, 505.0, 750.0, 20.0], [0.0, 5.0, 150.0, 10.0]]


def test_an_aiperf_record_keeps_its_send_time_and_chunk_gaps_and_events_reads_them() -> None:
    """`measure` keeps AIPerf 0.13's send time (metadata.request_start_ns) and the chunks' gaps beside the latencies;
    a failed request is dropped; `events` places requests at their stored send times (ms from the first), not at the
    trace's schedule."""
    bench = _bench()
    row = {"metadata": {"request_start_ns": 2_000_000_000, "request_end_ns": 2_100_000_000},
           "metrics": {"time_to_first_token": {"value": 5.0, "unit": "ms"},
                       "request_latency": {"value": 100.0, "unit": "ms"},
                       "inter_token_latency": {"value": 2.5, "unit": "ms"},
                       "output_sequence_length": {"value": 39, "unit": "tokens"},
                       "input_sequence_length": {"value": 300, "unit": "tokens"},
                       "inter_chunk_latency": {"value": [2.0, 3.0], "unit": "ms"},
                       "request_count": {"value": 1, "unit": "requests"}}}
    record = bench.aiperf_record(row)
    assert record == {"time_to_first_token": 5.0, "request_latency": 100.0, "inter_token_latency": 2.5,
                      "output_sequence_length": 39, "input_sequence_length": 300,
                      "inter_chunk_latency": [2.0, 3.0], "request_start_ns": 2_000_000_000}
    assert bench.aiperf_record({**row, "error": {"code": 500}}) is None
    later = record | {"request_start_ns": 2_250_000_000}
    times = bench.vllm_request_times({"trace": []}, {"rate_rps": 1.0, "requests": [later, record]})
    assert times.tolist() == [[250.0, 255.0, 350.0, 39.0], [0.0, 5.0, 100.0, 39.0]]
