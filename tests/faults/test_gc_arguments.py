"""Nonsense retention is refused, by the CLI and by the daemon: nothing dropped.

The fault this reproduces (issue 11, item 12): `gc --keep-last -2` was accepted and dropped
snapshots (a negative slice kept all but the last two)."""

from envgit.daemon.client import connect
from envgit.paths import Project
from faultlib import dropped, no_traceback


def test_nonsense_retention_is_refused(bare_proj):
    proj = bare_proj
    for n in range(4):
        assert proj.run(f"echo {n} > a").returncode == 0
    for args in (["--keep-last", "-2"], ["--keep-last=-2"], ["--keep-last", "0"], ["--keep-last", "x"],
                 ["--keep-within", "0d"], ["--keep-within", "-1d"], ["--keep-within", "7"]):
        r = no_traceback(proj.envgit("gc", *args))
        assert r.returncode == 2 and "envgit" in r.stderr, (args, r.stderr)
    conn = connect(Project(str(proj.root)))
    for msg in ({"keep_last": -2}, {"keep_last": 0}, {"keep_last": True}, {"keep_last": 1.5},
                {"keep_within_s": -5}, {"keep_within_s": 0}, {"keep_within_s": "7d"},
                {"keep_within_s": float("inf")}):
        r = conn.request({"op": "gc", **msg})
        assert r.get("exit") == 2 and "error" in r, (msg, r)
    conn.close()
    assert dropped(proj) == set()
    r = no_traceback(proj.envgit("gc", "--keep-last", "2"))
    assert r.returncode == 0 and dropped(proj) == {1, 2}
