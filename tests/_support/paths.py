"""Where the repository's example models and search spaces are (the tests' only knowledge of the checkout)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "examples" / "models"
REFERENCE_MODEL = MODELS / "qwen3.8-2.4t-a95b-nvfp4"
SPACES = REPO / "search_spaces"
REFERENCE_SPACE = SPACES / "gb300-nvl72-8k1k.yaml"
