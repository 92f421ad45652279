from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import ConfigError

ComputeDtype = Literal["fp4", "fp8", "bf16"]
GIB = 1024**3


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
    inter_host_bandwidth_gb_s: float = Field(gt=0, description="Per GPU, outside the NVLink domain.")
    gpus_per_host: int = Field(gt=0)
    nvlink_domain_gpus: int = Field(gt=0)
    non_torch_memory_gib: float = Field(ge=0, description="Driver, CUDA context, NCCL buffers.")

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
    def _parse(text: str, source: str) -> dict[str, GpuSpec]:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"not valid YAML: {exc}", field=source, fix="fix the YAML syntax") from exc
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            raise ConfigError("expected a mapping with a list under 'gpus:'", field=source,
                              fix="write `gpus:` followed by one entry per GPU")
        out: dict[str, GpuSpec] = {}
        for i, entry in enumerate(data["gpus"]):
            try:
                gpu = GpuSpec.model_validate(entry)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"])
                raise ConfigError(err["msg"], field=f"{source}: gpus[{i}].{loc}",
                                  fix="see tuner/hardware/gpus.yaml for the schema") from exc
            out[gpu.name] = gpu
        return out

    @classmethod
    def builtin(cls) -> HardwareCatalog:
        text = resources.files("tuner.hardware").joinpath("gpus.yaml").read_text()
        return cls(cls._parse(text, "gpus.yaml"))

    def with_file(self, path: str | Path) -> HardwareCatalog:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}", field="--hardware-file",
                              fix="give the path of a readable YAML file") from exc
        return HardwareCatalog({**self._gpus, **self._parse(text, str(path))})

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
