"""Unprivileged users for the tests that run as one, made before any test runs.

useradd and userdel rewrite /etc/passwd, /etc/shadow, /etc/group and /etc/gshadow by renaming
new files over them. A step starting at that moment elsewhere on the machine (another test,
run side by side) masks those root-only files and can find one replaced under it: bwrap then
fails to start ("Unable to find /newroot/etc/gshadow in mount table"). So the users are made
once per run, one per xdist worker, by the controlling pytest before its workers start
(`make_pool`, from tests/conftest.py's pytest_configure), and removed after they all stop. A
worker runs one test at a time, so its user is the test's alone while it runs; every process
the user left is killed when the test ends.

The directories above the venv's Python (under /root here) are given search permission for
others for the same span (`open_path_to`), not per test: changing their mode while other tests'
steps start would change the root-only set under them too.
"""

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from kit.locks import machine_lock

POOL_ENV = "ENVGIT_TEST_USERS"          # the pool's names, comma-separated, for the workers
_PATH_LOCK = "/tmp/envgit-test-open-path.lock"
_PATH_STATE = "/tmp/envgit-test-open-path.json"


def can_make_users() -> bool:
    return os.geteuid() == 0 and shutil.which("useradd") is not None


def _useradd(name):
    with machine_lock("passwd"):
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)


def _kill_all_of(name):
    """Every process of `name` killed and gone (bounded: 10 s)."""
    for _ in range(100):
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        if subprocess.run(["pgrep", "-u", name], capture_output=True).returncode != 0:
            return
        time.sleep(0.1)


def _userdel(name):
    _kill_all_of(name)      # userdel refuses a user with a process left
    with machine_lock("passwd"):
        subprocess.run(["userdel", name], capture_output=True)


def make_pool(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    names = [f"envgit-t{tag}-{i}" for i in range(n)]
    for name in names:
        _useradd(name)
    return names


def drop_pool(names):
    for name in names:
        _userdel(name)


def _worker_index() -> int:
    w = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(w[2:]) if w.startswith("gw") and w[2:].isdigit() else 0


@contextlib.contextmanager
def test_user(prefix: str = "envgit-t"):
    """Yields this worker's pooled user (made for this test when there is no pool: a test run
    by hand outside the suite's configure); every process it left is killed at the end."""
    pool = [n for n in os.environ.get(POOL_ENV, "").split(",") if n]
    idx = _worker_index()
    own = idx >= len(pool)
    name = prefix + uuid.uuid4().hex[:6] if own else pool[idx]
    if own:
        _useradd(name)
    try:
        yield name
    finally:
        if own:
            _userdel(name)
        else:
            _kill_all_of(name)


test_user.__test__ = False      # not a test, whatever pytest's name rules say


@contextlib.contextmanager
def open_path_to(*paths):
    """Give others search permission on the directories above `paths` that lack it (the venv's
    Python may live under root's home) for as long as any test run on this machine needs it:
    a count shared under a lock, so one run's teardown does not close the path under another
    run's test user; the last one out restores the modes."""
    with open(_PATH_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(Path(_PATH_STATE).read_text())
        except (OSError, ValueError):
            state = {"users": 0, "changed": []}
        for path in paths:
            d = os.path.dirname(os.path.realpath(path))
            while d != "/":
                mode = os.stat(d).st_mode & 0o7777
                if not mode & 0o001:
                    os.chmod(d, mode | 0o001)
                    state["changed"].append([d, mode])
                d = os.path.dirname(d)
        state["users"] += 1
        Path(_PATH_STATE).write_text(json.dumps(state))
    try:
        yield
    finally:
        with open(_PATH_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(Path(_PATH_STATE).read_text())
            state["users"] -= 1
            if state["users"] <= 0:
                for d, mode in reversed(state["changed"]):
                    os.chmod(d, mode)
                os.unlink(_PATH_STATE)
            else:
                Path(_PATH_STATE).write_text(json.dumps(state))
