"""The runner's view of a host agent (AgentProcess): a slow agent is asked again, a dead one is lost when Ray says so.

A real Ray actor stands in for the host's HostAgent (same method names, answers on demand), so the timeouts are
Ray's own: a loaded CI host once took over a minute to answer one status call while the trial's servers pinned
both cores, and the old rule (no answer within 60 s: lost) crashed a trial that was healthy.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tuner.backends import TrialStatus
from tuner.executors._starter import AgentProcess

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _agent_process(agent: object, *, call_timeout_s: float, silence_limit_s: float) -> AgentProcess:
    record = {"node_id": "n" * 16, "pid": 1, "log_path": "/nonexistent/server.log"}
    spec = SimpleNamespace(name="prefill0")  # AgentProcess reads only the name
    return AgentProcess(agent, "tok", spec, record, call_timeout_s=call_timeout_s,  # type: ignore[arg-type]
                        silence_limit_s=silence_limit_s)


def _slow_agent(delay_s: float, then_delay_s: float | None = None) -> object:
    import ray

    class SlowAgent:
        """Answers status/log_text after `delay_s` (status: `then_delay_s` from its second call on, when given),
        like a starved host agent (a local class: Ray pickles it by value, as workers cannot import the tests)."""

        def __init__(self) -> None:
            self.delay_s = 0.0
            self.then_delay_s: float | None = None

        def set_delay(self, delay_s: float, then_delay_s: float | None) -> None:
            self.delay_s, self.then_delay_s = delay_s, then_delay_s

        def status(self, token: str, name: str) -> dict:
            delay_s = self.delay_s
            if self.then_delay_s is not None:
                self.delay_s = self.then_delay_s
            time.sleep(delay_s)
            return {"returncode": None, "failure": None}

        def log_text(self, token: str, name: str, max_bytes: int) -> str:
            time.sleep(self.delay_s)
            return f"log of {name}"

    agent = ray.remote(SlowAgent).options(num_cpus=0, max_concurrency=4).remote()
    ray.get(agent.set_delay.remote(delay_s, then_delay_s))
    return agent


def test_an_agent_slower_than_one_call_is_asked_again_not_lost() -> None:
    proc = _agent_process(_slow_agent(1.5), call_timeout_s=0.2, silence_limit_s=120.0)
    assert proc.failure() is None  # timed out, but silent for far less than the limit
    assert proc.log_text() == "log of prefill0"  # waited for, not read as empty


def test_an_agent_silent_past_the_limit_is_lost() -> None:
    proc = _agent_process(_slow_agent(60.0), call_timeout_s=0.2, silence_limit_s=1.0)
    time.sleep(1.2)  # no answer since the process was started
    failure = proc.failure()
    assert failure is not None and failure.status is TrialStatus.CRASHED
    assert "prefill0" in failure.reason and "answered nothing for" in failure.reason


def test_an_answer_restarts_the_silence_clock() -> None:
    # the first status call answers at once, every later one after 60 s: no round trip to the agent between the
    # answer and the slow call, so 4 s of silence limit leave 3.7 s of margin however loaded the host
    proc = _agent_process(_slow_agent(0.0, then_delay_s=60.0), call_timeout_s=120.0, silence_limit_s=4.0)
    time.sleep(4.5)  # silent that long only because nobody asked
    assert proc.failure() is None  # answered: the clock starts again
    proc.call_timeout_s = 0.3
    assert proc.failure() is None  # slow now, but silent for far less than the limit since the last answer


def test_a_dead_agent_is_lost_when_ray_says_so_not_at_the_silence_limit() -> None:
    import ray

    agent = _slow_agent(0.0)
    ray.kill(agent, no_restart=True)
    proc = _agent_process(agent, call_timeout_s=5.0, silence_limit_s=3600.0)
    failure = None
    deadline = time.monotonic() + 600.0
    while failure is None and time.monotonic() < deadline:
        failure = proc.failure()  # None while Ray has not told this caller yet (seconds; more on a loaded host)
    assert failure is not None and failure.status is TrialStatus.CRASHED
    assert "lost (" in failure.reason  # Ray's verdict (its error named), not the hour-long silence limit's
    assert proc.log_text() == ""
