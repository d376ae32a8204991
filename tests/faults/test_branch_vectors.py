"""Known-answer vectors for branches (docs/FORMAT.md, "Branches" and "Head"): the rewound
branches a journal's rewind steps make, a fork branch's name on a remote, and a branch's head
bytes, written out here apart from the code that makes them, so a second implementation can
check itself against the same values."""

import json
from pathlib import Path

from envgit.branch.rewound import rewound
from envgit.journal.fold import Step
from envgit.remote.segments import decode_head, encode_head

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md"
TREE_A, TREE_B, TREE_C = "a" * 64, "b" * 64, "c" * 64

# FORMAT.md's example: steps 1-9; `envgit rewind 5` is step 10 (to_step 5, undo_step 9); a step
# 11; `envgit rewind --undo` is step 12 (to_step 9, undo_step 11); an adopt (step 13) is no
# branch, nor a rewind with nothing stepped over (step 14: to_step 13, undo_step 13).
STEPS = [Step(i) for i in range(1, 10)] + [
    Step(10, rewind={"to_step": 5, "undo_step": 9, "undo_tree": TREE_A, "target_tree": TREE_C}),
    Step(11),
    Step(12, rewind={"to_step": 9, "undo_step": 11, "undo_tree": TREE_B, "target_tree": TREE_A}),
    Step(13, rewind={"to_step": None, "undo_step": 12, "undo_tree": TREE_C, "target_tree": TREE_B,
                     "adopt": {"branch": "1", "kind": "fork"}}),
    Step(14, rewind={"to_step": 13, "undo_step": 13, "undo_tree": TREE_B, "target_tree": TREE_B}),
]

BRANCH_HEAD = ('{"branch": {"from_step": 4, "from_tree": "' + TREE_A + '", "id": 2, "parent": "app"}, '
               '"format": "envgit-head-1", "hash": "' + "0" * 64 + '", "machine": "m1", "packs": 1, '
               '"project": "app.envgit-2", "pushed_at": 1767225600000000000, "seq": 3, "step": 1, '
               '"version": 1}')


def test_the_rewound_branches_of_formats_example():
    got = [(b["id"], b["steps"], b["tree"]) for b in rewound(STEPS)]
    assert got == [("r10", [6, 9], TREE_A), ("r12", [10, 11], TREE_B)]


def test_a_fork_branchs_head_bytes_and_name():
    from envgit.commands.remotebranches import SUFFIX
    branch = {"parent": "app", "id": 2, "from_step": 4, "from_tree": TREE_A}
    data = encode_head("app.envgit-2", "m1", 1, 3, "0" * 64, 1, 1, 1767225600000000000, branch)
    assert data.decode() == BRANCH_HEAD
    assert decode_head(data, "app.envgit-2", "m1")["branch"] == branch
    assert "app" + SUFFIX + "2" == "app.envgit-2"
    # a head whose branch is not a branch record is not a head a reader trusts
    bad = json.loads(BRANCH_HEAD)
    bad["branch"] = {"parent": "app", "id": "2"}
    import pytest

    from envgit.remote.segments import BadSegment
    with pytest.raises(BadSegment):
        decode_head(json.dumps(bad).encode(), "app.envgit-2", "m1")


def test_format_md_states_the_branch_vectors():
    flat = " ".join(FORMAT_MD.read_text().split())
    assert "branch `r10`, steps [6, 9]" in flat and "branch `r12`, steps [10, 11]" in flat
    assert " ".join(BRANCH_HEAD.split()) in flat
