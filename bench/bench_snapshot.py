"""Snapshot store benchmark: envgit's figures beside git's and a plain lstat walk, one run.

    .venv/bin/python bench/bench_snapshot.py [--quick]

Builds its trees in a temp dir: 1k / 10k / 100k small files in nested folders, a clone of this
repository with its .git, and a node_modules-like tree with one 40k-entry folder. For each:
first snapshot, no change, 1 file changed, 100 files changed, a new 100 MB file, restore of 1
and of 100 files. Anchors: `git add -A && git write-tree` with a separate GIT_DIR (git itself
never adds a directory named .git, so for the clone git does less work than envgit),
`git read-tree -u --reset` for restores, and an lstat walk (os.scandir + lstat, in Python like
envgit). Medians of several runs (--quick: 1k/10k only, 3 runs).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from envgit.snapshot import ChangeWatcher, Filter, StatCache, Store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com", "GIT_CONFIG_NOSYSTEM": "1"}


# -- trees ------------------------------------------------------------------------------------
def small_files(root: Path, n: int) -> None:
    """n files of ~100 bytes, 20 per folder, folders nested two deep."""
    for i in range(n):
        d = root / f"d{i // 2000}" / f"s{(i // 20) % 100}"
        if i % 20 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"file {i} " + "x" * 90)


def source_tree(root: Path) -> None:
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(root)], check=True)


def node_modules(root: Path) -> None:
    big = root / "node_modules" / ".pnpm"
    big.mkdir(parents=True)
    for i in range(40_000):
        (big / f"entry{i}.js").write_text(f"module.exports = {i};\n")
    for p in range(300):
        pkg = root / "node_modules" / f"pkg{p}" / "lib"
        pkg.mkdir(parents=True)
        for j in range(10):
            (pkg / f"m{j}.js").write_text(f"export const v = {p * 10 + j};\n")


def files_of(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        out += [Path(dirpath) / f for f in filenames]
    out.sort()
    return out


def lstat_walk(root) -> int:
    n, stack = 0, [os.fsencode(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                e.stat(follow_symlinks=False)       # the lstat is what is measured
                n += 1
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return n


# -- measuring ------------------------------------------------------------------------------
def ms(fn, setup=None, repeat=5) -> float:
    times = []
    for _ in range(repeat):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


class Git:
    def __init__(self, work: Path, git_dir: Path):
        self.work, self.git_dir = work, git_dir
        self.env = {**os.environ, **GIT_ENV, "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(work)}

    def init(self):
        shutil.rmtree(self.git_dir, ignore_errors=True)
        subprocess.run(["git", "init", "-q", "--bare", str(self.git_dir)], check=True,
                       env={**os.environ, **GIT_ENV})

    def run(self, *args) -> str:
        return subprocess.run(["git", *args], check=True, env=self.env, cwd=self.work,
                              capture_output=True, text=True).stdout.strip()

    def write_tree(self) -> str:
        self.run("add", "-A")
        return self.run("write-tree")


def touch_files(paths: list[Path], tag: str) -> None:
    for p in paths:
        with open(p, "r+b") as f:
            f.write(tag.encode()[:8].ljust(8, b"-"))


class Bench:
    def __init__(self, tmp: Path, repeat: int):
        self.tmp, self.repeat, self.rows = tmp, repeat, []

    def row(self, tree, what, envgit_ms, anchor_name, anchor_ms, goal=None):
        ratio = envgit_ms / anchor_ms if anchor_ms else float("nan")
        verdict = ""
        if goal is not None:
            kind, limit = goal
            ok = envgit_ms <= limit if kind == "ms" else ratio <= limit
            verdict = ("MET " if ok else "MISSED ") + (f"<= {limit} ms" if kind == "ms" else f"<= {limit}x")
        self.rows.append((tree, what, envgit_ms, anchor_name, anchor_ms, ratio, verdict))
        print(f"{tree:<12} {what:<28} {envgit_ms:>10.1f} {anchor_name:<24} {anchor_ms:>10.1f} {ratio:>7.2f}  {verdict}",
              flush=True)

    def tree(self, name: str, build, big: bool) -> None:
        work = self.tmp / name
        work.mkdir()
        build(work)
        files = files_of(work)
        flt = Filter()
        rep = max(3, self.repeat // 2) if big else self.repeat
        store_dir = self.tmp / f"{name}-store"
        git = Git(work, self.tmp / f"{name}-git")

        # First snapshot: a fresh store and cache each run; git: a fresh GIT_DIR each run.
        def fresh_store():
            shutil.rmtree(store_dir, ignore_errors=True)
        first = ms(lambda: Store(store_dir).snapshot(work, flt, StatCache()), fresh_store, rep)
        git_first = ms(git.write_tree, git.init, rep)
        self.row(name, "first snapshot", first, "git add+write-tree", git_first, ("x", 0.5))

        store = Store(store_dir)
        cache = StatCache(self.tmp / f"{name}-cache")
        old = os.stat(work).st_mtime_ns - 10**10     # age the files: none is racy
        for p in files:
            os.utime(p, ns=(old, old))
        store.snapshot(work, flt, cache)
        store.snapshot(work, flt, cache)
        git.write_tree()
        walk = ms(lambda: lstat_walk(work), repeat=self.repeat)
        nochange = ms(lambda: store.snapshot(work, flt, cache), repeat=self.repeat)
        self.row(name, "no change (walk)", nochange, "lstat walk", walk, ("x", 1.5))
        self.row(name, "no change (walk)", nochange, "git add+write-tree", ms(git.write_tree, repeat=rep))
        t = time.perf_counter()
        cache.changed = True
        cache.save()
        save_ms = (time.perf_counter() - t) * 1000
        load_ms = ms(lambda: StatCache(self.tmp / f"{name}-cache"), repeat=3)
        self.row(name, "stat cache load / save", load_ms, "save", save_ms)

        cache.autosave = False          # the daemon's way: the cache stays in memory
        watcher = ChangeWatcher(work, flt)
        store.snapshot(work, flt, cache, watcher=watcher)
        store.snapshot(work, flt, cache, watcher=watcher)
        self.row(name, "no change (watcher)", ms(lambda: store.snapshot(work, flt, cache, watcher=watcher)),
                 "lstat walk", walk)

        counter = iter(range(10**6))
        pick1 = [files[len(files) // 2]]
        pick100 = files[:: max(1, len(files) // 100)][:100]

        def change(paths):
            return lambda: touch_files(paths, f"c{next(counter)}")
        one_w = ms(lambda: store.snapshot(work, flt, cache, watcher=watcher), change(pick1), self.repeat)
        one_nw = ms(lambda: store.snapshot(work, flt, cache), change(pick1), self.repeat)
        git_one = ms(git.write_tree, change(pick1), rep)
        self.row(name, "1 file changed (watcher)", one_w, "git add+write-tree", git_one,
                 ("ms", 10) if name == "100k" else None)
        self.row(name, "1 file changed (walk)", one_nw, "git add+write-tree", git_one)
        hundred = ms(lambda: store.snapshot(work, flt, cache, watcher=watcher), change(pick100), self.repeat)
        git_hundred = ms(git.write_tree, change(pick100), rep)
        self.row(name, "100 files changed (watcher)", hundred, "git add+write-tree", git_hundred)

        big_file = work / "new-100MB.bin"

        def new_big():
            if big_file.exists():
                big_file.unlink()
            with open(big_file, "wb") as f:
                f.write(os.urandom(100 << 20))
            os.sync()      # not timed: the write-back of the new file is not the snapshot's cost
        env_big = ms(lambda: store.snapshot(work, flt, cache, watcher=watcher), new_big, 3)
        git_big = ms(git.write_tree, new_big, 3)
        self.row(name, "new 100 MB file (watcher)", env_big, "git add+write-tree", git_big, ("x", 0.3))
        big_file.unlink()

        base = store.snapshot(work, flt, cache, watcher=watcher).tree_id
        git_base = git.write_tree()
        for label, picked, goal in (("restore 1 file", pick1, ("ms", 50) if name == "100k" else None),
                                    ("restore 100 files", pick100, None)):
            def envgit_restore():
                store.restore(work, store.plan_restore(work, base, flt, cache=cache, watcher=watcher))
            env_ms = ms(envgit_restore, change(picked), self.repeat)
            git_ms = ms(lambda: git.run("read-tree", "-u", "--reset", git_base), change(picked), rep)
            self.row(name, label + " (watcher)", env_ms, "git read-tree -u --reset", git_ms, goal)
        watcher.close()
        store.close()
        shutil.rmtree(work)
        shutil.rmtree(store_dir)
        shutil.rmtree(git.git_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1k and 10k trees only, 3 runs each")
    ap.add_argument("--trees", help="comma-separated subset of: 1k,10k,100k,source+.git,node_modules")
    args = ap.parse_args()
    trees = [("1k", lambda r: small_files(r, 1000), False), ("10k", lambda r: small_files(r, 10_000), False)]
    if not args.quick:
        trees += [("100k", lambda r: small_files(r, 100_000), True), ("source+.git", source_tree, False),
                  ("node_modules", node_modules, True)]
    if args.trees:
        every = trees if not args.quick else trees + [
            ("100k", lambda r: small_files(r, 100_000), True), ("source+.git", source_tree, False),
            ("node_modules", node_modules, True)]
        wanted = args.trees.split(",")
        trees = [t for t in every if t[0] in wanted]
    with tempfile.TemporaryDirectory(prefix="envgit-bench-", dir=os.environ.get("BENCH_TMP")) as tmp:
        bench = Bench(Path(tmp), 3 if args.quick else 5)
        print(f"{'tree':<12} {'measurement':<28} {'envgit ms':>10} {'anchor':<24} {'anchor ms':>10} {'ratio':>7}  goal")
        for name, build, big in trees:
            bench.tree(name, build, big)
        print("\nmedians; ratio = envgit / anchor; git never adds a nested .git, so on source+.git it does less work")
        missed = [r for r in bench.rows if r[6].startswith("MISSED")]
        print(f"goals: {sum(1 for r in bench.rows if r[6].startswith('MET'))} met, {len(missed)} missed")


if __name__ == "__main__":
    main()
