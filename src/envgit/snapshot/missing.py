"""Objects a reader finds missing are reported like damaged copies (issue 32, case 2).

A pack index damaged after the daemon loaded it (or a pack file gone under its index) hides
every object of that pack from the processes that open the store afterwards: they find those
objects "not in the store". The daemon, whose index still has them, would go on reusing them by
id, so every later snapshot lacked them for every other reader. A missing object is therefore
reported the way a damaged copy is: each object of the pack that a reader cannot use is added
to the `damaged` list (damaged_list.py) naming that pack, the running daemon drops those copies
from its index on its next snapshot, its stat cache forgets the paths that held them, and what
the working tree still holds is stored again, in a new pack every process can read.

The objects of a pack whose index does not read are found by scanning the record headers of
the pack itself (once per process and pack; only ever on a miss). `envgit fsck --repair`
writes the index again and drops the lines whose copies read back sound (heal.recheck_listed).
"""

import os
import time

from . import damaged_list, packs
from .packs import PACK_MAGIC, RECORD

RESCAN_S = 0.5       # packs sealed since the store was opened are looked for at most this often


def unusable(objects, pack_id: str, entries=None) -> None:
    """Remember a pack this process cannot read from: its index did not load (`entries` None)
    or its pack file is gone (`entries`: what its index lists)."""
    objects.unusable_packs[pack_id] = entries


def find_late(objects, oid: bytes):
    """The object's location after loading the indexes of packs sealed since this store was
    opened (a reader opened before the daemon's latest snapshot), or None."""
    now = time.monotonic()
    if now - objects.rescanned_at < RESCAN_S:    # a restore missing 10,000 paths lists once
        return None
    objects.rescanned_at = now
    known = set(objects.pack_entries) | set(objects.unusable_packs)
    try:
        subs = sorted(os.listdir(objects.packs_dir))
        for sub in subs:
            d = os.path.join(objects.packs_dir, sub)
            for name in sorted(os.listdir(d)):
                if name.endswith(".idx") and name[:-4] not in known:
                    objects._load_index(os.path.join(d, name), name[:-4])
    except OSError:
        return None
    return objects.index.get(oid)


def report(objects) -> None:
    """Add to the `damaged` list every object of the packs this process cannot read from, each
    naming its pack (a reader met a missing object). Best effort, once per pack."""
    copies = set()
    for pack_id, entries in list(objects.unusable_packs.items()):
        if pack_id in objects.reported_packs:
            continue
        objects.reported_packs.add(pack_id)
        oids = [e[0] for e in entries] if entries is not None else _record_ids(objects, pack_id)
        copies |= {(oid, pack_id) for oid in oids}
    if copies:
        damaged_list.record(objects, copies)


def _record_ids(objects, pack_id: str) -> list[bytes]:
    """The ids the pack's record headers carry, up to where a header no longer fits."""
    try:
        with open(packs.pack_path(objects.packs_dir, pack_id, ".pack"), "rb") as f:
            data = f.read()
    except OSError:
        return []
    out, pos = [], len(PACK_MAGIC)
    while pos + RECORD.size <= len(data):
        oid, _, _, _, _, stored_len = RECORD.unpack_from(data, pos)
        out.append(oid)
        pos += RECORD.size + stored_len
    return out
