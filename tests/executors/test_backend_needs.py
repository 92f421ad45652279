"""Executors serve what a backend declares (ExecutorNeeds), never a backend's name or run() signature."""

from __future__ import annotations

import functools

from tuner.backends import ExecutorNeeds, SimulatedBackend, backend_class
from tuner.executors import BackendSpec
from tuner.testing import ProbeBackend


def test_needs_come_from_the_backend_class() -> None:
    from tuner.backends.vllm import VllmBackend

    assert backend_class("vllm") is VllmBackend and VllmBackend.needs == ExecutorNeeds(True, True)
    assert BackendSpec("vllm").executor_needs() == ExecutorNeeds(device_ids=True, process_starter=True)
    assert BackendSpec("simulated").executor_needs() == ExecutorNeeds()
    # a factory is judged by what it builds, whatever name the spec carries
    assert BackendSpec("anything", factory=functools.partial(VllmBackend)).executor_needs().process_starter
    assert BackendSpec("vllm", factory=SimulatedBackend).executor_needs() == ExecutorNeeds()
    assert BackendSpec("probe", factory=functools.partial(ProbeBackend, "/tmp/x")).executor_needs() == ExecutorNeeds()
    # an opaque factory says so explicitly
    told = ExecutorNeeds(process_starter=True)
    assert BackendSpec("probe", factory=lambda: SimulatedBackend(), needs=told).executor_needs() is told
