"""One bad journal row does not brick the project: rows are checked on the way in (an event
body of the wrong type is refused with an error, the daemon serves on) and read defensively on
the way out (log, show and the daemon skip what does not fit; fsck names the row).

The fault this reproduces (issue 11, item 5): a row whose body was not a JSON object made
log, show and fsck crash with tracebacks and the daemon unable to start."""

import json
import sqlite3

import pytest

from envgit.daemon.client import connect
from envgit.paths import Project
from faultlib import assert_rewinds_exactly, no_traceback, rows, tree_of


def edit(proj, seq, body):
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    db.execute("UPDATE entries SET body = ? WHERE seq = ?", (body, seq))
    db.commit()
    db.close()


@pytest.mark.parametrize("bad", ["[1, 2]", "not json", '{"argv": 5, "cwd": ["x"]}', '"text"',
                                 '{"exit_code": "zero", "snapshot": {"tree": 7}, "marks": "m"}',
                                 '{"exit_code": 0, "snapshot": {"tree": "' + "a" * 64 + '", "added": 1, '
                                 '"modified": 0, "deleted": 0, "ms": 1, "paths": [1], "left_out": {"count": "x"}}}'])
def test_a_bad_row_is_named_and_the_rest_stays_usable(bare_proj, bad):
    proj = bare_proj
    after = {}
    for n in (1, 2, 3):
        assert proj.run(f"echo {n} > a").returncode == 0
        after[n] = tree_of(proj.root)
    proj.stop()
    kind = "begin" if "argv" in bad else "end"
    seq = next(s for s, step, k, _ in rows(proj) if step == 2 and k == kind)
    edit(proj, seq, bad)
    for args in (("log",), ("log", "--json"), ("show", "2"), ("show", "2", "--json"), ("show", "1")):
        r = no_traceback(proj.envgit(*args))
        assert r.returncode == 0, (args, r.stderr)
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and f"entry {seq}" in f.stdout
    r = no_traceback(proj.run("echo 4 > a"))              # the daemon starts and serves
    assert r.returncode == 0
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert steps[-1]["id"] == 4 and steps[-1]["status"] == "done"
    # Step 1 is before the bad row, but a rewind to it is recorded after it and could not be
    # undone: refused until the repair (this test used to expect it to go ahead; issue 32, case 3).
    r = no_traceback(proj.envgit("rewind", "1", "--yes"))
    assert r.returncode != 0 and "could not be undone" in r.stderr and "fsck --repair" in r.stderr
    r = no_traceback(proj.envgit("rewind", "3", "--yes"))  # after it: the chain does not verify
    assert r.returncode != 0 and "does not verify" in r.stderr
    proj.stop()                                            # the bad row set aside: both sides trusted
    assert "re-sealed" in no_traceback(proj.envgit("fsck", "--repair")).stdout
    assert_rewinds_exactly(proj, {1: after[1], 3: after[3]})


def test_events_of_the_wrong_type_are_refused_on_the_way_in(bare_proj):
    proj = bare_proj
    conn = connect(Project(str(proj.root)))
    begin = conn.request({"op": "begin", "argv": ["recorded"], "cwd": str(proj.root), "record_only": True})
    step = begin["step"]
    for body in ([1, 2], "text", 7, {"blob": b"\x00bytes"}, {"nan": float("nan")}):
        r = conn.request({"op": "event", "step": step, "kind": "note", "body": body})
        assert "error" in r, body
    ok = conn.request({"op": "event", "step": step, "kind": "note", "body": {"ok": 1}})
    assert ok == {"ok": True, "rid": conn._rid}
    r = conn.request({"op": "end", "step": step, "exit_code": "zero", "signal": 9, "duration_ms": "x",
                      "extra": {"k": b"not json"}})
    assert r.get("ok"), r
    conn.close()
    s = json.loads(proj.envgit("show", str(step), "--json", check=True).stdout)
    assert s["status"] == "done" and s["exit_code"] is None and s["signal"] is None and s["extra"] == {}
    assert [e for e in s["events"]] == [{"kind": "note", "ok": 1}]
    assert no_traceback(proj.envgit("fsck")).returncode == 0
