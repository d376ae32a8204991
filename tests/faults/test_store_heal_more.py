"""Three holes in the store's healing an attacker found (issue 32, case 2: "one damaged object
never makes later snapshots unrestorable"), each a real daemon and real steps, each step
restored and compared byte for byte with what it wrote.

1. A pack index damaged while the daemon holds it: readers find its objects missing, the
   daemon (which loaded the index before) kept reusing them, so every later step lacked them.
2. Damage nobody has read yet: the daemon re-hashes packs while no step runs and records what
   it finds, so the next step stores the working tree's bytes again.
3. A wrong line in `objects/damaged` (a sound copy): fsck --repair re-checks it and drops it.
"""

import os
import time

from faultlib import no_traceback, tree_of
from test_store_heal import (
    first_step,
    flip_at,
    flip_object,
    later_steps,
    location,
    oid_at,
    restore_every_step,
    step_tree,
)


def damaged_lines(proj) -> str:
    try:
        return (proj.root / ".envgit" / "objects" / "damaged").read_text()
    except FileNotFoundError:
        return ""


def test_a_pack_index_damaged_under_the_running_daemon_is_healed_by_the_next_step(bare_proj, tmp_path):
    proj = bare_proj
    proj.env["ENVGIT_DAEMON_SCRUB"] = "0"      # a reader finds it, not the daemon's re-hash
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    path, _, _ = location(proj, blob)        # (stops the daemon)
    later_steps(proj, after, (2,))           # a daemon that loads every index, then keeps them
    idx = path[:-len(".pack")] + ".idx"
    flip_at(idx, os.path.getsize(idx) // 2)
    r = no_traceback(proj.envgit("restore", "2", "--target", str(tmp_path / "first-try")))
    assert r.returncode == 4, r.stdout + r.stderr      # its trees and blobs: not in the store
    later_steps(proj, after, (3,))           # the same daemon stores them again
    # (step 1's tree and its `a` are only in the pack whose index is damaged: gone from the tree)
    restore_every_step(proj, tmp_path, {2: after[2], 3: after[3]})


def test_damage_nobody_read_is_found_by_the_daemon_and_healed_by_the_next_step(bare_proj, tmp_path):
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    proj.stop()
    flip_object(proj, blob)                  # in the middle of f's blob; no reader meets it
    later_steps(proj, after, (2,))           # the daemon starts and reuses f's id
    deadline = time.monotonic() + 30
    while blob not in damaged_lines(proj) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert blob in damaged_lines(proj), "the idle daemon did not find the damaged blob"
    later_steps(proj, after, (3,))           # stores f's bytes again: every step is whole
    restore_every_step(proj, tmp_path, after)


def test_a_wrong_line_in_the_damaged_list_costs_nothing_after_a_repair(bare_proj, tmp_path):
    proj = bare_proj
    assert proj.run("echo zed > z.txt").returncode == 0
    after = {1: tree_of(proj.root)}
    assert proj.run("echo other > z.txt").returncode == 0      # step 1's z.txt: only in the store
    after[2] = tree_of(proj.root)
    blob = oid_at(proj, step_tree(proj, 1), b"z.txt")
    path, _, _ = location(proj, blob)
    pack_id = os.path.basename(path)[:-len(".pack")]
    with open(proj.root / ".envgit" / "objects" / "damaged", "a") as f:
        f.write(f"{blob} {pack_id}\n")
    proj.stop()
    r = no_traceback(proj.envgit("fsck", "--repair"))
    assert r.returncode == 0 and "unrestorable" not in r.stdout, r.stdout + r.stderr
    assert blob not in damaged_lines(proj)
    c = no_traceback(proj.envgit("cat", "1:z.txt"))
    assert c.returncode == 0 and c.stdout == "zed\n", c.stdout + c.stderr
    restore_every_step(proj, tmp_path, after)


def test_plain_fsck_drops_a_line_naming_a_sound_copy(bare_proj, tmp_path):
    proj = bare_proj
    assert proj.run("echo zed > z.txt").returncode == 0
    after = {1: tree_of(proj.root)}
    blob = oid_at(proj, step_tree(proj, 1), b"z.txt")
    path, _, _ = location(proj, blob)
    pack_id = os.path.basename(path)[:-len(".pack")]
    with open(proj.root / ".envgit" / "objects" / "damaged", "a") as f:
        f.write(f"{blob} {pack_id}\n")
    r = no_traceback(proj.envgit("fsck"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert blob not in damaged_lines(proj)
    restore_every_step(proj, tmp_path, after)
