"""The scenario envgit exists for: history destroyed beyond git's reach, brought back."""

import os
import subprocess

from envgit.snapshot import Filter, StatCache, Store

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def git(repo, *args, check=True):
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, check=check,
                          capture_output=True, text=True)


def test_reflog_expire_and_gc_then_restore_brings_the_commit_back(tmp_path):
    repo = tmp_path / "proj"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "base.txt").write_text("base\n")
    git(repo, "add", "base.txt")
    git(repo, "commit", "-qm", "base")
    (repo / "a.txt").write_text("hi\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "a")
    commit = git(repo, "rev-parse", "HEAD").stdout.strip()

    store = Store(tmp_path / "objects")       # outside the repository the agent operates on
    cache = StatCache(tmp_path / "statcache")
    flt = Filter()
    a = store.snapshot(repo, flt, cache)

    git(repo, "reset", "-q", "--hard", "HEAD~1")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    assert git(repo, "cat-file", "-e", commit, check=False).returncode != 0   # gone for git
    b = store.snapshot(repo, flt, cache)
    changed = {c.path for c in store.diff(a.tree_id, b.tree_id)}
    assert b"a.txt" in changed and any(p.startswith(b".git/") for p in changed)

    plan = store.plan_restore(repo, a.tree_id, flt, cache=cache)
    assert plan.current_tree_id == b.tree_id
    store.restore(repo, plan)
    assert store.snapshot(repo, flt, cache).tree_id == a.tree_id    # before git touches its index
    assert git(repo, "cat-file", "-e", commit).returncode == 0
    assert git(repo, "log", "--format=%H %s").stdout.splitlines()[0] == f"{commit} a"
    assert git(repo, "status", "--porcelain").stdout == ""
    assert git(repo, "fsck", "--strict").returncode == 0
    assert (repo / "a.txt").read_text() == "hi\n"

    # The rewind itself can be undone: back to the state after the gc.
    store.restore(repo, store.plan_restore(repo, b.tree_id, flt, cache=cache))
    assert git(repo, "cat-file", "-e", commit, check=False).returncode != 0
    assert store.fsck([a.tree_id, b.tree_id]) == []
