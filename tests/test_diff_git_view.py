"""`envgit diff` shows `.git` as git sees it (issue 12, section 5): refs moved, commits added
and commits lost (reachable before, on no ref after), the index changed; the object files only
with --raw. A path the policy denies is shown as changed with its content withheld.

Real steps (`envgit run -- git commit`, `git reset --hard HEAD~1`, `git gc`) in a real project;
what envgit says is checked against what git itself says about the same repository.
"""

import json
import os
import subprocess
import time

from conftest import CANARY, ENVGIT
from envgit.snapshot import Filter, StatCache, Store
from envgit.snapshot.gitview import git_changes
from test_cli_conventions import documented_keys

AS = "git -c user.name=agent -c user.email=a@example.test"


def step(proj, script):
    r = proj.run(script)
    assert r.returncode == 0, r.stderr
    return r.stdout


def host_git(root, *args):
    r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def reachable(root) -> set:
    return set(host_git(root, "rev-list", "--all").split())


def refs(root) -> dict:
    out = dict(line.split(" ", 1)[::-1] for line in
               host_git(root, "for-each-ref", "--format=%(objectname) %(refname)").splitlines())
    head = subprocess.run(["git", "-C", str(root), "symbolic-ref", "-q", "HEAD"], capture_output=True, text=True)
    out["HEAD"] = f"ref: {head.stdout.strip()}" if head.returncode == 0 else host_git(root, "rev-parse", "HEAD").strip()
    return out


def diff_json(proj, a, b, *more):
    return json.loads(proj.envgit("diff", a, b, "--json", *more, check=True).stdout)


def test_a_commit_is_a_ref_moved_and_a_commit_added(proj):
    step(proj, f"echo one > a.txt && git add a.txt && {AS} commit -qm first")
    old = host_git(proj.root, "rev-parse", "HEAD").strip()
    step(proj, f"echo two >> a.txt && echo new > b.txt && git add a.txt b.txt && {AS} commit -qm 'second: two'")
    new = host_git(proj.root, "rev-parse", "HEAD").strip()

    d = proj.envgit("diff", "1", "2", check=True).stdout
    assert "git .git:" in d and f"refs/heads/main: {old[:12]} -> {new[:12]}" in d
    assert "commits added: 1" in d and f"{new[:12]} second: two" in d
    assert "index: 2 path(s) staged differently" in d and "    M a.txt" in d and "    A b.txt" in d
    assert ".git/objects/" not in d and "M  .git/index" not in d            # not object files
    assert "+two" in d                                                       # the worktree's own diff
    raw = proj.envgit("diff", "1", "2", "--raw", "--stat", check=True).stdout
    assert ".git/objects/" in raw and "M  .git/index" in raw and "commits added" not in raw

    j = diff_json(proj, "1", "2")
    g = j["git"]
    assert len(g) == 1 and g[0]["gitdir"] == ".git"
    assert set(g[0]) == documented_keys()["diff.git"]
    assert g[0]["refs"] == [{"name": "refs/heads/main", "old": old, "new": new}]
    assert [c["id"] for c in g[0]["commits_added"]] == [new] and g[0]["lost_count"] == 0
    assert g[0]["commits_added"][0]["summary"] == "second: two"
    assert g[0]["commits_added"][0]["committed_at"].endswith("Z")
    assert sorted((i["path"], i["status"]) for i in g[0]["index"]) == [("a.txt", "modified"), ("b.txt", "added")]
    assert not any(c["path"].startswith(".git/objects/") for c in j["changes"])
    assert any(c["path"].startswith(".git/objects/") for c in diff_json(proj, "1", "2", "--raw")["changes"])


def test_reset_hard_shows_the_commits_lost_and_gc_shows_them_gone(proj):
    for i in range(1, 4):
        step(proj, f"echo {i} > f && git add f && {AS} commit -qm c{i}")
    ids = host_git(proj.root, "rev-list", "HEAD").split()            # c3, c2, c1
    step(proj, "git reset -q --hard HEAD~2")                          # step 4
    d = proj.envgit("diff", "last~1", "last", check=True).stdout
    assert f"refs/heads/main: {ids[0][:12]} -> {ids[2][:12]}" in d
    assert "commits lost (on no ref now): 2" in d and "commits added" not in d
    assert d.index(f"{ids[0][:12]} c3") < d.index(f"{ids[1][:12]} c2")          # newest first
    assert "gone too" not in d                                        # still in the objects (reflog)
    j = diff_json(proj, "3", "4")["git"][0]
    assert [c["id"] for c in j["commits_lost"]] == ids[:2] and j["complete"]

    step(proj, "git reflog expire --expire=now --all && git gc -q --prune=now")      # step 5
    assert subprocess.run(["git", "-C", str(proj.root), "cat-file", "-e", ids[0]]).returncode != 0
    d = proj.envgit("diff", "3", "5", check=True).stdout
    assert f"{ids[0][:12]} c3  (its object is gone too)" in d
    d = proj.envgit("diff", "4", "5", check=True).stdout       # repacked, nothing moved
    assert "refs, commits and index unchanged" in d
    # back the other way (what a rewind to step 3 would do): the commits come back
    j = diff_json(proj, "5", "3")["git"][0]
    assert [c["id"] for c in j["commits_added"]] == ids[:2] and j["lost_count"] == 0


HISTORY = f"""
set -e
for i in $(seq 1 40); do echo "line $i" >> log.txt; git add log.txt; {AS} commit -qm "main $i"; done
git checkout -qb topic HEAD~10
for i in $(seq 1 8); do echo "t $i" > t.txt; git add t.txt; {AS} commit -qm "topic $i"; done
git checkout -q main
{AS} merge -q --no-edit topic
{AS} tag -a v1 -m "release one"
git tag light HEAD~3
git checkout -qb side HEAD~20
for i in $(seq 1 5); do echo "s $i" > s.txt; git add s.txt; {AS} commit -qm "side $i"; done
git checkout -q main
git gc -q
"""


def test_what_diff_says_matches_what_git_says(proj):
    """Packed objects (deltas), packed refs, branches, merges, annotated tags, a detached
    HEAD: every step's commits added and lost, and refs moved, equal git's own answers."""
    step(proj, "echo start > log.txt && git add log.txt && " + AS + " commit -qm start")
    seen = [(reachable(proj.root), refs(proj.root))]
    scripts = [
        HISTORY,                                               # many commits, then packed
        "git branch -D side",                                  # lost: the side commits
        "git reset -q --hard HEAD~5",                          # lost: merge and friends, not topic's
        f"echo x > x.txt && git add x.txt && {AS} commit -qm 'after the reset'",
        "git tag -d v1 && git branch -D topic",
        "git checkout -q --detach HEAD~2",                     # HEAD symbolic -> detached
        "git checkout -q main && echo y >> x.txt && git stash -q",      # refs/stash
    ]
    for script in scripts:
        step(proj, script)
        seen.append((reachable(proj.root), refs(proj.root)))
    for n in range(1, len(seen)):
        (before, refs_a), (after, refs_b) = seen[n - 1], seen[n]
        g = diff_json(proj, str(n), str(n + 1))["git"]
        assert len(g) == 1, (n, g)
        g = g[0]
        assert g["problems"] == [] and g["complete"], (n, g["problems"])
        assert {c["id"] for c in g["commits_added"]} == after - before, (n, scripts[n - 1])
        assert {c["id"] for c in g["commits_lost"]} == before - after, (n, scripts[n - 1])
        assert g["added_count"] == len(after - before) and g["lost_count"] == len(before - after)
        moved = {r["name"]: (r["old"], r["new"]) for r in g["refs"]}
        expect = {k: (refs_a.get(k), refs_b.get(k)) for k in refs_a.keys() | refs_b.keys()
                  if refs_a.get(k) != refs_b.get(k)}
        assert moved == expect, (n, scripts[n - 1])
    assert len(seen[1][0] - seen[0][0]) > 50                 # the history really was big


def test_a_nested_sha256_repository_is_its_own(proj):
    step(proj, "mkdir lib && cd lib && git init -q --object-format=sha256 -b trunk "
               f"&& echo l > l.txt && git add l.txt && {AS} commit -qm 'lib start'")
    step(proj, f"cd lib && echo m >> l.txt && {AS} commit -qam 'lib more' && git gc -q")
    lib = proj.root / "lib"
    head = host_git(lib, "rev-parse", "HEAD").strip()
    assert len(head) == 64
    d = proj.envgit("diff", "1", "2", check=True).stdout
    assert "git lib/.git:" in d and f"{head[:12]} lib more" in d and "git .git:" not in d
    j = diff_json(proj, "1", "2")["git"]
    assert [r["gitdir"] for r in j] == ["lib/.git"]
    assert [c["id"] for c in j[0]["commits_added"]] == [head]


def test_damaged_git_files_are_said_not_fatal(proj):
    """A step writes what it likes under .git: diff reads around it and says what it could
    not read, and still shows the rest."""
    step(proj, f"echo a > a && git add a && {AS} commit -qm base")
    step(proj, "mkdir -p .git/objects/pack && head -c 3000 /dev/urandom > .git/objects/pack/pack-bad.pack "
               "&& printf '\\377tOc\\000\\000\\000\\002' > .git/objects/pack/pack-bad.idx "
               "&& mkdir -p .git/objects/ab && echo junk > .git/objects/ab/" + "c" * 38 + " "
               "&& echo " + "ab" + "c" * 38 + " > .git/refs/heads/broken "
               "&& echo 1234567890123456789012345678901234567890 > .git/refs/heads/missing "
               f"&& echo b > b && git add b && {AS} commit -qm next")
    r = proj.envgit("diff", "1", "2")
    assert r.returncode == 0, r.stderr
    assert "not read:" in r.stdout and "commits added: 1" in r.stdout and "next" in r.stdout
    assert "refs/heads/broken: (none) -> abcccccccccc" in r.stdout


def test_denied_files_are_changed_but_withheld(proj):
    (proj.root / ".env").write_text("TOKEN=old\n")
    step(proj, "echo 1 > a")
    (proj.root / ".env").write_text(f"TOKEN={CANARY}\n")          # the person's edit
    d = proj.envgit("diff", check=True).stdout
    assert f"M  .env  (10 -> {len(CANARY) + 7} bytes)" in d and CANARY not in d and "TOKEN=old" not in d
    assert "content withheld; --show-secrets shows it" in d and "deny_read **/.env" in d
    assert f"+TOKEN={CANARY}" in proj.envgit("diff", "--show-secrets", check=True).stdout
    step(proj, "echo 2 > a")                                       # the edit becomes an outside step
    d = proj.envgit("diff", "1", "last", check=True).stdout
    assert ".env" in d and CANARY not in d and "withheld" in d
    j = diff_json(proj, "1", "last")
    assert {c["path"]: c["withheld"] for c in j["changes"]} == {".env": True, "a": False}
    assert any(c["path"] == ".env" and c["withheld"] for p in j["parts"] for c in p["changes"])


def test_git_changes_for_the_rewind_plan(tmp_path):
    """The function the rewind plan calls: two tree ids in, one RepoChange per repository."""
    repo = tmp_path / "p"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*a):
        return subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q", "-b", "main")
    for i in range(3):
        (repo / "f").write_text(f"{i}\n")
        git("add", "f")
        git("commit", "-qm", f"c{i}")
    store, flt, cache = Store(tmp_path / "objects"), Filter(), StatCache()
    a = store.snapshot(repo, flt, cache).tree_id
    lost = git("rev-parse", "HEAD").strip()
    git("reset", "-q", "--hard", "HEAD~1")
    b = store.snapshot(repo, flt, cache).tree_id
    [r] = git_changes(store, a, b)
    assert r.gitdir == ".git" and [c.id for c in r.lost] == [lost] and r.added == []
    assert r.covers(b".git/objects/aa/bb") and r.covers(b".git/index") and not r.covers(b".git/config")
    assert not r.covers(b"src/.git/objects/aa")
    assert set(r.to_json()) == documented_keys()["diff.git"]
    assert r.lines()[0] == "git .git:" and any("commits lost" in line for line in r.lines())
    assert git_changes(store, a, a) == [] and git_changes(store, b, b, []) == []
    [first] = git_changes(store, None, a)                    # a repository that appears whole
    assert first.added_count == 3 and first.refs[0].name == "HEAD"


def test_a_long_history_costs_little(proj):
    """3000 commits in one pack; a reset of one commit reads only what differs."""
    stream = ("""awk 'BEGIN { for (i = 0; i < 3000; i++) {
        printf "commit refs/heads/main\\nmark :%d\\ncommitter a <a@e> %d +0000\\ndata 6\\nc%04d\\n", i + 1, 1700000000 + i, i
        if (i > 0) printf "from :%d\\n", i
        printf "M 644 inline f\\ndata 5\\n%04d\\n\\n", i } }'""")  # noqa: E501 (an awk program)
    step(proj, f"{stream} | git fast-import --quiet && git reset -q --hard main && git gc -q")
    step(proj, "git reset -q --hard HEAD~1")
    t0 = time.monotonic()
    j = diff_json(proj, "1", "2")["git"][0]
    took = time.monotonic() - t0
    assert j["lost_count"] == 1 and j["commits_lost"][0]["summary"] == "c2999"
    assert took < 10, took                       # generous: a loaded 2-core machine
    t0 = time.monotonic()
    [first] = diff_json(proj, "2", "1")["git"]
    assert first["added_count"] == 1
    print(f"diff of a one-commit reset in a 3000-commit pack: {took:.2f} s (whole CLI)")


def _pack_header(typ, size):
    out = [(typ << 4) | (size & 15)]
    size >>= 4
    while size:
        out[-1] |= 0x80
        out.append(size & 0x7F)
        size >>= 7
    return bytes(out)


def _ofs(rel):
    out = [rel & 0x7F]
    rel >>= 7
    while rel:
        rel -= 1
        out.insert(0, 0x80 | (rel & 0x7F))
        rel >>= 7
    return bytes(out)


def test_hand_made_packs_are_read_within_bounds(tmp_path):
    """A pack is the step's to write: a delta chain 3000 deep (git allows 4095) is followed,
    a REF_DELTA naming its own id and an object whose bytes are not its id are said as
    problems; nothing recurses without bound or raises out of git_changes."""
    import hashlib
    import struct
    import zlib
    body = b"tree " + b"4b825dc642cb6eb9a060e54bf8d69288fbee4904" + \
        b"\nauthor a <a@e> 1700000000 +0000\ncommitter a <a@e> 1700000000 +0000\n\ndeep chain\n"
    commit = hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()
    loop = "ab" * 20
    liar = hashlib.sha1(b"commit 3\0abc").hexdigest()
    pack = bytearray(b"PACK" + struct.pack(">II", 2, 3003))
    offsets = {}
    base = len(pack)
    pack += _pack_header(1, len(body)) + zlib.compress(body)
    delta = bytes([len(body), len(body)]) if len(body) < 128 else None
    assert delta is not None
    delta += bytes([0x90, len(body)])             # copy the whole base
    prev = base
    for _ in range(3000):
        at = len(pack)
        pack += _pack_header(6, len(delta)) + _ofs(at - prev) + zlib.compress(delta)
        prev = at
    offsets[commit] = prev
    offsets[loop] = len(pack)
    pack += _pack_header(7, len(delta)) + bytes.fromhex(loop) + zlib.compress(delta)
    offsets[liar] = len(pack)
    pack += _pack_header(1, len(body)) + zlib.compress(body)
    pack += hashlib.sha1(pack).digest()
    names = sorted(offsets)
    fanout = [sum(1 for n in names if int(n[:2], 16) <= i) for i in range(256)]
    idx = b"\377tOc" + struct.pack(">I", 2) + struct.pack(">256I", *fanout)
    idx += b"".join(bytes.fromhex(n) for n in names) + b"\0\0\0\0" * len(names)
    idx += b"".join(struct.pack(">I", offsets[n]) for n in names) + b"\0" * 40

    root = tmp_path / "p"
    gitdir = root / ".git"
    (gitdir / "objects" / "pack").mkdir(parents=True)
    (gitdir / "refs" / "heads").mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    for name, oid in (("main", commit), ("loop", loop), ("liar", liar)):
        (gitdir / "refs" / "heads" / name).write_text(oid + "\n")
    (gitdir / "objects" / "pack" / "pack-x.pack").write_bytes(pack)
    (gitdir / "objects" / "pack" / "pack-x.idx").write_bytes(idx)
    store = Store(tmp_path / "objects")
    tree = store.snapshot(root, Filter(), StatCache()).tree_id
    [r] = git_changes(store, None, tree)
    assert [(c.id, c.summary) for c in r.added] == [(commit, "deep chain")]
    problems = " ".join(r.problems)
    assert "a delta chain deeper than" in problems and f"{liar[:12]}: its content does not match its id" in problems


def test_a_submodule_is_its_own_repository(proj):
    """A submodule's gitdir lives under .git/modules/NAME: its commits are its own, and its
    logs/ and refs/remotes/origin/ (which hold a HEAD too) are not taken for gitdirs."""
    step(proj, f"mkdir libsrc && cd libsrc && git init -q -b main && echo l > l && git add l "
               f"&& {AS} commit -qm lib1 && cd .. && echo a > a && git add a && {AS} commit -qm top")
    step(proj, f"git -c protocol.file.allow=always submodule add -q ./libsrc sub && {AS} commit -qm 'add sub'")
    step(proj, f"cd sub && echo m >> l && {AS} commit -qam 'sub change' && cd .. && {AS} commit -qam 'bump sub'")
    sub_head = host_git(proj.root / "sub", "rev-parse", "HEAD").strip()
    j = diff_json(proj, "2", "3")["git"]
    assert [r["gitdir"] for r in j] == [".git", ".git/modules/sub"]
    top, sub = j
    assert [c["summary"] for c in top["commits_added"]] == ["bump sub"]
    assert [i["path"] for i in top["index"]] == ["sub"]
    assert [c["id"] for c in sub["commits_added"]] == [sub_head] and sub["commits_added"][0]["summary"] == "sub change"
    assert [r["name"] for r in sub["refs"]] == ["refs/heads/main"]
    added = diff_json(proj, "1", "2")["git"]
    assert [r["gitdir"] for r in added] == [".git", ".git/modules/sub"]
    d = proj.envgit("diff", "2", "3", check=True).stdout
    assert "git .git/modules/sub:" in d and "sub change" in d and ".git/modules/sub/objects" not in d


def test_what_a_step_wrote_in_git_is_shown_inert(proj):
    """Commit messages and ref names are the step's: escapes are shown, never obeyed."""
    step(proj, f"echo a > a && git add a && {AS} commit -qm base")
    step(proj, f"echo b > b && git add b && {AS} commit -qm \"$(printf 'evil \\033[2J\\033]0;title\\007')\" "
               "&& cp .git/refs/heads/main \"$(printf '.git/refs/heads/x\\033[31m')\"")
    r = subprocess.run([ENVGIT, "diff", "1", "2"], cwd=proj.root, env=proj.env, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert b"\x1b" not in r.stdout and b"\x07" not in r.stdout
    assert b"evil \\x1b[2J\\x1b]0;title\\x07" in r.stdout and b"refs/heads/x\\x1b[31m" in r.stdout
    j = diff_json(proj, "1", "2")["git"][0]
    assert j["commits_added"][0]["summary"] == "evil \x1b[2J\x1b]0;title\x07"     # JSON: escaped, exact


def test_a_shallow_clone_ends_the_walk_at_its_boundary(proj):
    step(proj, f"mkdir src && cd src && git init -q -b main && for i in 1 2 3 4 5; do echo $i > f; "
               f"git add f; {AS} commit -qm c$i; done")
    step(proj, "git clone -q --depth 2 file://$PWD/src shallow")
    step(proj, f"cd shallow && echo 6 > f && {AS} commit -qam c6")
    j = diff_json(proj, "2", "3")["git"]
    assert [r["gitdir"] for r in j] == ["shallow/.git"]
    assert j[0]["problems"] == [] and [c["summary"] for c in j[0]["commits_added"]] == ["c6"]
    first = diff_json(proj, "1", "2")["git"]
    got = next(r for r in first if r["gitdir"] == "shallow/.git")
    assert got["problems"] == [] and [c["summary"] for c in got["commits_added"]] == ["c5", "c4"]


def test_a_diff_too_costly_to_show_says_the_command_that_shows_it(proj):
    """`envgit diff` bounds difflib's work (view/diffs.py unified_lines: quadratic on a
    large changed middle); the file it does not diff is named with its line counts and the
    command that diffs it whatever it costs (--full), which does."""
    proj.run("seq 25000 > big.txt && echo a > small.txt", check=True)
    proj.run("seq 25000 | sed 's/$/ x/' > big.txt && echo b > small.txt", check=True)
    r = proj.envgit("diff", "1", "2", check=True)
    assert ("too much changed to diff here: 25000 lines -> 25000 lines: contents not shown; "
            "`envgit diff 1 2 --full -- big.txt` shows it") in r.stdout, r.stdout[-2000:]
    assert "-a\n+b\n" in r.stdout                  # the cheap file beside it is still diffed
    full = proj.envgit("diff", "1", "2", "--full", "--", "big.txt", check=True).stdout
    assert "-24999\n" in full and "+24999 x\n" in full and "too much" not in full
