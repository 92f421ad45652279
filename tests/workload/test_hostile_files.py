"""Hostile trace and workload files (issue 47): each gives a clear error (exit 2, naming the file, the line, the
field and the fix), never a traceback, a hang or unbounded memory. Big files are sparse (truncate); FIFOs are made
and removed by the test; where a hang is the failure the command runs in a subprocess with a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import ConfigError
from tuner.workload import Workload, read_trace, summarise_trace

REPO = Path(__file__).resolve().parents[2]
_CHILD_TIMEOUT_S = 120  # far above a refusal; only a hang reaches it


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.err + captured.out


_PEAK = "peak-rss-kib:"


def _child(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """`topotune ARGS` in a child process; its result and the child's own peak memory (KiB, as it reports it).

    The peak is /proc's VmHWM, which starts afresh at exec: getrusage's ru_maxrss survives execve on Linux, so a
    child of a large pytest process would report its parent's size."""
    code = ("import re, sys; from tuner.cli import main; code = main(sys.argv[1:]); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]; "
            f"print({_PEAK!r}, hwm, file=sys.stderr); sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=_CHILD_TIMEOUT_S, check=False)
    peak = next((int(line.split()[-1]) for line in done.stderr.splitlines() if line.startswith(_PEAK)), -1)
    return done, peak


def _refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stderr + done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert all(n in done.stderr for n in needles), done.stderr


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_non_finite_lengths_name_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                value: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 5, "output_length": 1}\n'
                     f'{{"input_length": {value}, "output_length": 1}}\n')
    code, out = _cli(capsys, "workload", str(trace))
    assert code == 2 and "Traceback" not in out
    assert "t.jsonl line 2: input_length" in out and "positive integer" in out and "fix:" in out


def test_a_directory_as_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.jsonl").mkdir()
    code, out = _cli(capsys, "workload", str(tmp_path / "d.jsonl"))
    assert code == 2 and "is a directory, not a regular file" in out and "fix:" in out


def test_a_deeply_nested_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "deep.jsonl"
    trace.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    code, out = _cli(capsys, "workload", str(trace))
    assert code == 2 and "deep.jsonl line 1" in out and "nested too deeply" in out


def test_a_huge_integer_is_not_json(tmp_path: Path) -> None:
    trace = tmp_path / "int.jsonl"
    trace.write_text('{"input_length": ' + "9" * 5000 + ', "output_length": 1}\n')
    with pytest.raises(ConfigError, match=r"int\.jsonl line 1"):
        summarise_trace(trace)


def test_non_utf8_workload_yaml_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml_file = tmp_path / "w.yaml"
    yaml_file.write_bytes(b"isl: 100\nosl: 10\n# \xff\n")
    code, out = _cli(capsys, "workload", str(yaml_file))
    assert code == 2 and "w.yaml line 3" in out and "not UTF-8" in out and "--workload" in out
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'{"input_length": 5, "output_length": 1}\n'
                      b'{"input_length": 5, "output_length": 1, "x": "\xfe"}\n')
    with pytest.raises(ConfigError, match=r"t\.jsonl line 2.*not UTF-8"):
        summarise_trace(trace)


def test_merge_key_bomb_in_a_workload_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """~600 bytes of merge keys that expand x10 per level (58 s and 1.7 GB before the guard)."""
    lines = ["a0: &a0 {" + ", ".join(f"k{i}: {i}" for i in range(10)) + "}"]
    lines += [f"a{n}: &a{n} {{<<: [*a{n - 1}], x{n}: [{', '.join([f'*a{n - 1}'] * 9)}]}}" for n in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nisl: 100\nosl: 10\n")
    assert bomb.stat().st_size < 1000
    code, out = _cli(capsys, "workload", str(bomb))
    assert code == 2 and "bomb.yaml" in out and "YAML nodes" in out


def test_dev_zero_is_refused() -> None:
    done, _ = _child("workload", "/dev/zero")
    _refused(done, "/dev/zero is a character device, not a regular file", "fix:")


@pytest.mark.parametrize("name", ["f.jsonl", "f.yaml", "f"])
def test_a_fifo_does_not_hang(tmp_path: Path, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    try:
        done, _ = _child("workload", str(fifo))
        _refused(done, "FIFO", "not a regular file")
    finally:
        fifo.unlink()


def test_a_huge_line_is_refused_while_read(tmp_path: Path) -> None:
    """A 1.5 GB file without a newline (sparse): refused after the first MB, not after 3.2 GB in memory."""
    big = tmp_path / "big.jsonl"
    with big.open("wb") as handle:
        handle.truncate(1500 * 2**20)
    done, peak_kib = _child("workload", str(big))
    _refused(done, "big.jsonl line 1", "more than 1,000,000 bytes on one line")
    assert 0 < peak_kib < 300 * 1024, peak_kib


def test_a_long_line_after_good_ones_is_refused_at_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'{"input_length": 5, "output_length": 1}\n' * 3 + b"x" * 3_000_000 + b"\n")
    with pytest.raises(ConfigError, match=r"t\.jsonl line 4: line"):
        summarise_trace(trace)


def test_over_two_gib_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "huge.jsonl"
    with big.open("wb") as handle:
        handle.truncate(2 * 2**30 + 1)
    with pytest.raises(ConfigError, match=r"at most 2\.0 GiB"):
        next(read_trace(big))


def test_request_cap_is_checked_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that could hold more than the cap is counted first: the refusal comes before any line is parsed
    (the cap scaled down so the file is small)."""
    import tuner.workload._trace as trace_module

    monkeypatch.setattr(trace_module, "MAX_TRACE_REQUESTS", 1000)
    trace = tmp_path / "many.jsonl"
    trace.write_bytes(b'{"input_length":1,"output_length":1}\n' * 1001)
    parsed: list[str] = []
    real_loads = trace_module.json.loads
    monkeypatch.setattr(trace_module.json, "loads", lambda text, **kw: parsed.append(text) or real_loads(text))
    with pytest.raises(ConfigError, match="more than 1,000 lines") as err:
        next(read_trace(trace))
    assert parsed == [] and err.value.field == "workload.trace"
    # exactly at the cap: read
    trace.write_bytes(b'{"input_length":1,"output_length":1}\n' * 1000)
    assert summarise_trace(trace).requests == 1000


def test_hash_ids_bounded_by_the_prompts_blocks(tmp_path: Path) -> None:
    trace = tmp_path / "h.jsonl"
    trace.write_text(json.dumps({"input_length": 1, "output_length": 1, "hash_ids": list(range(110_000))}) + "\n")
    with pytest.raises(ConfigError) as err:
        summarise_trace(trace)
    message = err.value.user_message()
    assert "h.jsonl line 1: hash_ids" in message and "110,000 block ids for a 1-token prompt" in message
    assert "ceil(input_length / 512)" in message
    # ceil(1025 / 512) = 3 blocks, one id of slack: 4 accepted, 5 refused
    trace.write_text(json.dumps({"input_length": 1025, "output_length": 1, "hash_ids": [1, 2, 3, 4]}) + "\n")
    assert summarise_trace(trace).requests == 1
    trace.write_text(json.dumps({"input_length": 1025, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]}) + "\n")
    with pytest.raises(ConfigError, match="hash_ids"):
        summarise_trace(trace)
    # the bound follows the trace's block size
    trace.write_text(json.dumps({"input_length": 1025, "output_length": 1, "hash_ids": list(range(60))}) + "\n")
    assert summarise_trace(trace, block_tokens=16).requests == 1


def test_flow_mapping_yaml_workload_is_yaml(tmp_path: Path) -> None:
    from tuner.cli._traffic import load_workload

    for name in ("flow", "flow.yaml", "flow.txt"):
        path = tmp_path / name
        path.write_text("{isl: 100, osl: 10}\n")
        assert load_workload(path, isl=1, osl=1, concurrency=(1,)) == Workload.fixed(100, 10, (1,))
    trace = tmp_path / "trace-without-suffix"
    trace.write_text('{"input_length": 100, "output_length": 10}\n')
    assert load_workload(trace, isl=1, osl=1, concurrency=(1,)).trace is not None


@pytest.mark.parametrize("rate", ["inf", "1,inf", "nan", "-inf"])
def test_request_rate_must_be_finite(rate: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tuner.cli._traffic import load_workload

    with pytest.raises(ConfigError) as err:
        load_workload(None, isl=100, osl=10, concurrency=(1,), request_rate=rate)
    assert err.value.field == "--request-rate" and "finite" in err.value.user_message()


@pytest.mark.parametrize("kind", ["fifo", "device", "deep"])
def test_a_model_path_that_is_not_a_config_is_refused(tmp_path: Path, kind: str) -> None:
    """The model's config.json goes through the same reader: a FIFO or a device is refused before it is opened."""
    if kind == "fifo":
        path = tmp_path / "config.json"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path = tmp_path / "config.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
    try:
        done, _ = _child("memory", str(path))
        _refused(done, "MODEL", "fix:")
    finally:
        if kind == "fifo":
            path.unlink()
