"""Helpers of the fault-injection suite: what a directory holds, exactly, and the journal as
it is on disk (read with sqlite3 directly, not through envgit)."""

import json
import sqlite3
import subprocess

import pytest

from kit.trees import tree_of


def rows(proj, where="", args=()):
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    try:
        return db.execute(f"SELECT seq, step, kind, body FROM entries {where} ORDER BY seq", args).fetchall()
    finally:
        db.close()


def dropped(proj) -> set:
    out = set()
    for _, _, _, body in rows(proj, "WHERE step = 0 AND kind = 'gc'"):
        out |= set(json.loads(body).get("dropped", []))
    return out


def no_traceback(r):
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr + r.stdout
    return r


def assert_rewinds_exactly(proj, expected: dict):
    """Rewind to every step in `expected` (step -> tree_of after it) and compare the whole
    directory; then the last one again, so the project ends where it was."""
    for n, tree in expected.items():
        r = no_traceback(proj.envgit("rewind", str(n), "--yes"))
        assert r.returncode == 0, f"rewind {n}: {r.stderr}"
        assert tree_of(proj.root) == tree, f"rewind {n} did not give back its tree"


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path):
    """A project on a 12 MiB tmpfs the test mounts under its tmp dir (root only): a disk that
    really fills up. Import it as `from faultlib import small_disk_fixture  # noqa: F401`."""
    from conftest import Env, make_home
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], check=True)
    try:
        home = make_home(tmp_path)
        root = mnt / "proj"
        root.mkdir()
        e = Env(home, root)
        e.envgit("init", check=True)
        yield e
        e.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def three_steps(proj) -> dict:
    """Steps 1-3, each changing `a` and adding a directory; {n: the tree after step n}; the
    daemon stopped after them."""
    after = {}
    for n in (1, 2, 3):
        assert proj.run(f"echo {n} > a && mkdir -p d{n} && echo x > d{n}/f").returncode == 0
        after[n] = tree_of(proj.root)
    proj.stop()
    return after
