"""`topotune doctor`: a preflight of the cluster a real campaign will use, before any GPU time is spent."""

from tuner.doctor._checks import CheckResult, CheckStatus
from tuner.doctor._probe import NodeFacts, ProbeRequest, probe_node
from tuner.doctor._run import DoctorReport, FirstTrial, backend_settings, run_doctor

__all__ = ["CheckResult", "CheckStatus", "DoctorReport", "FirstTrial", "NodeFacts", "ProbeRequest",
           "backend_settings", "probe_node", "run_doctor"]
