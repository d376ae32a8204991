"""A damaged stored object is healed from the working tree (issue 32, case 2).

The fault this reproduces: one flipped bit in a stored blob made every later snapshot holding
that file unrestorable, silently. The daemon reused the damaged blob by id (the file's stat was
unchanged, so the stat cache said "same content, same id"), `envgit restore` refused (`cannot
decompress`), and `envgit fsck --repair` repaired nothing while the intact bytes sat in the
working tree. Here a bit is flipped in each kind of stored thing (a blob, a tree, an object's
record header in its pack, a pack's own header, a pack index), new steps run, and then every
step is restored into a directory of its own and compared byte for byte with what it wrote."""

import os

from faultlib import no_traceback, tree_of

BIG = "".join(f"line {i} of a file that compresses well\n" for i in range(400))


def step_tree(proj, n):
    import json
    return json.loads(proj.envgit("show", str(n), "--json", check=True).stdout)["snapshot"]["tree"]


def oid_at(proj, tree_hex, path: bytes) -> str:
    """The id a tree names at `path` (a subtree's or a file's)."""
    from envgit.snapshot import Store
    from envgit.snapshot.diff import read_tree
    s = Store(proj.root / ".envgit" / "objects")
    try:
        oid = bytes.fromhex(tree_hex)
        for name in path.split(b"/"):
            oid = next(e.oid for e in read_tree(s.objects, oid) if e.name == name)
        return oid.hex()
    finally:
        s.close()


def location(proj, oid_hex):
    """(pack file path, offset of the object's record, stored length) (daemon stopped)."""
    from envgit.snapshot import Store
    from envgit.snapshot.packs import pack_path
    objects = proj.root / ".envgit" / "objects"
    s = Store(objects)
    try:
        pack_id, offset, _, _, _, stored_len = s.objects.index[bytes.fromhex(oid_hex)]
    finally:
        s.close()
    return pack_path(str(objects / "packs"), pack_id, ".pack"), offset, stored_len


def flip_at(path, offset, bit=0x10):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ bit]))


def flip_object(proj, oid_hex):
    from envgit.snapshot.packs import RECORD
    path, offset, stored_len = location(proj, oid_hex)
    flip_at(path, offset + RECORD.size + stored_len // 2)


def restore_every_step(proj, tmp_path, expected: dict):
    """`envgit restore N --target` for every step, each compared with what the step wrote."""
    for n, tree in expected.items():
        target = tmp_path / f"at-{n}"
        r = no_traceback(proj.envgit("restore", str(n), "--target", str(target)))
        assert r.returncode == 0, f"restore {n}: {r.stdout}{r.stderr}"
        assert tree_of(target) == tree, f"restore {n} did not give back what step {n} wrote"


def first_step(proj):
    assert proj.run(f"mkdir d && echo keep > d/k && printf '%s' '{BIG}' > f && echo 1 > a").returncode == 0
    return tree_of(proj.root)


def later_steps(proj, after, numbers):
    for n in numbers:
        assert no_traceback(proj.run(f"echo {n} > a")).returncode == 0
        after[n] = tree_of(proj.root)


def repair(proj):
    proj.stop()
    r = no_traceback(proj.envgit("fsck", "--repair"))
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_a_flipped_bit_in_a_blob_is_healed_by_fsck_repair(bare_proj, tmp_path):
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    proj.stop()
    flip_object(proj, blob)
    later_steps(proj, after, (2, 3))              # the stat cache reuses the damaged blob's id
    repair(proj)
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    restore_every_step(proj, tmp_path, after)


def test_a_failed_restore_is_remembered_and_the_next_step_heals(bare_proj, tmp_path):
    """No fsck: the daemon that keeps running learns of the damage a restore met, and its next
    snapshot stores the working tree's bytes afresh (every step holding them is whole again)."""
    proj = bare_proj
    proj.env["ENVGIT_DAEMON_SCRUB"] = "0"      # a reader finds it, not the daemon's re-hash
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    proj.stop()
    flip_object(proj, blob)
    later_steps(proj, after, (2,))
    r = no_traceback(proj.envgit("restore", "2", "--target", str(tmp_path / "first-try")))
    assert r.returncode == 4 and "f:" in r.stderr          # the damaged path is named
    # every other path was restored
    assert (tmp_path / "first-try" / "d" / "k").read_bytes() == b"keep\n"
    assert (tmp_path / "first-try" / "a").read_bytes() == b"2\n"
    assert not (tmp_path / "first-try" / "f").exists()
    later_steps(proj, after, (3,))                 # the same daemon: watcher and memos warm
    restore_every_step(proj, tmp_path, after)


def test_a_flipped_bit_in_a_tree_is_healed(bare_proj, tmp_path):
    proj = bare_proj
    after = {1: first_step(proj)}
    d_tree = oid_at(proj, step_tree(proj, 1), b"d")
    proj.stop()
    flip_object(proj, d_tree)
    later_steps(proj, after, (2, 3))              # d unchanged: its tree is re-encoded to the same id
    repair(proj)
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    restore_every_step(proj, tmp_path, after)


def test_a_flipped_bit_in_a_record_header_is_healed(bare_proj, tmp_path):
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    proj.stop()
    path, offset, _ = location(proj, blob)
    flip_at(path, offset + 3)                      # in the id the record header carries
    later_steps(proj, after, (2, 3))
    repair(proj)
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    restore_every_step(proj, tmp_path, after)


def test_a_flipped_bit_in_a_pack_header_is_repaired(bare_proj, tmp_path):
    """The pack's magic: every object still reads, but fsck named the pack for ever; repair
    moves its objects into a sound pack and keeps the damaged file aside."""
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    proj.stop()
    path, _, _ = location(proj, blob)
    flip_at(path, 2)
    later_steps(proj, after, (2, 3))
    proj.stop()
    assert no_traceback(proj.envgit("fsck")).returncode == 1
    repair(proj)
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    restore_every_step(proj, tmp_path, after)


def test_a_flipped_bit_in_a_pack_index_is_repaired(bare_proj, tmp_path):
    """An index is derived from its pack: repair writes it again, so a step whose files the
    working tree no longer holds comes back too."""
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    assert proj.run("echo changed > f && echo 2 > a").returncode == 0     # step 1's f: only in its pack
    after[2] = tree_of(proj.root)
    proj.stop()
    path, _, _ = location(proj, blob)
    idx = path[:-len(".pack")] + ".idx"
    flip_at(idx, os.path.getsize(idx) // 2)
    later_steps(proj, after, (3,))
    repair(proj)
    assert no_traceback(proj.envgit("fsck")).returncode == 0
    restore_every_step(proj, tmp_path, after)


def test_what_cannot_be_healed_is_named_and_the_rest_restores(bare_proj, tmp_path):
    """The working tree no longer holds step 1's f: repair names step 1 and f; a restore of
    step 1 writes every other path and names f, exit 4."""
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    assert proj.run("echo changed > f && echo 2 > a").returncode == 0
    after[2] = tree_of(proj.root)
    proj.stop()
    flip_object(proj, blob)
    later_steps(proj, after, (3,))
    proj.stop()
    r = no_traceback(proj.envgit("fsck", "--repair"))
    assert r.returncode == 1
    assert "step 1" in r.stdout and "f" in r.stdout.split("step 1", 1)[1].splitlines()[0], r.stdout
    assert "step 2" not in r.stdout and "step 3" not in r.stdout
    target = tmp_path / "at-1"
    r = no_traceback(proj.envgit("restore", "1", "--target", str(target)))
    assert r.returncode == 4 and "f:" in r.stderr, r.stderr
    want = {p: v for p, v in after[1].items() if p != "f"}
    assert tree_of(target) == want
    restore_every_step(proj, tmp_path, {2: after[2], 3: after[3]})


def test_what_plain_fsck_finds_is_remembered_and_the_next_step_heals(bare_proj, tmp_path):
    """`envgit fsck` (no --repair, the daemon running) finds the damaged blob; the daemon's
    next snapshot stores the working tree's bytes afresh."""
    proj = bare_proj
    after = {1: first_step(proj)}
    blob = oid_at(proj, step_tree(proj, 1), b"f")
    proj.stop()
    flip_object(proj, blob)
    later_steps(proj, after, (2,))
    f = no_traceback(proj.envgit("fsck"))
    assert f.returncode == 1 and blob in f.stdout
    later_steps(proj, after, (3,))                 # the same daemon
    restore_every_step(proj, tmp_path, after)


def test_a_damaged_chunk_of_a_big_file_is_healed_by_the_next_step(bare_proj, tmp_path):
    """A file over 1 MiB is stored as chunks: a damaged chunk is not the file's own id, and the
    snapshot still finds the file that holds it and reads it again."""
    from envgit.snapshot import Store
    from envgit.snapshot.encoding import decode_chunks
    from envgit.snapshot.ids import CHUNKS
    proj = bare_proj
    proj.env["ENVGIT_DAEMON_SCRUB"] = "0"      # a reader finds it, not the daemon's re-hash
    assert proj.run("mkdir d && head -c 3000000 /dev/urandom > d/big && echo 1 > a").returncode == 0
    after = {1: tree_of(proj.root)}
    index_id = oid_at(proj, step_tree(proj, 1), b"d/big")
    proj.stop()
    s = Store(proj.root / ".envgit" / "objects")
    chunk = decode_chunks(s.objects.get(bytes.fromhex(index_id), CHUNKS))[1][0].hex()
    s.close()
    flip_object(proj, chunk)
    later_steps(proj, after, (2,))
    r = no_traceback(proj.envgit("restore", "2", "--target", str(tmp_path / "first-try")))
    assert r.returncode == 4 and "d/big:" in r.stderr
    later_steps(proj, after, (3,))                 # the same daemon
    restore_every_step(proj, tmp_path, after)
