"""Library settings from the environment (TOPOTUNE_*), one object, created on demand (never at import)."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("topotune", appauthor=False))


class TunerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOPOTUNE_", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir, description="studies, artifacts, reports")
    storage: str | None = Field(None, description="SQLAlchemy URL of the Optuna storage; default SQLite in data_dir")
    ray_address: str | None = Field(None, validation_alias="RAY_ADDRESS",
                                    description="connect to this Ray cluster; default: start a local one")
    ray_port: int | None = Field(None, gt=0, lt=65536,
                                 description="GCS port of the local Ray head; default: a free one its GCS binds itself")

    @property
    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.data_dir / 'topotune.db').resolve()}"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def reports_dir(self) -> Path:
        return self.data_dir / "reports"
