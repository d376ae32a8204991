"""The step journal: an append-only, hash-chained log of entries in SQLite (WAL).

Nothing is ever updated in place. A step is the fold of its entries:
  begin        argv, cwd, started_at, policy_sha256, user, session, pid, …
  end          exit_code, signal, ended_at, duration_ms, marks, denied_paths, …
  interrupted  the step's client or daemon died before `end`
  request / approval / snapshot / …   what later parts add, each an entry of its own
Each entry carries the hash of the one before it, so `fsck` can prove no entry was changed,
dropped or reordered. The format is in docs/FORMAT.md.

Only the standard library: `envgit log` and `show` read the journal without the daemon.
"""

import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field

GENESIS = "0" * 64
SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq   INTEGER PRIMARY KEY,
    step  INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    at_ns INTEGER NOT NULL,
    body  TEXT NOT NULL,
    prev  TEXT NOT NULL,
    hash  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_step ON entries(step);
"""


def entry_hash(seq, step, kind, at_ns, body, prev) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([seq, step, kind, at_ns, body, prev], separators=(",", ":")).encode())
    return h.hexdigest()


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Step:
    id: int
    argv: list = field(default_factory=list)
    cwd: str = ""
    session: str = ""
    user: str = ""
    status: str = "running"        # running | done | interrupted
    exit_code: int | None = None
    signal: str | None = None
    started_at: str = ""
    ended_at: str | None = None
    started_ns: int = 0
    duration_ms: float | None = None
    policy_sha256: str = ""
    marks: list = field(default_factory=list)
    denied_paths: list = field(default_factory=list)
    escape_routes: list = field(default_factory=list)   # protected paths the step created
    tool_call_id: str | None = None
    pid: int | None = None
    requests: list = field(default_factory=list)
    approvals: list = field(default_factory=list)
    snapshot: dict | None = None        # the tree after the step and what changed (end entry)
    baseline: dict | None = None        # the tree before step 1: what the first diff compares to
    rewind: dict | None = None          # for a rewind step: its target and undo trees
    irreversible: list = field(default_factory=list)
    events: list = field(default_factory=list)   # mcp-call / file-op / note entries, in order
    extra: dict = field(default_factory=dict)    # what a recorded step's caller added at its end

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d.pop("started_ns")
        return d


def utc(ns: int) -> str:
    t = time.gmtime(ns // 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{ns % 1_000_000_000 // 1000:06d}Z"


class Journal:
    def __init__(self, path: str, readonly: bool = False):
        self.path = path
        self.lock = threading.RLock()
        if readonly:
            if not os.path.exists(path):
                raise FileNotFoundError(path)
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10,
                                      isolation_level=None)
        else:
            # The daemon's worker threads (rewind) write too: one connection, one lock.
            self.db = sqlite3.connect(path, timeout=10, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)

    def close(self):
        self.db.close()

    # --- writing: one transaction per entry, so an entry is whole or absent ---------------

    def _append(self, step, kind, body, new_step=False) -> int:
        with self.lock:
            return self._append_locked(step, kind, body, new_step)

    def _append_locked(self, step, kind, body, new_step) -> int:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (row[0] + 1, row[1]) if row else (1, GENESIS)
            if new_step:
                step = (db.execute("SELECT MAX(step) FROM entries").fetchone()[0] or 0) + 1
            at = time.time_ns()
            text = canonical(body)
            db.execute("INSERT INTO entries VALUES (?,?,?,?,?,?,?)",
                       (seq, step, kind, at, text, prev, entry_hash(seq, step, kind, at, text, prev)))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return step

    def begin_step(self, body: dict) -> int:
        """A new step id (1, 2, 3, … per project) with its `begin` entry."""
        return self._append(None, "begin", body, new_step=True)

    def append(self, step: int, kind: str, body: dict):
        """An entry on a step; step 0 holds the project's own entries (gc)."""
        self._append(step, kind, body)

    # --- reading ---------------------------------------------------------------------------

    def _rows(self, where="", args=()):
        with self.lock:
            return self.db.execute(f"SELECT step, kind, at_ns, body FROM entries {where} ORDER BY seq",
                                   args).fetchall()

    def steps(self, session: str | None = None) -> list[Step]:
        out: dict[int, Step] = {}
        for step, kind, at, body in self._rows():
            _fold(out, step, kind, at, json.loads(body))
        steps = sorted(out.values(), key=lambda s: s.id)
        return [s for s in steps if session is None or s.session == session]

    def step(self, n: int) -> Step | None:
        out: dict[int, Step] = {}
        for step, kind, at, body in self._rows("WHERE step = ?", (n,)):
            _fold(out, step, kind, at, json.loads(body))
        return out.get(n)

    def dropped_snapshots(self) -> set[int]:
        """Steps whose snapshot `envgit gc` dropped (project-level `gc` entries, step 0)."""
        out = set()
        for (body,) in self.db.execute("SELECT body FROM entries WHERE step = 0 AND kind = 'gc'"):
            out.update(json.loads(body).get("dropped", []))
        return out

    def live_trees(self, dropping=()) -> list[str]:
        """Every snapshot tree the journal still refers to (a step's snapshot, the baseline,
        rewind undo points), leaving out the steps gc dropped and those in `dropping`."""
        gone = self.dropped_snapshots() | set(dropping)
        out = []
        for s in self.steps():
            if s.id in gone:
                continue
            for t in ((s.snapshot or {}).get("tree"), (s.baseline or {}).get("tree"),
                      (s.rewind or {}).get("undo_tree")):
                if t and t not in out:
                    out.append(t)
        return out

    def open_steps(self) -> list[Step]:
        return [s for s in self.steps() if s.status == "running"]

    def verify(self) -> list[str]:
        """Every problem of the chain: a changed, dropped or reordered entry."""
        problems, prev, expect = [], GENESIS, 1
        for seq, step, kind, at, body, p, h in self.db.execute(
                "SELECT seq, step, kind, at_ns, body, prev, hash FROM entries ORDER BY seq"):
            if seq != expect:
                problems.append(f"journal: entry {expect} is missing (next is {seq})")
            if p != prev:
                problems.append(f"journal: entry {seq} does not follow entry {seq - 1} (chain broken)")
            if entry_hash(seq, step, kind, at, body, p) != h:
                problems.append(f"journal: entry {seq} ({kind} of step {step}) was changed after it was written")
            try:
                json.loads(body)
            except ValueError:
                problems.append(f"journal: entry {seq} is not valid JSON")
            prev, expect = h, seq + 1
        return problems


def _fold(out, step, kind, at, body):
    if kind == "begin":
        s = out[step] = Step(id=step, started_ns=at, started_at=utc(at))
        for k in ("argv", "cwd", "session", "user", "policy_sha256", "tool_call_id", "pid", "marks",
                  "baseline", "rewind"):
            if k in body:
                setattr(s, k, body[k])
        return
    s = out.get(step)
    if s is None:
        return
    if kind == "end":
        s.status = "done"
        s.exit_code, s.signal = body.get("exit_code"), body.get("signal")
        s.denied_paths = body.get("denied_paths", [])
        s.escape_routes = body.get("escape_routes", [])
        s.snapshot = body.get("snapshot", s.snapshot)
        s.extra = body.get("extra", s.extra)
        s.marks = s.marks + [m for m in body.get("marks", []) if m not in s.marks]
        _ended(s, at)
        if body.get("duration_ms") is not None:   # the command's own time, measured by the client
            s.duration_ms = body["duration_ms"]
    elif kind == "interrupted":
        s.status = "interrupted"
        s.snapshot = body.get("snapshot", s.snapshot)
        s.marks = s.marks + ["interrupted"]
        _ended(s, at)
    elif kind == "request":
        s.requests.append(body)
        if body.get("irreversible"):
            s.irreversible.append(body)
    elif kind == "approval":
        s.approvals.append(body)
    elif kind in ("mcp-call", "file-op", "note"):
        s.events.append({"kind": kind, **body})
    elif kind == "mark":
        s.marks = s.marks + [m for m in body.get("marks", []) if m not in s.marks]


def _ended(s, at):
    s.ended_at = utc(at)
    s.duration_ms = round((at - s.started_ns) / 1e6, 3)
