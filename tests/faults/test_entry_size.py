"""An entry's size is not the step's to choose: a step that writes thousands of escape routes
(here 1,100 git hooks, each a file git would run) still ends with an entry of bounded size, so
it is written whole (also into the space a full disk keeps for held ends), with the first
LISTED_MAX paths and how many more; its terminal line names the first few and the count; and
every one of them is still taken back."""

import json
import sqlite3

from envgit.journal.rows import LISTED_MAX
from faultlib import no_traceback

N = LISTED_MAX + 100


def test_thousands_of_escape_routes_make_a_bounded_entry_and_all_are_taken_back(bare_proj):
    proj = bare_proj
    assert proj.run("true").returncode == 0
    r = no_traceback(proj.run(f"for i in $(seq {N}); do mkdir -p d$i/.git/hooks && "
                              f"echo 'touch /tmp/x' > d$i/.git/hooks/pre-commit; done"))
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "took back" in line]
    assert len(said) == 1 and f"and {N - 20} more" in said[0] and len(said[0]) < 2000, r.stderr[:3000]
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    body = json.loads(db.execute("SELECT body FROM entries WHERE step = 2 AND kind = 'end'").fetchone()[0])
    assert len(body["escape_routes"]) == LISTED_MAX and body["escape_routes_more"] == N - LISTED_MAX
    assert len(body["taken_back"]) == LISTED_MAX and body["taken_back_more"] == N - LISTED_MAX
    assert not list(proj.root.glob("d*/.git/hooks/pre-commit"))     # every one taken back
    assert no_traceback(proj.envgit("fsck")).returncode == 0
