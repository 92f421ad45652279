"""Starting and stopping the processes of a trial, neutral to which backend asked and which executor runs it."""

from tuner.launch._alive import alive_pids, process_alive

__all__ = ["alive_pids", "process_alive"]
