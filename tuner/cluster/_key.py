"""What a cluster's learnt calibration is keyed by: what transfers between models on the same hardware and stack."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.hardware import GpuSpec

UNKNOWN = "unknown"


@dataclass(frozen=True)
class ClusterKey:
    """A cluster as the calibration store sees it. Never the model: efficiencies, per-layout step factors and
    launch crashes are properties of the GPUs, the interconnect, the vLLM build and its kernels, so every model
    tuned on the same key teaches the next one."""

    name: str  # the operator's name for the cluster (default: derived from the GPU and its NVLink domain)
    gpu_class: str  # catalog name: gb300, h200, ...
    interconnect: str  # e.g. nvlink72+ib: NVLink domain size and scale-out fabric
    vllm_version: str  # the version the hosts run (unknown when the space does not pin it)
    kernel_family: str  # GPU architecture, which picks vLLM's kernels (blackwell, hopper, ...)

    @classmethod
    def of(cls, gpu: GpuSpec, vllm_version: str | None = None, name: str | None = None) -> ClusterKey:
        fabric = gpu.scale_out.fabric if gpu.scale_out is not None else "infiniband"
        interconnect = f"nvlink{gpu.nvlink_domain_gpus}+{fabric}"
        key = cls(name="", gpu_class=gpu.name, interconnect=interconnect, vllm_version=vllm_version or UNKNOWN,
                  kernel_family=gpu.architecture)
        return cls(name=name or key.default_name(), gpu_class=key.gpu_class, interconnect=key.interconnect,
                   vllm_version=key.vllm_version, kernel_family=key.kernel_family)

    def default_name(self) -> str:
        return f"{self.gpu_class}-{self.interconnect}"

    def __post_init__(self) -> None:
        for field, value in (("cluster", self.name), ("gpu_class", self.gpu_class)):
            if field == "cluster" and value == "":
                continue  # filled by `of`
            if not value or len(value) > 128:
                raise ConfigError(f"{field} {value!r} is empty or longer than 128 characters", field=field,
                                  fix="give a short name such as gb300-nvl72")

    def label(self) -> str:
        return (f"{self.name} ({self.gpu_class}, {self.interconnect}, vLLM {self.vllm_version}, "
                f"{self.kernel_family} kernels)")
