"""Names a package exports but loads on first use (PEP 562): a short command imports only what it runs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module `__getattr__`: each name in `homes` is imported from its submodule (`homes[name]`,
    relative to `package`) when first read, then kept in the package like an eager import."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
