"""Errors raised by the engine binding and the model tools.

Every C return code maps to one class, so callers (the CLI, the worker's retry
policy) can tell a bad request from a bad model file from a crash.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every engine failure; `code` is the C return code, if any."""

    code: int = -8

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ModelFileError(EngineError):
    """A model file is missing, unreadable, truncated or inconsistent."""

    code = -2


class ModelNotFoundError(ModelFileError):
    code = -1


class InvalidRequestError(EngineError, ValueError):
    """A request argument is outside what the engine supports."""

    code = -3


class EngineOutOfMemoryError(EngineError, MemoryError):
    code = -4


class EngineCanceled(EngineError):
    """A progress or frame callback asked the engine to stop."""

    code = -5


class NumericError(EngineError):
    """NaN or Inf appeared in the latents; the message names the step."""

    code = -6


class UnsupportedError(EngineError):
    code = -7


class EngineInternalError(EngineError):
    code = -8


class LibraryNotFoundError(EngineError):
    """The compiled engine library could not be located or loaded."""


class ConvertError(Exception):
    """A source checkpoint cannot be converted; the message names the file."""


_BY_CODE: dict[int, type[EngineError]] = {
    -1: ModelNotFoundError,
    -2: ModelFileError,
    -3: InvalidRequestError,
    -4: EngineOutOfMemoryError,
    -5: EngineCanceled,
    -6: NumericError,
    -7: UnsupportedError,
    -8: EngineInternalError,
}


def error_for_code(code: int, message: str) -> EngineError:
    return _BY_CODE.get(code, EngineError)(message or f"engine error {code}", code)
