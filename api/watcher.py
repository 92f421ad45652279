"""Watch the model store: a new folder with a config.json becomes a registered model (and a study).

watchfiles reports changes; each change (and a periodic tick) rescans the top-level folders, so a config.json
that was half-written at the first event is simply tried again at the next one. Registration is idempotent per
resolved path, so repeated events, restarts and a POST /v1/models of the same folder start one study.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker
from watchfiles import watch

from api.config import ApiSettings
from api.models import ModelStatus
from api.service import ConfigNotReady, register_model

log = logging.getLogger("topotune.api.watcher")

RETRY_EVERY_S = 1.0
GIVE_UP_AFTER_S = 600.0  # a config.json still incomplete after this long is reported, not retried forever


class ModelWatcher:
    def __init__(self, settings: ApiSettings, sessions: sessionmaker[Session], on_study: Callable[[int], None]) -> None:
        self.settings = settings
        self.sessions = sessions
        self.on_study = on_study
        self.root = settings.model_store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: set[Path] = set()
        self._waiting: dict[Path, float] = {}  # folder -> first time it was seen incomplete
        self.last_error: str | None = None

    @property
    def state(self) -> str:
        if self._thread is None:
            return "off"
        return "watching" if self._thread.is_alive() else "stopped"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="topotune-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        self.scan()
        while not self._stop.is_set():
            try:
                for _changes in watch(self.root, stop_event=self._stop, debounce=300, step=50,
                                      rust_timeout=int(RETRY_EVERY_S * 1000), yield_on_timeout=True,
                                      raise_interrupt=False):
                    self.scan()
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
                with self.sessions() as session:
                    record, created = register_model(session, self.settings, folder, source="watcher")
                    study_id = record.study_id if created and record.status is ModelStatus.TUNING else None
            except ConfigNotReady as exc:
                first = self._waiting.setdefault(folder, time.monotonic())
                if time.monotonic() - first > GIVE_UP_AFTER_S:
                    self.last_error = f"{folder}: {exc}"
                continue
            except Exception as exc:  # a database hiccup: try again at the next tick
                self.last_error = f"{folder}: {exc}"
                log.warning("model watcher: cannot register %s: %s", folder, exc)
                continue
            self._waiting.pop(folder, None)
            self._seen.add(folder)
            if created:
                registered.append(folder)
                log.info("model watcher: registered %s (%s)", folder, record.status.value)
            if study_id is not None:
                self.on_study(study_id)
        return registered
