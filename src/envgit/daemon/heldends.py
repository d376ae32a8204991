"""Entries a full disk held back (a step's `end`, an `interrupted`): kept in the daemon's memory
and written before anything else once there is room, and kept through a stop.

While the daemon runs, `record` appends an entry or, on a full disk, holds it in
`sess.unrecorded` (oldest first); the next write op flushes them, each marked `late`.

At a stop on a still-full disk the held entries would be lost with the process (the next
daemon closed their steps as `interrupted`, no exit code). So the daemon sets space aside when
it starts: `.envgit/held-ends.reserve`, RESERVE_BYTES preallocated (posix_fallocate: the blocks
are the file's, so writing into them later needs none from a full disk). At the stop the held
entries are written into those blocks in place (never truncated: that would give the space
back), with a header giving their length and SHA-256, synced, then the file is renamed to
`.envgit/held-ends`: the name appears only once the content is whole, and a torn write fails
its checksum and is never read as entries. The next daemon, before it closes orphaned steps,
writes them into the journal (marked late), removes the file and sets space aside again. The
reply to `envgit daemon stop` says what was kept there and what could not be kept at all.
"""

import asyncio
import hashlib
import json
import os
import sqlite3

from .. import steporder
from ..journal import disk_full

RESERVE, HELD = "held-ends.reserve", "held-ends"
RESERVE_BYTES = 1 << 20         # a few held ends with their snapshot summaries (≤ 200 paths each)
MAGIC = b"envgit held ends 1\n"
LATE = "written when the disk had room again: it was full when the step ended"


def log_line(text):
    """A line to daemon.log that a full disk cannot turn into an exception."""
    try:
        print(text, flush=True)
    except OSError:
        pass


# --- while the daemon runs ----------------------------------------------------------------

def record(sess, step, kind, body) -> bool:
    """Append, or, when the disk is full, keep the entry to write before anything else once
    there is room (False)."""
    try:
        if sess.unrecorded:
            flush(sess)
        sess.journal.append(step, kind, body)
        return True
    except (OSError, sqlite3.OperationalError) as e:
        if not disk_full(e):
            raise
        sess.unrecorded.append((step, kind, body))
        log_line(f"envgit daemon: the disk is full: the {kind} of step {step} is kept in memory "
                 "until there is room")
        return False


def flush(sess):
    """Write the entries a full disk held back, in order, each saying it is late; raises (the
    disk still full) with the rest still held. Once none is held, a held-ends file they came
    from is done with."""
    while sess.unrecorded:
        step, kind, body = sess.unrecorded[0]
        sess.journal.append(step, kind, {**body, "late": body.get("late", LATE)})
        sess.unrecorded.pop(0)
    if getattr(sess, "held_file", False):
        _unlink(sess.project.state_path(HELD))
        sess.held_file = False
        set_aside(sess.project)


def close_orphans(sess):
    """What the start-up could not do on a full disk: close the steps a dead daemon or client
    left open (not this daemon's own live steps, nor rewinds, nor steps whose held entry is
    still to be written)."""
    if not sess.orphans_pending:
        return
    held = {step for step, _, _ in sess.unrecorded}
    for st in sess.journal.open_steps():
        if st.id not in sess.live and st.id not in held and not st.rewind:
            sess.journal.append(st.id, "interrupted", {
                "reason": "the session daemon stopped before the step ended (closed late: "
                          "the disk was full when this daemon started)"})
    sess.orphans_pending = False


def disk_full_notice(step, end) -> str:
    snap = end.get("snapshot") or {}
    return (f"the disk is full: step {step} ran (exit {end.get('exit_code')}) but its end is not "
            "recorded yet" + (", and no snapshot was taken" if "error" in snap else
                              f" (its snapshot {snap.get('tree', '')[:12]} is stored)")
            + "; free some space: the next envgit command records it (until then `envgit log` "
            "shows it running)")


# --- the space set aside, and a stop --------------------------------------------------------

def set_aside(project) -> str | None:
    """At the daemon's start: the reserve file, RESERVE_BYTES preallocated. Returns why it
    could not be made (a full disk), or None."""
    path = project.state_path(RESERVE)
    try:
        if os.path.getsize(path) >= RESERVE_BYTES:
            return None
    except OSError:
        pass
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        return e.strerror or str(e)
    return None


def keep(project, entries) -> tuple[list, list]:
    """Write `entries` into the reserve and name it held-ends: (kept, not kept). As many as fit,
    oldest first. With no reserve (it could not be made at the start), those a held-ends file
    from an earlier stop still holds count as kept."""
    reserve, held = project.state_path(RESERVE), project.state_path(HELD)
    try:
        size = os.path.getsize(reserve)
    except OSError:
        there, _ = load(project)
        old = [json.dumps(e, sort_keys=True) for e in there]
        kept = [e for e in entries if json.dumps(list(e), sort_keys=True) in old]
        return kept, [e for e in entries if e not in kept]
    n = len(entries)
    while n and len(_encode(entries[:n])) > size:
        n -= 1
    if n == 0:
        return [], list(entries)
    data = _encode(entries[:n])
    try:
        fd = os.open(reserve, os.O_WRONLY | os.O_CLOEXEC)     # no O_TRUNC: the blocks stay ours
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(reserve, held)
        _sync_dir(os.path.dirname(held))
    except OSError:
        return [], list(entries)
    return list(entries[:n]), list(entries[n:])


def load(project) -> tuple[list, str | None]:
    """The entries a held-ends file holds [(step, kind, body)], and why it cannot be read (a
    torn or damaged file: its entries are not taken), or None."""
    try:
        with open(project.state_path(HELD), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], None
    except OSError as e:
        return [], e.strerror or str(e)
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a held-ends file")
        head, _, rest = data[len(MAGIC):].partition(b"\n")
        length, digest = head.split(b" ")
        payload = rest[:int(length)]
        if len(payload) != int(length) or hashlib.sha256(payload).hexdigest().encode() != digest:
            raise ValueError("its checksum does not match (written only in part)")
        out = []
        for step, kind, body in json.loads(payload):
            if type(step) is int and isinstance(kind, str) and isinstance(body, dict):
                out.append((step, kind, body))
        return out, None
    except (ValueError, TypeError) as e:
        return [], str(e)


def _encode(entries) -> bytes:
    payload = json.dumps([list(e) for e in entries], separators=(",", ":")).encode()
    return MAGIC + f"{len(payload)} {hashlib.sha256(payload).hexdigest()}\n".encode() + payload


def _sync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_back(sess) -> bool:
    """At the daemon's start, before orphaned steps are closed: the held-ends file a stop left,
    into the journal (late). A step already closed with no exit code (a reader closed it as
    interrupted meanwhile) still gets its end; one already ended is left (the file outlived its
    writing). On a full disk the rest stay held in memory and in the file: returns False, and
    the orphans are closed once there is room."""
    entries, problem = load(sess.project)
    if problem:
        log_line(f"envgit daemon: .envgit/held-ends could not be read ({problem}); the steps it "
                 "held are closed as interrupted")
        _unlink(sess.project.state_path(HELD))
        set_aside(sess.project)
        return True
    if not entries:
        set_aside(sess.project)
        return True
    sess.held_file = True
    for step, kind, body in entries:
        st = sess.journal.step(step)
        if st is None or not (st.status == "running" or (kind == "end" and st.exit_code is None
                                                          and st.signal is None)):
            continue
        sess.unrecorded.append((step, kind, body))
    try:
        flush(sess)
    except (OSError, sqlite3.OperationalError) as e:
        if not disk_full(e):
            raise
        return False
    # The Session read the newest tree before these ends were in the journal: read it again.
    newest = steporder.newest_tree(sess.journal)
    sess.last_tree = newest.tree if newest else None
    sess.tree_unknown = bool(sess.journal.lost_now) or steporder.newest_untreed(sess.journal)
    return True


async def finish(sess) -> dict:
    """A stop: the live steps closed as interrupted, then stop(). Asked by `envgit daemon stop`
    before its reply, and again as the daemon exits (for steps begun since; SIGTERM, idle):
    {"notice": the line, "lost": entries not kept} for the reply, {} when all is recorded."""
    lock = sess.__dict__.setdefault("_finish_lock", asyncio.Lock())
    async with lock:
        live = list(sess.live)
        for step in live:
            await sess.interrupted(step, "the session daemon stopped before the step ended")
        if sess.__dict__.get("_finished") and not live and not sess.unrecorded:
            return {}
        sess._finished = True
        line, lost = stop(sess)
        return {"notice": line, "lost": lost} if line else {}


def stop(sess) -> tuple[str | None, int]:
    """At a stop, after the live steps were closed: write what is held, or keep it in the
    reserve; the stat cache saved. Returns the line for the terminal of `envgit daemon stop`
    (also daemon.log's one line; None when everything was recorded) and how many entries
    could not be kept at all."""
    try:
        flush(sess)
    except (OSError, sqlite3.OperationalError) as e:
        if not disk_full(e):
            raise
    cache = None
    try:
        sess.snapshotter.save()
    except OSError as e:
        cache = e.strerror or str(e)
    if not sess.unrecorded:
        if cache:
            log_line(f"envgit daemon: the stat cache was not saved at the stop ({cache}); the next "
                     "snapshot reads the whole directory")
        return None, 0
    kept, lost = keep(sess.project, sess.unrecorded)
    sess.unrecorded = []

    def what(es):
        return ", ".join(f"the {k} of step {s}" for s, k, _ in es)
    line = "envgit: the disk is full: the session daemon stopped with entries not in the journal: "
    if kept:
        line += (f"{what(kept)} kept in .envgit/held-ends (the next daemon writes it into the journal "
                 "once there is room)")
    if lost:
        line += ("; " if kept else "") + (f"{what(lost)} could not be kept (the next daemon closes "
                                          "those steps as interrupted)")
    if cache:
        line += "; the stat cache was not saved (the next snapshot reads the whole directory)"
    log_line(line + "; free some space")
    return line + "; free some space", len(lost)
