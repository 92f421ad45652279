"""Watch the model store: a new folder with a config.json becomes a registered model (and a study).

watchfiles reports changes; each change (and a periodic tick) rescans the top-level folders, so a config.json
that was half-written at the first event is simply tried again at the next one. Registration is idempotent per
resolved path, so repeated events, restarts and a POST /v1/models of the same folder start one study.

Every folder goes through the same path check as a request (api.service.confine_model_path, inside
register_model): a symlink leading out of the allowed roots is refused, never registered. A config that can never
be a model (a FIFO, over 16 MiB, not a JSON object), or one still not JSON after it stopped changing for
SETTLE_S, is registered as unsupported with its reason instead of being skipped silently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from watchfiles import watch

from api.background import BackgroundLoop
from api.config import ApiSettings
from api.errors import FieldError
from api.models import ModelRecord, ModelStatus, StudyRecord, StudyStatus
from api.service import ConfigNotReady, ConfigRejected, register_model
from tuner.errors import TopotuneError
from tuner.models import UNKNOWN_REVISION, model_revision
from tuner.study import current_versions

log = logging.getLogger("topotune.api.watcher")

RETRY_EVERY_S = 1.0
VERSION_CHECK_S = 30.0  # how often finished studies are compared with the cluster's vLLM and their model's weights
VERSION_CHECK_STUDIES = 200  # the newest finished studies compared
SETTLE_S = 5.0  # a config.json unchanged this long and still not JSON is not being written: it is broken


class ModelWatcher(BackgroundLoop):
    thread_name = "topotune-watcher"

    def __init__(self, settings: ApiSettings, sessions: sessionmaker[Session], on_study: Callable[[int], None],
                 on_reverify: Callable[[int, str, str | None], None] = lambda _id, _why, _version: None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.on_study = on_study
        self.on_reverify = on_reverify  # (study id, why, the cluster's new vLLM version or None)
        self._acted: set[tuple[int, str]] = set()  # (study, signal) already re-verified: once per change
        self._checked_at = 0.0
        self.root = settings.model_store
        super().__init__()
        self._seen: set[Path] = set()
        self.refused: dict[Path, str] = {}  # folders the path check refused, with the reason
        self.last_error: str | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        super().start()

    def _loop(self) -> None:
        self.scan()
        while not self._stop.is_set():
            try:
                for _changes in watch(self.root, stop_event=self._stop, debounce=300, step=50,
                                      rust_timeout=int(RETRY_EVERY_S * 1000), yield_on_timeout=True,
                                      raise_interrupt=False):
                    self.scan()
                    if self.settings.reverify_on_change and time.monotonic() - self._checked_at > VERSION_CHECK_S:
                        self._checked_at = time.monotonic()
                        self.check_versions()
            except Exception as exc:  # the folder vanished, inotify limits...: report, wait, watch again
                self.last_error = str(exc)
                log.warning("model watcher: %s", exc)
                self._stop.wait(RETRY_EVERY_S)

    def scan(self) -> list[Path]:
        """Register every new complete model folder; returns the folders registered now."""
        registered = []
        try:
            folders = sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError as exc:
            self.last_error = str(exc)
            return registered
        for folder in folders:
            if folder in self._seen or not (folder / "config.json").exists():
                continue
            try:
                record, created = self._register(folder)
            except ConfigNotReady:
                continue  # being written: the next tick tries again
            except FieldError as exc:  # outside the allowed roots (a symlink leading out): never acted on
                self.refused[folder] = exc.message
                self._seen.add(folder)
                self.last_error = f"{folder}: {exc.message}"
                log.warning("model watcher: refused %s: %s", folder, exc.message)
                continue
            except Exception as exc:  # a database hiccup: try again at the next tick
                self.last_error = f"{folder}: {exc}"
                log.warning("model watcher: cannot register %s: %s", folder, exc)
                continue
            self._seen.add(folder)
            if created:
                registered.append(folder)
                log.info("model watcher: registered %s (%s)", folder, record.status.value)
                if record.status is ModelStatus.TUNING and record.study_id is not None:
                    self.on_study(record.study_id)
        return registered

    def _register(self, folder: Path) -> tuple[ModelRecord, bool]:
        """register_model; a config that is not JSON and has stopped changing is registered with its reason."""
        loc = ("watcher", folder.name)
        with self.sessions() as session:
            try:
                return register_model(session, self.settings, folder, source="watcher", loc=loc)
            except ConfigRejected as exc:
                return register_model(session, self.settings, folder, source="watcher", loc=loc,
                                      unreadable=str(exc))
            except ConfigNotReady as exc:
                try:
                    age_s = time.time() - (folder / "config.json").stat().st_mtime
                except OSError:
                    raise exc from None
                if age_s < SETTLE_S:
                    raise
                return register_model(session, self.settings, folder, source="watcher", loc=loc,
                                      unreadable=f"{exc} (unchanged for {age_s:.0f} s)".replace(" yet", ""))

    # -- version signals: a new vLLM on the cluster, new weights of a model ------------------------------------------
    def cluster_vllm_version(self) -> str | None:
        """What the cluster runs now (the settings' one-line file), None when nothing says."""
        path = self.settings.cluster_vllm_version_file
        try:
            text = path.read_text().strip() if path is not None else ""
        except OSError:
            return None
        return text.split()[-1].lstrip("v") if text else None

    def check_versions(self) -> list[tuple[int, str]]:
        """Re-verify every finished study whose newest runs were on another vLLM than the cluster's, or whose
        model's weights changed since (tuner.models.model_revision); each change triggers once per study."""
        triggered = []
        cluster = self.cluster_vllm_version()
        with self.sessions() as session:
            records = session.scalars(select(StudyRecord).where(StudyRecord.status == StudyStatus.SUCCEEDED)
                                      .order_by(StudyRecord.id.desc()).limit(VERSION_CHECK_STUDIES)).all()
            studies = [(r.id, r.campaign, r.model_path) for r in records]
        for study_id, campaign, model_path in studies:
            try:
                tags = current_versions(self.settings.database_url, campaign)
            except TopotuneError:
                continue
            if not tags:
                continue
            why = None
            revision = model_revision(model_path)
            old_revisions = {t.model_revision for t in tags.values()} - {UNKNOWN_REVISION}
            if cluster and any(t.vllm_version != cluster for t in tags.values()):
                seen = ", ".join(sorted({t.vllm_version for t in tags.values()}))
                why, signal = f"the cluster now runs vLLM {cluster} (the study ran on {seen})", f"vllm {cluster}"
            elif revision != UNKNOWN_REVISION and old_revisions and revision not in old_revisions:
                why, signal = (f"the model's weights changed (revision {', '.join(sorted(old_revisions))} -> "
                               f"{revision})"), f"model {revision}"
            if why is None or (study_id, signal) in self._acted:
                continue
            self._acted.add((study_id, signal))
            log.info("model watcher: re-verifying study %s: %s", study_id, why)
            try:
                self.on_reverify(study_id, why, cluster)
            except Exception as exc:  # a conflict (already running) or a database hiccup: next change tries again
                self.last_error = f"study {study_id}: {exc}"
                log.warning("model watcher: cannot re-verify study %s: %s", study_id, exc)
                continue
            triggered.append((study_id, why))
        return triggered
