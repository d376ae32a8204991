"""Reads that cost the whole journal (issue 11, item 9): `show N`, `log -n 10`, the open steps
(every CLI read's repair, the daemon's start) and the last snapshot (the daemon's start) were a
fold of every entry: 1.5-2.7 s at 20,000 steps. They now read a few rows through indexes and
the open-steps table (journal format 2). Measured here without clocks: the SQLite virtual
machine instructions each read costs, counted by a progress handler, must not grow with the
journal (500 vs 5,000 steps). bench/bench_journal.py has the timings."""

import pytest

from envgit.journal import Journal

TREE = "7e007a746d37aafe6d90b7011894910db6fb7538c7de662acd5dbdaaf72438b5"


def build(path, steps, open_every=0):
    j = Journal(str(path))
    for i in range(steps):
        n = j.begin_step({"argv": ["sh", "-c", f"echo {i}"], "cwd": "/p", "session": f"s{i % 3}"})
        if open_every and i % open_every == 0:
            continue                                   # left open (an orphan)
        j.append(n, "end", {"exit_code": 0, "snapshot": {"tree": TREE, "added": 1, "modified": 0,
                                                           "deleted": 0, "ms": 1.0}})
    j.close()


def cost(j, read):
    count = [0]

    def tick():
        count[0] += 1
        return 0
    j.db.set_progress_handler(tick, 100)
    try:
        out = read(j)
    finally:
        j.db.set_progress_handler(None, 0)
    return count[0], out


READS = {
    "show N": lambda j: j.step(250),
    "log -n 10": lambda j: [s.id for s in j.steps(last=10)],
    "log --session -n 10": lambda j: [s.id for s in j.steps(session="s1", last=10)],
    "open steps": lambda j: [s.id for s in j.open_steps()],
    "last snapshot": lambda j: j.last_snapshot_step().id,
}


@pytest.fixture(scope="module")
def journals(tmp_path_factory):
    d = tmp_path_factory.mktemp("journals")
    out = {}
    for n in (500, 5000):                              # a directory each: journal.head is per directory
        (d / str(n)).mkdir()
        build(d / str(n) / "journal.sqlite", n, open_every=0)
        out[n] = d / str(n) / "journal.sqlite"
    return out


@pytest.mark.parametrize("read", list(READS))
def test_a_read_costs_the_same_at_500_and_5000_steps(journals, read):
    costs = {}
    for n, path in journals.items():
        j = Journal(str(path), readonly=True)
        costs[n], out = cost(j, READS[read])
        j.close()
        assert out is not None
    assert costs[5000] <= costs[500] * 1.5 + 20, costs      # flat, not 10x


def test_what_the_indexed_reads_answer_is_what_the_whole_fold_says(tmp_path):
    path = tmp_path / "j.sqlite"
    build(path, 300, open_every=37)
    j = Journal(str(path))
    every = j.steps()
    assert [s.id for s in j.steps(last=10)] == [s.id for s in every[-10:]]
    assert [s.id for s in j.steps(session="s2", last=7)] == [s.id for s in every if s.session == "s2"][-7:]
    assert [s.id for s in j.open_steps()] == [s.id for s in every if s.status == "running"]
    assert j.last_snapshot_step().id == [s for s in every if s.snapshot][-1].id
    assert j.step(150).to_json() == every[149].to_json()
    assert j.verify() == []
    # the derived table is checked by verify, and rebuilt by fsck --repair's path
    j.db.execute("DELETE FROM open_steps")
    assert any("open steps" in p for p in j.verify())
    j.rebuild_open_steps()
    assert j.verify() == [] and [s.id for s in j.open_steps()] == [s.id for s in every if s.status == "running"]
    j.close()
