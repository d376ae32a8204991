"""git's view of two snapshots (snapshot/gitview.py) is bounded per call by one budget of time
and bytes, indexes included (red team 12: 40 repositories with 200k-entry indexes made
`envgit diff` and the rewind plan take minutes). Real git writes the repositories; the store
snapshots them; git_changes is the function diff and the rewind plan call."""

import os
import subprocess
import time

from envgit.snapshot import Filter, StatCache, Store, gitrepo
from envgit.snapshot.gitview import BUDGET_BYTES, BUDGET_SECONDS, Budget, git_changes


def _env(tmp_path):
    return {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@e", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}


def _repo_with_index(root, env, entries, extra=None):
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], env=env, check=True)
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=root, input=b"x", env=env,
                          capture_output=True, check=True).stdout.strip().decode()
    lines = "".join(f"100644 {blob}\td{i // 1000}/f{i}\n" for i in range(entries))
    if extra:
        lines += f"100644 {blob}\t{extra}\n"
    subprocess.run(["git", "update-index", "--index-info"], cwd=root, input=lines.encode(), env=env, check=True)
    return blob


def _many(tmp_path, n=12, entries=60_000):
    """`n` repositories whose 60k-entry indexes each gain one path between two snapshots."""
    env = _env(tmp_path)
    proj = tmp_path / "p"
    blob = _repo_with_index(proj / "r0", env, entries)
    for i in range(1, n):
        (proj / f"r{i}").mkdir()
        subprocess.run(["cp", "-a", str(proj / "r0" / ".git"), str(proj / f"r{i}")], check=True)
    store, flt, cache = Store(tmp_path / "objects"), Filter(), StatCache()
    a = store.snapshot(proj, flt, cache).tree_id
    for i in range(n):
        subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},extra"],
                       cwd=proj / f"r{i}", env=env, check=True)
    b = store.snapshot(proj, flt, cache).tree_id
    return store, a, b, (proj / "r0" / ".git" / "index").stat().st_size


def _read_and_unread(repos, n):
    read = [r for r in repos if r.index_count]
    unread = [r for r in repos if any("budget" in p for p in r.problems)]
    assert len(repos) == n and len(read) + len(unread) == n, \
        [(r.gitdir, r.index_count, r.problems) for r in repos]
    assert all(r.index[0].path == "extra" for r in read)
    assert unread and any(line.startswith("  not read: ") and "budget" in line
                          for line in unread[-1].lines())
    return read, unread


def test_many_large_indexes_finish_within_the_time_budget(tmp_path):
    """12 x 2 x 60k entries (the old reader took 12 s over them in one run here): a budget of 1 s
    ends the call near 1 s, the rest said as not read."""
    store, a, b, _ = _many(tmp_path)
    start = time.monotonic()
    repos = git_changes(store, a, b, budget=Budget(1.0, BUDGET_BYTES))
    took = time.monotonic() - start
    assert took < 1.0 + 2, took
    _read_and_unread(repos, 12)
    start = time.monotonic()
    git_changes(store, a, b)                                      # the default budget
    assert time.monotonic() - start < BUDGET_SECONDS + 3


def test_the_bytes_budget_stops_reading_indexes(tmp_path):
    """Bytes for three index files: the first repository's two are read, then nothing."""
    store, a, b, size = _many(tmp_path, n=5, entries=20_000)
    read, unread = _read_and_unread(git_changes(store, a, b, budget=Budget(60, 3 * size + 4096)), 5)
    assert len(read) == 1 and len(unread) == 4


def test_an_index_the_same_on_both_sides_is_not_read(tmp_path, monkeypatch):
    env = _env(tmp_path)
    proj = tmp_path / "p"
    _repo_with_index(proj, env, 1000)
    subprocess.run(["git", "commit", "-qm", "one"], cwd=proj, env=env, check=True)
    store, flt, cache = Store(tmp_path / "objects"), Filter(), StatCache()
    a = store.snapshot(proj, flt, cache).tree_id
    subprocess.run(["git", "branch", "other"], cwd=proj, env=env, check=True)
    b = store.snapshot(proj, flt, cache).tree_id
    parsed = []
    real = gitrepo._parse_index
    monkeypatch.setattr(gitrepo, "_parse_index", lambda *a: parsed.append(1) or real(*a))
    [r] = git_changes(store, a, b)
    assert [m.name for m in r.refs] == ["refs/heads/other"] and r.index_count == 0
    assert parsed == []


def test_an_index_over_the_entry_cap_is_said_not_read(tmp_path, monkeypatch):
    env = _env(tmp_path)
    proj = tmp_path / "p"
    blob = _repo_with_index(proj, env, 50)
    store, flt, cache = Store(tmp_path / "objects"), Filter(), StatCache()
    a = store.snapshot(proj, flt, cache).tree_id
    subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},extra"],
                   cwd=proj, env=env, check=True)
    b = store.snapshot(proj, flt, cache).tree_id
    monkeypatch.setattr(gitrepo, "MAX_INDEX_ENTRIES", 40)
    [r] = git_changes(store, a, b)
    assert r.index_count == 0 and any("over the 40" in p for p in r.problems), r.problems
