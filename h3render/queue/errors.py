"""Errors of the job system. One base class; the CLI maps each to an exit code.

QueueInputError and its subclasses are the user's to fix (exit 2); the rest are
failures of the system around the job (exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass


class QueueError(Exception):
    """Base of every h3render.queue failure."""


class RedisUnavailableError(QueueError):
    """No Redis could be reached or started; the message says what was tried."""


class NotFoundError(QueueError):
    """A job or sweep id that Redis does not know."""


class NotStoredError(QueueError):
    """Redis did not store a write on disk (or did not say it had): nothing is reported queued.

    `cause` is what Redis said or logged; `free_bytes` the free space of the disk its AOF is
    on when that disk is on this machine, else None (`where` then says what INFO reports).
    """

    def __init__(self, cause: str, free_bytes: int | None = None, where: str = ""):
        self.cause = cause
        self.free_bytes = free_bytes
        self.where = where
        disk = (f"{free_bytes} bytes free on the disk of its AOF ({where})" if free_bytes is not None
                else where or "free space of its disk unknown")
        super().__init__(f"not queued: Redis cannot persist: {cause}; {disk}")

    def to_dict(self) -> dict:
        return {"error": "not queued: Redis cannot persist", "cause": self.cause,
                "free_bytes": self.free_bytes, "where": self.where}


class QueueInputError(QueueError, ValueError):
    """Bad input from the user: a job field, a sweep axis, a TOML file."""


@dataclass(frozen=True)
class Problem:
    """One invalid field: what it is, what was given, the rule, the nearest valid value."""

    field: str
    value: object
    rule: str
    nearest: object = None

    def __str__(self) -> str:
        text = f"{self.field}={self.value!r}: {self.rule}"
        if self.nearest is not None:
            text += f"; nearest valid: {self.nearest!r}"
        return text


class JobValidationError(QueueInputError):
    """A job payload broke one or more rules; `problems` lists each one."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("invalid job: " + "; ".join(str(p) for p in self.problems))

    def to_dict(self) -> dict:
        return {
            "error": "invalid job",
            "problems": [
                {"field": p.field, "value": _jsonable(p.value), "rule": p.rule, "nearest": _jsonable(p.nearest)}
                for p in self.problems
            ],
        }


def _jsonable(v: object) -> object:
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
