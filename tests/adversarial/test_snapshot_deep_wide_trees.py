"""Red team 12: a step shapes the project so that envgit can no longer snapshot it, restore it
or rewind it: the promise "a snapshot of the project is taken after it" and `envgit rewind`
are what a person relies on to undo a step.

1. Depth: the snapshotter walks directories recursively (RecursionError past ~1000 levels).
   A step that leaves a directory 1500 levels deep makes its own snapshot fail, AND every
   later step's (the tree is still there), AND `envgit rewind` (it records the directory
   first): what it or a later step overwrites is not recorded and cannot be rewound.
2. Breadth: restore and rewind keep one open fd per directory of the snapshot (restore.py
   _Dirs) until the end; under the common soft limit of 1024 open files a snapshot with more
   than ~1000 directories (any node_modules) cannot be restored or rewound (EMFILE halfway).
Oracles: a marker file's content after rewind, the journal's snapshot of a step.
"""

import json

from conftest import CANARY, ENVGIT

DEEP = r'''
import os
os.mkdir("deep"); os.chdir("deep")
for i in range(1500):
    os.mkdir("d"); os.chdir("d")
'''

WIDE = r'''
import os
for i in range(1500):
    os.makedirs("wide/d%d" % i)
'''


def _snapshot(attacker, ref="last"):
    s = json.loads(attacker.envgit("show", ref, "--json").stdout)
    return s.get("snapshot") or {}, s.get("marks") or []


def _py(attacker, name, text):
    p = attacker.root / name
    p.write_text(text)
    attacker.own(p)
    return name


def test_a_deep_tree_does_not_stop_the_next_steps_snapshot(attacker):
    r = attacker.envgit("run", "--", "python3", _py(attacker, "deep.py", DEEP), timeout=120)
    assert r.returncode == 0, r.stderr
    r = attacker.run("echo changed > later.txt")
    assert r.returncode == 0, r.stderr
    snap, marks = _snapshot(attacker)
    assert "snapshot-failed" not in marks and snap.get("tree"), (marks, snap, r.stderr)


def test_a_deep_tree_does_not_stop_rewind_giving_back_a_persons_file(attacker):
    (attacker.root / "precious.txt").write_text("the person's work\n")
    attacker.own(attacker.root / "precious.txt")
    assert attacker.run("true").returncode == 0          # recorded: precious.txt as it is
    r = attacker.envgit("run", "--", "python3", _py(attacker, "deep.py", DEEP), timeout=120)
    assert r.returncode == 0, r.stderr
    assert attacker.run(f"echo {CANARY} > precious.txt").returncode == 0
    r = attacker.envgit("rewind", "last~2", "--yes", timeout=300)
    assert (attacker.root / "precious.txt").read_text() == "the person's work\n", (r.returncode, r.stdout,
                                                                                  r.stderr)


def _limited(attacker, args, timeout=300):
    """envgit under the soft limit most login shells have (1024 open files), its daemon too."""
    return attacker.host(f"ulimit -n 1024 && exec {ENVGIT} {args}", timeout=timeout)


def test_rewind_of_a_project_with_many_directories_under_the_default_fd_limit(attacker):
    attacker.stop()
    (attacker.root / "precious.txt").write_text("the person's work\n")
    attacker.own(attacker.root / "precious.txt")
    r = _limited(attacker, "run -- python3 " + _py(attacker, "wide.py", WIDE))
    assert r.returncode == 0, r.stderr
    assert _limited(attacker, f"run -- sh -c 'rm -rf wide; echo {CANARY} > precious.txt'").returncode == 0
    r = _limited(attacker, "rewind last~1 --yes")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert (attacker.root / "precious.txt").read_text() == "the person's work\n"
    assert len(list((attacker.root / "wide").iterdir())) == 1500


def test_restore_target_of_many_directories_under_the_default_fd_limit(attacker):
    r = attacker.envgit("run", "--", "python3", _py(attacker, "wide.py", WIDE), timeout=120)
    assert r.returncode == 0, r.stderr
    target = attacker.home / "restored"             # outside the project, the person's own
    r = _limited(attacker, f"restore last --target {target}")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert len(list((target / "wide").iterdir())) == 1500


def test_a_steps_write_is_not_blamed_on_the_next_step_after_its_snapshot_failed(attacker):
    """The step writes evil.txt beside its deep tree: its snapshot fails; the person removes the
    tree (as envgit's message invites), and the next step, `true`, is recorded as having added
    evil.txt: the write is hidden from the step that made it."""
    assert attacker.run("true").returncode == 0
    r = attacker.envgit("run", "--", "python3", _py(attacker, "deep.py",
                        'open("evil.txt", "w").write("planted\\n")\n' + DEEP), timeout=120)
    assert r.returncode == 0, r.stderr
    attacker.host("rm -rf deep")
    assert attacker.run("true").returncode == 0
    innocent, _ = _snapshot(attacker)
    assert not any(p.get("path") == "evil.txt" for p in innocent.get("paths") or []), innocent
