"""The on-disk format, pinned: known-answer vectors (the same values are printed in
docs/FORMAT.md, "Known-answer vectors"), and a store and journal written by format version 1,
checked in (tests/faults/data/format-v1, made once by make_format_v1.py), read back whole.

A change to an id context, the tree encoding, the chunker table or the entry hash fails here
instead of passing the suite while every existing store stops verifying."""

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from blake3 import blake3

from envgit.journal import FORMAT_VERSION, Journal, entry_hash
from envgit.snapshot import Filter, Store, chunker
from envgit.snapshot.encoding import DIR, EXEC, FILE, SYMLINK, Entry, encode_chunks, encode_tree
from envgit.snapshot.ids import BLOB, CHUNKS, TREE, object_id

DATA = Path(__file__).parent / "data"
FORMAT_MD = Path(__file__).parents[2] / "docs" / "FORMAT.md"

BLOB_ID = "8e4c7c1b99dbfd50e7a95185fead5ee1448fa904a2fdd778eaf5f2dbfd629a99"      # b"hello\n"
CHUNK_LENGTHS = [1630914, 532743, 1132708, 711552, 2113597, 169942]
FIRST_CHUNK_ID = "95fd5c5ae4dde6098b1d2b2cbbeca2dfacfc6bcb7ece2ecf8bc7e502940cf952"
CHUNK_INDEX_ID = "0a650b2556d086d918514911ef7d8e509a1ba6c3388cd15f6a5b6a7c4ab3ac3e"
EMPTY_TREE_ID = "7e007a746d37aafe6d90b7011894910db6fb7538c7de662acd5dbdaaf72438b5"
TREE_ID = "625828ef0059eade42cfa6b6957662b25a2d646b8b1e26738f359b6069c17871"
TREE_HEX = ("656e766769742d747265652d310a0500612e7478740100a40106000000000000008e4c7c1b99dbfd50"
            "e7a95185fead5ee1448fa904a2fdd778eaf5f2dbfd629a9903006269670101800100006000000000000a"
            "650b2556d086d918514911ef7d8e509a1ba6c3388cd15f6a5b6a7c4ab3ac3e030062696e0400ed0100"
            "000000000000007e007a746d37aafe6d90b7011894910db6fb7538c7de662acd5dbdaaf72438b50400"
            "6c696e6b0300ff010500000000000000612e747874060072756e2e73680200ed01060000000000000"
            "08e4c7c1b99dbfd50e7a95185fead5ee1448fa904a2fdd778eaf5f2dbfd629a99")
ENTRY_HASH = "230fb1e30daa15586abe6df7f642a43cfb171f884c045fce23ad5fc8184bd6bb"
STORED_TREE = "30d031a43fb8ebc20e3ec075739ee09328232ba281d8ac43698a0976783ae1b0"
# A re-sealed chain (FORMAT.md, "Re-sealing"): entries 2-4 and the `reseal` entry 5 that re-joins
# entry 4 to entry 2 once entry 3 is set aside.
RESEAL_HASHES = ["c6078039c36d879cc5b25729197a28546714fe55ccc5195db779a98b947d4f1a",
                 "81be484a3ca2f8e76e8188125da571b14efa99d2bed508c24ce1c38dc66c4385",
                 "2ba092245380f425c2bf4da7c805ade06fbc079125d1e9e036420bacb00e88b9",
                 "0ab98db4e29c527ec9b3da64a7d3e4d4674e46eb7167cddb54dfad9c5b73b285"]


def chunk_vector():
    data = blake3(b"envgit chunker vector 1").digest(length=6 << 20)
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        lengths = [len(c) for c in chunker.chunks(fd)]
    finally:
        os.close(fd)
        os.unlink(path)
    parts, off = [], 0
    for n in lengths:
        parts.append((object_id(BLOB, data[off:off + n]), n))
        off += n
    return lengths, parts


def test_known_answer_vectors():
    assert object_id(BLOB, b"hello\n").hex() == BLOB_ID
    lengths, parts = chunk_vector()
    assert lengths == CHUNK_LENGTHS
    assert parts[0][0].hex() == FIRST_CHUNK_ID
    assert object_id(CHUNKS, encode_chunks(parts)).hex() == CHUNK_INDEX_ID
    assert object_id(TREE, encode_tree([])).hex() == EMPTY_TREE_ID
    blob, cid, eid = (bytes.fromhex(x) for x in (BLOB_ID, CHUNK_INDEX_ID, EMPTY_TREE_ID))
    tree = encode_tree([Entry(b"a.txt", FILE, 0o644, 6, blob), Entry(b"big", FILE, 0o600, 6 << 20, cid, True),
                        Entry(b"bin", DIR, 0o755, 0, eid),
                        Entry(b"link", SYMLINK, 0o777, 5, None, False, b"a.txt"),
                        Entry(b"run.sh", EXEC, 0o755, 6, blob)])
    assert tree.hex() == TREE_HEX and object_id(TREE, tree).hex() == TREE_ID
    assert entry_hash(1, 1, "begin", 1767225600000000000, '{"argv":["true"]}', "0" * 64) == ENTRY_HASH


def resealed_rows():
    """The vector's journal as `entries` holds it after the re-seal: 1, 2, 4, 5 (3 set aside)."""
    t, h2, h3, h4, _ = 1767225600000000000, *RESEAL_HASHES
    link = {"after": 2, "after_hash": h2, "prev": h3, "seq": 4}
    body5 = json.dumps({"links": [link], "missing": [], "set_aside": [3]}, sort_keys=True, separators=(",", ":"))
    return [(1, 1, "begin", t, '{"argv":["true"]}', "0" * 64, ENTRY_HASH),
            (2, 1, "end", t + 1, '{"exit_code":0}', ENTRY_HASH, h2),
            (4, 2, "end", t + 3, '{"exit_code":1}', h3, h4),
            (5, 0, "reseal", t + 4, body5, h4, RESEAL_HASHES[3])]


def test_a_resealed_chain_verifies_by_the_rule_and_by_the_journal(tmp_path):
    rows = resealed_rows()
    t = 1767225600000000000
    assert entry_hash(3, 2, "begin", t + 2, '{"argv":["false"]}', RESEAL_HASHES[0]) == RESEAL_HASHES[1]
    for seq, step, kind, at, body, prev, h in rows:
        assert entry_hash(seq, step, kind, at, body, prev) == h, seq
    # FORMAT.md's rule, written out here apart from the journal's code.
    seals = {r[0]: json.loads(r[4]) for r in rows if r[2] == "reseal"}
    a, ah = 0, "0" * 64
    for seq, _, _, _, _, prev, h in rows:
        if not (seq == a + 1 and prev == ah):
            assert any(e >= seq and {"seq": seq, "prev": prev, "after": a, "after_hash": ah} in b["links"]
                       and range(a + 1, seq) and all(k in b["set_aside"] + b["missing"] for k in range(a + 1, seq))
                       for e, b in seals.items()), seq
        a, ah = seq, h
    # The journal's own verify agrees (this minimal entry names no step, so nothing is said).
    j = Journal(str(tmp_path / "journal.sqlite"))
    j.db.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?,?)", rows)
    (tmp_path / "journal.head").unlink(missing_ok=True)
    assert j.verify() == []
    # Without the reseal entry, entry 4 does not follow entry 2.
    j.db.execute("DELETE FROM entries WHERE seq = 5")
    assert [p for p in j.verify() if p.taints(4)]
    j.close()


def test_format_md_prints_the_same_vectors():
    text = FORMAT_MD.read_text()
    section = text[text.index("### Known-answer vectors"):]
    flat = re.sub(r"\s+", "", section)
    for value in (BLOB_ID, FIRST_CHUNK_ID, CHUNK_INDEX_ID, EMPTY_TREE_ID, TREE_ID, TREE_HEX, ENTRY_HASH,
                  STORED_TREE, ",".join(map(str, CHUNK_LENGTHS)), *RESEAL_HASHES):
        assert value in flat, value


def test_the_checked_in_version_1_store_and_journal_read_back(tmp_path):
    copy = tmp_path / "format-v1"
    shutil.copytree(DATA / "format-v1", copy)
    store = Store(copy / "objects")
    assert store.fsck([STORED_TREE]) == []
    out = tmp_path / "out"
    out.mkdir()
    store.restore(out, store.plan_restore(out, STORED_TREE, Filter()))
    sys.path.insert(0, str(DATA))
    try:
        from make_format_v1 import make_tree
    finally:
        sys.path.remove(str(DATA))
    make_tree(tmp_path / "again")                         # the same directory, made now
    again = Store(tmp_path / "store-now").snapshot(tmp_path / "again", Filter())
    assert again.tree_id == STORED_TREE                   # this code makes the same ids
    for rel in ("a.txt", "run.sh", "sub/b.bin"):
        assert (out / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes()
        assert os.stat(out / rel).st_mode == os.stat(tmp_path / "again" / rel).st_mode
    assert os.readlink(out / "link") == "a.txt" and (out / "empty").is_dir()

    j = Journal(str(copy / "journal.sqlite"), readonly=True)
    assert j.db.execute("PRAGMA user_version").fetchone()[0] == 1 and FORMAT_VERSION == 2
    assert j.verify() == []
    (step,) = j.steps()
    assert step.argv == ["sh", "-c", "make"] and step.status == "done" and step.snapshot["tree"] == STORED_TREE
    assert j.live_trees() == [STORED_TREE] and j.dropped_snapshots() == set()
    assert j.open_steps() == [] and j.last_snapshot_step().id == 1
    j.close()
    # Its first writer migrates it to version 2 (the open-steps table, the (kind, step) index)
    w = Journal(str(copy / "journal.sqlite"))
    assert w.db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert w.verify() == [] and w.open_steps() == []
    n = w.begin_step({"argv": ["true"], "cwd": "/"})
    assert [s.id for s in w.open_steps()] == [n] == [2]
    w.append(n, "end", {"exit_code": 0})
    assert w.open_steps() == [] and w.verify() == []
    w.close()
