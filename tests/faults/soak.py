"""The soak behind `make faults`: hundreds of random faults over one sweep, bounded in time.

    python tests/faults/soak.py [--minutes 8] [--jobs 40] [--steps 30] [--seed 1]

It starts a private redis-server (AOF on, a free port, a temporary H3RENDER_HOME),
enqueues a sweep of tiny-wan jobs and keeps one real `h3render worker` running, as
a supervisor would (restarted when it exits). Until the time bound it injects, at
random every 0.3-2 s, one of:

    kill-worker   SIGKILL of the worker process (its render process is left alone)
    kill-render   SIGKILL of the render process of the job in flight
    kill-both     SIGKILL of both: the job is abandoned
    kill-redis    SIGKILL of redis-server, restarted 0-2 s later
    corrupt       one field of a queued job's record overwritten with garbage
    cancel        cancel of a random job that has not ended
    enqueue       one more job enqueued in the middle of it all

then lets the worker drain the queue and checks every promise of docs/RELIABILITY.md:
every acknowledged job exists and ended finished, failed with a reason or canceled;
no job finished twice (rq's results of the job); a finished job's folder holds
video.mp4, poster.png and meta.json, a failed one's only meta.json; no temporary
file anywhere under renders/; the worker exited only when it was killed. It prints
the fault table (tests/faults/table.py) and exits 1 when a row did not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the tests folder: `faults` is a package there

from faults.harness import CLI, REPO, SMALL, temp_files, write_readings  # noqa: E402
from faults.table import FaultRow, format_table  # noqa: E402

# A corrupted field and the garbage written into it (a sample of tests/faults/test_records.py's).
CORRUPTIONS = [
    ("created_at", "garbage"), ("enqueued_at", "not a date"), ("status", "exploded"),
    ("timeout", "ten"), ("retries_left", "-x"), ("meta", "{not json"), ("data", "\x00\x01"),
    ("description", "x" * 100_000), ("result_ttl", "soon"), ("retry_intervals", "[1,"),
]
FAULTS = ("kill-worker", "kill-render", "kill-both", "kill-redis", "corrupt", "cancel", "enqueue")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.tmp = Path(tempfile.mkdtemp(prefix="h3render-soak-"))
        self.home = self.tmp / "home"
        self.port = free_port()
        from h3render.queue.redis_server import EmbeddedRedis
        from h3render.settings import Settings

        self.redis = EmbeddedRedis(self.tmp / "redis", self.port)
        self.url = self.redis.url()
        self.settings = Settings(redis_url=self.url, home=self.home,
                                 retry_intervals_s=[1, 1, 1])
        readings = self.tmp / "readings.json"
        from h3render.worker.health import Readings

        write_readings(readings, Readings(platform="test"))
        self.env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        H3RENDER_HOME=str(self.home), H3RENDER_REDIS_URL=self.url,
                        H3RENDER_GATE_POLL_S="1", H3RENDER_RETRY_INTERVALS_S="[1, 1, 1]",
                        H3RENDER_ENABLE_TEST_TRIGGERS="1", H3RENDER_TEST_READINGS=str(readings))
        self.worker: subprocess.Popen | None = None
        self.worker_log = open(self.tmp / "worker.log", "w")
        self.acked: list[str] = []
        self.corrupted: dict[str, str] = {}  # job id -> field
        self.canceled: set[str] = set()
        self.tried: Counter = Counter()
        self.unexpected_exits: list[int] = []
        self.killed_pids: set[int] = set()

    # -------------------------------------------------------------- processes

    def conn(self):
        return self.redis.client()

    def ensure_worker(self) -> None:
        w = self.worker
        if w is not None and w.poll() is None:
            return
        if w is not None and w.pid not in self.killed_pids and w.returncode not in (0, -9):
            self.unexpected_exits.append(w.returncode)
        self.worker = subprocess.Popen([sys.executable, "-c", CLI, "worker"], env=self.env,
                                       stdout=self.worker_log, stderr=subprocess.STDOUT,
                                       start_new_session=True)

    def render_pids(self) -> list[int]:
        from rq.registry import StartedJobRegistry
        from rq.serializers import JSONSerializer

        try:
            r = self.conn()
            reg = StartedJobRegistry(self.settings.queue_name, connection=r, serializer=JSONSerializer)
            pids = []
            for jid in reg.get_job_ids(cleanup=False):
                raw = r.hget(f"rq:job:{jid}", "meta")
                pid = int((json.loads(raw or b"{}").get("h3r") or {}).get("pid") or 0)
                if pid:
                    pids.append(pid)
            return pids
        except Exception:  # noqa: BLE001 - Redis may be down right now
            return []

    def kill(self, pid: int) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return False
        self.killed_pids.add(pid)
        return True

    # -------------------------------------------------------------- faults

    def inject(self, fault: str) -> bool:
        """Inject one fault; False when there was nothing to do it to (not counted)."""
        did = False
        if fault in ("kill-worker", "kill-both") and self.worker and self.worker.poll() is None:
            did = self.kill(self.worker.pid)
        if fault in ("kill-render", "kill-both"):
            for pid in self.render_pids():
                did = self.kill(pid) or did
        if fault == "kill-redis":
            pid = self.redis.read_pid()
            if pid:
                os.kill(pid, signal.SIGKILL)
                did = True
                time.sleep(self.rng.uniform(0, 2))
            self.redis.start()
        if fault == "corrupt":
            did = self.corrupt_one()
        if fault == "cancel":
            did = self.cancel_one()
        if fault == "enqueue":
            did = self.enqueue_one()
        if did:
            self.tried[fault] += 1
        return did

    def live_ids(self) -> list[str]:
        return [j for j in self.acked if j not in self.corrupted and j not in self.canceled]

    def corrupt_one(self) -> bool:
        from rq.registry import StartedJobRegistry

        r = self.conn()
        try:
            queued = {x.decode() for x in r.lrange(f"rq:queue:{self.settings.queue_name}", 0, -1)}
            started = set(StartedJobRegistry(self.settings.queue_name, connection=r).get_job_ids())
        except Exception:  # noqa: BLE001
            return False
        cands = [j for j in self.live_ids() if j in queued and j not in started]
        if not cands:
            return False
        jid = self.rng.choice(cands)
        field, value = self.rng.choice(CORRUPTIONS)
        r.hset(f"rq:job:{jid}", field, value)
        self.corrupted[jid] = field
        return True

    def cancel_one(self) -> bool:
        from h3render.queue import control

        try:
            r = self.conn()
            cands = [j for j in self.live_ids()
                     if r.hget(f"rq:job:{j}", "status") not in (b"finished", b"failed", b"canceled")]
        except Exception:  # noqa: BLE001 - Redis down right now
            return False
        if not cands:
            return False
        jid = self.rng.choice(cands)
        try:
            done = control.cancel(r, jid).done
        except Exception:  # noqa: BLE001 - e.g. Redis down: not a cancel
            return False
        if done:
            self.canceled.add(jid)
        return bool(done)

    def enqueue_one(self) -> bool:
        from h3render.queue.enqueue import enqueue

        try:
            res = enqueue(self.conn(), {**SMALL, "steps": self.args.steps,
                                        "seed": self.rng.randrange(1 << 30)}, self.settings)
        except Exception:  # noqa: BLE001 - Redis down: not acknowledged, nothing to check
            return False
        self.acked.extend(res.job_ids)
        return True

    # -------------------------------------------------------------- the run

    def run(self) -> list[FaultRow]:
        from h3render.queue.enqueue import enqueue_sweep

        self.redis.start()
        res = enqueue_sweep(self.conn(), {**SMALL, "steps": self.args.steps},
                            {"seed": list(range(self.args.jobs))}, self.settings)
        self.acked.extend(res.job_ids)
        self.ensure_worker()
        end = time.time() + self.args.minutes * 60
        faults = 0
        while time.time() < end and faults < self.args.faults:
            time.sleep(self.rng.uniform(0.3, 2.0))
            faults += self.inject(self.rng.choice(FAULTS))
            self.ensure_worker()
        drained = self.drain(self.args.drain_minutes * 60)
        self.stop_worker()
        return self.verify(drained)

    def ended(self) -> dict[str, str]:
        from h3render.queue.status import job_status

        r = self.conn()
        out = {}
        for jid in self.acked:
            try:
                out[jid] = job_status(r, jid).state
            except Exception:  # noqa: BLE001 - a corrupted record: rq's raw status field decides
                raw = (r.hget(f"rq:job:{jid}", "status") or b"").decode(errors="replace")
                out[jid] = {"stopped": "canceled"}.get(raw, raw) if raw in (
                    "finished", "failed", "canceled", "stopped") else "unreadable"
        return out

    def drain(self, limit_s: float) -> bool:
        end = time.time() + limit_s
        while time.time() < end:
            self.ensure_worker()
            states = self.ended()
            if all(s in ("finished", "failed", "canceled") for s in states.values()):
                return True
            time.sleep(2)
        return False

    def stop_worker(self) -> None:
        w = self.worker
        if w and w.poll() is None:
            w.send_signal(signal.SIGTERM)
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
        if w and w.returncode not in (0, -9, -15) and w.pid not in self.killed_pids:
            self.unexpected_exits.append(w.returncode)

    def verify(self, drained: bool) -> list[FaultRow]:
        from rq.job import Job
        from rq.results import Result
        from rq.serializers import JSONSerializer

        r = self.conn()
        states = self.ended()
        lost = [j for j in self.acked if not r.exists(f"rq:job:{j}")]
        not_ended = [j for j, s in states.items() if s not in ("finished", "failed", "canceled")]
        twice, bad_folder, no_reason, corrupt_unnamed = [], [], [], []
        renders = self.settings.renders_dir()
        for jid, s in states.items():
            if jid in lost:
                continue
            try:
                job = Job.fetch(jid, connection=r, serializer=JSONSerializer)
                ok_runs = sum(1 for x in Result.all(job, serializer=JSONSerializer)
                              if x.type == Result.Type.SUCCESSFUL)
                h = job.meta.get("h3r") or {}
            except Exception:  # noqa: BLE001 - a record we corrupted may stay unreadable
                ok_runs, h = 0, {}
            if ok_runs > 1 and jid not in self.canceled:
                twice.append(jid)
            folder = [d for d in renders.glob(f"*/{jid}") if d.is_dir()]
            names = {p.name for d in folder for p in d.iterdir()}
            if s == "finished" and names != {"video.mp4", "poster.png", "meta.json"}:
                bad_folder.append((jid, s, sorted(names)))
            if s == "failed":
                if names not in (set(), {"meta.json"}):
                    bad_folder.append((jid, s, sorted(names)))
                if not h.get("error"):
                    no_reason.append(jid)
                field = self.corrupted.get(jid)
                if field and field not in (h.get("error") or ""):
                    corrupt_unnamed.append((jid, field, (h.get("error") or "")[:80]))
        temps = temp_files(renders)
        total = sum(self.tried.values())
        note = ", ".join(f"{k} {v}" for k, v in sorted(self.tried.items()))
        ends = Counter(states.values())
        rows = [
            FaultRow("soak", f"random faults over a {len(self.acked)}-job sweep", total,
                     total if not (lost or twice or not_ended) else 0, len(lost),
                     "0 lost, 0 run twice, every job ended", note),
            FaultRow("soak", "jobs ended", len(self.acked), len(self.acked) - len(not_ended),
                     len(lost), "finished, failed with a reason, or canceled",
                     ", ".join(f"{k} {v}" for k, v in sorted(ends.items()))),
            FaultRow("soak", "jobs finished twice", len(self.acked), len(self.acked) - len(twice),
                     0, "0", ", ".join(twice[:5])),
            FaultRow("soak", "failed jobs with a reason", ends["failed"],
                     ends["failed"] - len(no_reason), 0, "every failed job names why"),
            FaultRow("soak", "corrupted records failed naming the field", len(self.corrupted),
                     len(self.corrupted) - len(corrupt_unnamed), 0, "field named",
                     "; ".join(f"{j} {f}: {e}" for j, f, e in corrupt_unnamed[:3])),
            FaultRow("soak", "job folders complete or meta.json only", len(states),
                     len(states) - len(bad_folder), len(bad_folder), "no half file under a final name",
                     "; ".join(f"{j} {s} {n}" for j, s, n in bad_folder[:3])),
            FaultRow("soak", "temporary files left under renders/", 1, 0 if temps else 1, len(temps),
                     "0", "; ".join(str(p.relative_to(renders)) for p in temps[:3])),
            FaultRow("soak", "worker exits not caused by a kill", 1, 0 if self.unexpected_exits else 1,
                     0, "0", ", ".join(map(str, self.unexpected_exits[:5]))),
        ]
        if not drained:
            rows.append(FaultRow("soak", "queue drained in time", 1, 0, 0,
                                 f"within {self.args.drain_minutes} min after the faults stop",
                                 "; ".join(self.where(r, j) for j in not_ended[:3])))
        return rows

    def where(self, r, jid: str) -> str:
        """Where a job that did not end sits: its status, meta state and every list holding it."""
        q = self.settings.queue_name
        raw = r.hgetall(f"rq:job:{jid}")
        meta = json.loads(raw.get(b"meta") or b"{}").get("h3r") or {}
        places = [name for name, hit in (
            ("queue", jid.encode() in r.lrange(f"rq:queue:{q}", 0, -1)),
            ("intermediate", jid.encode() in r.lrange(f"rq:queue:{q}:intermediate", 0, -1)),
            ("scheduled", r.zscore(f"rq:scheduled:{q}", jid) is not None),
            ("started", any(e.decode().startswith(jid) for e in r.zrange(f"rq:wip:{q}", 0, -1))),
            ("failed", r.zscore(f"rq:failed:{q}", jid) is not None),
            ("deferred", r.zscore(f"rq:deferred:{q}", jid) is not None)) if hit]
        return (f"{jid} status {raw.get(b'status', b'?').decode()} state {meta.get('state')} attempt "
                f"{meta.get('attempt')} in {','.join(places) or 'no list'}")

    def close(self) -> None:
        try:
            self.redis.stop(hard=True)
        except Exception:  # noqa: BLE001
            pass
        self.worker_log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="time bound of the fault phase")
    ap.add_argument("--faults", type=int, default=400, help="at most this many faults")
    ap.add_argument("--jobs", type=int, default=40, help="jobs in the sweep")
    ap.add_argument("--steps", type=int, default=30, help="denoising steps per job")
    ap.add_argument("--drain-minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--report", type=Path, default=None, help="also append the rows as JSON lines")
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 20)
    soak = Soak(args)
    print(f"soak: seed {args.seed}, {args.jobs} jobs, up to {args.faults} faults in "
          f"{args.minutes:g} min; logs in {soak.tmp}", flush=True)
    t0 = time.time()
    try:
        rows = soak.run()
    finally:
        soak.close()
    print(f"soak: {time.time() - t0:.0f} s")
    for line in format_table(rows):
        print(line)
    if args.report:
        with open(args.report, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row.__dict__) + "\n")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
