"""Red team 12: git's view of a snapshot (snapshot/gitview.py) is bounded in repositories (100)
and in walking time (20 s per call), but not in the time spent reading indexes: each
repository's `index` up to MAX_INDEX (256 MiB) is parsed on both sides. A step that leaves 40
nested repositories, each with a 200 000-entry index (16 MB, deduplicated in the store: one
copy), changed between two steps, makes:
- `envgit diff A B` take minutes (about 7 s a repository here; 100 repositories of 256 MiB
  indexes: hours),
- `envgit rewind A`, whose plan the daemon summarises with the same reader
  (daemon/rewind.py git_summary), take as long: the person's undo stalls.
Oracle: the commands finish within a bound, and the rewind gives back the person's file.
"""

import subprocess

from conftest import CANARY

REPOS = 20          # 20 × 16 MB × 2 sides = 640 MB: past the view's 512 MiB budget, and
                    # (at about 7 s a repository unbounded) past the 90 s bound too


def _indexes(where):
    """Two git indexes of 200 000 entries that differ by one path."""
    gen = where / "gen"
    subprocess.run(["git", "init", "-q", str(gen)], check=True)
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=gen, input=b"x",
                          capture_output=True, check=True).stdout.strip().decode()
    lines = "".join(f"100644 {blob}\tdir{i // 1000}/file{i}\n" for i in range(200_000))
    subprocess.run(["git", "update-index", "--index-info"], cwd=gen, input=lines.encode(), check=True)
    (where / "I1").write_bytes((gen / ".git" / "index").read_bytes())
    subprocess.run(["git", "update-index", "--index-info"], cwd=gen, check=True,
                   input=f"100644 {blob}\textra\n".encode())
    (where / "I2").write_bytes((gen / ".git" / "index").read_bytes())


def _plant(attacker):
    _indexes(attacker.root)
    attacker.own(attacker.root / "I1", attacker.root / "I2")
    r = attacker.run(f"for i in $(seq 1 {REPOS}); do mkdir -p r$i/.git/objects r$i/.git/refs/heads; "
                     "echo 'ref: refs/heads/main' > r$i/.git/HEAD; cp I1 r$i/.git/index; done", timeout=300)
    assert r.returncode == 0, r.stderr


def _bounded(attacker, *args, limit):
    try:
        return attacker.envgit(*args, timeout=limit)
    except subprocess.TimeoutExpired:
        return None


def test_diff_of_many_large_indexes_finishes_in_bounded_time(attacker):
    _plant(attacker)
    assert attacker.run(f"for i in $(seq 1 {REPOS}); do cp I2 r$i/.git/index; done", timeout=300).returncode == 0
    r = _bounded(attacker, "diff", "last~1", "last", limit=90)
    assert r is not None, "envgit diff did not finish in 90 s"
    assert r.returncode == 0, r.stderr


def test_rewind_past_many_large_indexes_finishes_and_gives_back_the_file(attacker):
    (attacker.root / "precious.txt").write_text("the person's work\n")
    attacker.own(attacker.root / "precious.txt")
    _plant(attacker)                                   # this step's snapshot holds precious.txt
    r = attacker.run(f"for i in $(seq 1 {REPOS}); do cp I2 r$i/.git/index; done; echo {CANARY} > precious.txt",
                     timeout=300)
    assert r.returncode == 0, r.stderr
    r = _bounded(attacker, "rewind", "last~1", "--yes", limit=120)
    assert r is not None, "envgit rewind did not finish in 120 s"
    assert (attacker.root / "precious.txt").read_text() == "the person's work\n", (r.stdout, r.stderr)
