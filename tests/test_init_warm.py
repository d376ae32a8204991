"""`envgit init` of a large project begins its first snapshot's reading in the session daemon
and returns; the baseline is still what the directory is when step 1 begins (edits made
between init and step 1 are in it, and are nobody's step)."""

import json
import os
import subprocess
import time

from conftest import Env, make_home
from envgit.commands.setup import WARM_AT


def _tree(root, n):
    for i in range(n):
        d = root / f"d{i // 500}"
        if i % 500 == 0:
            d.mkdir()
        (d / f"f{i}.txt").write_text(f"file {i}\n")


def _env(tmp_path, n):
    home = make_home(tmp_path)
    root = home / "big"
    root.mkdir()
    _tree(root, n)
    return Env(home, root)


def _daemon_running(env) -> bool:
    out = subprocess.run(["pgrep", "-f", f"envgit.daemon {env.root}"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def test_a_large_project_is_read_at_init_and_its_baseline_is_still_taken_at_step_1(tmp_path):
    env = _env(tmp_path, WARM_AT + 100)
    try:
        r = env.envgit("init", "--json", check=True)
        assert json.loads(r.stdout)["warming"] is True
        assert _daemon_running(env)             # init started it, and did not wait for the reading
        packs = env.root / ".envgit" / "objects" / "packs"
        deadline = time.monotonic() + 120
        while not list(packs.rglob("*.idx")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(packs.rglob("*.idx")), "no step yet, and the files were not read and stored"
        # edits between init and step 1: the baseline is the directory as step 1 begins
        (env.root / "d0" / "f1.txt").write_text("edited after init\n")
        (env.root / "after-init.txt").write_text("new after init\n")
        os.unlink(env.root / "d0" / "f2.txt")
        r = env.run("cat d0/f1.txt > copy.txt; rm after-init.txt")
        assert r.returncode == 0, r.stderr
        steps = json.loads(env.envgit("log", "--json", check=True).stdout)
        assert [s["argv"][0] for s in steps] == ["sh"]      # no step for what init's read missed
        one = json.loads(env.envgit("show", "1", "--json", check=True).stdout)
        changes = {c["path"]: c["status"] for c in one["snapshot"]["paths"]}
        assert changes == {"copy.txt": "added", "after-init.txt": "deleted"}, one["snapshot"]
        assert (env.root / "copy.txt").read_text() == "edited after init\n"
        # rewinding to step 1 and diffing against it reads the trees the baseline wrote
        r = env.envgit("rewind", "1", "--yes")
        assert r.returncode == 0, r.stderr
        assert not (env.root / "d0" / "f2.txt").exists()
        assert (env.root / "d0" / "f3.txt").read_text() == "file 3\n"
        assert env.envgit("fsck").returncode == 0
    finally:
        env.stop()


def test_a_small_project_starts_nothing_at_init(tmp_path):
    env = _env(tmp_path, 50)
    try:
        r = env.envgit("init", "--json", check=True)
        assert json.loads(r.stdout)["warming"] is False
        assert not _daemon_running(env)
        r = env.envgit("init", "--force", check=True)
        assert "background" not in r.stdout
    finally:
        env.stop()
