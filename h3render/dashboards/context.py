"""What every dashboard request needs, where the pages can read it: app.extensions["h3render"].

Its own module so that the pages (views.py) read it without importing the app that
registers them (app.py), which would be an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from h3render.dashboards.security import Auth, Csrf
from h3render.settings import Settings


@dataclass
class DashState:
    """What every request needs: app.extensions["h3render"]."""

    r: redis.Redis
    settings: Settings
    auth: Auth
    csrf: Csrf
    redis_url: str


def state() -> DashState:
    """The running app's DashState (inside a request or an app context)."""
    from flask import current_app

    return current_app.extensions["h3render"]
