from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner._yaml import safe_load_bounded
from tuner.errors import ConfigError, config_error
from tuner.files import read_text

MAX_HARDWARE_FILE_BYTES = 256 * 1024  # the built-in catalog of every GPU is under 4 KiB

ComputeDtype = Literal["fp4", "fp8", "bf16"]
Fabric = Literal["infiniband", "roce", "efa", "tcp"]
GIB = 1024**3
#: Fabrics DeepEP's internode and low-latency kernels run on: NVSHMEM/NCCL-GIN over InfiniBand verbs, which RoCE
#: also speaks (DeepEP docs/legacy.md "Network Configurations": fully tested on InfiniBand, compatible with RoCE).
RDMA_FABRICS: tuple[str, ...] = ("infiniband", "roce")


class ScaleOutNetwork(BaseModel):
    """The host's network to other hosts (outside the NVLink domain): what a multi-host EP group runs over."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nics_per_host: int = Field(gt=0, description="RDMA NICs per host (HGX H100/H200/B200: 8, one per GPU).")
    nic_gbit_s: float = Field(gt=0, description="Line rate of one NIC port, Gbit/s (ConnectX-7: 400).")
    fabric: Fabric = Field("infiniband", description="infiniband, roce, efa or tcp.")
    gpudirect_rdma: bool = Field(True, description="NICs read and write GPU memory directly (GPUDirect RDMA; "
                                                   "DeepEP's internode kernels need it, with IBGDA).")

    @property
    def rdma(self) -> bool:
        """DeepEP can cross hosts on this network: an RDMA fabric with GPUDirect RDMA."""
        return self.fabric in RDMA_FABRICS and self.gpudirect_rdma

    def gb_s_per_gpu(self, gpus_per_host: int) -> float:
        """Per-direction bytes/s share of one GPU, GB/s (NICs split evenly over the host's GPUs)."""
        return self.nics_per_host * self.nic_gbit_s / 8 / gpus_per_host


class GpuSpec(BaseModel):
    """One GPU model and the host/NVLink-domain it ships in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9_\-]+$")
    description: str = ""
    architecture: Literal["blackwell", "hopper", "ampere", "cpu", "other"] = "other"
    memory_gib: float = Field(gt=0, description="Memory the driver reports per GPU.")
    hbm_bandwidth_tb_s: float = Field(gt=0)
    peak_tflops: dict[ComputeDtype, float] = Field(description="Dense tensor-core peak per dtype.")
    nvlink_bandwidth_gb_s: float = Field(gt=0, description="Per GPU, both directions.")
    inter_host_bandwidth_gb_s: float = Field(gt=0, description=(
        "Per GPU and direction, outside the NVLink domain, GB/s; derived from `scale_out` when that is given."))
    gpus_per_host: int = Field(gt=0)
    nvlink_domain_gpus: int = Field(gt=0)
    non_torch_memory_gib: float = Field(ge=0, description="Driver, CUDA context, NCCL buffers.")
    sm_count: int | None = Field(None, gt=0, description=(
        "Streaming multiprocessors per GPU; a communication kernel that holds some of them (DeepEP's normal "
        "kernels) leaves the rest to the compute it overlaps. None: unknown, no such share is priced."))
    scale_out: ScaleOutNetwork | None = Field(None, description=(
        "The host's RDMA network (NICs, link speed, fabric, GPUDirect RDMA); None: only inter_host_bandwidth_gb_s "
        "is known (old files), priced as an InfiniBand fabric with GPUDirect RDMA."))

    @model_validator(mode="before")
    @classmethod
    def _derive_inter_host(cls, data: object) -> object:
        """inter_host_bandwidth_gb_s follows from scale_out; given both, they must agree (one truth per GPU)."""
        if not isinstance(data, dict) or not isinstance(data.get("scale_out"), dict):
            return data
        try:
            net = ScaleOutNetwork.model_validate(data["scale_out"])
            per_gpu = net.gb_s_per_gpu(int(data["gpus_per_host"]))
        except (ValidationError, KeyError, TypeError, ValueError, ZeroDivisionError):
            return data  # field validation reports the bad entry by name
        given = data.get("inter_host_bandwidth_gb_s")
        if given is None:
            return {**data, "inter_host_bandwidth_gb_s": per_gpu}
        if abs(float(given) - per_gpu) > 0.01 * per_gpu:
            raise ValueError(f"inter_host_bandwidth_gb_s {given} disagrees with scale_out ({per_gpu:g} GB/s per GPU "
                             "= nics_per_host x nic_gbit_s / 8 / gpus_per_host); give one of them")
        return data

    @property
    def network(self) -> ScaleOutNetwork:
        """The scale-out network; an old entry's single figure reads as one InfiniBand NIC per GPU at that rate."""
        if self.scale_out is not None:
            return self.scale_out
        return ScaleOutNetwork(nics_per_host=self.gpus_per_host, nic_gbit_s=self.inter_host_bandwidth_gb_s * 8)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def tflops(self, dtype: ComputeDtype) -> float:
        """Peak for dtype; GPUs without FP4 tensor cores run FP4 weights at the FP8 rate."""
        for candidate in (dtype, "fp8", "bf16"):
            if candidate in self.peak_tflops:
                return self.peak_tflops[candidate]
        raise ConfigError("no peak_tflops entry", field=f"{self.name}.peak_tflops", fix="add bf16: <TFLOP/s>")


class HardwareCatalog:
    """Name -> GpuSpec; the built-in YAML first, user files override by name."""

    def __init__(self, gpus: dict[str, GpuSpec]) -> None:
        self._gpus = dict(gpus)

    @staticmethod
    def _parse(data: object, source: str) -> dict[str, GpuSpec]:
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            raise ConfigError("expected a mapping with a list under 'gpus:'", field=source,
                              fix="write `gpus:` followed by one entry per GPU")
        out: dict[str, GpuSpec] = {}
        for i, entry in enumerate(data["gpus"]):
            try:
                gpu = GpuSpec.model_validate(entry)
            except ValidationError as exc:
                raise config_error(exc, f"{source}: gpus[{i}]",
                                   fix="see tuner/hardware/gpus.yaml for the schema") from exc
            out[gpu.name] = gpu
        return out

    @classmethod
    def builtin(cls) -> HardwareCatalog:
        text = resources.files("tuner.hardware").joinpath("gpus.yaml").read_text()
        # our own file: libyaml's safe loader when present (the same data, a few ms less on every command's start)
        return cls(cls._parse(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), "gpus.yaml"))

    def with_file(self, path: str | Path) -> HardwareCatalog:
        """The catalog with a user's GPUs over it, the file read like every YAML a user hands topotune: a regular
        file under its size bound (tuner/files.py), aliases and nesting bounded (tuner/_yaml.py)."""
        text = read_text(path, max_bytes=MAX_HARDWARE_FILE_BYTES, field="--hardware-file",
                         fix="a hardware file lists a few GPUs: see tuner/hardware/gpus.yaml",
                         what="a YAML file of GPUs")
        data = safe_load_bounded(text, str(path), what="the hardware file", example="tuner/hardware/gpus.yaml")
        return HardwareCatalog({**self._gpus, **self._parse(data, str(path))})

    def get(self, name: str) -> GpuSpec:
        key = name.strip().lower()
        if key not in self._gpus:
            raise ConfigError(f"unknown hardware {name!r}", field="hardware",
                              fix=f"use one of {', '.join(sorted(self._gpus))} or add it with a YAML file")
        return self._gpus[key]

    def names(self) -> list[str]:
        return sorted(self._gpus)


@lru_cache(maxsize=1)
def default_catalog() -> HardwareCatalog:
    return HardwareCatalog.builtin()


def get_gpu(name: str, hardware_file: str | Path | None = None) -> GpuSpec:
    catalog = default_catalog()
    if hardware_file is not None:
        catalog = catalog.with_file(hardware_file)
    return catalog.get(name)


def gpu_architecture(gpu: str) -> str | None:
    """The catalog's architecture of a GPU name (None: not in the catalog)."""
    try:
        return get_gpu(gpu).architecture
    except Exception:  # an unknown GPU name: the caller's default
        return None


def has_multi_node_nvlink(device: str, gpu: str) -> bool:
    """GB200/GB300 NVL72: the NVLink domain spans hosts, so NIXL's UCX runs over multi-node NVLink (only on
    CUDA devices; an unknown GPU name has none)."""
    if device != "cuda":
        return False
    try:
        spec = get_gpu(gpu)
    except Exception:  # an unknown GPU name: no multi-node NVLink settings
        return False
    return spec.nvlink_domain_gpus > spec.gpus_per_host
