"""A journal that lost its tail (the daemon killed, then its journal.sqlite-wal deleted or
truncated) says so: the loss is recorded as a `lost` entry and named by fsck, steps whose end
was lost are not called "died", step ids go on past the lost ones, and rewinds still write
exactly their trees.

The fault this reproduces (issue 11, item 3): all six steps of a session vanished with the
WAL, the repair labelled a finished step "envgit run died", a new step reused id 1, and fsck
passed."""

import json
import os
import signal

import pytest

from faultlib import assert_rewinds_exactly, no_traceback, rows, tree_of


def kill_daemon(proj):
    st = json.loads(proj.envgit("daemon", "status", check=True).stdout)
    os.kill(st["pid"], signal.SIGKILL)


def cut_after_a_begin(proj):
    """The journal as a lost tail leaves it when the cut falls inside a step: step 4's begin
    kept, its end and everything after gone (what a WAL truncated at that frame leaves)."""
    import sqlite3
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    (seq,) = db.execute("SELECT seq FROM entries WHERE step = 4 AND kind = 'begin'").fetchone()
    db.execute("DELETE FROM entries WHERE seq > ?", (seq,))
    db.commit()
    db.close()


@pytest.mark.parametrize("damage", ["delete", "truncate", "cut-after-a-begin"])
def test_a_lost_wal_tail_is_said_and_ids_are_not_reused(bare_proj, damage):
    proj = bare_proj
    for n in range(1, 7):
        assert proj.run(f"echo {n} > f{n}").returncode == 0
    kill_daemon(proj)
    state = proj.root / ".envgit"
    wal = state / "journal.sqlite-wal"
    assert wal.exists() and wal.stat().st_size > 0       # the entries live in the WAL
    if damage == "delete":
        wal.unlink()
        (state / "journal.sqlite-shm").unlink(missing_ok=True)
    elif damage == "truncate":
        os.truncate(wal, wal.stat().st_size // 2)
    else:
        proj.stop()
        cut_after_a_begin(proj)
    log = no_traceback(proj.envgit("log", "--json"))
    assert log.returncode == 0
    kept = json.loads(log.stdout)
    assert len(kept) < 6                                  # the fault happened
    lost = [json.loads(b) for _, s, k, b in rows(proj) if k == "lost"]
    assert len(lost) == 1 and lost[0]["last_step"] == 6
    for s in kept:                                        # no finished step is said to have died
        if s["status"] == "interrupted":
            assert "envgit run died" not in json.dumps(s)
    if damage == "cut-after-a-begin":
        assert [s["id"] for s in kept] == [1, 2, 3, 4] and kept[3]["status"] == "interrupted"
        reason = [json.loads(b) for _, st, k, b in rows(proj) if st == 4 and k == "interrupted"][0]["reason"]
        assert "lost" in reason and "not known" in reason
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and "lost" in f.stdout and "tail" in f.stdout
    assert proj.run("echo 7 > f7").returncode == 0
    ids = [s["id"] for s in json.loads(proj.envgit("log", "--json", check=True).stdout)]
    assert ids[-1] == 7 and len(ids) == len(set(ids))     # 7, never a reused 1
    after7 = tree_of(proj.root)
    assert proj.run("rm f7 f1").returncode == 0
    assert_rewinds_exactly(proj, {7: after7})
    # the loss is recorded once, not again by every command
    proj.stop()
    no_traceback(proj.envgit("log"))
    assert [k for _, _, k, _ in rows(proj)].count("lost") == 1
