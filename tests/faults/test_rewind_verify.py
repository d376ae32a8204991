"""Rewind verifies the journal's hash chain up to its target before it writes anything.

The fault this reproduces (issue 11, item 2): a journal row edited to name another step's
(valid) tree made `envgit rewind` write that other tree; fsck named the row, rewind did not
look. Also a history edited with its hashes recomputed: the head record outside SQLite still
names the old last hash, so the rewrite is seen (unless the head is rewritten too: THREATS.md)."""

import json
import sqlite3

from faultlib import assert_rewinds_exactly, no_traceback, rows, three_steps, tree_of


def end_row(proj, step):
    return next((seq, body) for seq, s, kind, body in rows(proj) if s == step and kind == "end")


def set_body(proj, seq, body, rehash_from=None):
    """Change entry `seq`'s body; with rehash_from, recompute the chain from there on as a
    forger who read FORMAT.md would."""
    from envgit.journal import entry_hash
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    db.execute("UPDATE entries SET body = ? WHERE seq = ?", (body, seq))
    if rehash_from is not None:
        prev = db.execute("SELECT hash FROM entries WHERE seq = ?", (rehash_from - 1,)).fetchone()[0]
        for s, step, kind, at, text, _ in db.execute(
                "SELECT seq, step, kind, at_ns, body, prev FROM entries WHERE seq >= ? ORDER BY seq",
                (rehash_from,)).fetchall():
            h = entry_hash(s, step, kind, at, text, prev)
            db.execute("UPDATE entries SET prev = ?, hash = ? WHERE seq = ?", (prev, h, s))
            prev = h
    db.commit()
    db.close()


def test_an_edited_row_is_not_trusted_by_rewind(bare_proj):
    proj = bare_proj
    after = three_steps(proj)
    seq2, body2 = end_row(proj, 2)
    _, body1 = end_row(proj, 1)
    tree1 = json.loads(body1)["snapshot"]["tree"]
    edited = json.loads(body2)
    edited["snapshot"]["tree"] = tree1                   # step 2 now claims step 1's tree
    set_body(proj, seq2, json.dumps(edited, sort_keys=True, separators=(",", ":")))
    (proj.root / "a").write_text("work in progress\n")
    before = tree_of(proj.root)
    for target in (2, 3):                                # 3: the chain up to it holds the edit
        r = no_traceback(proj.envgit("rewind", str(target), "--yes"))
        assert r.returncode != 0 and "does not verify" in r.stderr and "nothing was changed" in r.stderr
        assert f"entry {seq2}" in r.stderr
        assert tree_of(proj.root) == before              # not one byte written
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and f"entry {seq2}" in f.stdout and "changed" in f.stdout
    # Step 1 is before the edit and verifies, but this test used to expect its rewind to go
    # ahead: its undo point is recorded after the edited row, so `rewind --undo` was refused
    # once the work in progress was out of the directory (issue 32, case 3). Now refused before
    # anything is written, with the way out.
    r = no_traceback(proj.envgit("rewind", "1", "--yes"))
    assert r.returncode != 0 and "fsck --repair" in r.stderr and tree_of(proj.root) == before
    # fsck --repair sets the edited row aside: the edit is never trusted (step 2 refused, named),
    # step 1 rewinds, and --undo gives back the work in progress.
    proj.stop()
    assert "re-sealed" in no_traceback(proj.envgit("fsck", "--repair")).stdout
    r = no_traceback(proj.envgit("rewind", "2", "--yes"))
    assert r.returncode != 0 and "step 2" in r.stderr and "set aside" in r.stderr
    assert tree_of(proj.root) == before
    assert_rewinds_exactly(proj, {1: after[1]})
    assert no_traceback(proj.envgit("rewind", "--undo", "--yes")).returncode == 0
    assert tree_of(proj.root) == before
    assert proj.run("echo 5 > a").returncode == 0        # the project goes on


def test_a_recomputed_history_is_seen_by_the_head_record(bare_proj):
    proj = bare_proj
    three_steps(proj)
    seq2, body2 = end_row(proj, 2)
    _, body1 = end_row(proj, 1)
    edited = json.loads(body2)
    edited["snapshot"]["tree"] = json.loads(body1)["snapshot"]["tree"]
    set_body(proj, seq2, json.dumps(edited, sort_keys=True, separators=(",", ":")), rehash_from=seq2)
    f = no_traceback(proj.envgit("fsck"))                # the chain itself verifies now…
    assert f.returncode == 1 and "rewritten" in f.stdout, f.stdout   # …but not against the head
    before = tree_of(proj.root)
    r = no_traceback(proj.envgit("rewind", "2", "--yes"))
    assert r.returncode != 0 and "rewritten" in r.stderr and tree_of(proj.root) == before
    # recorded once (a `lost` entry saying the history was rewritten), and still refused after
    assert [k for _, _, k, _ in rows(proj)].count("lost") == 1
    r = no_traceback(proj.envgit("rewind", "2", "--yes"))
    assert r.returncode != 0 and "rewritten" in r.stderr and tree_of(proj.root) == before
    # steps after it are trusted again: the project is not wedged
    assert proj.run("echo 4 > a").returncode == 0
    after4 = tree_of(proj.root)
    assert proj.run("echo 5 > a").returncode == 0
    assert_rewinds_exactly(proj, {4: after4})


def test_an_interrupted_rewind_with_an_edited_target_is_not_finished(bare_proj):
    """The daemon finishes a rewind it finds open only if the chain verifies up to it: the
    begin row of a killed rewind, edited to name another tree, is closed as not finished, and
    nothing is written."""
    proj = bare_proj
    after = three_steps(proj)
    r = no_traceback(proj.envgit("rewind", "2", "--yes", env={"ENVGIT_FAULT": "rewind-begun"}))
    assert r.returncode == 3                                  # killed after its begin entry
    seq, body = next((s, b) for s, st, k, b in rows(proj) if st == 4 and k == "begin")
    edited = json.loads(body)
    _, body1 = end_row(proj, 1)
    edited["rewind"]["target_tree"] = json.loads(body1)["snapshot"]["tree"]
    set_body(proj, seq, json.dumps(edited, sort_keys=True, separators=(",", ":")))
    before = tree_of(proj.root)
    assert before == after[3]
    steps = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
    assert steps[3]["status"] == "done" and "not-finished" in steps[3]["marks"]
    assert tree_of(proj.root) == before                       # not one byte written
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and f"entry {seq}" in f.stdout
