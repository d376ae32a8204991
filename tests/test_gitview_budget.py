"""git's view of two snapshots (snapshot/gitview.py) is bounded per call by one budget of time
and bytes, indexes included (red team 12: 40 repositories with 200k-entry indexes made
`envgit diff` and the rewind plan take minutes). Real git writes the repositories; the store
snapshots them; git_changes is the function diff and the rewind plan call."""

import os
import subprocess
import time

from envgit.snapshot import Filter, StatCache, Store
from envgit.snapshot import gitview
from envgit.snapshot.gitview import BUDGET_SECONDS, git_changes


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


def test_many_large_indexes_finish_within_the_budget(tmp_path):
    env = _env(tmp_path)
    proj = tmp_path / "p"
    n = 12
    blob = _repo_with_index(proj / "r0", env, 60_000)
    for i in range(1, n):
        (proj / f"r{i}").mkdir()
        subprocess.run(["cp", "-a", str(proj / "r0" / ".git"), str(proj / f"r{i}")], check=True)
    store, flt, cache = Store(tmp_path / "objects"), Filter(), StatCache()
    a = store.snapshot(proj, flt, cache).tree_id
    for i in range(n):
        subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},extra"],
                       cwd=proj / f"r{i}", env=env, check=True)
    b = store.snapshot(proj, flt, cache).tree_id
    start = time.monotonic()
    repos = git_changes(store, a, b)
    took = time.monotonic() - start
    assert took < BUDGET_SECONDS + 3, took
    assert len(repos) == n
    read = [r for r in repos if r.index_count]
    unread = [r for r in repos if any("budget" in p for p in r.problems)]
    assert read and read[0].index[0].path == "extra", [r.to_json() for r in repos[:2]]
    assert unread and len(read) + len(unread) == n, [(r.gitdir, r.index_count, r.problems) for r in repos]
    assert any(line.startswith("  not read: ") and "budget" in line for line in unread[-1].lines())


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
    real = gitview._parse_index
    monkeypatch.setattr(gitview, "_parse_index", lambda *a: parsed.append(1) or real(*a))
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
    monkeypatch.setattr(gitview, "MAX_INDEX_ENTRIES", 40)
    [r] = git_changes(store, a, b)
    assert r.index_count == 0 and any("over the 40" in p for p in r.problems), r.problems
