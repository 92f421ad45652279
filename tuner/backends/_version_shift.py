"""An emulated vLLM release for the simulated backends, so re-verification is tested end to end without GPUs.

A new vLLM changes kernels, schedulers and defaults: some layouts get faster, some slower, a few stop starting.
`VersionShift(from_version, to_version)` is that change, drawn deterministically from the two version names:

- a share CHANGED_SHARE of parallel layouts (tp, dp, ep, mtp) changes speed, each by a step-time factor whose
  size is drawn in SHIFT_SPREAD (x or / with equal odds); the others keep their speed exactly (factor 1);
- a share STOP_STARTING_RATE of configurations (layout and memory flags) no longer starts (it crashes at start-up
  every time, like a removed kernel or a flag the new version refuses).

The same names always give the same shift (seeded by both), and the same version gives none (identity). Rates
scale by 1/factor and latencies by factor, as the hidden truth's per-layout factor does (tuner/backends/_truth.py).
Only the simulated backends read it; tests read its factors to compute what a re-verification must report.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from tuner.topology import Topology

# The version a simulated backend runs when nothing names one: the newest vLLM the version table was checked
# against (tuner.backends.vllm._versions.NEWEST_CHECKED; a test keeps the two equal, this module stays free of the
# vllm package).
SIMULATED_VLLM_VERSION = "0.32.0"
CHANGED_SHARE = 0.5  # layouts whose speed changes on the new version
SHIFT_SPREAD = (1.12, 1.35)  # a changed layout's step time is x or / a factor in this range
STOP_STARTING_RATE = 0.10  # configurations that no longer start on the new version


def _seeded(*key: object) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


@dataclass(frozen=True)
class VersionShift:
    """How `to_version` differs from `from_version` on a simulated cluster (identity when they are equal)."""

    from_version: str
    to_version: str
    changed_share: float = CHANGED_SHARE
    spread: tuple[float, float] = SHIFT_SPREAD
    stop_starting_rate: float = STOP_STARTING_RATE

    @property
    def identity(self) -> bool:
        return self.from_version == self.to_version

    def step_factor(self, topo: Topology) -> float:
        """The new version's step time over the old one's for this layout (>1: slower, 1: unchanged)."""
        if self.identity:
            return 1.0
        rng = _seeded("vllm-shift", self.from_version, self.to_version, topo.tp, topo.dp, topo.ep, topo.mtp)
        changed, size, slower = rng.random() < self.changed_share, rng.uniform(*self.spread), rng.random() < 0.5
        if not changed:
            return 1.0
        return float(size) if slower else float(1.0 / size)

    def stops_starting(self, topo: Topology) -> bool:
        """Whether this configuration crashes at start-up on the new version (fixed per configuration)."""
        if self.identity:
            return False
        key = (topo.tp, topo.dp, topo.ep, topo.mtp, topo.gpu_memory_utilization, topo.max_num_seqs,
               topo.max_num_batched_tokens)
        return bool(_seeded("vllm-shift-start", self.from_version, self.to_version, *key).random()
                    < self.stop_starting_rate)
