"""How the doctor runs a tool (`vllm --version`, ...): stopped when it burns its CPU budget or stops using CPU, not
by a short clock while it works (on a loaded CI host vLLM's import took over 180 s of wall time)."""

from __future__ import annotations

import sys
import time

from tuner.doctor._probe import _cpu_seconds, _run


def test_a_tool_that_answers_gives_its_output() -> None:
    code, out = _run([sys.executable, "-c", "import sys; print('ok'); print('warn', file=sys.stderr)"], 60.0)
    assert code == 0 and [ln for ln in out.splitlines() if ln] == ["ok", "warn"]


def test_a_tool_spinning_past_its_cpu_budget_is_stopped() -> None:
    started = time.monotonic()
    code, out = _run([sys.executable, "-c", "while True: pass"], 120.0, cpu_limit_s=1.0)
    assert code == -1 and out.endswith("its CPU budget")
    assert time.monotonic() - started < 60.0  # the CPU budget ended it, not the 120 s clock


def test_a_tool_that_waits_without_using_cpu_is_stopped() -> None:
    code, out = _run([sys.executable, "-c", "import time; time.sleep(60)"], 120.0, cpu_limit_s=100.0, stall_s=3.0)
    assert code == -1 and out.startswith("timed out after") and "no CPU use for" in out


def test_the_time_limit_caps_any_run() -> None:
    code, out = _run([sys.executable, "-c", "import time; time.sleep(60)"], 1.5, stall_s=100.0)
    assert code == -1 and out.endswith("the time limit")


def test_cpu_seconds_of_this_process_are_read() -> None:
    import os

    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert _cpu_seconds(os.getpid()) >= 0.3
    assert _cpu_seconds(2**22 + 7) == 0.0  # no such process
