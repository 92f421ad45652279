"""GPU specs: a built-in catalog plus user YAML files."""

from tuner.hardware._catalog import (
    GpuSpec,
    HardwareCatalog,
    ScaleOutNetwork,
    default_catalog,
    get_gpu,
    gpu_architecture,
    has_multi_node_nvlink,
)

__all__ = ["GpuSpec", "HardwareCatalog", "ScaleOutNetwork", "default_catalog", "get_gpu",
           "gpu_architecture", "has_multi_node_nvlink"]
