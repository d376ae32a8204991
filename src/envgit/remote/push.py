"""`envgit push NAME`: upload what the remote lacks (docs/FORMAT.md, "Remote").

Order, so that a kill at any instant leaves nothing a reader trusts half-made: read the
journal's entries first, then list the local packs (every tree an entry names is in a pack
sealed before the entry was written), upload each missing pack then its index, then the
journal segments, then the head. The next push lists the bucket and uploads only what is
still missing."""

import fcntl
import os
import time

from .. import faults
from . import RemoteError, layout, segments
from .crypto import Sealer, Unopenable
from .s3 import Bucket


class Pushed(dict):
    """What a push did: project, machine, packs, bytes, indexes, entries, segments, head, seq, ms."""


def open_remote(remote):
    """(bucket, sealer) of a configured remote, its key checked against the bucket's config."""
    sealer = Sealer(remote.key())
    bucket = Bucket(remote)
    check_key(bucket, sealer)
    return bucket, sealer


def read_head(bucket, sealer, project, machine) -> dict | None:
    from .segments import BadSegment, decode_head
    name = layout.head_name(project, machine)
    data = bucket.get(name)
    if data is None:
        return None
    try:
        return decode_head(sealer.open(name, data), project, machine)
    except (Unopenable, BadSegment) as e:
        raise RemoteError(f"{name}: {e}; `envgit fsck --remote {bucket.remote.name}` says more") from None


def push(project, remote, progress=None, repair=False, name=None, branch=None) -> Pushed:
    """Upload what `remote` lacks of `project`; returns counts. One push per project at a time
    (a flock on .envgit/push.lock: the daemon's auto-push and a person's push wait in turn).
    `name`: its project name on the remote (default layout.project_name); `branch`: for a fork
    branch, whose branch it is, written into the head (commands/remotebranches.py)."""
    lock_fd = os.open(project.state_path("push.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        return _push(project, remote, progress, repair, name, branch)
    finally:
        os.close(lock_fd)


def _push(project, remote, progress, repair=False, name=None, branch=None) -> Pushed:
    started = time.perf_counter()
    P, M = name or layout.project_name(project.root), layout.machine_name()
    sealer = Sealer(remote.key())
    bucket = Bucket(remote)
    # the key check, the head and the listing: three requests at once
    _, head, listing = bucket.map(lambda f: f(), [
        lambda: check_key(bucket, sealer), lambda: read_head(bucket, sealer, P, M),
        lambda: bucket.listing(layout.machine_prefix(P, M))])
    version = head["version"] if head else 0
    done = head["seq"] if head else 0
    # An object whose ETag is not the one this machine's put got back was changed on the bucket
    # since (bytes flipped, replaced): it counts as missing, and is uploaded again below.
    etags_path = project.state_path(f"remote-{remote.name}.etags.json")
    known = _load_etags(etags_path)
    head_key = layout.head_name(P, M)
    changed = {n for n, e in listing.items() if n != head_key and known.get(n, e) != e}
    if repair:      # --repair: every object of this machine fetched and opened (AES-GCM checks it whole)
        changed |= _unopenable(bucket, sealer, [n for n in listing if n != head_key and n not in changed])
    every_segment = _segment_ranges(listing, P, M)
    every_name = list(listing)
    listing = {n: e for n, e in listing.items() if n not in changed}
    # 1. the journal, before the packs: only the entries past the head (and those of a run of
    # small segments to be rewritten as one)
    have = _segment_ranges(listing, P, M)
    on_chain, reached = segments.chain(have, done)
    run: list[tuple[int, int]] = []
    for first, last in reversed(on_chain):
        if last - first + 1 >= segments.MAX_ENTRIES:
            break
        run.insert(0, (first, last))
    merge_from = run[0][0] if len(run) >= segments.MERGE_RUN else done + 1
    # a segment the head reaches is gone or changed (reached <= done): the entries from there
    # are uploaded again, so the next push repairs the chain
    merge_from = min(merge_from, reached)
    rows = _journal_rows(project, min(merge_from, done) if done else 1)     # seq -> row
    last = max(rows, default=done)
    if done and (done not in rows or rows[done][6] != head["hash"]):
        raise RemoteError(f"the remote's journal of {P}/{M} (entry {done}) is not this project's "
                          f"journal; push this project under another machine name "
                          f"(ENVGIT_MACHINE) or project name (ENVGIT_PROJECT)")
    if last < done:
        raise RemoteError(f"this project's journal ends at entry {last}, the remote's {P}/{M} at "
                          f"{done}: not the journal that was pushed; push under another machine name")
    start = merge_from if last > done or reached <= done else done + 1
    # 2. the packs and indexes it lacks
    packs_dir = project.state_path("objects", "packs")
    todo = []
    for pack_id in _local_packs(packs_dir):
        name = sealer.pack_name(pack_id)
        need_pack = layout.pack_name(P, M, name) not in listing
        need_idx = layout.index_name(P, M, name) not in listing
        if need_pack or need_idx:
            todo.append((pack_id, name, need_pack, need_idx))
    total = sum(os.path.getsize(_local(packs_dir, t[0], ".pack")) for t in todo if t[2])
    bar = progress(total, "B", "push") if progress and total else None
    sent = {"packs": 0, "bytes": 0}
    put_etags = {}

    def put(name, plaintext):
        put_etags[name] = bucket.put(name, sealer.seal(name, plaintext))

    def upload(item):
        pack_id, name, need_pack, need_idx = item
        if need_pack:
            data = _read(_local(packs_dir, pack_id, ".pack"))
            put(layout.pack_name(P, M, name), data)
            faults.point("push-pack-uploaded")      # a pack without its index: invisible
        if need_idx:
            idx = _read(_local(packs_dir, pack_id, ".idx"))
            put(layout.index_name(P, M, name), idx)
        return len(data) if need_pack else 0

    def tick(item, n):
        sent["packs"] += item[2]
        sent["bytes"] += n
        if bar is not None:
            bar.update(n)
    # 3. the journal segments past the head (or one longer segment covering a run of small ones),
    # uploaded beside the packs: nothing trusts either before the head names them
    pieces = [[rows[q] for q in range(a, min(last, a + segments.MAX_ENTRIES - 1) + 1)]
              for a in range(start, last + 1, segments.MAX_ENTRIES)]

    def put_segment(part):
        name = layout.segment_name(P, M, part[0][0], part[-1][0])
        put(name, segments.encode_segment(P, M, part, version))
        faults.point("push-segment-written")        # entries past the head: not trusted yet
        return part[0][0], part[-1][0]
    jobs = [("pack", t) for t in todo] + [("segment", p) for p in pieces]
    written = []

    def one(job):
        return upload(job[1]) if job[0] == "pack" else put_segment(job[1])

    def done_one(job, got):
        if job[0] == "pack":
            tick(job[1], got)
        else:
            written.append(got)
    try:
        bucket.map(one, jobs, done_one)
    finally:
        if bar is not None:
            bar.close()
    indexes = len({n for n in listing if n.startswith(layout.machine_prefix(P, M) + "indexes/")}
                  | {layout.index_name(P, M, t[1]) for t in todo})
    # 4. the head, last
    if written or todo or not head or indexes != head.get("packs") or head.get("branch") != branch:
        step = max([head["step"] if head else 0] + [r[1] for q, r in rows.items() if q > done])
        h = rows[last][6] if last else segments.GENESIS
        version += 1
        name = layout.head_name(P, M)
        bucket.put(name, sealer.seal(name, segments.encode_head(P, M, version, last, h, step, indexes,
                                                                time.time_ns(), branch)))
        layout.note_heads(remote.name, {f"{P}/{M}": version})
        # then the head's mark: a head put back to an older version is seen by any reader
        # (a mark past it), unless the marks are deleted too
        put(layout.version_name(P, M, version), b"")
    # 5. segments no reader uses any more (superseded by a longer one, or left by a killed push)
    used, _ = segments.chain(have + written, last)
    stale = [r for r in every_segment if r not in used and r[1] <= last]
    # and the marks of older heads: all deleted at once
    marks = [n for n in every_name if (layout.parse_version(n, P, M) or version) < version]
    bucket.map(bucket.delete, [layout.segment_name(P, M, *r) for r in stale] + marks)
    gone = {layout.segment_name(P, M, *r) for r in stale} | {head_key} | set(marks)
    now = {n: e for n, e in listing.items() if n not in gone}
    now.update((n, e) for n, e in put_etags.items() if e)
    if now != known:
        _save_etags(etags_path, now)
    return Pushed(project=P, machine=M, packs=sent["packs"], bytes=sent["bytes"],
                  indexes=sum(t[3] for t in todo), entries=last - done, segments=len(written),
                  head=version, seq=last, ms=round((time.perf_counter() - started) * 1000, 1))


def check_key(bucket, sealer) -> None:
    """The remote's config must open with this key (else: not a remote, or another key)."""
    remote = bucket.remote
    data = bucket.get(layout.CONFIG)
    if data is None:
        raise RemoteError(f"{remote.url}: not an envgit remote (no config object); "
                          f"`envgit remote add {remote.name} {remote.url} …` makes one")
    problem, _ = config_problem(bucket, sealer, data)
    if problem:
        raise RemoteError(problem)


# how many machines' heads a config that does not open is checked against
HEADS_TRIED = 8


def config_problem(bucket, sealer, data) -> tuple[str | None, bool]:
    """(what is wrong with the remote's config object `data`, None when it opens with the key;
    whether the key is known right, by the config or by a head).
    AES-GCM cannot tell an altered object from one sealed with another key, so a config that
    does not open is told apart by the heads: when one of them opens with this key, the key is
    right and the config was altered on the bucket."""
    remote = bucket.remote
    try:
        sealer.open(layout.CONFIG, data)
        return None, True
    except Unopenable:
        pass
    tried = 0
    for p in sorted(bucket.children(layout.PROJECTS)):
        for m in sorted(bucket.children(layout.PROJECTS + p + "/")):
            if tried >= HEADS_TRIED:
                break
            tried += 1
            try:
                if read_head(bucket, sealer, p, m) is not None:
                    return (f"{remote.url}: the object {layout.CONFIG!r} fails authentication while the "
                            f"heads open with this key: it was altered on the bucket; put it back from a "
                            f"copy of the bucket, or delete it and `envgit remote remove {remote.name}`, "
                            f"then `envgit remote add {remote.name} {remote.url}` (the key is kept) "
                            "writes a fresh one"), True
            except RemoteError:
                continue
    return (f"{remote.url}: the key in {layout.key_path(remote.name)} does not open this remote's "
            f"{layout.CONFIG!r} object" + (", nor any head" if tried else "") +
            ": another remote's key, or the object altered on the bucket (the cipher cannot tell "
            "which); put the right key back, or check the object against a copy of the bucket"), False


def _unopenable(bucket, sealer, names) -> set:
    """The names whose object is gone or does not open with the key under its own name."""
    def bad(name):
        data = bucket.get(name)
        if data is None:
            return True
        try:
            sealer.open(name, data)
        except Unopenable:
            return True
        return False
    return {n for n, b in zip(names, bucket.map(bad, names), strict=True) if b}


def _segment_ranges(listing, P, M) -> list[tuple[int, int]]:
    base = layout.machine_prefix(P, M) + "journal/"
    return [r for r in (layout.parse_segment(n[len(base):]) for n in listing if n.startswith(base)) if r]


def _load_etags(path) -> dict:
    """name -> ETag of every object this machine has pushed (or found there at its last push)."""
    import json
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in d.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(d, dict) else {}


def _save_etags(path, etags: dict) -> None:
    import json

    from ..atomicfile import write_atomic
    write_atomic(path, json.dumps(etags, sort_keys=True, separators=(",", ":")).encode(), 0o600)


def _journal_rows(project, since: int) -> dict:
    """seq -> (seq, step, kind, at_ns, body, prev, hash) of the entries from `since` on,
    which must have no gaps."""
    import sqlite3
    path = project.journal
    if not os.path.exists(path):
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT seq, step, kind, at_ns, body, prev, hash FROM entries WHERE seq >= ? "
                          "ORDER BY seq", (since,)).fetchall()
    finally:
        db.close()
    for i, r in enumerate(rows):
        if r[0] != since + i:
            raise RemoteError(f"{path}: entry {since + i} is missing; `envgit fsck` says what is "
                              "damaged (a remote gets a journal without gaps)")
    return {r[0]: r for r in rows}


def _local_packs(packs_dir: str) -> list[str]:
    """Pack ids with both the pack and its index (a pack without an index is invisible)."""
    out: list[str] = []
    try:
        subs = sorted(os.listdir(packs_dir))
    except FileNotFoundError:
        return out
    for sub in subs:
        d = os.path.join(packs_dir, sub)
        names = set(os.listdir(d))
        out += [n[:-4] for n in sorted(names) if n.endswith(".idx") and n[:-4] + ".pack" in names]
    return out


def _local(packs_dir, pack_id, ext):
    return os.path.join(packs_dir, pack_id[:2], pack_id + ext)


def _read(path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise RemoteError(f"{path}: gone during the push (`envgit gc` ran?); push again") from None
