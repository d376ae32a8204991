"""Memory snapshots of the VM tier on disk: `.envgit/vm/mem/<step>/`, beside the step's file
snapshot (docs/FORMAT.md, "VM memory snapshots").

  memory.chunks  a step's snapshot (meta "format": "chunks"): the list of the chunks
               (memchunks.py, shared by every snapshot) of QEMU's migration stream of the whole
               guest, every page it touched and its device state, written by a background
               snapshot while the guest ran on (background.py)
  memory.stream  that stream while QEMU writes it, until it is cut into chunks
  ram          the kept boot's (and older steps'): the guest's RAM file as it was (sparse:
               only the pages the guest ever touched hold blocks; a reflink of the running file
               where the filesystem shares extents)
  device.state beside `ram`: QEMU's device state (migrate with x-ignore-shared: ~50 KB)
  meta.json    {"step", "format", "pause_ms", "bytes", "memory_mb", "cpus", "accel", "host_manifest", ...}
  ok           written last (after an fsync of the rest): a directory without it is a snapshot
               being written in the background, or one that was being taken when the daemon
               died: never restored, removed by gc/fsck once no daemon writes it

Retention follows the steps: gc keeps the memory snapshot of every step it keeps and removes
the rest (`collect`); fsck checks each one (`check`).
"""

import errno
import fcntl
import json
import os
import shutil

from . import memchunks

RAM = "ram"
DEVICE_STATE = "device.state"
STREAM = "memory.stream"       # QEMU's stream while it is written, cut into chunks once whole
CHUNKS_FORMAT = "chunks"
META = "meta.json"
OK = "ok"
FICLONE = 0x40049409


def root(project) -> str:
    return project.state_path("vm", "mem")


def chunks_root(project) -> str:
    return memchunks.root(project.state_path("vm"))


def path(project, step) -> str:
    return os.path.join(root(project), str(int(step)))


def clone(src, dst, size=None, how=None) -> int:
    """`dst` becomes a copy of `src`: a reflink (FICLONE) where the filesystem has them, else a
    copy of its data extents only (SEEK_DATA/SEEK_HOLE; copy_file_range, which shares extents
    itself on XFS/btrfs), holes left holes. Returns the bytes of data the copy holds; `how` (a
    list) is told which it was: "reflink" or "copy"."""
    tmp = dst + ".part"
    sfd = os.open(src, os.O_RDONLY)
    try:
        dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            total = os.fstat(sfd).st_size
            try:
                fcntl.ioctl(dfd, FICLONE, sfd)
                copied = _allocated(sfd, total)
                method = "reflink"
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EPERM):
                    raise
                copied = _copy_extents(sfd, dfd, total)
                method = "copy"
            if how is not None:
                how.append(method)
            os.ftruncate(dfd, max(size or 0, total))
            # no fsync: a killed daemon loses nothing the page cache holds, and an fsync of
            # hundreds of MB would be most of the pause; `ok` is written after it all
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    os.replace(tmp, dst)
    return copied


def _extents(fd, total):
    off = 0
    while off < total:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:          # no data past `off`
                return
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        off = end


def _allocated(fd, total):
    return sum(e - s for s, e in _extents(fd, total))


def _copy_extents(sfd, dfd, total) -> int:
    copied = 0
    for start, end in _extents(sfd, total):
        off = start
        while off < end:
            try:
                n = os.copy_file_range(sfd, dfd, end - off, off, off)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                n = os.pwrite(dfd, os.pread(sfd, min(end - off, 8 << 20), off), off)
            if n == 0:
                break
            off += n
        copied += end - start
    return copied


def begin(project, step) -> str:
    d = path(project, step)
    if os.path.isdir(d):
        shutil.rmtree(d)                # a half-taken one (a daemon died taking it): retaken
    os.makedirs(d, mode=0o700)
    return d


def commit(d, meta: dict):
    with open(os.path.join(d, META), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(os.path.join(d, OK), "w") as f:
        f.write("ok\n")
        f.flush()
        os.fsync(f.fileno())


def link_copy(project, src_step, dst_step):
    """Step `dst_step`'s memory snapshot is `src_step`'s (a rewind to it): hard links, the
    files being written once and never changed."""
    src, dst = path(project, src_step), begin(project, dst_step)
    for name in _files(read_meta(src)):
        os.link(os.path.join(src, name), os.path.join(dst, name))
    commit(dst, {**read_meta(src), "step": dst_step, "same_as": src_step})


def _files(meta) -> tuple[str, ...]:
    if meta.get("format") != CHUNKS_FORMAT:
        return (RAM, DEVICE_STATE)
    return (memchunks.LIST, memchunks.PAGES) if meta.get("pages_hash") else (memchunks.LIST,)


# what a restore reads of meta.json, and its type: anything else is a damaged snapshot
_META_KINDS = {"memory_mb": int, "cpus": int, "format": str, "list_hash": str, "pages_hash": str,
               "accel": str, "packages": list, "host_manifest": dict}


def read_meta(d) -> dict:
    """Snapshot `d`'s meta.json, its kinds checked: ValueError says what is wrong (a damaged
    or hand-edited file is refused, never half used). A snapshot in chunks must name its
    list's hash: without it the list could not be checked."""
    with open(os.path.join(d, META)) as f:
        meta = json.load(f)
    if not isinstance(meta, dict):
        raise ValueError("its meta.json is not a JSON object")
    for key, kind in _META_KINDS.items():
        v = meta.get(key)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            raise ValueError(f"its meta.json's {key} is not a {kind.__name__}")
    if not 0 < meta.get("memory_mb", 1) <= 1 << 20 or not 0 < meta.get("cpus", 1) <= 64:
        raise ValueError("its meta.json's memory_mb or cpus is out of range")
    if meta.get("format") == CHUNKS_FORMAT and not meta.get("list_hash"):
        raise ValueError("its meta.json names no list_hash: its list of chunks cannot be checked")
    return meta


def complete(d) -> bool:
    return os.path.isfile(os.path.join(d, OK))


def steps(project) -> list[int]:
    try:
        names = os.listdir(root(project))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def latest_complete(project, at_most=None):
    for s in reversed(steps(project)):
        if (at_most is None or s <= at_most) and complete(path(project, s)):
            return s
    return None


def collect(project, keep) -> tuple[int, list[int]]:
    """Remove every memory snapshot whose step is not in `keep`, and every incomplete one:
    (bytes freed, steps removed)."""
    freed, dropped, lists = 0, [], []
    keep = set(keep)
    for s in steps(project):
        d = path(project, s)
        if s in keep and complete(d):
            lists.append(os.path.join(d, memchunks.LIST))
            continue
        freed += _du(d)
        shutil.rmtree(d, ignore_errors=True)
        dropped.append(s)
    freed += memchunks.sweep(chunks_root(project), [p for p in lists if os.path.exists(p)])
    return freed, dropped


def usage(project) -> dict:
    """{count, bytes}: the memory snapshots kept and the disk they take (`envgit stats`)."""
    got = [path(project, s) for s in steps(project)]
    return {"count": sum(1 for d in got if complete(d)),
            "bytes": sum(_du(d) for d in got) + memchunks.usage(chunks_root(project))}


def _du(d) -> int:
    total = 0
    for name in os.listdir(d):
        try:
            total += os.lstat(os.path.join(d, name)).st_blocks * 512
        except OSError:
            pass
    return total


def check(project, steps_known=None) -> tuple[list[str], list[str]]:
    """fsck: (problems, notes). A problem is a damaged complete snapshot, or one of no step of
    the journal; an incomplete one is a note, not damage: it was being taken when the daemon
    died, is never restored, and gc removes it."""
    problems, notes = [], []
    for s in steps(project):
        d = path(project, s)
        if not complete(d):
            notes.append(f"memory snapshot of step {s} is incomplete (being written in the "
                         "background, or the daemon stopped while taking it): never restored; "
                         "`envgit gc` removes it once it is not being written")
            continue
        try:
            meta = read_meta(d)
            sizes = [os.stat(os.path.join(d, name)).st_size for name in _files(meta)]
        except (OSError, ValueError) as e:
            problems.append(f"memory snapshot of step {s} is damaged: {e}")
            continue
        if meta.get("format") == CHUNKS_FORMAT:
            listed = os.path.join(d, memchunks.LIST)
            if not memchunks.list_matches(listed, meta.get("list_hash")):
                problems.append(f"memory snapshot of step {s} is damaged: its list of chunks is not "
                                "the one written with it")
            if meta.get("pages_hash") and not memchunks.list_matches(os.path.join(d, memchunks.PAGES),
                                                                     meta["pages_hash"]):
                problems.append(f"memory snapshot of step {s} is damaged: its page index is not "
                                "the one written with it")
            problems += [f"memory snapshot of step {s} is damaged: {p}"
                         for p in memchunks.verify(chunks_root(project), listed)]
        elif sizes[0] < int(meta.get("memory_mb", 0)) << 20 or sizes[1] == 0:
            problems.append(f"memory snapshot of step {s} is damaged: its files are shorter than recorded")
        if steps_known is not None and s not in steps_known:
            problems.append(f"memory snapshot of step {s} belongs to no step in the journal")
    return problems, notes


def ram_place(project_root, run_dir, memory_mb) -> str:
    """Where the running guest's RAM file lives: a directory of this project's in /dev/shm
    when it has room for the RAM twice over (a snapshot clones it there during the pause:
    at memory speed, the copy to the project's disk made once the guest runs again), else
    the project's .envgit/vm/run. Named by the project, so a daemon killed -9 leaves nothing
    the next one does not reuse."""
    import hashlib
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        room = st.f_bavail * st.f_frsize
    except OSError:
        return run_dir
    if room < (2 * memory_mb + 256) << 20 or os.environ.get("ENVGIT_VM_RAM_ON_DISK"):
        return run_dir
    d = os.path.join(shm, f"envgit-vm-{os.getuid()}-"
                     + hashlib.sha256(os.path.realpath(project_root).encode()).hexdigest()[:16])
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        own = os.lstat(d)
        if not os.path.isdir(d) or os.path.islink(d) or own.st_uid != os.getuid() or own.st_mode & 0o077:
            return run_dir              # not ours: never use it
    return d
