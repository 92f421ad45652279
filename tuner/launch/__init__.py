"""Starting and stopping the processes of a trial, neutral to which backend asked and which executor runs it.

Used by the vLLM backend (its processes on this machine) and by the executors' host agents (each process on the
host Ray placed it on). A backend says what its logs mean with a `ProcessPolicy`. Their ports come from
free_port_block, and start_on_free_ports starts them again on a fresh block when another process took one first.
"""

from tuner.launch._alive import alive_pids, process_alive
from tuner.launch._ports import PORT_ATTEMPTS, PortsLost, free_port_block, lost_port, start_on_free_ports
from tuner.launch._process import (
    Failure,
    LaunchSpec,
    LocalStarter,
    LogClassifier,
    ProcessHandle,
    ProcessPolicy,
    ProcessStarter,
    RunningProcess,
    classify_exit,
    clean_temp_files,
    http_ok,
    start_process,
    temp_files_snapshot,
    terminate,
    wait_healthy,
)

__all__ = [
    "PORT_ATTEMPTS",
    "Failure",
    "LaunchSpec",
    "LocalStarter",
    "LogClassifier",
    "PortsLost",
    "ProcessHandle",
    "ProcessPolicy",
    "ProcessStarter",
    "RunningProcess",
    "alive_pids",
    "classify_exit",
    "clean_temp_files",
    "free_port_block",
    "http_ok",
    "lost_port",
    "process_alive",
    "start_on_free_ports",
    "start_process",
    "temp_files_snapshot",
    "terminate",
    "wait_healthy",
]
