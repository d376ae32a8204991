"""A rewind is always undoable, and `envgit fsck --repair` re-seals a damaged journal (issue 32,
case 3).

The fault this reproduces (found by fault injection, 14 of 16 trials): one journal row damaged
(its hash, the row deleted, its step number, a body that is not JSON), then `envgit rewind 1`
went ahead; `envgit rewind --undo` and every rewind to a later step were then refused ("the
journal does not verify up to …"), even after `envgit fsck --repair`, and the latest work was
out of the directory with only a manual `restore --target` to bring it back.

Now: a rewind whose own undo point would not verify is refused before it changes anything,
saying the way out (`fsck --repair`, or `restore N --target DIR`); `fsck --repair` sets the
damaged rows aside (the `set_aside` table, byte for byte) and appends a `reseal` entry that
re-joins the chain (docs/FORMAT.md, "Re-sealing"), after which rewinds past the damage work
again and the damaged step is named by fsck and by a rewind to or across it. The oracle is the
working tree's bytes against what each step wrote, and the exit codes."""

import json
import sqlite3

import pytest

from faultlib import no_traceback, rows, three_steps, tree_of

KINDS = ["hash", "deleted", "step", "not-json"]


def all_rows(proj, table="entries"):
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    try:
        return db.execute(f"SELECT seq, step, kind, at_ns, body, prev, hash FROM {table} ORDER BY seq").fetchall()
    finally:
        db.close()


def damage(proj, kind, step=2, which="end"):
    """Damage the `which` row of `step` as a fault would; returns its seq."""
    seq = next(s for s, st, k, _ in rows(proj) if st == step and k == which)
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    if kind == "hash":
        h = db.execute("SELECT hash FROM entries WHERE seq = ?", (seq,)).fetchone()[0]
        db.execute("UPDATE entries SET hash = ? WHERE seq = ?", (("0" if h[0] != "0" else "1") + h[1:], seq))
    elif kind == "deleted":
        db.execute("DELETE FROM entries WHERE seq = ?", (seq,))
    elif kind == "step":
        db.execute("UPDATE entries SET step = 42 WHERE seq = ?", (seq,))
    else:
        db.execute("UPDATE entries SET body = '{\"exit_code\": 0, \"snap' WHERE seq = ?", (seq,))
    db.commit()
    db.close()
    return seq


def one_line(r, *words):
    no_traceback(r)
    said = [line for line in r.stderr.splitlines() if line.startswith("envgit: ")]
    assert len(said) == 1 and all(w in said[0] for w in words), r.stderr
    return said[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_rewind_that_could_not_be_undone_is_refused_before_it_changes_anything(bare_proj, tmp_path, kind):
    proj = bare_proj
    after = three_steps(proj)
    seq = damage(proj, kind)
    (proj.root / "a").write_text("work in progress\n")       # the latest work, not yet a step
    before = tree_of(proj.root)
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and f"entry {seq}" in f.stdout, f.stdout
    journal = all_rows(proj)
    # Step 1 verifies by itself, but the rewind's own undo point (recorded after the damage)
    # would not: refused, nothing written, the way out said.
    r = proj.envgit("rewind", "1", "--yes")
    assert r.returncode != 0
    one_line(r, "undo", "nothing was changed", "envgit fsck --repair", "envgit restore 1 --target")
    assert tree_of(proj.root) == before
    assert all_rows(proj) == journal                          # not even an `outside` entry
    for args in (("rewind", "--undo", "--yes"), ("rewind", "3", "--yes"), ("rewind", "1", "--dry-run")):
        r = no_traceback(proj.envgit(*args))
        assert r.returncode != 0, args
        assert tree_of(proj.root) == before, args
    # The way out it names works without touching the directory.
    out = tmp_path / "at-1"
    assert no_traceback(proj.envgit("restore", "1", "--target", str(out))).returncode == 0
    assert tree_of(out) == after[1]
    assert tree_of(proj.root) == before


@pytest.mark.parametrize("kind", KINDS)
def test_fsck_repair_reseals_the_journal_and_rewinds_past_the_damage_work_again(bare_proj, kind):
    proj = bare_proj
    after = three_steps(proj)
    seq = damage(proj, kind)
    damaged = all_rows(proj)
    r = no_traceback(proj.envgit("fsck", "--repair"))
    assert "re-sealed the journal" in r.stdout, r.stdout + r.stderr
    # Nothing silently dropped: every row is either still in the chain or set aside, byte for byte.
    kept, aside = all_rows(proj), all_rows(proj, "set_aside")
    assert {row[0] for row in aside}.isdisjoint(row[0] for row in kept)
    by_seq = {row[0]: row for row in kept + aside}
    assert all(by_seq[row[0]] == row for row in damaged)
    seal = [json.loads(b) for _, st, k, _, b, _, _ in kept if k == "reseal"]
    assert len(seal) == 1 and set(seal[0]["set_aside"]) == {row[0] for row in aside}
    if kind == "deleted":                     # nothing to keep; its neighbours verify and stay
        assert seal[0]["missing"] == [seq] and not aside
    else:
        assert [row[0] for row in aside] == [seq]
    # fsck names the damaged step every time after; the chain verifies past it.
    f = no_traceback(proj.envgit("fsck"))
    problems = [line for line in f.stdout.splitlines() if line.startswith("journal:")]
    assert problems and all("set aside" in p or "re-sealed" in p for p in problems), f.stdout
    assert any("step 2" in p for p in problems), f.stdout
    # Rewinds to either side of the damage, across it, and back: exactly each step's tree.
    (proj.root / "a").write_text("work in progress\n")
    wip = tree_of(proj.root)
    r = no_traceback(proj.envgit("rewind", "1", "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == after[1]
    assert "step 2" in r.stdout and "set aside" in r.stdout, r.stdout     # it crossed the damage
    r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == wip
    for n in (3, 1, 3):
        r = no_traceback(proj.envgit("rewind", str(n), "--yes"))
        assert r.returncode == 0, (n, r.stderr)
        assert tree_of(proj.root) == after[n], n
    # A rewind to the damaged step itself is refused, naming why; nothing written.
    r = proj.envgit("rewind", "2", "--yes")
    assert r.returncode != 0
    one_line(r, "step 2", "set aside", "fsck --repair")
    assert tree_of(proj.root) == after[3]
    # The project goes on: a new step, rewinds to it and back.
    assert proj.run("echo 5 > a").returncode == 0
    after5 = tree_of(proj.root)
    for n, want in ((1, after[1]), ("--undo", after5)):
        r = no_traceback(proj.envgit("rewind", str(n), "--yes"))
        assert r.returncode == 0, (n, r.stderr)
        assert tree_of(proj.root) == want, n


@pytest.mark.parametrize("kind", KINDS)
def test_a_rewind_made_before_the_damage_is_undone_after_the_repair(bare_proj, kind):
    """The order of the issue's trials where the rewind came first: the rewind to 1 was made,
    then a row of step 2 was damaged; --undo is refused (naming the repair) until fsck --repair,
    then gives back the latest work."""
    proj = bare_proj
    after = three_steps(proj)
    assert no_traceback(proj.envgit("rewind", "1", "--yes")).returncode == 0
    assert tree_of(proj.root) == after[1]
    proj.stop()
    damage(proj, kind)
    r = proj.envgit("rewind", "--undo", "--yes")
    assert r.returncode != 0
    one_line(r, "fsck --repair")
    assert tree_of(proj.root) == after[1]
    proj.stop()
    no_traceback(proj.envgit("fsck", "--repair"))
    r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == after[3]


@pytest.mark.parametrize("kind", ["deleted", "not-json"])
def test_a_damaged_begin_is_named_by_a_rewind_to_its_step(bare_proj, kind):
    """Step 2's begin damaged instead of its end: after the re-seal step 2 has no begin (its end
    is left on its own), and a rewind to it says why instead of "no step 2"; both sides rewind."""
    proj = bare_proj
    after = three_steps(proj)
    damage(proj, kind, which="begin")
    assert "re-sealed the journal" in no_traceback(proj.envgit("fsck", "--repair")).stdout
    r = proj.envgit("rewind", "2", "--yes")
    assert r.returncode != 0
    one_line(r, "step 2", "fsck --repair")
    assert tree_of(proj.root) == after[3]
    for n in (1, 3):
        r = no_traceback(proj.envgit("rewind", str(n), "--yes"))
        assert r.returncode == 0, (n, r.stderr)
        assert tree_of(proj.root) == after[n], n
    r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
    assert r.returncode == 0 and tree_of(proj.root) == after[1], r.stderr


def test_a_repair_killed_before_its_commit_leaves_the_journal_as_it_was(bare_proj):
    """The re-seal is one transaction: killed (-9) just before its commit, not a row has moved,
    nothing is set aside, and the next `fsck --repair` does it whole."""
    proj = bare_proj
    after = three_steps(proj)
    damage(proj, "hash")
    damaged = all_rows(proj)
    r = proj.envgit("fsck", "--repair", env={"ENVGIT_FAULT": "reseal-inserted"})
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr)
    assert all_rows(proj) == damaged
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'set_aside'").fetchall() == []
    db.close()
    assert "re-sealed the journal" in no_traceback(proj.envgit("fsck", "--repair")).stdout
    r = no_traceback(proj.envgit("rewind", "1", "--yes"))
    assert r.returncode == 0 and tree_of(proj.root) == after[1], r.stderr
    r = no_traceback(proj.envgit("rewind", "--undo", "--yes"))
    assert r.returncode == 0 and tree_of(proj.root) == after[3], r.stderr
