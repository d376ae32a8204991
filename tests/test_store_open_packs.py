"""The object store keeps a bounded number of pack files open, however many it has sealed and
read back: a daemon seals one pack a step and reads its trees back, and used to hold one
descriptor per step for its whole life (EMFILE after ~20,000 steps). The oracle is the
process's own open descriptors (/proc/self/fd) and every object reading back whole."""

import os

from envgit.snapshot.ids import BLOB
from envgit.snapshot.objects import MAX_OPEN_PACKS, ObjectStore


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_reading_back_many_packs_keeps_descriptors_bounded(tmp_path):
    store = ObjectStore(tmp_path / "store")
    ids = []
    for i in range(MAX_OPEN_PACKS * 3):              # one pack per "step"
        ids.append(store.put(BLOB, f"step {i}\n".encode() * 10))
        store.flush()
    assert len(store.pack_entries) >= MAX_OPEN_PACKS * 3
    before = _open_fds()
    for _ in range(2):                                 # every pack read, twice over
        for i, oid in enumerate(ids):
            assert store.get(oid) == f"step {i}\n".encode() * 10
    assert store.open_packs() <= MAX_OPEN_PACKS
    assert _open_fds() - before <= MAX_OPEN_PACKS, (before, _open_fds())
    store.close()
    assert store.open_packs() == 0


def test_a_pack_closed_for_room_reads_again(tmp_path):
    store = ObjectStore(tmp_path / "store")
    first = store.put(BLOB, b"the oldest pack's object\n")
    store.flush()
    store.get(first)
    for i in range(MAX_OPEN_PACKS + 5):                # push the first pack out of the cache
        oid = store.put(BLOB, f"{i}\n".encode())
        store.flush()
        store.get(oid)
    assert store.get(first) == b"the oldest pack's object\n"
    store.close()
