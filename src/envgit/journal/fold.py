"""A step as the fold of its entries (docs/FORMAT.md): `Step`, and `fold_entry`, which the
journal, its checks and a remote's reader (remote/read.py) all fold rows with."""

import time

from .rows import read_body


class Step:
    """A step as the journal's entries tell it (`fold`): each field with its value before any
    entry sets it, in the order `to_json` gives. A plain class, not a dataclass: `dataclasses`
    imports `inspect`, 10 ms of CPU that every `envgit log` and `envgit show` paid for nothing
    they used. A list or dict default is copied for each step, never shared."""

    id: int
    argv: list = []
    cwd: str = ""
    session: str = ""
    user: str = ""
    status: str = "running"               # running | done | interrupted
    exit_code: int | None = None
    signal: str | None = None
    started_at: str = ""
    ended_at: str | None = None
    started_ns: int = 0
    duration_ms: float | None = None
    policy_sha256: str = ""
    marks: list = []
    denied_paths: list = []
    denied_reads: list = []               # [{path, rule, where}]: denied paths it opened
    escape_routes: list = []              # protected paths the step created
    taken_back: list = []                 # of those, brought back (daemon/takeback.py)
    dns_names: list = []                  # names it looked up (all "do not exist")
    dns_queries: int | None = None        # how many lookups, names past 100 included
    tool_call_id: str | None = None
    pid: int | None = None
    published: list = []                  # [[host port, step port]…] (sandbox/publish.py)
    requests: list = []
    approvals: list = []
    snapshot: dict | None = None          # the tree after the step and what changed (end entry)
    baseline: dict | None = None          # the tree before step 1: what the first diff compares to
    rewind: dict | None = None            # for a rewind step: its target and undo trees
    outside: dict | None = None           # for changes made outside envgit: {since_step, before}
    irreversible: list = []
    events: list = []                     # mcp-call / file-op / note entries, in order
    extra: dict = {}                      # what a recorded step's caller added at its end
    memory: dict | None = None            # backend: vm: the memory snapshot after it (vm/memstore.py)
    sandbox: dict | None = None           # not bubblewrap: {backend, weaker} (sandbox/backend.py)
    last_seq: int = 0                     # the last entry folded in (what rewind verifies)

    def __init__(self, id: int, **given):
        unknown = given.keys() - _DEFAULTS.keys()
        if unknown:
            raise TypeError(f"Step has no field {sorted(unknown)[0]!r}")
        self.id = id
        for k, v in _DEFAULTS.items():
            setattr(self, k, given[k] if k in given else v.copy() if isinstance(v, (list, dict)) else v)

    def __repr__(self):
        return f"Step({self.__dict__!r})"

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d.pop("started_ns")
        d.pop("last_seq")
        return d


_DEFAULTS = {k: getattr(Step, k) for k in Step.__annotations__ if k != "id"}


def utc(ns: int) -> str:
    t = time.gmtime(ns // 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{ns % 1_000_000_000 // 1000:06d}Z"


def fold_entry(out, seq, step, kind, at, text):
    """Fold one entry row into `out` (step id -> Step): a begin or an outside entry makes a
    step, the others add to the step they name."""
    if type(step) is not int or type(at) is not int:
        return                          # a row edited out of shape: verify names it
    body, _ = read_body(kind, text)
    if body is None:
        return
    if kind == "begin":
        s = out[step] = Step(id=step, started_ns=at, started_at=utc(at), last_seq=seq)
        for k in ("argv", "cwd", "session", "user", "policy_sha256", "tool_call_id", "pid", "marks",
                  "baseline", "rewind", "published"):
            if k in body:
                setattr(s, k, body[k])
        if body.get("learn") is True:   # it ran in learn mode: said wherever marks are (log,
            s.marks = [*s.marks, "learn"]   # show, the page, --mark filters)
        if isinstance(body.get("sandbox"), dict):   # a weaker sandbox than bubblewrap's: said so
            s.sandbox = body["sandbox"]
            s.marks = [*s.marks, "sandbox-degraded"]
        return
    if kind == "outside":               # a step of one entry: changes made outside envgit
        s = out[step] = Step(id=step, started_ns=at, started_at=utc(at), last_seq=seq, status="done",
                             session=body.get("session", ""), user=body.get("user", ""),
                             marks=["outside"] + (["sandbox-alive"] if body.get("sandboxes_alive") else [])
                             + (["setuid-stripped"] if body.get("setuid_stripped") else []),
                             snapshot=body.get("snapshot"),
                             outside={k: body.get(k) for k in ("since_step", "before")})
        _ended(s, at)
        s.duration_ms = None
        return
    s = out.get(step)
    if s is None:
        return
    s.last_seq = seq
    if kind == "end":
        s.status = "done"
        s.exit_code, s.signal = body.get("exit_code"), body.get("signal")
        s.denied_paths = body.get("denied_paths", [])
        s.denied_reads = body.get("denied_reads", [])
        s.escape_routes = body.get("escape_routes", [])
        s.taken_back = body.get("taken_back", [])
        s.dns_names, s.dns_queries = body.get("dns_names", []), body.get("dns_queries")
        s.snapshot = body.get("snapshot", s.snapshot)
        s.extra = body.get("extra", s.extra)
        s.memory = body.get("memory", s.memory)
        s.marks = s.marks + [m for m in body.get("marks", []) if m not in s.marks]
        _ended(s, at)
        if body.get("duration_ms") is not None:   # the command's own time, measured by the client
            s.duration_ms = body["duration_ms"]
    elif kind == "interrupted":
        s.status = "interrupted"
        s.snapshot = body.get("snapshot", s.snapshot)
        s.escape_routes = body.get("escape_routes", s.escape_routes)
        s.taken_back = body.get("taken_back", s.taken_back)
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


def _ended(s, at):
    s.ended_at = utc(at)
    s.duration_ms = round((at - s.started_ns) / 1e6, 3)
