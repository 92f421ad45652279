"""The service's own tables, next to Optuna's in the same database (prefix topotune_ so they never collide)."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Enum, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from tuner.backends import stored_backend_config
from tuner.space import SearchSpace
from tuner.tune import TuneRequest

SCHEMA_VERSION = "0001"  # the head of api/migrations/versions; tests check the two agree


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class StudyStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        return self in (StudyStatus.QUEUED, StudyStatus.RUNNING, StudyStatus.CANCELLING)


class ModelStatus(enum.StrEnum):
    TUNING = "tuning"  # a study was started for it and is queued or running
    TUNED = "tuned"  # its study succeeded
    TUNING_FAILED = "tuning_failed"  # its study failed (the study's error says why)
    TUNING_CANCELLED = "tuning_cancelled"  # its study was cancelled
    DOES_NOT_FIT = "does_not_fit"  # the memory model finds no layout on the configured cluster
    UNSUPPORTED = "unsupported"  # config.json unreadable for the model registry, or no valid configuration
    REGISTERED = "registered"  # registered without a study (auto_tune off)


class StudyRecord(Base):
    """A study request: what was asked, its status, and the Optuna campaign name it runs under."""

    __tablename__ = "topotune_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign: Mapped[str] = mapped_column(String(512), unique=True)
    model_name: Mapped[str] = mapped_column(String(256))
    model_path: Mapped[str] = mapped_column(String(4096))
    space: Mapped[dict[str, Any]] = mapped_column()  # the validated SearchSpace, as JSON
    space_name: Mapped[str] = mapped_column(String(256))
    backend: Mapped[str] = mapped_column(String(32))
    # The study's TuneRequest (tuner.tune) as JSON: what the runner runs, on resume too. The column keeps its first
    # name: a row stored before requests were typed holds the backend's options dict there (with the study's phases
    # and retry flag), which `tune_request` still reads.
    request_json: Mapped[dict[str, Any]] = mapped_column("backend_options", default=dict)
    trials_per_phase: Mapped[int] = mapped_column(Integer)
    sampler: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int] = mapped_column(Integer)
    warm_start: Mapped[bool] = mapped_column(default=True)
    status: Mapped[StudyStatus] = mapped_column(Enum(StudyStatus, native_enum=False, length=16),
                                                default=StudyStatus.QUEUED, index=True)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    resumes: Mapped[int] = mapped_column(Integer, default=0)  # times a restarted service picked it up again
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    events: Mapped[list[EventRecord]] = relationship(back_populates="study", cascade="all, delete-orphan",
                                                     order_by="EventRecord.id")

    @property
    def tune_request(self) -> TuneRequest:
        """The request this study runs: the stored one, or one rebuilt from an older row's columns and options."""
        data = self.request_json or {}
        if "model_path" in data and "space" in data:
            return TuneRequest.model_validate(data)
        space = SearchSpace.model_validate(self.space)  # an older row's space already has its SLA applied
        return TuneRequest(model_path=self.model_path, space=space,
                           backend=stored_backend_config(self.backend, data, gpu=space.cluster.gpu),
                           trials=self.trials_per_phase, sampler=self.sampler, seed=self.seed,
                           warm_start=self.warm_start, phases=tuple(data["phases"]) if data.get("phases") else None,
                           retry_risks=bool(data.get("retry_risks")))

    @property
    def phases(self) -> list[str]:
        """The phases the study runs, in order."""
        return list(self.tune_request.phases or self.space.get("phases", {}))


class ModelRecord(Base):
    """A model registered by path (POST /v1/models or the watcher); one row per resolved path."""

    __tablename__ = "topotune_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(String(4096), unique=True)
    name: Mapped[str] = mapped_column(String(256))
    source: Mapped[str] = mapped_column(String(16))  # "api" | "watcher"
    status: Mapped[ModelStatus] = mapped_column(Enum(ModelStatus, native_enum=False, length=16))
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("topotune_studies.id", ondelete="SET NULL"),
                                                 default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EventRecord(Base):
    """What happened to a study: status changes and the driver's trial events (launched, done, failed...)."""

    __tablename__ = "topotune_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("topotune_studies.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    phase: Mapped[str | None] = mapped_column(String(16), default=None)
    trial_number: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str] = mapped_column(Text, default="")

    study: Mapped[StudyRecord] = relationship(back_populates="events")
