"""Remembered grants: a person's "allow, and remember" for one effect, kept in the journal.

A grant is made from one pending question (the gate's `_question`, proxy/judge.py) and covers
exactly the effect that question was about, on exactly its scheme, host and port:

  request   the same method (and every other method a server may act on: policy/acts.py's
            override headers and `_method` fields; and the same X-Original-URL/X-Rewrite-URL
            paths; every kind of grant requires these), the same path (a glob only
            when the person widened it: `--path`, recorded with who and when) and the same
            query (compared by its sha256: the journal never holds query values)
  git-push  the same repository; each ref update's ref and action (create / update / delete)
            among the granted ones (the commits differ push to push: a grant for `main` covers
            the next push to `main`, and a force push is an update, which the gate cannot tell
            apart); the same push options
  graphql   the same method and endpoint path; each operation (type, name, top-level fields)
            among the granted ones

A grant never covers another host or port, another method, another repository, ref, action or
operation, and never a credential's host (the policy's `credentials.*.hosts`, checked when the
grant is made and again at each use, so a credential added later wins). It expires
(DEFAULT_FOR_S unless `--for` says otherwise, at most MAX_FOR_S) and can be revoked.

Stored append-only in the journal as project entries (step 0): `grant` (the grant whole) and
`grant-revoke` (its id, who, when). Each use is the step's `approval` entry with
`how: "grant"` and `granted_by: ID`; uses are counted from those. The daemon keeps the live
grants in memory, read back from the journal when it starts, so a grant survives a restart.

Standard library and envgit.policy only (the daemon's import chain, not the hot path's).
"""

import re
import time
from dataclasses import dataclass, field

from ..journal.rows import read_body

DEFAULT_FOR_S = 8 * 3600
MAX_FOR_S = 30 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class GrantError(ValueError):
    """A grant that cannot be made as asked; the text says why and what to do instead."""


def parse_for(text) -> int:
    """`--for 8h` / 30m / 2d / 90s -> seconds (1 s .. MAX_FOR_S)."""
    t = str(text).strip()
    if t[-1:] in _UNITS and t[:-1].isdigit() and int(t[:-1]) > 0:
        s = int(t[:-1]) * _UNITS[t[-1]]
    elif t.isdigit() and int(t) > 0:
        s = int(t)
    else:
        raise GrantError(f"{text!r} is not a duration: give one like 30m, 8h or 2d")
    if s > MAX_FOR_S:
        raise GrantError(f"{text!r} is longer than a grant may last ({MAX_FOR_S // 86400}d)")
    return s


def scope_of(q: dict) -> dict:
    """The effect a question is about, as a grant stores and matches it. GrantError when the
    question is not about a network effect that can be remembered."""
    if not isinstance(q, dict) or not isinstance(q.get("host"), str) or type(q.get("port")) is not int \
            or q.get("scheme") not in ("http", "https", "ssh") or not isinstance(q.get("method"), str):
        raise GrantError("only a network request's question can be remembered (this one is "
                         f"{(q or {}).get('kind') or 'not a request'}); answer it without remembering")
    from ..policy.hostnames import norm_host
    base = {"scheme": q["scheme"], "host": norm_host(q["host"]), "port": q["port"],
            "method": q["method"].upper(), "method_override": sorted(q.get("method_override") or []),
            "rewrite_paths": sorted(q.get("rewrite_paths") or [])}
    path = str(q.get("path") or "/").partition("?")[0]
    if q.get("refs") is not None:
        return {**base, "effect": "git-push", "repository": q.get("repository") or path.rsplit("/", 1)[0],
                "path": path, "refs": sorted({(r["ref"], r["action"]) for r in q["refs"]}),
                "options": sorted(q.get("options") or [])}
    if q.get("operations") is not None:
        return {**base, "effect": "graphql", "path": path,
                "operations": sorted({(o["type"], o.get("name") or "", tuple(o.get("fields") or ()))
                                      for o in q["operations"]})}
    return {**base, "effect": "request", "path": path, "path_glob": None,
            "query_sha256": q.get("query_sha256")}


def _jsonable(scope: dict) -> dict:
    out = dict(scope)
    if "refs" in out:
        out["refs"] = [{"ref": r, "action": a} for r, a in out["refs"]]
    if "operations" in out:
        out["operations"] = [{"type": t, "name": n, "fields": list(f)} for t, n, f in out["operations"]]
    return out


def _from_json(scope: dict) -> dict:
    out = dict(scope)
    if "refs" in out:
        out["refs"] = sorted({(r["ref"], r["action"]) for r in out["refs"]})
    if "operations" in out:
        out["operations"] = sorted({(o["type"], o["name"], tuple(o["fields"])) for o in out["operations"]})
    return out


def credential_of(policy, host: str) -> str | None:
    """The credential whose hosts include `host` (a grant never covers one), or None."""
    from ..policy.hostnames import host_matches, norm_host, split_entry
    h = norm_host(host)
    for name, c in (getattr(policy, "credentials", None) or {}).items():
        # any port: a credential's host is never granted, whichever port it is reached on
        if any(host_matches(split_entry(str(e))[0], h) for e in c.get("hosts", ())):
            return name
    return None


@dataclass
class Grant:
    id: str
    scope: dict
    who: str
    how: str
    at: float
    expires_at: float
    step: int | None = None            # the step whose question it was made from
    ask: int | None = None
    widened: dict | None = None        # {"path": glob, "who", "at"} when the person widened it
    revoked: dict | None = None        # {"who", "at", "how"}
    uses: int = 0
    _glob: re.Pattern[str] | None = field(default=None, repr=False)   # path_glob compiled, once

    def live(self, now=None) -> bool:
        return self.revoked is None and (now or time.time()) < self.expires_at

    def to_json(self) -> dict:
        return {"id": self.id, "scope": _jsonable(self.scope), "who": self.who, "how": self.how,
                "at": self.at, "expires_at": self.expires_at, "step": self.step, "ask": self.ask,
                "widened": self.widened, "revoked": self.revoked, "uses": self.uses}

    def covers(self, q: dict) -> bool:
        """Whether the question `q` falls inside this grant (liveness and credentials aside)."""
        try:
            s = scope_of(q)
        except (GrantError, KeyError, TypeError):
            return False
        g = self.scope
        if s["effect"] != g["effect"] or any(s[k] != g.get(k, []) for k in
                                               ("scheme", "host", "port", "method", "method_override",
                                                "rewrite_paths")):
            return False
        if s["effect"] == "git-push":
            return (s["repository"] == g["repository"] and s["path"] == g["path"] and bool(s["refs"])
                    and set(s["refs"]) <= set(g["refs"]) and s["options"] == g["options"])
        if s["effect"] == "graphql":
            return s["path"] == g["path"] and bool(s["operations"]) and \
                set(s["operations"]) <= set(g["operations"])
        if s["query_sha256"] != g["query_sha256"]:
            return False
        if g.get("path_glob") is None:
            return s["path"] == g["path"]
        return self._glob_covers(s["path"])

    def _glob_covers(self, path: str) -> bool:
        """A widened path: every reading a server may give the path (policy/urlpath.py) is
        inside the glob, and the path has no doubtful reading (`..` above the root …)."""
        from ..policy.globs import compile_glob
        from ..policy.urlpath import readings
        if self._glob is None:
            self._glob = compile_glob(self.scope["path_glob"].lstrip("/") or "**")
        r = readings(path)
        if r.doubt:
            return False
        return all(self._glob.match(p.lstrip("/")) for p in r.spellings)


def widen_check(pattern: str, scope: dict) -> str:
    """A `--path` widening, checked: a request's grant only, an absolute glob that still
    matches the path asked about. Returns the pattern."""
    from ..policy.globs import GlobError, compile_glob
    if scope["effect"] != "request":
        raise GrantError(f"--path widens a request's path; a {scope['effect']} grant covers its "
                         + ("repository and refs" if scope["effect"] == "git-push" else "operations")
                         + " exactly")
    if not isinstance(pattern, str) or not pattern.startswith("/") or any(c in pattern for c in "?#\x00"):
        raise GrantError(f"--path {pattern!r}: give an absolute path glob such as '/repos/me/*/issues'")
    try:
        rx = compile_glob(pattern.lstrip("/") or "**")
    except GlobError as e:
        raise GrantError(f"--path {pattern!r}: {e}") from None
    if not rx.match(scope["path"].lstrip("/")):
        raise GrantError(f"--path {pattern!r} does not cover the path asked about ({scope['path']}); "
                         "a widening must include it")
    return pattern


class Grants:
    """The project's grants, as the journal holds them; the daemon's one copy."""

    def __init__(self, journal):
        self.journal = journal
        self.all: dict[str, Grant] = {}
        self._load()

    def _load(self):
        rows = self.journal._rows("WHERE step = 0 AND kind IN ('grant', 'grant-revoke')")
        for _, _, kind, _, text in rows:
            body, _ = read_body(kind, text)
            if not body:
                continue
            if kind == "grant":
                try:
                    g = Grant(id=body["id"], scope=_from_json(body["scope"]), who=body["who"],
                              how=body["how"], at=body["at"], expires_at=body["expires_at"],
                              step=body.get("step"), ask=body.get("ask"), widened=body.get("widened"))
                except (KeyError, TypeError):
                    continue                        # fsck names the row
                self.all[g.id] = g
            elif body.get("id") in self.all:
                self.all[body["id"]].revoked = {k: body.get(k) for k in ("who", "at", "how")}
        for gid, n in uses(self.journal).items():
            if gid in self.all:
                self.all[gid].uses = n

    def make(self, question, *, who, how, step, ask, for_s=DEFAULT_FOR_S, path=None, policy=None) -> Grant:
        scope = scope_of(question)
        cred = credential_of(policy, scope["host"])
        if cred is not None:
            raise GrantError(f"{scope['host']} is a host of credential {cred!r} (envgit.yaml "
                             "credentials): a grant never covers it; answer without remembering")
        now = time.time()
        widened = None
        if path is not None and path != scope["path"]:
            scope["path_glob"] = widen_check(path, scope)
            widened = {"path": path, "who": who, "at": now}
        if not (isinstance(for_s, (int, float)) and 0 < for_s <= MAX_FOR_S):
            raise GrantError(f"a grant lasts 1 s to {MAX_FOR_S // 86400} days, not {for_s!r}")
        gid = f"g{len(self.all) + 1}"
        g = Grant(id=gid, scope=scope, who=who, how=how, at=now, expires_at=now + for_s, step=step,
                  ask=ask, widened=widened)
        body = g.to_json()
        for k in ("revoked", "uses"):
            body.pop(k)
        self.journal.append(0, "grant", body)
        self.all[gid] = g
        return g

    def revoke(self, gid, *, who, how) -> Grant:
        g = self.all.get(gid)
        if g is None:
            raise GrantError(f"no grant {gid!r}; `envgit grants --all` lists them")
        if g.revoked is None:
            now = time.time()
            self.journal.append(0, "grant-revoke", {"id": gid, "who": who, "how": how, "at": now})
            g.revoked = {"who": who, "at": now, "how": how}
        return g

    def match(self, question, policy) -> Grant | None:
        """The live grant covering `question`, if any (never one on a credential's host)."""
        now = time.time()
        for g in self.all.values():
            if g.live(now) and g.covers(question) and credential_of(policy, g.scope["host"]) is None:
                return g
        return None


def uses(journal) -> dict[str, int]:
    """How many times each grant allowed a request: its steps' approval entries."""
    with journal.lock:
        rows = journal.db.execute(
            "SELECT json_extract(body, '$.granted_by'), COUNT(*) FROM entries WHERE kind = 'approval' "
            "AND json_valid(body) AND json_extract(body, '$.granted_by') IS NOT NULL GROUP BY 1").fetchall()
    return {r[0]: r[1] for r in rows if isinstance(r[0], str)}


def read_all(journal) -> list[Grant]:
    """Every grant with its revocation and uses (the CLI's read-only view)."""
    return list(Grants(journal).all.values())
