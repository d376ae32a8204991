"""Two holes in the journal's head record an independent attacker found (issue 32, "a rewind
is always undoable").

A. One flipped character in `.envgit/journal.head` was taken as "the history up to entry N was
   rewritten": a false `lost … rewritten` entry that refused `rewind --undo` and every rewind
   for good, `fsck --repair` did not clear it, and the refusal named no way out. A damaged head
   is told apart from a rewritten history (the rows' chain is whole; only the record is wrong):
   no rewrite is claimed, and `--undo` works (after at most `fsck --repair`).
B. Rows deleted from the journal's tail while the daemon ran vanished without a trace: the
   next entry chained onto the row left and the head was rewritten to match. The daemon checks
   the tail is what it last wrote before every append and records the loss as a `lost` entry."""

import json
import shutil
import sqlite3
import subprocess
import time

import pytest

from faultlib import no_traceback, rows


def stopd(proj):
    """Stop the daemon and wait until nothing holds the journal open."""
    proj.stop()
    db = proj.root / ".envgit" / "journal.sqlite"
    for _ in range(100):
        if not shutil.which("fuser") or subprocess.run(["fuser", str(db)], capture_output=True).returncode != 0:
            return
        time.sleep(0.1)


def flip_head_hash(proj, legacy=False):
    """Change the first hex digit of the head record's hash (what disk rot or a slip of an
    editor does); `legacy`: also drop any checksum, as an older envgit wrote the record."""
    head = proj.root / ".envgit" / "journal.head"
    rec = json.loads(head.read_text())
    h = rec["hash"]
    rec["hash"] = ("0" if h[0] == "f" else "f") + h[1:]
    if legacy:
        rec = {k: rec[k] for k in ("seq", "hash", "step")}
    head.write_text(json.dumps(rec, sort_keys=True).ljust(159) + "\n")


def says_a_way_out(text):
    return "envgit fsck --repair" in text or ("envgit restore" in text and "--target" in text)


def undo_works(proj, precious):
    r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
    if r.returncode != 0:                       # refused: it must say how to get out
        assert says_a_way_out(r.stderr), r.stderr
        stopd(proj)
        fix = no_traceback(proj.envgit("fsck", "--repair"))
        r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
        assert r.returncode == 0, f"undo refused even after fsck --repair: {r.stderr}\n{fix.stdout}"
    assert (proj.root / "f").read_text() == precious


@pytest.mark.parametrize("legacy", [False, True], ids=["checksummed-head", "legacy-head"])
def test_a_flipped_head_is_no_rewritten_history(bare_proj, legacy):
    proj = bare_proj
    assert proj.run("echo v1 > f").returncode == 0
    assert proj.run("echo v2 > f").returncode == 0
    (proj.root / "f").write_text("PRECIOUS\n")
    assert proj.envgit("rewind", "1", "--yes").returncode == 0
    assert (proj.root / "f").read_text() == "v1\n"
    stopd(proj)
    flip_head_hash(proj, legacy)
    undo_works(proj, "PRECIOUS\n")
    lost = [json.loads(b) for _, _, k, b in rows(proj) if k == "lost"]
    assert not any(x.get("rewritten") for x in lost), lost     # no history was rewritten
    assert all("head" in x["reason"] for x in lost), lost       # what was damaged is named
    for n, want in ((2, "v2\n"), (3, "PRECIOUS\n")):     # rewinds to every step work again
        r = no_traceback(proj.envgit("rewind", str(n), "--yes"))
        assert r.returncode == 0, r.stderr
        assert (proj.root / "f").read_text() == want
    f = no_traceback(proj.envgit("fsck"))
    assert "rewritten" not in f.stdout and "are gone" not in f.stdout, f.stdout


def test_a_false_rewrite_already_recorded_is_cleared_by_repair(bare_proj):
    """A journal an older envgit left with a `lost … rewritten` entry about a head record that
    was only damaged (its hash one digit off the row's): fsck --repair clears it."""
    proj = bare_proj
    assert proj.run("echo v1 > f").returncode == 0
    assert proj.run("echo v2 > f").returncode == 0
    (proj.root / "f").write_text("PRECIOUS\n")
    assert proj.envgit("rewind", "1", "--yes").returncode == 0
    stopd(proj)
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2] / "src"))
    from envgit.journal import Journal
    j = Journal(str(proj.root / ".envgit" / "journal.sqlite"))
    last_seq, last_hash = j.db.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    bad = ("0" if last_hash[0] == "f" else "f") + last_hash[1:]
    j.append(0, "lost", {"entries": [1, last_seq], "last_step": j.floor, "head_hash": bad, "rewritten": True,
                         "reason": f"entry {last_seq} is not the one the journal had written there: the "
                                   "history up to it was rewritten or replaced"})
    j.close()
    undo_works(proj, "PRECIOUS\n")
    stopd(proj)
    f = no_traceback(proj.envgit("fsck"))
    assert "are gone" not in f.stdout and "not verify" not in f.stdout, f.stdout


@pytest.mark.parametrize("delete", ["step 2", "step 2's end"])
def test_rows_deleted_under_a_running_daemon_are_recorded_lost(bare_proj, delete):
    proj = bare_proj
    assert proj.run("echo v1 > f").returncode == 0
    assert proj.run("echo v2 > f; echo g > g").returncode == 0
    before = rows(proj)
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    if delete == "step 2":
        db.execute("DELETE FROM entries WHERE step = 2")
    else:
        db.execute("DELETE FROM entries WHERE seq = (SELECT MAX(seq) FROM entries)")
    db.commit()
    db.close()
    gone = sorted({s for s, *_ in before} - {s for s, *_ in rows(proj)})
    assert gone
    assert proj.run("echo v3 > f").returncode == 0              # the daemon is still the one running
    after = rows(proj)
    lost = [(s, json.loads(b)) for s, _, k, b in after if k == "lost"]
    assert len(lost) == 1, after
    seq, body = lost[0]
    assert body["entries"] == [gone[0], gone[-1]] and body["last_step"] >= 2, body
    assert seq == gone[0], "the loss is recorded where the rows went, before anything chains on"
    stopd(proj)
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and f"entries {gone[0]}–{gone[-1]} as they were are gone" in f.stdout, f.stdout
    ids = [s["id"] for s in json.loads(proj.envgit("log", "--json", check=True).stdout)]
    assert ids[-1] == 3 and 2 not in ids or delete != "step 2"
    assert [k for _, _, k, _ in rows(proj)].count("lost") == 1    # recorded once


def test_a_foreign_head_refusal_names_the_way_out(bare_proj, tmp_path):
    """A whole, well-formed head record naming another entry (a person copied another project's
    `.envgit/journal.head` over this one): it is taken as a rewritten history, which no repair
    can vouch for, so rewinds up to it refuse; the refusal names `envgit restore N --target DIR`,
    and that writes the step's snapshot."""
    import hashlib
    proj = bare_proj
    assert proj.run("echo v1 > f").returncode == 0
    assert proj.run("echo v2 > f").returncode == 0
    stopd(proj)
    head = proj.root / ".envgit" / "journal.head"
    rec = json.loads(head.read_text())
    h = hashlib.sha256(b"another project").hexdigest()
    rec.update(hash=h, sum=hashlib.sha256(f"{rec['seq']}:{h}:{rec['step']}".encode()).hexdigest()[:16])
    head.write_text(json.dumps(rec, sort_keys=True).ljust(159) + "\n")
    r = no_traceback(proj.envgit("rewind", "1", "--yes"))
    assert r.returncode != 0 and "envgit restore N --target DIR" in r.stderr, r.stderr
    assert (proj.root / "f").read_text() == "v2\n"
    r = no_traceback(proj.envgit("restore", "1", "--target", str(tmp_path / "out")))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "f").read_text() == "v1\n"
