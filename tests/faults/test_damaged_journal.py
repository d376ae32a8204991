"""A damaged journal.sqlite (issue 11, item 7): bytes of a page overwritten, or the header.
Before: "database disk image is malformed" tracebacks and no way forward. Now every command
says in one line that the journal is damaged and what to do, `envgit fsck` says what (which
entries cannot be read), and `envgit fsck --repair` keeps every readable entry (the store is
not touched), records what it could not keep, and the project works again: steps run, ids are
not reused, and every kept step rewinds to exactly its tree."""

import json
import sqlite3

import pytest

from faultlib import no_traceback, rows, tree_of

STEPS = 40


def build(proj):
    trees = {}
    for n in range(1, STEPS + 1):
        assert proj.run(f"echo {n} > f{n}; rm -f f{n - 3}").returncode == 0
        trees[n] = tree_of(proj.root)
    proj.stop()
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")          # the entries in the main file
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    return trees, pages, size


def damage(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def one_line(r, *words):
    assert "Traceback" not in r.stderr + r.stdout
    said = [line for line in r.stderr.splitlines() if line.startswith("envgit: ")]
    assert len(said) == 1 and all(w in said[0] for w in words), r.stderr


@pytest.mark.parametrize("where", ["a page", "the header"])
def test_a_damaged_journal_is_said_and_repaired_keeping_every_readable_entry(bare_proj, where):
    proj = bare_proj
    trees, pages, size = build(proj)
    journal = proj.root / ".envgit" / "journal.sqlite"
    before = rows(proj)
    if where == "a page":
        damage(journal, size * (pages // 2) + 100, b"\xde\xad\xbe\xef" * 200)
    else:
        damage(journal, 0, b"\x00" * 100)
    # Said, one line, with the way forward.
    r = proj.envgit("log")
    assert r.returncode == 5
    one_line(r, "journal", "fsck --repair")
    r = no_traceback(proj.envgit("run", "--", "true"))
    assert r.returncode != 0
    one_line(r, "damaged", "fsck --repair")
    r = no_traceback(proj.envgit("fsck"))
    assert r.returncode == 1 and "damaged" in r.stdout and "--repair" in r.stdout
    # Repaired: every readable row kept, byte for byte; what was not, said and recorded.
    r = no_traceback(proj.envgit("fsck", "--repair"))
    assert "rebuilt the journal" in r.stdout, r.stdout + r.stderr
    after = {row[0]: row for row in rows(proj)}
    kept = [row for row in before if row[0] in after]
    assert all(after[row[0]] == row for row in kept)
    lost = [json.loads(b) for _, _, k, b in after.values() if k == "lost"]
    missing = set(lost[0]["missing"]) if lost and "missing" in lost[0] else set()
    assert {row[0] for row in before} == {row[0] for row in kept} | missing
    if where == "the header":
        assert not missing                                    # a fresh header reads them all
    else:
        assert missing and ("could not keep entries" in r.stdout)
    assert list((proj.root / ".envgit").glob("journal.sqlite.damaged-*"))       # kept aside
    # The project works again: reads, a new step with a new id, fsck names only the gap.
    log = json.loads(no_traceback(proj.envgit("log", "--json")).stdout)
    ids = [s["id"] for s in log]
    assert proj.run("echo new > new").returncode == 0
    log2 = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert log2[-1]["id"] == STEPS + 1 and len({s["id"] for s in log2}) == len(log2)
    f = no_traceback(proj.envgit("fsck"))
    problems = [line for line in f.stdout.splitlines() if line.startswith("journal:")]
    assert all("lost" in p or "records that" in p for p in problems), f.stdout
    # Every kept step with a snapshot rewinds to exactly its tree (the store was not touched).
    done = [s["id"] for s in log if s["status"] == "done" and s.get("snapshot", {}).get("tree")
            and s["id"] in ids]
    for n in done[:3] + done[-2:]:
        r = no_traceback(proj.envgit("rewind", str(n), "--yes"))
        assert r.returncode == 0, r.stderr
        assert tree_of(proj.root) == trees[n], f"rewind {n}"
