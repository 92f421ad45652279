"""Service settings (TOPOTUNE_* env vars): the library's TunerSettings plus what only the service needs.

ApiSettings extends TunerSettings so both read ONE set of variables: TOPOTUNE_STORAGE is the database of Optuna's
tables and the service's own, TOPOTUNE_DATA_DIR and RAY_ADDRESS mean the same to the runner and the library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from tuner.settings import TunerSettings

REPO_DIR = Path(__file__).resolve().parents[1]
BUNDLED_SPACE = REPO_DIR / "search_spaces" / "gb300-nvl72-8k1k.yaml"

# Tokens that appear in docs, compose files and tutorials: refused so a copy-pasted example never goes live.
DEFAULT_TOKENS = frozenset({"", "changeme", "change-me", "changethis", "secret", "token", "topotune", "password",
                            "admin", "test"})
MIN_TOKEN_CHARS = 16


class ApiSettings(TunerSettings):
    """Everything the service reads; created by the caller (CLI, tests) and handed to create_app."""

    api_token: SecretStr | None = Field(None, description="bearer token of mutating endpoints (>= 16 chars)")
    auth: bool = Field(True, description="require the token; off only for a loopback-only dev server")
    read_auth: bool = Field(False, description="require the token on read endpoints and pages too")
    session_hours: float = Field(12.0, gt=0, le=24 * 30, description="lifetime of a browser sign-in (/ui/login)")
    cookie_secure: bool | None = Field(None, description="Secure flag of the session cookie; default: set when "
                                       "the request came over https")
    models_dir: Path | None = Field(None, description="watched model store; default DATA_DIR/models")
    watch_models: bool = Field(True, description="start a study when a model folder lands in models_dir")
    cluster_vllm_version_file: Path | None = Field(
        None, description="one line: the vLLM version the cluster runs now (written by the deploy that upgrades "
                          "it, e.g. `vllm --version > FILE`); default DATA_DIR/cluster-vllm-version. When it names "
                          "another version than a finished study's newest runs, the watcher re-verifies the study")
    reverify_on_change: bool = Field(True, description="the watcher re-verifies finished studies when the cluster's "
                                                       "vLLM version or a model's weights change")
    allowed_roots: list[Path] = Field(default_factory=list,
                                      description="client paths must resolve under one of these; "
                                                  "default: models_dir and the default space's folder")
    default_space: Path = Field(BUNDLED_SPACE, description="space of auto-tuned models and of requests without one")
    default_backend: Literal["simulated", "vllm"] = "simulated"
    default_sampler: Literal["gp", "tpe", "nsga2", "random"] = "gp"
    default_trials: int = Field(10, ge=1, le=10_000, description="launched trials per phase of auto-tuned models")
    executor: Literal["local", "ray"] = Field("ray", description="where trials run")
    max_parallel_studies: int = Field(2, ge=1, le=64, description="campaigns running at once (runner threads)")
    max_parallel_trials: int = Field(1, ge=1, le=256, description="trials in flight per study")
    host: str = Field("127.0.0.1", description="bind address of `topotune serve`")
    port: int = Field(8470, ge=1, le=65535, description="port of `topotune serve` (never 6379 or 5432)")

    @field_validator("storage")
    @classmethod
    def _normalise_url(cls, url: str | None) -> str | None:
        """`postgres://` and `postgresql://` (what most tools print) use psycopg 3, the driver installed here."""
        if url is None:
            return None
        for prefix in ("postgres://", "postgresql://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix):]
        return url

    @field_validator("port")
    @classmethod
    def _not_reserved(cls, port: int) -> int:
        if port in (6379, 5432):
            raise ValueError(f"port {port} belongs to Redis/PostgreSQL on these machines; pick another, e.g. 8470")
        return port

    @model_validator(mode="after")
    def _check(self) -> ApiSettings:
        if self.auth:
            token = self.api_token.get_secret_value() if self.api_token else ""
            if token.strip().lower() in DEFAULT_TOKENS or len(token) < MIN_TOKEN_CHARS:
                raise ValueError(
                    "TOPOTUNE_API_TOKEN is empty, a default or shorter than 16 characters; set a random one "
                    "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or set "
                    "TOPOTUNE_AUTH=false for a dev server bound to 127.0.0.1")
        if not self.auth and self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"TOPOTUNE_AUTH=false is allowed only on a loopback host, not {self.host!r}")
        if self.models_dir is None:
            self.models_dir = self.data_dir / "models"
        if self.cluster_vllm_version_file is None:
            self.cluster_vllm_version_file = self.data_dir / "cluster-vllm-version"
        if not self.allowed_roots:
            self.allowed_roots = [self.models_dir, self.default_space.parent]
        return self

    @property
    def database_url(self) -> str:
        """One database for Optuna's tables and the service's (TOPOTUNE_STORAGE, default SQLite in data_dir)."""
        return self.storage_url

    @property
    def space_roots(self) -> list[Path]:
        """Where a `space_path` may lie: the allowed roots, and always the service's own folder of spaces (the one
        the new-study form offers), even when TOPOTUNE_ALLOWED_ROOTS leaves it out."""
        own = self.default_space.parent
        return self.allowed_roots if own in self.allowed_roots else [*self.allowed_roots, own]

    @property
    def model_store(self) -> Path:
        assert self.models_dir is not None  # set by the validator
        return self.models_dir

    def token(self) -> str | None:
        return self.api_token.get_secret_value() if (self.auth and self.api_token) else None
