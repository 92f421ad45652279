"""A service's background loop (the model watcher, the deployment watch): one daemon thread started with the app,
stopped with it through an event its loop waits on."""

from __future__ import annotations

import threading


class BackgroundLoop:
    """`_loop` runs on a daemon thread named `thread_name` until `_stop` is set; `stop` waits `join_s` for it."""

    thread_name = "topotune-background"
    join_s = 10.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> str:
        if self._thread is None:
            return "off"
        return "watching" if self._thread.is_alive() else "stopped"

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_s)

    def _loop(self) -> None:
        raise NotImplementedError
