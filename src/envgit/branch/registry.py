"""The main project's record of its fork branches, and a branch's record of its parent.

Pure file I/O, standard library only (docs/FORMAT.md, "Branches"):

- `.envgit/branches/<id>.json` in the main project, one per fork branch (mode 0600):
  `{"version": 1, "id", "kind": "fork", "dir", "from_step", "from_tree", "created_ns"}`;
- `.envgit/branches/last_id`: the highest id ever given (ids are never reused, even after
  `envgit branch rm`), so a record removed and a new fork never share an id;
- `.envgit/branch.json` in a branch directory: `{"version": 1, "parent", "id", "from_step",
  "from_tree"}`.

Rewound branches (`r<R>`) are derived from the journal (branch/rewound.py); their removal
markers `r<R>.removed` live in the same directory and are not read here.

`project` is a paths.Project or a project root (str) everywhere."""

import fcntl
import json
import os
from contextlib import contextmanager

from ..atomicfile import write_atomic
from ..paths import STATE_DIR

VERSION = 1
BRANCHES_DIR = "branches"
BRANCH_FILE = "branch.json"
LAST_ID_FILE = "last_id"
FORK_KEYS = ("version", "id", "kind", "dir", "from_step", "from_tree", "created_ns")
PARENT_KEYS = ("version", "parent", "id", "from_step", "from_tree")


class BadRecord(ValueError):
    """A registry file that is not what FORMAT.md says (named in the message)."""


def _root(project) -> str:
    return getattr(project, "root", project)


def branches_dir(project) -> str:
    return os.path.join(_root(project), STATE_DIR, BRANCHES_DIR)


def record_path(project, branch_id: int) -> str:
    return os.path.join(branches_dir(project), f"{int(branch_id)}.json")


def _read_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise BadRecord(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise BadRecord(f"{path}: not a version-{VERSION} branch record")
    return data


def _check_fork(path: str, rec: dict) -> dict:
    missing = [k for k in FORK_KEYS if k not in rec]
    if missing or rec.get("kind") != "fork" or not isinstance(rec.get("id"), int) \
            or not isinstance(rec.get("dir"), str) or not os.path.isabs(rec["dir"]):
        raise BadRecord(f"{path}: not a fork branch record (missing or wrong: "
                        f"{', '.join(missing) or 'kind/id/dir'})")
    return rec


def forks(project) -> list[dict]:
    """Every fork branch the project records, by id."""
    d = branches_dir(project)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        stem, dot, ext = name.partition(".")
        if ext != "json" or not stem.isdigit():
            continue
        path = os.path.join(d, name)
        rec = _read_json(path)
        if rec is not None:
            out.append(_check_fork(path, rec))
    return sorted(out, key=lambda r: r["id"])


def fork(project, branch_id: int) -> dict | None:
    """The record of fork branch `branch_id`, or None."""
    path = record_path(project, branch_id)
    rec = _read_json(path)
    return None if rec is None else _check_fork(path, rec)


def add(project, record: dict) -> None:
    """Write (or replace) a fork branch's record, whole or not at all."""
    rec = {k: record[k] for k in FORK_KEYS}
    _check_fork("new record", rec)
    os.makedirs(branches_dir(project), mode=0o700, exist_ok=True)
    write_atomic(record_path(project, rec["id"]), json.dumps(rec, indent=2) + "\n", 0o600, chmod=0o600)


def remove(project, branch_id: int) -> bool:
    """Drop a fork branch's record (the id stays used). True when there was one."""
    try:
        os.unlink(record_path(project, branch_id))
    except FileNotFoundError:
        return False
    return True


@contextmanager
def locked(project):
    """Hold the registry's lock (forks and removals in several processes at once)."""
    d = branches_dir(project)
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(d, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def last_id(project) -> int:
    """The highest id ever given (0 when none): the counter, or a record above it."""
    try:
        with open(os.path.join(branches_dir(project), LAST_ID_FILE), "rb") as f:
            n = int(f.read().strip() or b"0")
    except FileNotFoundError:
        n = 0
    except (OSError, ValueError) as e:
        raise BadRecord(f"{os.path.join(branches_dir(project), LAST_ID_FILE)}: not a number ({e})") from None
    return max([n] + [r["id"] for r in forks(project)])


def take_ids(project, count: int) -> list[int]:
    """Reserve `count` new ids (call under locked()): written before any branch is made, so
    an id is never given twice even when a fork is interrupted."""
    first = last_id(project) + 1
    ids = list(range(first, first + count))
    write_atomic(os.path.join(branches_dir(project), LAST_ID_FILE), f"{ids[-1]}\n", 0o600, chmod=0o600)
    return ids


def parent_of(project) -> dict | None:
    """This project's `.envgit/branch.json` (it is a fork branch of `parent`), or None."""
    path = os.path.join(_root(project), STATE_DIR, BRANCH_FILE)
    rec = _read_json(path)
    if rec is None:
        return None
    if any(k not in rec for k in PARENT_KEYS) or not isinstance(rec.get("parent"), str):
        raise BadRecord(f"{path}: not a branch parent record")
    return rec


def write_parent(branch_root: str, record: dict) -> None:
    """Write a branch directory's `.envgit/branch.json`."""
    rec = {k: record[k] for k in PARENT_KEYS}
    write_atomic(os.path.join(branch_root, STATE_DIR, BRANCH_FILE), json.dumps(rec, indent=2) + "\n",
                 0o600, chmod=0o600)
