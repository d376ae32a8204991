"""Reading a remote: every project and machine on it, each machine's journal (the chain from
entry 1 to its head, verified), its objects (for restore and fsck) and audit's table.
Layout: docs/FORMAT.md, "Remote"."""

import json
import os
import shutil
import tempfile

from blake3 import blake3

from . import RemoteError, layout, segments
from .crypto import Unopenable
from .push import read_head
from .segments import GENESIS, BadSegment

READ_AGAIN = 3          # a machine's head and listing read again while its chain falls short
_AUDITED = frozenset(("begin", "end", "interrupted", "outside", "request"))
_decode = json.JSONDecoder().raw_decode


def _str(v) -> str:
    return v if isinstance(v, str) else ""


def _strs(v) -> list:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def machines(bucket) -> list[tuple[str, str]]:
    """Every (project, machine) on the remote."""
    out = []
    for p in sorted(bucket.children(layout.PROJECTS)):
        for m in sorted(bucket.children(layout.PROJECTS + p + "/")):
            out.append((p, m))
    return out


def vanished(remote_name, found, project=None, machine=None) -> list[str]:
    """A project/machine this machine has seen a head of (<NAME>.seen.json) that is no longer
    on the bucket at all: every object of it deleted, the biggest rollback there is."""
    out = []
    for where, version in sorted(layout.seen_heads(remote_name).items()):
        p, _, m = where.partition("/")
        if (p, m) in found or project not in (None, p) or machine not in (None, m):
            continue
        if isinstance(version, int) and version > 0:
            out.append(f"{layout.machine_prefix(p, m)}: rolled back: every object of {where} is gone "
                       f"from the bucket, this machine has seen its head version {version} (if it was "
                       f"removed on purpose, delete \"{where}\" from {layout.seen_path(remote_name)})")
    return out


def has_head(bucket, sealer, project, machine) -> bool:
    """A head there that opens with the key and names its own place."""
    try:
        return read_head(bucket, sealer, project, machine) is not None
    except RemoteError:
        return False


class MachineView:
    """One machine's journal as a reader trusts it: the rows the chain reaches up to the head.
    `problems`: what is wrong (fsck names them; log and audit say them and go on)."""

    def __init__(self, bucket, sealer, project, machine, remote_name, deep=False):
        self.project, self.machine = project, machine
        self.problems: list[str] = []
        self.rows: list = []
        self.head, self.listing = None, []      # a head that does not open leaves them so
        where = f"{project}/{machine}"
        # what was seen before this read began (a push landing meanwhile raises it)
        seen = layout.seen_heads(remote_name).get(where, 0)
        # The head before the listing (a push writes its segments before its head, so every
        # segment the head reaches is listed); a chain that still falls short may be a push
        # that merged segments meanwhile: read both again, a few times, before saying so.
        for _ in range(READ_AGAIN):
            try:
                self.head = read_head(bucket, sealer, project, machine)
            except RemoteError as e:
                self.head = None
                self.problems.append(str(e))
                return
            self.listing = bucket.listing(layout.machine_prefix(project, machine))
            version = self.head["version"] if self.head else 0
            # marks of heads newer than this one (a push writes its mark after its head: one
            # that landed meanwhile is read again; one still past it is a head put back)
            marks = sorted(v for v in (layout.parse_version(n, project, machine) for n in self.listing)
                           if v and v > version)
            if self.head is None:
                if marks or seen:
                    continue
                self.problems.append(f"{where}: no head (a first push that did not finish; "
                                     "nothing here is trusted yet)")
                return
            ranges = self._segment_ranges()
            used, reached = segments.chain(ranges, self.head["seq"])
            if reached > self.head["seq"] and not marks:
                break
        written = self._newest_mark(bucket, sealer, marks)
        if self.head is None:
            self.problems.append(
                f"{layout.head_name(project, machine)}: rolled back: it is gone, but this machine has seen "
                f"version {seen}" if seen else
                f"{layout.head_name(project, machine)}: rolled back: it is gone, but head version "
                f"{written} was written" if written else
                f"{where}: no head (a first push that did not finish; nothing here is trusted yet)")
            return
        if written:
            self.problems.append(f"{layout.head_name(project, machine)}: rolled back: it is version "
                                 f"{self.head['version']} (entry {self.head['seq']}), but head version "
                                 f"{written} was written ({layout.version_name(project, machine, written)})")
        head = self.head
        if head["version"] < seen:
            self.problems.append(f"{layout.head_name(project, machine)}: rolled back: it is version "
                                 f"{head['version']} (entry {head['seq']}), this machine has seen version {seen}")
        if reached <= head["seq"]:
            after = [r for r in ranges if r[0] > reached and r[1] <= head["seq"]]
            upto = min([r[0] for r in after], default=head["seq"] + 1) - 1
            self.problems.append(f"{where}: journal entries {reached}-{upto} are missing from the "
                                 f"bucket (a segment {layout.machine_prefix(project, machine)}journal/"
                                 f"{reached:012d}-… deleted); the chain stops at entry {reached - 1}")
        opened = bucket.map(lambda r: self._open_segment(bucket, sealer, *r), used)
        prev = GENESIS
        for (first, last), got in zip(used, opened, strict=True):
            if isinstance(got, str):
                self.problems.append(got)
                break
            header, rows = got
            name = layout.segment_name(project, machine, first, last)
            bad, prev = segments.check_rows(rows, prev, name)
            self.problems += bad
            self.rows += rows
        if reached > head["seq"] and self.rows and self.rows[-1][6] != head["hash"] and not self.problems:
            self.problems.append(f"{layout.head_name(project, machine)}: names entry {head['seq']} "
                                 f"with another hash than the journal's")
        if deep:        # the head's own mark (older ones a push deletes): it opens, or is named
            own = [v for v in (layout.parse_version(n, project, machine) for n in self.listing)
                   if v and v <= head["version"]]
            for v in own:
                self._newest_mark(bucket, sealer, [v])
            # segments past the head: an interrupted push, or a head rolled back
            later = [r for r in ranges if r[1] > head["seq"]]
            opened = bucket.map(lambda r: self._open_segment(bucket, sealer, *r), later)
            for (first, last), got in zip(later, opened, strict=True):
                name = layout.segment_name(project, machine, first, last)
                if isinstance(got, str):
                    self.problems.append(got)
                elif got[0].get("after_head", 0) > head["version"]:
                    self.problems.append(f"{layout.head_name(project, machine)}: rolled back: it is version "
                                         f"{head['version']} (entry {head['seq']}), but {name} was written by a "
                                         f"push that began after head version {got[0]['after_head']}")
        layout.note_heads(remote_name, {where: head["version"]})

    def _newest_mark(self, bucket, sealer, marks) -> int:
        """The newest of the marks past the head that opens (a push with the key wrote it),
        0 for none; one that does not open is named."""
        for version in reversed(marks):
            name = layout.version_name(self.project, self.machine, version)
            try:
                data = bucket.get(name)
                if data is None:
                    continue
                sealer.open(name, data)
            except (RemoteError, Unopenable) as e:
                self.problems.append(str(e) if str(e).startswith(name) else f"{name}: {e}")
                continue
            return version
        return 0

    def _segment_ranges(self):
        base = layout.machine_prefix(self.project, self.machine) + "journal/"
        return [r for r in (layout.parse_segment(n[len(base):]) for n in self.listing if n.startswith(base)) if r]

    def _open_segment(self, bucket, sealer, first, last):
        name = layout.segment_name(self.project, self.machine, first, last)
        try:
            data = bucket.get(name)
        except RemoteError as e:
            return str(e)
        if data is None:
            return f"{name}: deleted while being read"
        try:
            return segments.decode_segment(sealer.open(name, data), self.project, self.machine, first, last)
        except (Unopenable, BadSegment) as e:
            return f"{name}: {e}"

    def steps(self) -> list:
        """The steps, folded from the trusted rows as the local journal folds them."""
        from ..journal.fold import fold_entry
        out: dict = {}
        for seq, step, kind, at, body, _, _ in self.rows:
            fold_entry(out, seq, step, kind, at, body)
        return sorted(out.values(), key=lambda s: s.id)

    def audit_rows(self) -> list[dict]:
        """What audit shows of each step, folded from the trusted rows in one pass that reads
        only the entries that matter to it (begin, end, interrupted, outside, request) and only
        the keys it shows, each checked for its type: the journal's full fold (Step objects,
        every body checked whole) costs ~5x more, and audit reads 100,000s of steps."""
        out: dict[int, dict] = {}
        for _, step, kind, at, body, _, _ in self.rows:
            if kind not in _AUDITED or type(step) is not int or type(at) is not int:
                continue
            try:
                b, end = _decode(body)      # a canonical body: no whitespace around it
            except (ValueError, TypeError):
                continue
            if end != len(body):
                continue
            if not isinstance(b, dict):
                continue
            if kind == "begin" or kind == "outside":
                s = out[step] = {"project": self.project, "machine": self.machine, "id": step,
                                 "started_ns": at, "ended_ns": None, "status": "running",
                                 "exit_code": None, "argv": _strs(b.get("argv")),
                                 "session": _str(b.get("session")), "user": _str(b.get("user")),
                                 "cwd": _str(b.get("cwd")), "marks": _strs(b.get("marks")),
                                 "irreversible": 0, "denied_requests": 0, "denied_paths": 0, "paths": []}
                if kind == "outside":
                    snap = b.get("snapshot")
                    if not isinstance(snap, dict):
                        snap = {}
                    s.update(status="done", ended_ns=at, argv=[], marks=["outside"],
                             paths=[p.get("path") for p in snap.get("paths") or []
                                    if isinstance(p, dict) and isinstance(p.get("path"), str)][:5])
                continue
            if step not in out:
                continue
            s = out[step]
            if kind == "end":
                s["status"], s["ended_ns"] = "done", at
                s["exit_code"] = b["exit_code"] if type(b.get("exit_code")) is int else None
                s["marks"] += [m for m in _strs(b.get("marks")) if m not in s["marks"]]
                s["denied_paths"] = len(b.get("denied_paths") or []) if isinstance(b.get("denied_paths"), list) else 0
            elif kind == "interrupted":
                s["status"], s["ended_ns"] = "interrupted", at
                s["marks"] = s["marks"] + ["interrupted"]
            else:                       # request
                s["irreversible"] += bool(b.get("irreversible"))
                s["denied_requests"] += b.get("decision") == "deny"
        return [out[n] for n in sorted(out)]

    def dropped(self) -> set:
        from ..journal.live import dropped_by_gc
        return dropped_by_gc(body for _, step, kind, _, body, _, _ in self.rows if step == 0 and kind == "gc")

    def live_trees(self) -> list[str]:
        """The trees this machine's journal still refers to, by the local journal's rule."""
        from ..journal.live import live_trees
        return live_trees(self.steps(), self.dropped())

    def index_names(self) -> list[str]:
        base = layout.machine_prefix(self.project, self.machine) + "indexes/"
        return sorted(n[len(base):] for n in self.listing if n.startswith(base))


def pick_machine(bucket, remote, project: str | None, machine: str | None, default_project=None,
                 sealer=None):
    """The (project, machine) a command reads: the ones named, else the only one there is
    (the current project's name first). Unnamed, only a machine with a valid head counts: one
    junk object under a stray prefix does not make the choice ambiguous."""
    found = machines(bucket)
    if sealer is not None and (project is None or machine is None) and len(found) > 1:
        heads = bucket.map(lambda pm: has_head(bucket, sealer, *pm), found)
        found = [pm for pm, ok in zip(found, heads, strict=True) if ok]
    if project is None and default_project and any(p == default_project for p, _ in found):
        project = default_project
    cands = [(p, m) for p, m in found if (project is None or p == project) and (machine is None or m == machine)]
    if machine is None and project is not None:
        here = layout.machine_name()
        if (project, here) in cands:
            return project, here
    if len(cands) == 1:
        return cands[0]
    listed = ", ".join(f"{p}/{m}" for p, m in found) or "none yet"
    if not cands:
        raise RemoteError(f"remote {remote.name} holds no {project or '*'}/{machine or '*'} "
                          f"(it holds: {listed})")
    raise RemoteError(f"remote {remote.name} holds {len(cands)} of them ({listed}); "
                      "name one with --project NAME --machine NAME")


# --- objects ----------------------------------------------------------------------------------

def remote_objects(bucket, sealer, view, problems=None):
    """An ObjectStore over a temporary directory whose packs are fetched from the bucket when
    first read (opened, their BLAKE3 checked against the pack id), indexes loaded at once."""
    from ..snapshot.objects import ObjectStore
    from ..snapshot.packs import decode_index

    class RemoteObjects(ObjectStore):
        def __init__(self):
            self.tmp = tempfile.mkdtemp(prefix="envgit-remote-")
            super().__init__(self.tmp)
            self.names: dict[str, str] = {}        # pack id -> its name on the bucket
            self.fetch_problems = problems if problems is not None else []

        def _fd(self, pack_id):
            if pack_id not in self._fds:
                self.fetch(pack_id)
            return super()._fd(pack_id)

        def fetch(self, pack_id) -> bool:
            path = os.path.join(self.packs_dir, pack_id[:2], pack_id + ".pack")
            if os.path.exists(path):
                return True
            name = layout.pack_name(view.project, view.machine, self.names[pack_id])
            try:
                data = bucket.get(name)
            except RemoteError as e:
                self.fetch_problems.append(str(e))
                return False
            if data is None:
                self.fetch_problems.append(f"{name}: missing (pack {pack_id[:12]}…, its index is there)")
                return False
            try:
                data = sealer.open(name, data)
            except Unopenable as e:
                self.fetch_problems.append(str(e))
                return False
            if blake3(data).hexdigest() != pack_id:
                self.fetch_problems.append(f"{name}: its content is not the pack its index names")
                return False
            os.makedirs(os.path.dirname(path), exist_ok=True)
            from ..atomicfile import write_atomic
            write_atomic(path, data, sync=False)
            return True

        def prefetch(self, oids) -> None:
            want = {self.index[o][0] for o in oids if o in self.index}
            bucket.map(self.fetch, sorted(want))

        def close(self):
            super().close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    objects = RemoteObjects()
    found = problems if problems is not None else []

    def load(name):
        full = layout.index_name(view.project, view.machine, name)
        try:
            data = bucket.get(full)
        except RemoteError as e:
            return str(e)
        if data is None:
            return f"{full}: deleted while being read"
        try:
            pack_id, entries = decode_index(sealer.open(full, data))
        except (Unopenable, ValueError) as e:
            return f"{full}: {e}"
        if sealer.pack_name(pack_id) != name:
            return f"{full}: holds the index of another pack (moved from another name)"
        return pack_id, entries
    names = view.index_names()
    for name, got in zip(names, bucket.map(load, names), strict=True):
        if isinstance(got, str):
            found.append(got)
            continue
        objects.names[got[0]] = name
        objects.add_pack(*got)
    if view.head is not None and len(names) < view.head["packs"]:
        found.append(f"{view.project}/{view.machine}: {view.head['packs'] - len(names)} pack index(es) "
                     f"missing (the head counts {view.head['packs']}, the bucket has {len(names)})")
    return objects
