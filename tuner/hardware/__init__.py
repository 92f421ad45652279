"""GPU specs: a built-in catalog plus user YAML files."""

from tuner.hardware._catalog import (
    GpuSpec,
    HardwareCatalog,
    default_catalog,
    get_gpu,
)

__all__ = ["GpuSpec", "HardwareCatalog", "default_catalog", "get_gpu"]
