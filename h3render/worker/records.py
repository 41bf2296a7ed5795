"""Is a job record fit to be loaded by rq? Pure checks of the raw rq:job:<id> hash, field by field.

rq's Job.restore parses every field of the hash as it loads it, and one bad field
(a date that is not a date, a status it does not know, a retry count that is not a
number, bytes that are not UTF-8, ...) raises out of the worker's loop: the worker
used to quit on it, and the next one quit on the same record again. Here every field
rq reads is checked before rq sees it, so the worker can fail that one job with a
reason that names the field and the value, and go on with the next.

    check_job_id(raw_id)           -> Problem | None   an id as it sits in a queue list
    check_record(raw, queue, ...)  -> [Problem]        a raw HGETALL (bytes -> bytes)
    Problem.repair                 what to write instead (None: delete the field), so the
                                   failed job can be read again by rq, the status views and
                                   the dashboards; the original value is kept, cut, in the
                                   job's meta["h3r"]["corrupt"] by the caller

Nothing here touches Redis (h3render.worker.intake does the writes).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Callable

from rq.job import JobStatus
from rq.utils import utcparse

JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")  # rq's pattern, with a length bound
YEAR_S = 366 * 24 * 3600
MAX_META_BYTES = 4 * 1024**2  # a preview PNG is tens of KiB; the rest is small
MAX_DATA_BYTES = 1024**2  # a render payload is a few KiB (prompt <= 4000 characters)
MAX_NUMBER_CHARS = 24  # longer "numbers" are not parsed at all (int() of huge text is slow)
DATE_EXAMPLE = "2024-01-31T12:00:00.000000Z"
STATUSES = tuple(s.value for s in JobStatus)
SHOWN_CHARS = 80


def shown(value: bytes | str | None, limit: int = SHOWN_CHARS) -> str:
    """A value as a reason may quote it: repr of its text, cut, with its full length."""
    if value is None:
        return "(missing)"
    try:
        r = repr(value.decode("utf-8") if isinstance(value, bytes) else value)
    except UnicodeDecodeError:
        r = repr(value)  # b'...' shows which bytes are not text
    if len(r) <= limit:
        return r
    size = len(value)
    return f"{r[:limit - 3]}... ({size} {'bytes' if isinstance(value, bytes) else 'characters'})"


@dataclass(frozen=True)
class Problem:
    """One field that rq cannot load, or must not: what it holds and what is allowed.

    `repair` is what the caller writes instead so rq can load the record again:
    bytes to store, or None to delete the field."""

    field: str
    value: str  # shown(...) of the raw value
    wrong: str  # what is wrong with it
    allowed: str  # what is allowed, with the nearest valid value where there is one
    repair: bytes | None = None
    key: bytes | None = None  # the raw hash field, when its name is not `field` itself

    @property
    def hash_field(self) -> bytes:
        return self.key if self.key is not None else self.field.encode()

    @property
    def message(self) -> str:
        return f"field {self.field}={self.value} {self.wrong}; allowed: {self.allowed}"


# ---------------------------------------------------------------- the id


def check_job_id(raw_id: bytes | str) -> Problem | None:
    """An id popped from a queue list. rq builds a key from it (rq:job:<id>), splits it at
    ':' (an execution's composite key) and decodes it as UTF-8, so only its own id pattern
    is safe."""
    if isinstance(raw_id, bytes):
        try:
            text = raw_id.decode("utf-8")
        except UnicodeDecodeError:
            return Problem("job id", shown(raw_id), "is not UTF-8 text", _ID_RULE)
    else:
        text = raw_id
    if not text:
        return Problem("job id", "''", "is empty", _ID_RULE)
    if len(text) > 128:
        return Problem("job id", shown(text), f"is {len(text)} characters long", _ID_RULE)
    if not JOB_ID_RE.fullmatch(text):
        bad = sorted({c for c in text if not re.fullmatch(r"[A-Za-z0-9_-]", c)})
        return Problem("job id", shown(text), f"contains {', '.join(repr(c) for c in bad[:5])}", _ID_RULE)
    return None


_ID_RULE = "1 to 128 letters, digits, '_' or '-' (as h3render's j-<12 hex digits>)"


# ---------------------------------------------------------------- one field each
# A checker gets the raw bytes and returns (wrong, allowed) or None; the table below
# pairs each with its repair.


def _text(limit: int) -> Callable[[bytes], tuple[str, str] | None]:
    def check(v: bytes):
        try:
            text = v.decode("utf-8")
        except UnicodeDecodeError:
            return "is not UTF-8 text", f"UTF-8 text of at most {limit} characters"
        if len(text) > limit:
            return f"is {len(text)} characters long", f"UTF-8 text of at most {limit} characters"
        if "\x00" in text:
            return "contains a NUL character", "text without NUL"
        return None
    return check


def _date(v: bytes):
    if v == b"":
        return None  # rq writes '' for a date that is not set yet
    try:
        utcparse(v.decode("ascii"))
    except (UnicodeDecodeError, ValueError, OverflowError):
        return "is not a date", f"an ISO date as rq writes it, e.g. {DATE_EXAMPLE}, or empty"
    return None


def _int(lo: int, hi: int, special: tuple[int, ...] = (), empty_ok: bool = True):
    rule = f"an integer from {lo} to {hi}" + "".join(f" or {s}" for s in special)

    def check(v: bytes):
        if v == b"" and empty_ok:
            return None
        if len(v) > MAX_NUMBER_CHARS:
            return f"is {len(v)} bytes long", rule
        try:
            n = int(v.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            return "is not an integer", rule
        if n in special or lo <= n <= hi:
            return None
        return f"is out of range", f"{rule} (nearest: {min(max(n, lo), hi)})"
    return check


def _timeout(v: bytes):
    """rq also reads '<digits><d|h|m|s>' (parse_timeout); h3render writes seconds."""
    m = re.fullmatch(rb"\s*(-?\d{1,12})([dhms]?)\s*", v) if len(v) <= MAX_NUMBER_CHARS else None
    rule = f"whole seconds from 1 to {YEAR_S}, or -1 (no timeout)"
    if v == b"":
        return None
    if not m:
        return "is not a number of seconds", rule
    n = int(m.group(1)) * {b"": 1, b"s": 1, b"m": 60, b"h": 3600, b"d": 86400}[m.group(2)]
    if n == -1 or 1 <= n <= YEAR_S:
        return None
    return "is out of range", f"{rule} (nearest: {min(max(n, 1), YEAR_S)})"


def _flag(v: bytes):
    if v in (b"0", b"1"):
        return None
    return "is not 0 or 1", "0 or 1"


def _kind(x) -> str:
    """The JSON name of a parsed value's type."""
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "a boolean", type(None): "null"}.get(type(x), type(x).__name__)


def _json(v: bytes, limit: int):
    if len(v) > limit:
        raise ValueError(f"is {len(v)} bytes long (at most {limit})")
    try:
        return json.loads(v)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"is not JSON ({type(e).__name__})") from None


def _int_list(limit_items: int, lo: int, hi: int, nonempty: bool):
    rule = f"a JSON list of {'1' if nonempty else '0'} to {limit_items} integers from {lo} to {hi}"

    def check(v: bytes):
        if v == b"":
            return None
        try:
            x = _json(v, 64 * 1024)
        except ValueError as e:
            return str(e), rule
        if not isinstance(x, list) or (nonempty and not x) or len(x) > limit_items:
            return f"is {_kind(x)}{f' of {len(x)}' if isinstance(x, list) else ''}", rule
        if not all(type(i) is int and lo <= i <= hi for i in x):
            return "holds an item that is not an integer in range", rule
        return None
    return check


def _id_list(v: bytes):
    rule = "a JSON list of at most 1000 job ids"
    if v == b"":
        return None
    try:
        x = _json(v, 256 * 1024)
    except ValueError as e:
        return str(e), rule
    if not isinstance(x, list) or len(x) > 1000:
        return f"is {_kind(x)}{f' of {len(x)}' if isinstance(x, list) else ''}", rule
    if not all(isinstance(i, str) and check_job_id(i) is None for i in x):
        return "holds an item that is not a job id", rule
    return None


def _one_id(v: bytes):
    if v == b"":
        return None
    p = check_job_id(v)
    return (p.wrong, p.allowed) if p else None


def _status(v: bytes):
    try:
        text = v.decode("ascii")
    except UnicodeDecodeError:
        text = None
    if text in STATUSES:
        return None
    return "is not an rq job status", ", ".join(STATUSES)


def _meta(v: bytes):
    rule = f"a JSON object of at most {MAX_META_BYTES} bytes whose 'h3r' is an object"
    if v == b"":
        return None
    try:
        x = _json(v, MAX_META_BYTES)
    except ValueError as e:
        return str(e), rule
    if not isinstance(x, dict):
        return f"is {_kind(x)}, not an object", rule
    if "h3r" in x and not isinstance(x["h3r"], dict):
        return f"has an 'h3r' that is {_kind(x['h3r'])}, not an object", rule
    return None


def decompress_data(v: bytes, limit: int = MAX_DATA_BYTES) -> bytes:
    """The job's data as rq reads it (zlib, else the raw bytes), never more than `limit`
    bytes (ValueError): a small compressed value can expand to gigabytes."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(v, limit + 1)
    except zlib.error:
        out = v
    else:
        if len(out) > limit or d.unconsumed_tail:
            raise ValueError(f"expands to more than {limit} bytes")
    if len(out) > limit:
        raise ValueError(f"is {len(out)} bytes long (at most {limit})")
    return out


def _data(v: bytes):
    rule = "zlib-compressed JSON [function, null, args, kwargs] of at most 1 MiB"
    try:
        x = _json(decompress_data(v), MAX_DATA_BYTES)
    except ValueError as e:
        return str(e), rule
    if not isinstance(x, list) or len(x) != 4:
        return f"is {_kind(x)}{f' of {len(x)}' if isinstance(x, list) else ''}, not a list of 4", rule
    func, _, args, kwargs = x
    if not (func is None or isinstance(func, str)) or not isinstance(args, list) \
            or not isinstance(kwargs, dict):
        return "has a function, args or kwargs of the wrong type", rule
    return None


def _exc_info(v: bytes):
    try:
        text = zlib.decompressobj().decompress(v, 1024**2)
    except zlib.error:
        text = v
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return "is not UTF-8 text (compressed or not)", "text, as rq writes it"
    return None


# A placeholder job tuple for data that cannot stay: the failed job still loads, names no function.
DATA_PLACEHOLDER = zlib.compress(b"[null, null, [], {}]")
_DAY = 24 * 3600
_TEN_YEARS = 10 * YEAR_S

# field -> (checker, repair): repair None deletes the field, bytes are written, a callable
# gets the raw value (meta keeps what it can).
FIELDS: dict[str, tuple[Callable, object]] = {
    "created_at": (_date, None),
    "enqueued_at": (_date, None),
    "started_at": (_date, None),
    "ended_at": (_date, None),
    "last_heartbeat": (_date, None),
    "status": (_status, b"failed"),
    "timeout": (_timeout, None),
    "result_ttl": (_int(0, _TEN_YEARS, (-1,)), None),
    "failure_ttl": (_int(1, _TEN_YEARS, (-1,)), None),
    "ttl": (_int(1, _TEN_YEARS, (-1,)), None),
    "retries_left": (_int(0, 1000), b"0"),
    "number_of_retries": (_int(0, 1000), None),
    "retry_intervals": (_int_list(100, 0, YEAR_S, nonempty=True), None),
    "repeats_left": (_int(0, 1000), None),
    "repeat_intervals": (_int_list(100, 0, YEAR_S, nonempty=True), None),
    "meta": (_meta, "meta"),
    "data": (_data, DATA_PLACEHOLDER),
    "description": (_text(2000), "text"),
    "origin": (_text(255), "origin"),
    "worker_name": (_text(255), None),
    "group_id": (_text(255), None),
    "success_callback_name": (_text(255), None),
    "failure_callback_name": (_text(255), None),
    "stopped_callback_name": (_text(255), None),
    "success_callback_timeout": (_int(0, _DAY, (-1,), empty_ok=False), None),
    "failure_callback_timeout": (_int(0, _DAY, (-1,), empty_ok=False), None),
    "stopped_callback_timeout": (_int(0, _DAY, (-1,), empty_ok=False), None),
    "dependency_ids": (_id_list, None),
    "dependency_id": (_one_id, None),
    "allow_dependency_failures": (_flag, None),
    "enqueue_at_front": (_flag, None),
    "enqueue_at_front_on_retry": (_flag, None),
    "exc_info": (_exc_info, None),
}


def _repair_meta(v: bytes) -> bytes:
    """Keep a meta object without its bad 'h3r'; anything else becomes {}."""
    try:
        x = json.loads(v)
    except (ValueError, RecursionError):
        return b"{}"
    if not isinstance(x, dict) or len(v) > MAX_META_BYTES:
        return b"{}"
    x.pop("h3r", None)
    return json.dumps(x).encode()


def check_record(raw: dict, queue_name: str | None = None,
                 statuses: tuple[str, ...] | None = None) -> list[Problem]:
    """Every problem of a raw job hash (HGETALL: bytes field -> bytes value).

    queue_name: the queue the record was found in; its `origin` must name it (rq files
    the job's registries under its origin). statuses: the rq statuses a record may have
    where it was found (a job in a queue list is 'queued'); None allows any."""
    problems: list[Problem] = []
    fields: dict[str, bytes] = {}
    for k, v in raw.items():
        name = k.decode("utf-8", "strict") if isinstance(k, bytes) and _utf8(k) else None
        if name is None:
            problems.append(Problem(f"(field name {shown(k)})", shown(v), "has a name that is not UTF-8",
                                    "rq's field names", None, key=k))
            continue
        fields[name] = v if isinstance(v, bytes) else str(v).encode()
    if "data" not in fields:
        problems.append(Problem("data", "(missing)", "is missing", "the job's function and payload",
                                DATA_PLACEHOLDER))
    for name, v in fields.items():
        spec = FIELDS.get(name)
        if spec is None:
            continue
        check, repair = spec
        bad = check(v)
        if bad is None:
            continue
        problems.append(Problem(name, shown(v), bad[0], bad[1], _repaired(name, v, repair, queue_name)))
    if queue_name is not None and "origin" in fields and not any(p.field == "origin" for p in problems):
        if fields["origin"].decode() != queue_name:
            problems.append(Problem("origin", shown(fields["origin"]), f"is not this queue ({queue_name!r})",
                                    repr(queue_name), queue_name.encode()))
    status = fields.get("status")
    if statuses is not None and status is not None and not any(p.field == "status" for p in problems):
        if status.decode() not in statuses:
            problems.append(Problem("status", shown(status),
                                    f"does not fit where the job was found (a job there is "
                                    f"{' or '.join(statuses)})", " or ".join(statuses), b"failed"))
    return problems


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _repaired(name: str, v: bytes, repair, queue_name: str | None) -> bytes | None:
    if repair == "meta":
        return _repair_meta(v)
    if repair == "text":
        return v.decode("utf-8", "replace").replace("\x00", "")[:200].encode()
    if repair == "origin":
        return (queue_name or "").encode() or None
    return repair  # bytes or None
