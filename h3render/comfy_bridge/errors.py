"""Errors the ComfyUI nodes raise. ComfyUI shows an exception's text in its error panel,
so every message says what happened and what the user can do about it.

    BridgeError              base
    BridgeInputError         a node input the queue refused (names field, value, rule)
    RedisDownError           Redis does not answer: what to start or set
    NoWorkerError            no h3render worker is alive to take the job: what to start
    JobFailedError           the worker's failure reason
    JobCanceledError         someone else canceled the job (the CLI, the dashboard)
    JobTimeoutError          the node's timeout passed; the job was canceled
"""

from __future__ import annotations


class BridgeError(RuntimeError):
    """Base of every error the ComfyUI bridge raises."""


class BridgeInputError(BridgeError, ValueError):
    """A node input the queue refused; the message lists each bad field."""


class RedisDownError(BridgeError):
    """Redis does not answer; nothing was enqueued."""


class NoWorkerError(BridgeError):
    """No live h3render worker serves the queue; the job was canceled, not left waiting."""


class JobFailedError(BridgeError):
    """The worker ended the job failed; `reason` is its recorded error."""

    def __init__(self, job_id: str, reason: str):
        self.job_id, self.reason = job_id, reason
        super().__init__(f"h3render job {job_id} failed: {reason}")


class JobCanceledError(BridgeError):
    """The job was canceled from outside this node (CLI, dashboard)."""


class JobTimeoutError(BridgeError, TimeoutError):
    """The node's timeout passed before the job ended; the job was canceled."""
