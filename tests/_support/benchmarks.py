"""The benchmark scripts, imported as modules by the tests that check them (they are not part of the library)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from _support.paths import REPO

BENCHMARKS = REPO / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as the module NAME, registered in sys.modules (dataclasses resolve their module by name),
    with benchmarks/ on the path while it loads (a script imports its sibling scripts)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
