"""The journal itself (`Journal`): appending an entry in one transaction onto the chain,
reading steps through the indexes, verifying the chain (the package's docstring says what it
holds)."""

import os
import sqlite3
import threading
import time

from .. import faults
from . import reseal
from .chain import CLOSING, FORMAT_VERSION, GENESIS, LAST_ROW, SCHEMA, SCHEMA_V2, entry_hash
from .errors import JournalError, Problem
from .fold import Step, fold_entry
from .head import HEAD_FILE, HeadRecord, recorded_loss, tail_problem_once
from .live import dropped_by_gc, live_trees
from .rows import check_entry, read_body
from .tailwatch import tail_moved


def _drop_half_made_wal(path: str) -> None:
    """A writer that could not open the journal (a full disk) may leave the WAL files it began:
    an empty -wal and a -shm too short to be one. Left there, every later reader fails on them
    ("disk I/O error") even once space is freed; nothing is in them, so they go."""
    try:
        # a WAL index is 32 KiB at least: one shorter was cut off as it was made
        if os.path.getsize(path + "-wal") != 0 or os.path.getsize(path + "-shm") >= 32768:
            return
    except OSError:
        return
    for suffix in ("-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except OSError:
            pass


def _wal_has_data(path: str) -> bool:
    try:
        return os.path.getsize(path + "-wal") > 0
    except OSError:
        return False


class Journal:
    def __init__(self, path: str, readonly: bool = False):
        self.path = path
        self.head = HeadRecord(os.path.join(os.path.dirname(path), HEAD_FILE))
        self.lock = threading.RLock()
        self.lost_now = None            # the `lost` entry this writer recorded on opening
        if readonly:
            if not os.path.exists(path):
                raise FileNotFoundError(path)
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10,
                                      isolation_level=None)
            try:
                self.version = self._check_version()
            except sqlite3.OperationalError as e:
                # A reader of a WAL journal makes the -shm file; on a full disk it cannot, and
                # every read failed ("disk I/O error") until space was freed. With no -wal, or
                # an empty one, the database file is the whole journal: read it as it is.
                if "disk I/O" not in str(e) or _wal_has_data(path):
                    raise
                self.db.close()
                self.db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, timeout=10,
                                          isolation_level=None)
                self.version = self._check_version()
        else:
            # The daemon's worker threads (rewind) write too: one connection, one lock.
            self.db = sqlite3.connect(path, timeout=10, isolation_level=None,
                                      check_same_thread=False)
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                self.db.close()
                _drop_half_made_wal(path)
                raise
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.version = self._check_version()
            self.db.executescript(SCHEMA)
            if self.version < FORMAT_VERSION:
                self._migrate()
            self.floor = self._highest_step_known()
            self.tip = self.db.execute(LAST_ROW).fetchone()     # what the tail must be (tailwatch.py)
            self.lost_now = self._record_a_lost_tail()

    def close(self):
        self.db.close()
        self.head.close()

    def _check_version(self) -> int:
        v = self.db.execute("PRAGMA user_version").fetchone()[0]
        if v > FORMAT_VERSION:
            self.db.close()
            raise JournalError(f"{self.path} is journal format {v}; this envgit reads format "
                               f"{FORMAT_VERSION} (upgrade envgit)")
        return max(v, 1)

    def _migrate(self):
        """Version 1 (or 0) to 2: the index and the open-steps table, filled from a fold of
        the begin/end/interrupted rows, in one transaction with the new version number."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for stmt in SCHEMA_V2.strip().split(";"):
                    if stmt.strip():
                        self.db.execute(stmt)
                self._fill_open_steps()
                self.db.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        self.version = FORMAT_VERSION

    def _fill_open_steps(self):
        self.db.execute("DELETE FROM open_steps")
        self.db.executemany("INSERT INTO open_steps VALUES (?)",
                            [(n,) for n in sorted(self._open_by_fold())])

    def _open_by_fold(self) -> set[int]:
        out: dict[int, Step] = {}
        for row in self.db.execute("SELECT seq, step, kind, at_ns, body FROM entries WHERE kind IN "
                                   "('begin', 'end', 'interrupted') ORDER BY seq"):
            fold_entry(out, *row)
        return {n for n, s in out.items() if s.status == "running"}

    def rebuild_open_steps(self) -> None:
        """Make the open-steps table what the entries say again (fsck --repair)."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self._fill_open_steps()
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    # --- writing: one transaction per entry, so an entry is whole or absent ---------------

    def _append(self, step, kind, body, new_step=False) -> int:
        with self.lock:
            return self._append_locked(step, kind, body, new_step)

    def _append_locked(self, step, kind, body, new_step) -> int:
        db = self.db
        try:               # checked before anything is written (a new step's id is not known yet)
            text = check_entry(1 if new_step else step, kind, body)
        except ValueError as e:
            raise JournalError(f"not written: {e}") from None
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(LAST_ROW).fetchone()
            if row != self.tip:     # rows deleted or replaced under this writer: recorded, not chained over
                row = tail_moved(self, row)
            seq, prev = (row[0] + 1, row[1]) if row else (1, GENESIS)
            if new_step:     # never an id the journal ever gave, even one it lost since
                step = max(db.execute("SELECT MAX(step) FROM entries").fetchone()[0] or 0, self.floor) + 1
            at = time.time_ns()
            h = entry_hash(seq, step, kind, at, text, prev)
            db.execute("INSERT INTO entries VALUES (?,?,?,?,?,?,?)", (seq, step, kind, at, text, prev, h))
            if kind == "begin":
                db.execute("INSERT OR IGNORE INTO open_steps VALUES (?)", (step,))
            elif kind in CLOSING:
                db.execute("DELETE FROM open_steps WHERE step = ?", (step,))
            faults.point("journal-inserted")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:       # a failed COMMIT may have ended it: never hide the cause
                db.execute("ROLLBACK")
            raise
        faults.point("journal-committed")
        self.floor, self.tip = max(self.floor, step), (seq, h)
        self.head.write(seq, h, self.floor)
        return step

    def begin_step(self, body: dict) -> int:
        """A new step id (1, 2, 3, … per project, never reused) with its `begin` entry."""
        return self._append(None, "begin", body, new_step=True)

    def outside_step(self, body: dict) -> int:
        """A new step id with its one `outside` entry: changes made outside envgit, whole."""
        return self._append(None, "outside", body, new_step=True)

    def append(self, step: int, kind: str, body: dict):
        """An entry on a step; step 0 holds the project's own entries (gc, lost)."""
        self._append(step, kind, body)

    # --- the head record: how far the journal reached ------------------------------------

    def _highest_step_known(self) -> int:
        floor = self.db.execute("SELECT MAX(step) FROM entries").fetchone()[0] or 0
        head = self.head.read()
        if head:        # a damaged one says nothing (None)
            floor = max(floor, head["step"])
        for (body,) in self.db.execute("SELECT body FROM entries WHERE step = 0 AND kind = 'lost'"):
            b, _ = read_body("lost", body)
            if b and type(b.get("last_step")) is int:
                floor = max(floor, b["last_step"])
        return floor

    def tail_problem(self) -> dict | None:
        """The body of a `lost` entry if the journal is not what its head record says it
        reached (entries lost from its tail, or a history rewritten); None if it is. A reader
        may meet the head half rewritten by the writer (one small pwrite, not atomic against a
        concurrent read): a problem is believed only if it is still there a moment later."""
        for attempt in range(3):
            found = self._tail_problem_once()
            if found is None:
                return None
            time.sleep(0.02 * (attempt + 1))
        return found

    def _tail_problem_once(self) -> dict | None:
        return tail_problem_once(self)

    def _record_a_lost_tail(self):
        lost = self.tail_problem()
        if lost is None:
            return None
        self.rebuild_open_steps()   # what the journal lost or had replaced, the derived table may still say
        self.append(0, "lost", lost)
        return lost

    # --- reading ---------------------------------------------------------------------------

    def _rows(self, where="", args=()):
        with self.lock:
            return self.db.execute(f"SELECT seq, step, kind, at_ns, body FROM entries {where} ORDER BY seq",
                                   args).fetchall()

    def steps(self, session: str | None = None, last: int | None = None) -> list[Step]:
        """Every step (of `session`), or with `last` the last that many, read through the
        (kind, step) index newest first: what `log -n` costs does not grow with the journal."""
        if last is not None:
            return self._last_steps(last, session)
        out: dict[int, Step] = {}
        for row in self._rows():
            fold_entry(out, *row)
        steps = sorted(out.values(), key=lambda s: s.id)
        return [s for s in steps if session is None or s.session == session]

    def step(self, n: int) -> Step | None:
        return self._fold_steps([n]).get(n)

    def _fold_steps(self, ids) -> dict[int, Step]:
        out: dict[int, Step] = {}
        ids = list(ids)
        for i in range(0, len(ids), 500):       # SQLite's bound on parameters
            part = ids[i:i + 500]
            for row in self._rows(f"WHERE step IN ({','.join('?' * len(part))})", part):
                fold_entry(out, *row)
        return out

    def steps_newest_first(self, session: str | None = None, batch: int = 32):
        """Steps from the highest id down, folded a batch at a time (begin rows through the
        index; a session is matched in SQL, a body that is not JSON never matches)."""
        below = (1 << 62)
        where = "kind = ? AND step < ?"
        if session is not None:
            where += " AND CASE WHEN json_valid(body) THEN json_extract(body, '$.session') END = ?"
        while True:
            ids = []
            with self.lock:         # a step starts with a begin, or is one `outside` entry
                for kind in ("begin", "outside"):     # one index range each, merged
                    ids += [r[0] for r in self.db.execute(
                        f"SELECT step FROM entries WHERE {where} ORDER BY step DESC LIMIT ?",
                        (kind, below, session, batch) if session is not None else (kind, below, batch))]
            ids = sorted(set(ids), reverse=True)[:batch]
            if not ids:
                return
            folded = self._fold_steps(ids)
            for n in ids:
                s = folded.get(n)
                if s is not None and (session is None or s.session == session):
                    yield s
            below = ids[-1]
            batch = min(batch * 2, 4096)

    def _last_steps(self, n: int, session=None) -> list[Step]:
        out = []
        if n > 0:
            for s in self.steps_newest_first(session, batch=max(n, 8)):
                out.append(s)
                if len(out) == n:
                    break
        return out[::-1]

    def outside_ids(self, after: int, upto: int | None) -> list[int]:
        """The `outside` steps (changes made outside envgit) with after < id <= upto (None: no
        bound), through the (kind, step) index."""
        with self.lock:
            return [r[0] for r in self.db.execute(
                "SELECT step FROM entries WHERE kind = 'outside' AND step > ? AND step <= ? ORDER BY step",
                (after, upto if upto is not None else 1 << 62))]

    def steps_between(self, first: int, last: int) -> list[Step]:
        """Steps first..last (ids), folded."""
        return sorted(self._fold_steps(range(first, last + 1)).values(), key=lambda s: s.id)

    def last_snapshot_step(self) -> Step | None:
        """The step with the highest id that has a snapshot tree (the daemon's start, diff)."""
        for s in self.steps_newest_first():
            if s.snapshot and s.snapshot.get("tree"):
                return s
        return None

    def dropped_snapshots(self) -> set[int]:
        """Steps whose snapshot `envgit gc` dropped (project-level `gc` entries, step 0)."""
        return dropped_by_gc(text for *_, text in self._rows("WHERE step = 0 AND kind = 'gc'"))

    def live_trees(self, dropping=()) -> list[str]:
        """Every snapshot tree the journal still refers to (live.py), leaving out the steps gc
        dropped and those in `dropping`."""
        return live_trees(self.steps(), self.dropped_snapshots() | set(dropping))

    def open_steps(self) -> list[Step]:
        """Steps with a begin and no end: from the open-steps table (version 2), each then
        folded and checked; a version-1 journal a reader opened is folded whole."""
        if self.version < 2:
            return [s for s in self.steps() if s.status == "running"]
        with self.lock:
            ids = [r[0] for r in self.db.execute("SELECT step FROM open_steps ORDER BY step")]
        folded = self._fold_steps(ids)
        return [folded[n] for n in ids if n in folded and folded[n].status == "running"]

    # --- verifying -------------------------------------------------------------------------

    def verify(self) -> list[Problem]:
        """Every problem: a changed, dropped or reordered entry, a row that cannot be read, a
        tail lost (recorded or not yet), a head record not written by envgit."""
        return self.problems()

    def verify_through(self, seq: int) -> list[str]:
        """The problems that make the history up to entry `seq` untrustworthy (rewind asks)."""
        return [p for p in self.problems(upto=seq) if p.taints(seq)]

    def _repaired_gaps(self) -> dict[int, int]:
        """seq -> the `lost` entry (fsck --repair) that recorded it unreadable in a damaged file."""
        out: dict[int, int] = {}
        for seq, _, kind, _, text in self._rows("WHERE step = 0 AND kind = 'lost'"):
            body, _ = read_body(kind, text)
            missing = (body or {}).get("missing")
            if isinstance(missing, list):
                out.update((m, seq) for m in missing if type(m) is int)
        return out

    def problems(self, upto: int | None = None) -> list[Problem]:
        problems: list[Problem] = []
        prev, expect = GENESIS, 1
        gaps, seals = self._repaired_gaps(), reseal.Seals(self)     # what repairs accounted for
        self.head.read(problems.append)
        stop = upto
        with self.lock:     # the daemon's connection is shared with its worker threads
            rows = self.db.execute("SELECT seq, step, kind, at_ns, body, prev, hash FROM entries"
                                   + (" WHERE seq <= ?" if stop is not None else "") + " ORDER BY seq",
                                   (stop,) if stop is not None else ()).fetchall()
        for seq, step, kind, at, body, p, h in rows:
            # A gap fsck --repair recorded (rows a damaged file lost) is said, not a rewrite:
            # the chain on either side of it still verifies, so rewinds trust it.
            known = seq != expect and all(k in gaps for k in range(expect, seq))
            joined = not known and (seq != expect or p != prev) and seals.joins(seq, p, expect - 1, prev)
            if known:
                problems.append(Problem(f"entries {expect}–{seq - 1} were lost with a damaged "
                                        f"journal.sqlite (recorded by entry {gaps[expect]})", seq, blocks=False))
            elif seq != expect and not joined:      # re-joined: its `reseal` entry says what went aside
                problems.append(Problem(f"entry {expect} is missing (next is {seq})", seq))
            if p != prev and not known and not joined:
                problems.append(Problem(f"entry {seq} does not follow entry {seq - 1} (chain broken)", seq))
            try:
                ok = entry_hash(seq, step, kind, at, body, p) == h
            except (TypeError, ValueError):
                ok = False
            if not ok:
                problems.append(Problem(f"entry {seq} ({kind} of step {step}) was changed after it was written", seq))
            what = [] if type(step) is int and type(at) is int else ["its step or time is not a number"]
            parsed, wrong = read_body(kind, body)
            what += wrong
            if what:
                problems.append(Problem(f"entry {seq} ({kind} of step {step}): {'; '.join(what)}; "
                                        "the rest of the journal is read without it", seq))
            elif kind == "lost":
                problems.append(recorded_loss(self, seq, parsed))
            elif kind == "reseal":
                problems += seals.notes(seq)
            prev, expect = h, seq + 1
        if stop is not None:        # losses recorded after `upto` may still be about entries before it
            for seq, _, kind, _, text in self._rows("WHERE step = 0 AND kind = 'lost' AND seq > ?", (stop,)):
                parsed, wrong = read_body(kind, text)
                if parsed is not None and not wrong:
                    problems.append(recorded_loss(self, seq, parsed))
        if stop is None and self.version >= 2:
            problems += self._open_steps_problems(rows)
        lost = self.tail_problem()
        if lost is not None:
            problems.append(Problem(lost["reason"] + " (not yet recorded: the next envgit "
                                    "command that writes records it)",
                                    None if lost.get("rewritten") else lost["entries"][0],
                                    blocks=not lost.get("head_damaged")))
        return problems

    def _open_steps_problems(self, rows) -> list[Problem]:
        """The open-steps table is derived (not in the hash chain): it must say what the
        entries say, or a step would never be closed, or a closed one reopened."""
        out: dict[int, Step] = {}
        for seq, step, kind, at, body, _, _ in rows:
            if kind == "begin" or kind in CLOSING:
                fold_entry(out, seq, step, kind, at, body)
        want = {n for n, s in out.items() if s.status == "running"}
        with self.lock:
            have = {r[0] for r in self.db.execute("SELECT step FROM open_steps")}
        if want == have:
            return []
        return [Problem("the table of open steps does not match the entries (steps "
                        f"{', '.join(map(str, sorted(want ^ have)[:10]))}); `envgit fsck --repair` "
                        "rebuilds it from the entries", blocks=False)]
