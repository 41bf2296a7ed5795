"""The job class of the worker: rq's Job that can name no function but the render task.

rq imports whatever a job names when it reads `func` or a callback property (its
abandoned-job cleanup calls failure callbacks in the worker process itself). Every
job the worker, its scheduler and its render process load is an AllowlistJob, so
rq's own paths never import a function a job names unless it is the allowed one
(h3render.worker.render.refusal).
"""

from __future__ import annotations

import logging

from rq.job import Job

from h3render.worker.render import refusal

log = logging.getLogger("h3render.worker")


class RefusedJobError(RuntimeError):
    """A job the allowlist refuses was about to be run (see render.refusal)."""


class AllowlistJob(Job):
    """rq's Job that resolves no function but ALLOWED_FUNC and no callbacks at all.

    rq imports whatever a job names when it reads `func` or a callback property
    (the worker's abandoned-job cleanup calls failure callbacks in the worker
    process itself). Here `func` raises RefusedJobError unless `refusal(job)` is
    None, callbacks resolve to None (logged), and webhooks are never sent.
    """

    @property
    def func(self):
        why = refusal(self)
        if why:
            raise RefusedJobError(why)
        return super().func

    def _no_callback(self, kind: str, name: str | None):
        if name:
            log.error("job %s names %s callback %r; not run (render jobs carry no callbacks)",
                      self.id, kind, name)
        return None

    @property
    def success_callback(self):
        return self._no_callback("success", self._success_callback_name)

    @property
    def failure_callback(self):
        return self._no_callback("failure", self._failure_callback_name)

    @property
    def stopped_callback(self):
        return self._no_callback("stopped", self._stopped_callback_name)

    def send_webhooks(self, status, *, exc_string=None) -> None:
        if self.webhooks:
            log.error("job %s carries webhooks; not sent (render jobs carry none)", self.id)
