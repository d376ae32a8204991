"""What the page reads of the journal: pages of steps from SQL, never the whole journal.

The journal is opened read-only (`Journal(readonly=True)`: SQLite `mode=ro`) once per request,
on the request's own thread (sqlite3 connections belong to one thread), and closed after it.
A page is at most PAGE_MAX step ids found through the (kind, step) index, newest first,
then folded (`Journal._fold_steps`, the journal's own fold): what a page costs does not grow
with the journal, only with what the filters must look at (a filter on marks, hosts, paths or
command text reads those entries' JSON in SQLite, never in Python).
"""

import contextlib
import json
from dataclasses import dataclass

from ..journal import Journal

PAGE = 50
PAGE_MAX = 200
NEW_MAX = 200           # steps one live update looks at; more is a reload's job
TOP = 1 << 62

# The marks a person filters by (the list), shown in the filter's menu; any other
# mark a step carries can be typed into the URL (?mark=NAME) or reached from its badge.
KNOWN_MARKS = ("denied-net", "denied-read", "asked", "irreversible", "escape-route-written", "tool-files-written",
               "credential-misuse", "read-much-return-little", "outside", "rewind",
               "policy-file-written", "setuid-stripped", "interrupted", "refused",
               "snapshot-failed", "learn", "sandbox-degraded")


@dataclass(frozen=True)
class Filters:
    mark: str = ""
    session: str = ""
    host: str = ""
    path: str = ""
    q: str = ""

    @classmethod
    def from_query(cls, params) -> "Filters":
        def one(k):
            v = params.get(k) or ""
            return v.strip()[:1000]
        return cls(one("mark"), one("session"), one("host"), one("path"), one("q"))

    def items(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v}

    def __bool__(self):
        return bool(self.items())


@contextlib.contextmanager
def journal(path: str):
    """The journal read-only for one request, or None when it does not exist yet."""
    try:
        j = Journal(path, readonly=True)
    except FileNotFoundError:
        yield None
        return
    try:
        yield j
    finally:
        j.close()


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


_BODY = "CASE WHEN json_valid(body) THEN body ELSE '{}' END"   # a damaged row matches nothing


def _in_text(value: str) -> str:
    """How `value` appears inside the canonical JSON of a body (journal/rows.py `canonical`):
    a cheap substring test SQLite runs before it parses a row's JSON."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


def _conditions(f: Filters) -> tuple[list[str], list]:
    """SQL conditions on `step` (each a `step IN (…)`) for the filters, and their arguments.
    Each first tests the row's text for the value (instr, LIKE), then parses only the rows
    that hold it: a filter costs one pass over the rows of its kinds, mostly without JSON."""
    where, args = [], []
    if f.mark == "outside":
        where.append("step IN (SELECT step FROM entries WHERE kind = 'outside')")
    elif f.mark == "interrupted":
        where.append("step IN (SELECT step FROM entries WHERE kind = 'interrupted')")
    elif f.mark:
        where.append("step IN (SELECT step FROM entries WHERE kind IN ('begin', 'end', 'outside') "
                     "AND instr(body, ?) > 0 "
                     f"AND EXISTS (SELECT 1 FROM json_each({_BODY}, '$.marks') WHERE value = ?))")
        args += [json.dumps(f.mark, ensure_ascii=False), f.mark]
    if f.session:
        where.append("step IN (SELECT step FROM entries WHERE kind IN ('begin', 'outside') "
                     f"AND instr(body, ?) > 0 AND json_extract({_BODY}, '$.session') = ?)")
        args += [json.dumps(f.session, ensure_ascii=False), f.session]
    if f.host:
        where.append("step IN (SELECT step FROM entries WHERE kind = 'request' AND instr(lower(body), lower(?)) > 0 "
                     f"AND lower(json_extract({_BODY}, '$.host')) = lower(?))")
        args += [_in_text(f.host), f.host]
    if f.path:
        p = f.path.strip("/")
        where.append("step IN (SELECT step FROM entries WHERE kind IN ('end', 'interrupted', 'outside') "
                     f"AND instr(body, ?) > 0 AND EXISTS (SELECT 1 FROM json_each({_BODY}, '$.snapshot.paths') "
                     "WHERE json_extract(value, '$.path') = ? "
                     "OR json_extract(value, '$.path') LIKE ? ESCAPE '\\'))")
        args += [_in_text(p), p, _like(p) + "/%"]
    if f.q:
        where.append("step IN (SELECT step FROM entries WHERE kind = 'begin' "
                     + ("AND body LIKE ? ESCAPE '\\' " if _in_text(f.q) == f.q else "")
                     + f"AND (SELECT group_concat(value, ' ') FROM json_each({_BODY}, '$.argv')) "
                     "LIKE ? ESCAPE '\\')")
        args += (["%" + _like(f.q) + "%"] if _in_text(f.q) == f.q else []) + ["%" + _like(f.q) + "%"]
    return where, args


def step_ids(j: Journal, f: Filters, before: int | None = None, limit: int = PAGE,
             only: list[int] | None = None) -> list[int]:
    """Up to `limit` step ids below `before`, newest first, that pass the filters (and are in
    `only` when given). A step starts with a `begin`, or is one `outside` entry."""
    where, args = _conditions(f)
    if only is not None:
        if not only:
            return []
        where.append(f"step IN ({','.join('?' * len(only))})")
        args += list(only)
    extra = "".join(" AND " + w for w in where)
    ids: set[int] = set()
    with j.lock:
        for kind in ("begin", "outside"):       # one index range each, merged
            ids.update(r[0] for r in j.db.execute(
                f"SELECT step FROM entries WHERE kind = ? AND step < ?{extra} ORDER BY step DESC LIMIT ?",
                (kind, before if before is not None else TOP, *args, limit)))
    return sorted(ids, reverse=True)[:limit]


def page(j: Journal, f: Filters, before: int | None = None, limit: int = PAGE):
    """(steps newest first, the `before` of the next older page or None)."""
    limit = max(1, min(limit, PAGE_MAX))
    ids = step_ids(j, f, before, limit + 1)
    more = len(ids) > limit
    ids = ids[:limit]
    folded = j._fold_steps(ids)
    return [folded[n] for n in ids if n in folded], (ids[-1] if more and ids else None)


def head_seq(j: Journal) -> int:
    with j.lock:
        return j.db.execute("SELECT COALESCE(MAX(seq), 0) FROM entries").fetchone()[0]


def changed_since(j: Journal, seq: int, f: Filters) -> tuple[list, int]:
    """(the steps with entries after `seq` that pass the filters, oldest first; the seq read
    up to). At most NEW_MAX steps a call: the rest come with the next call."""
    with j.lock:
        rows = j.db.execute("SELECT seq, step FROM entries WHERE seq > ? AND step > 0 ORDER BY seq LIMIT ?",
                            (seq, NEW_MAX * 8)).fetchall()
    if not rows:
        return [], max(seq, head_seq(j))
    upto = seq
    ids: list[int] = []
    for s, n in rows:
        if n not in ids:
            if len(ids) == NEW_MAX:
                break
            ids.append(n)
        upto = s
    if len(rows) < NEW_MAX * 8 and len(ids) < NEW_MAX:
        upto = rows[-1][0]
    keep = step_ids(j, f, None, len(ids), only=ids)
    folded = j._fold_steps(keep)
    return [folded[n] for n in sorted(keep) if n in folded], upto


def sessions(j: Journal, limit: int = 50, look: int = 2000) -> list[str]:
    """The sessions of the last `look` steps, newest first (at most `limit`), for the filter's
    menu; an older one is reached from its steps' session links."""
    out: list[str] = []
    with j.lock:
        rows = j.db.execute(f"SELECT json_extract({_BODY}, '$.session') FROM entries WHERE kind = 'begin' "
                            "ORDER BY step DESC LIMIT ?", (look,)).fetchall()
    for (s,) in rows:
        if isinstance(s, str) and s not in out:
            out.append(s)
            if len(out) == limit:
                break
    return out


def tree_before(j: Journal, s) -> str | None:
    """The tree a step's changes are counted from: its baseline (the first step), else the
    newest snapshot of a step before it (an `outside` step included); None: the empty tree."""
    if s.baseline and s.baseline.get("tree"):
        return s.baseline["tree"]
    with j.lock:
        rows = j.db.execute(
            "SELECT step, kind, body FROM entries WHERE kind IN ('end', 'interrupted', 'outside', 'begin') "
            "AND step < ? AND step > 0 ORDER BY step DESC, seq DESC LIMIT 64", (s.id,)).fetchall()
    for _, kind, body in rows:
        try:
            b = json.loads(body)
        except ValueError:
            continue
        if not isinstance(b, dict):
            continue
        snap = b.get("snapshot") if kind != "begin" else b.get("baseline")
        if isinstance(snap, dict) and isinstance(snap.get("tree"), str):
            return snap["tree"]
    return None
