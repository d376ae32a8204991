"""The page's reads do not grow with the journal: the timeline's first page, an older page and
a step page cost the same SQLite work on 1,000 and on 10,000 steps (counted in SQLite virtual
machine instructions: deterministic, unlike a timing on a shared machine). Filters read each
row of their kinds once (linear, in SQL); bench/bench_ui.py times both."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_journal import make_project  # noqa: E402

from envgit.ui import query  # noqa: E402


def _work(path, fn) -> int:
    """SQLite VM instructions `fn(journal)` costs, counted in steps of 100."""
    with query.journal(path) as j:
        n = [0]

        def tick():
            n[0] += 1
            return 0
        j.db.set_progress_handler(tick, 100)
        fn(j)
        j.db.set_progress_handler(None, 0)
        return n[0]


@pytest.mark.sandbox           # bench's make_project runs `envgit init`
def test_a_page_costs_the_same_on_four_times_the_journal(tmp_path):
    small = make_project(tmp_path / "small", 2500)
    big = make_project(tmp_path / "big", 10000)
    reads = {
        "first page": lambda j: query.page(j, query.Filters()),
        "older page": lambda j: query.page(j, query.Filters(), before=900),
        "step": lambda j: j.step(500),
        "head": query.head_seq,
        "sessions": query.sessions,
        "live look": lambda j: query.changed_since(j, query.head_seq(j) - 30, query.Filters()),
    }
    for name, fn in reads.items():
        a, b = _work(small.journal, fn), _work(big.journal, fn)
        assert b <= a * 1.5 + 50, f"{name}: {a} -> {b} (x100 SQLite instructions)"
    # a filter reads its rows once: linear, not worse
    a = _work(small.journal, lambda j: query.page(j, query.Filters(mark="asked")))
    b = _work(big.journal, lambda j: query.page(j, query.Filters(mark="asked")))
    assert b <= a * 5 + 50, (a, b)
