"""Typed errors with a message a user can act on.

Every error names the field that is wrong and the fix, so the CLI and the API can show it as one line
(exit code 2 / HTTP 422) without a traceback.
"""

from __future__ import annotations


class TopotuneError(Exception):
    """Base of every error topotune raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        self.field = field
        self.fix = fix
        self.message = message
        super().__init__(self.user_message())

    def user_message(self) -> str:
        parts = []
        if self.field:
            parts.append(f"{self.field}: ")
        parts.append(self.message)
        if self.fix:
            parts.append(f" (fix: {self.fix})")
        return "".join(parts)


class ConfigError(TopotuneError):
    """An input (file, flag, field) is missing, malformed or out of range."""


class UnsupportedModelError(ConfigError):
    """The model's architecture is unknown or its config lacks fields we need."""


class TopologyError(ConfigError):
    """A parallel layout that vLLM would refuse for this model or cluster."""


class InfeasibleError(ConfigError):
    """Constraints (SLA, GPU budget, pairing rules) leave no deployment; the message names the constraint."""


class DoesNotFitError(TopotuneError):
    """The weights and reserves leave no room for the KV cache a request needs."""

    def __init__(self, message: str, *, shortfall_gib: float, fix: str | None = None) -> None:
        self.shortfall_gib = shortfall_gib
        super().__init__(message, fix=fix)
