"""`envgit fork`: a working tree of the project at a step, as a project of its own.

Each branch is made whole under a hidden temporary name beside its final directory, then
renamed into place, then recorded; a marker in the main project (`.envgit/branches/<id>.forking`,
written before anything else) says what is under way, so a fork killed at any point is
finished or undone by the next `envgit fork`, `envgit branches` or `envgit branch rm`
(recover()): a branch is recorded once it is under its final name, and a temporary is removed.

Making one branch (docs/ARCHITECTURE.md, "Branches"):
1. its `.envgit/objects/` gets hard links of the main store's sealed packs and indexes (a
   sealed pack or index is never written again: a rewrite is a new file renamed over the name,
   which leaves the other name's file alone) and copies of the store's small files;
2. the step's tree is restored from *that* store (so every object the tree needs is in the
   branch's store, even if the main project's gc drops a pack meanwhile);
3. its stat cache is written from what the restore wrote (each file's lstat after writing it,
   and the content id written), so its daemon's first snapshot, the branch journal's baseline,
   re-reads no file: it lstats them, finds the contents stored, and records the fork point's
   tree (a file changed since is re-read: the cache only says what was written where);
4. `.envgit/branch.json` names the parent, the id and the fork point.
"""

import ctypes
import json
import os
import shutil
import stat
import time

from .. import faults
from ..atomicfile import write_atomic
from ..paths import STATE_DIR
from . import registry

PENDING_EXT = ".forking"


class ForkError(Exception):
    """A fork refused or failed (the message names the fix); nothing is left half-made."""


def branch_dir(project, into: str | None, branch_id: int) -> str:
    """Where branch `branch_id` goes: `<into or the project's parent>/<name>.envgit-<id>`."""
    parent = os.path.abspath(into) if into else os.path.dirname(project.root)
    return os.path.join(parent, f"{os.path.basename(project.root)}.envgit-{branch_id}")


def fork(project, step: int, tree: str, count: int, into: str | None = None, progress=None) -> list[dict]:
    """Make `count` branches of `tree` (the snapshot after `step`); returns their records."""
    from ..paths import inside
    if into:
        where = os.path.realpath(into)
        if inside(where, os.path.realpath(project.root)):
            raise ForkError(f"{into}: inside the project; a branch is made beside it (pick a directory outside)")
        try:
            os.makedirs(where, exist_ok=True)
        except OSError as e:
            raise ForkError(f"{into}: cannot make branches there ({e.strerror or e}); pick another "
                            "directory") from None
    made = []
    with registry.locked(project):
        recover(project, locked=True)
        ids = registry.take_ids(project, count)
        for branch_id in ids:
            final = branch_dir(project, into, branch_id)
            if os.path.lexists(final):
                raise ForkError(f"{final} exists; move it away (or fork --into another directory)")
        for branch_id in ids:
            made.append(_fork_one(project, step, tree, branch_id, branch_dir(project, into, branch_id), progress))
    return made


def _fork_one(project, step, tree, branch_id, final, progress) -> dict:
    parent_dir, name = os.path.split(final)
    tmp = os.path.join(parent_dir, f".{name}.forking-{os.urandom(4).hex()}")
    record = {"version": registry.VERSION, "id": branch_id, "kind": "fork", "dir": final,
              "from_step": step, "from_tree": tree, "created_ns": time.time_ns()}
    marker = _marker(project, branch_id)
    write_atomic(marker, json.dumps({**record, "tmp": tmp}) + "\n", 0o600, chmod=0o600)
    try:
        _make(project, step, tree, branch_id, tmp, progress)
        _rename_noreplace(tmp, final)
    except BaseException as e:
        # undone at once (a kill is undone by the next recover(): the marker says what)
        remove_tree(tmp)
        os.unlink(marker)
        if isinstance(e, OSError):
            raise ForkError(f"branch {branch_id} could not be made in {parent_dir}: "
                            f"{e.strerror or e} (nothing was left there; `--into DIR` picks another "
                            "place)") from None
        raise
    faults.point("fork-renamed")
    registry.add(project, record)
    faults.point("fork-recorded")
    os.unlink(marker)
    return record


def _make(project, step, tree, branch_id, tmp, progress) -> None:
    """The branch, whole, in the temporary directory `tmp`."""
    os.mkdir(tmp, 0o700)
    state = os.path.join(tmp, STATE_DIR)
    os.mkdir(state, 0o700)
    share_store(project.state_path("objects"), os.path.join(state, "objects"))
    faults.point("fork-linked")
    written = _restore(os.path.join(state, "objects"), tree, tmp, progress)
    _write_statcache(os.path.join(state, "statcache"), tmp, written)
    registry.write_parent(tmp, {"version": registry.VERSION, "parent": os.path.realpath(project.root),
                                "id": branch_id, "from_step": step, "from_tree": tree})
    os.chmod(tmp, stat.S_IMODE(os.stat(project.root).st_mode))
    faults.point("fork-restored")


def share_store(src: str, dst: str) -> None:
    """`dst` (new) holds the store `src`'s sealed packs as hard links (copies across file
    systems) and copies of its small files (config, the damaged list)."""
    os.makedirs(os.path.join(dst, "packs"), exist_ok=True)
    os.makedirs(os.path.join(dst, "tmp"), exist_ok=True)
    for entry in os.scandir(src):
        if entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, os.path.join(dst, entry.name))
    packs = os.path.join(src, "packs")
    for sub in sorted(os.listdir(packs)):
        names = set(os.listdir(os.path.join(packs, sub)))
        os.makedirs(os.path.join(dst, "packs", sub), exist_ok=True)
        for name in sorted(names):
            # sealed only: a pack is renamed into place before its index, so an index names one
            if not name.endswith(".idx") or name[:-4] + ".pack" not in names:
                continue
            for part in (name[:-4] + ".pack", name):
                _link(os.path.join(packs, sub, part), os.path.join(dst, "packs", sub, part))


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        import errno
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(src, dst)       # another file system (or links refused): a copy


def _restore(objects_dir: str, tree: str, target: str, progress) -> list:
    from ..snapshot import Item, RestorePlan, Store
    from ..snapshot.diff import walk_changes
    from ..snapshot.encoding import TYPE_NAMES
    from ..snapshot.restore import apply_plan
    store = Store(objects_dir)
    try:
        # from the empty directory to the tree: every path added, in path order (parents first)
        plan = RestorePlan(tree)
        plan.write = [Item(path, TYPE_NAMES[e.type], e.mode, e.size, e.oid, e.chunked, e.target)
                      for path, _status, _old, e in walk_changes(store.objects, None, bytes.fromhex(tree))]
        apply_plan(store.objects, target, plan, progress)
    finally:
        store.close()
    return [i for i in plan.write if i.type in ("file", "exec")]


def _write_statcache(path: str, root: str, written: list) -> None:
    """The branch's stat cache: each file restored, its lstat now and the content written."""
    from ..snapshot.statcache import FLAG_CHUNKED, StatCache
    entries = {}
    for item in written:
        try:
            st = os.lstat(os.path.join(root, os.fsdecode(item.path)))
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        entries[item.path] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                              item.oid, FLAG_CHUNKED if item.chunked else 0)
    cache = StatCache(path)
    # The on-disk table is exactly this (docs/FORMAT.md, "Stat cache"): the loader's own way
    # from it to memos, then save() writes it.
    cache._rebuild(entries)
    cache.changed = True
    cache.save()


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_noreplace(src: str, dst: str) -> None:
    """Rename, refusing (FileExistsError) when `dst` exists: os.rename would replace an empty
    directory someone made there meanwhile."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        fn = None
    if fn is None:
        if os.path.lexists(dst):
            raise FileExistsError(dst)
        os.rename(src, dst)
        return
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def _marker(project, branch_id: int) -> str:
    return os.path.join(registry.branches_dir(project), f"{branch_id}{PENDING_EXT}")


def recover(project, locked: bool = False) -> list[int]:
    """Finish or undo forks that were killed: a branch already under its final name (its
    branch.json names this project and id) is recorded; a temporary is removed. Returns the
    ids recorded."""
    d = registry.branches_dir(project)
    try:
        pending = [n for n in os.listdir(d) if n.endswith(PENDING_EXT) and n[:-len(PENDING_EXT)].isdigit()]
    except FileNotFoundError:
        return []
    if not pending:
        return []
    if not locked:
        with registry.locked(project):
            return recover(project, locked=True)
    done = []
    root = os.path.realpath(project.root)
    for name in pending:
        path = os.path.join(d, name)
        try:
            with open(path, "rb") as f:
                rec = json.loads(f.read())
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            rec = None
        if isinstance(rec, dict) and isinstance(rec.get("dir"), str):
            try:
                mine = registry.parent_of(rec["dir"])
            except registry.BadRecord:
                mine = None
            if mine and mine.get("parent") == root and mine.get("id") == rec.get("id") \
                    and registry.fork(project, rec["id"]) is None:
                registry.add(project, rec)
                done.append(rec["id"])
            tmp = rec.get("tmp")
            if isinstance(tmp, str) and os.path.basename(tmp).startswith(".") and ".forking-" in tmp:
                remove_tree(tmp)
        os.unlink(path)
    return done


def remove_tree(path: str) -> None:
    """Remove a directory tree envgit made, read-only directories included (a restore gives
    directories their snapshot's modes)."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        os.unlink(path)
        return

    for dirpath, dirnames, _ in os.walk(path):      # top-down: each made writable before entered
        for name in [""] + dirnames:
            p = os.path.join(dirpath, name) if name else dirpath
            _writable_dir(p)
    shutil.rmtree(path)      # (fd-based on Linux: a symlink in the tree is removed, never followed)


def _writable_dir(p: str) -> None:
    """u+rwx on the directory `p` itself, never through a symlink put in its place."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        # unreadable to its owner (mode 0o000 or 0o111): by name, after checking it is a directory
        try:
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
        except OSError:
            pass
        return
    try:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | stat.S_IRWXU)
    except OSError:
        pass
    finally:
        os.close(fd)
