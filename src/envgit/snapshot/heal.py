"""`envgit fsck --repair` for the snapshot store (issue 32, case 2).

A flipped bit in a pack must not leave every later snapshot unrestorable while the intact bytes
sit in the working tree. Repair, with no daemon holding the store:
  1. writes again each pack index that does not read (an index is derived from its pack);
  2. finds every damaged copy (a pack whose bytes no longer hash to its name has each of its
     objects re-read) and adds it to the `damaged` list (damaged_list.py), so no process
     reuses it by id again;
  3. stores again, from the working tree, every damaged object whose content is still there:
     the directory is walked as a snapshot would (same filter, so trees get the same ids) and
     only the objects wanted are written, into a new pack;
  4. moves each damaged pack aside (objects/damaged-packs/) after copying its sound objects
     into a new pack, so the store fscks clean;
  5. names each step that stays unrestorable and the paths it lacks.
"""

import os

from blake3 import blake3

from . import damaged_list, packs
from .capture import Capture
from .encoding import DIR, EXEC, FILE, decode_chunks, decode_tree
from .filter import Filter
from .ids import BLOB, CHUNKS, TREE, CorruptObject, object_id
from .objects import ObjectStore, StoreError
from .packs import IDX_ENTRY, PACK_MAGIC, RECORD
from .statcache import StatCache

ASIDE = "damaged-packs"
_NAMED = 10          # paths named per unrestorable step


def repair_store(project) -> list[str]:
    """What repair did and what stays lost, one line each (empty: nothing to say)."""
    path = project.state_path("objects")
    if not os.path.isdir(path):
        return []
    objects = ObjectStore(path)
    try:
        said, bad = _rebuild_indexes(objects)
        recheck_listed(objects)
        for pack_id, oids in _find_damage(objects).items():
            bad.setdefault(pack_id, set()).update(oids)
        for pack_id, oids in bad.items():
            for oid in oids:
                objects.quarantine(oid, [pack_id])
        said += _heal(objects, project)
        said += _set_aside(objects, bad)
        damaged_list.record(objects, set())        # drops the lines of packs set aside
        if bad or objects.damaged or objects.index_problems:     # else every step reads whole
            said += _unrestorable(objects, project)
    finally:
        objects.close()
    return said


# -- 1. indexes ---------------------------------------------------------------------------

def _rebuild_indexes(objects: ObjectStore) -> tuple[list[str], dict]:
    """Write again the index of every pack whose index did not load; -> (lines, {pack id:
    ids of its records that do not verify})."""
    said, bad = [], {}
    for sub in sorted(os.listdir(objects.packs_dir)):
        for name in sorted(os.listdir(os.path.join(objects.packs_dir, sub))):
            pack_id = name[:-len(".idx")]
            if not name.endswith(".idx") or pack_id in objects.pack_entries:
                continue
            try:
                with open(packs.pack_path(objects.packs_dir, pack_id, ".pack"), "rb") as f:
                    data = f.read()
            except OSError:
                continue            # the pack is gone: fsck names it, nothing to rebuild from
            entries, unsound = _records(data)
            if unsound:
                bad[pack_id] = unsound
            packs.write_file_atomically(objects.tmp_dir, packs.pack_path(objects.packs_dir, pack_id, ".idx"),
                                        packs.encode_index(pack_id, sorted(entries)))
            objects.add_pack(pack_id, sorted(entries))
            said.append(f"fsck: the index of pack {pack_id} was damaged: written again from the pack "
                        f"({len(entries)} object(s))")
    return said, bad


def _records(data: bytes) -> tuple[list[tuple], set[bytes]]:
    """(index entries of the records that verify, ids of those that do not). The scan starts
    after the magic whatever it holds, and stops where a record header no longer fits."""
    import zstandard
    zd = zstandard.ZstdDecompressor()
    entries, bad, pos = [], set(), len(PACK_MAGIC)
    while pos + RECORD.size <= len(data):
        oid, kind, flags, _, raw_len, stored_len = RECORD.unpack_from(data, pos)
        stored = data[pos + RECORD.size:pos + RECORD.size + stored_len]
        if len(stored) != stored_len or kind not in (BLOB, CHUNKS, TREE):
            break
        try:
            raw = zd.decompress(stored, max_output_size=raw_len) if flags & packs.FLAG_ZSTD else stored
            sound = len(raw) == raw_len and object_id(kind, raw) == oid
        except zstandard.ZstdError:
            sound = False
        if sound:
            entries.append(IDX_ENTRY.unpack(IDX_ENTRY.pack(oid, kind, flags, 0, pos, raw_len, stored_len)))
        else:
            bad.add(oid)
        pos += RECORD.size + stored_len
    return entries, bad


# -- 2. damaged copies --------------------------------------------------------------------

def recheck_listed(objects: ObjectStore) -> None:
    """Read again each copy the `damaged` list names in a pack this store has an index for;
    those that verify are dropped from the list and used again (a wrong line, a copy listed
    missing while its index was damaged and since written again)."""
    sound = set()
    for oid, pack_id in sorted(objects.bad_copies):
        for e in objects.pack_entries.get(pack_id, ()):
            if e[0] != oid:
                continue
            loc = (pack_id, e[4], e[1], e[2], e[5], e[6])
            try:
                objects._read(oid, loc)
            except (CorruptObject, StoreError):
                break
            sound.add((oid, pack_id))
            if oid not in objects.index:
                objects.index[oid] = loc
            break
    if sound:
        objects.bad_copies -= sound
        objects.damaged -= {oid for oid, _ in sound if oid in objects.index}
        damaged_list.forget(objects, sound)


def note_damage(objects: ObjectStore) -> None:
    """Add every damaged copy to the `damaged` list (plain fsck, after it found problems)."""
    for pack_id, oids in _find_damage(objects).items():
        for oid in oids:
            objects.quarantine(oid, [pack_id])


def _find_damage(objects: ObjectStore) -> dict:
    """{pack id: ids of its copies that do not read back} for every pack whose bytes do not
    hash to its name (a sound pack's objects are as they were written)."""
    out = {}
    for pack_id, entries in sorted(objects.pack_entries.items()):
        try:
            with open(packs.pack_path(objects.packs_dir, pack_id, ".pack"), "rb") as f:
                digest = blake3(f.read()).hexdigest()
        except OSError:
            continue
        if digest == pack_id:
            continue
        bad = set()
        for oid, kind, flags, _, offset, raw_len, stored_len in entries:
            try:
                objects._read(oid, (pack_id, offset, kind, flags, raw_len, stored_len))
            except (CorruptObject, StoreError):
                bad.add(oid)
        out[pack_id] = bad
    return out


# -- 3. healing from the working tree -----------------------------------------------------

class _OnlyWanted:
    """The object store as Capture sees it, writing only the objects in `wanted`."""

    def __init__(self, objects: ObjectStore, wanted: set):
        self.objects, self.wanted = objects, wanted

    def put(self, kind: int, data, oid: bytes | None = None) -> bytes:
        if oid is None:
            oid = object_id(kind, data)
        if oid in self.wanted:
            self.objects.put(kind, data, oid)
        return oid

    def has(self, oid: bytes) -> bool:
        return self.objects.has(oid)

    def remember_tree(self, oid: bytes, parts: list) -> None:
        pass


def _heal(objects: ObjectStore, project) -> list[str]:
    wanted = {oid for oid in objects.damaged if oid not in objects.index}
    if not wanted:
        return []
    try:
        Capture(_OnlyWanted(objects, wanted), _project_filter(project), StatCache(), None).root_tree(project.root)
        objects.flush()
    except OSError as e:
        objects.abort()
        return [f"fsck: {len(wanted)} damaged object(s); the working tree could not be read to store "
                f"them again ({e})"]
    healed = sum(1 for oid in wanted if oid in objects.index)
    return [f"fsck: {len(wanted)} damaged object(s) found; {healed} stored again from the working tree"]


def _project_filter(project) -> Filter:
    """The filter the daemon snapshots with, so a directory's tree gets the id it had."""
    from ..policy import PolicyError, load_policy
    try:
        pol = load_policy(project.policy)
    except (PolicyError, OSError):
        return Filter()
    return Filter(exclude=pol.snapshot_exclude, max_file_size=pol.max_file_size)


# -- 4. damaged packs set aside -----------------------------------------------------------

def _set_aside(objects: ObjectStore, bad: dict) -> list[str]:
    """Copy the sound objects of each damaged pack that no other pack holds into a new pack
    (sealed, with its index, before anything moves), then move the damaged pack aside: its
    index first (a pack without one is invisible), then the pack."""
    said = []
    aside = os.path.join(objects.path, ASIDE)
    for pack_id in sorted(bad):
        if pack_id not in objects.pack_entries:
            continue
        writer, copied = None, 0
        for oid, *_ in objects.pack_entries[pack_id]:
            loc = objects.index.get(oid)
            if loc is None or loc[0] != pack_id:
                continue                 # damaged, or read from another pack
            loc, stored = objects.read_record(oid)
            if writer is None:
                writer = packs.PackWriter(objects.tmp_dir, objects.packs_dir)
            writer.add(oid, loc[2], loc[3], loc[4], stored)
            copied += 1
        if writer is not None:
            objects.add_pack(*writer.seal())
        os.makedirs(aside, exist_ok=True)
        objects.forget_pack(pack_id)
        for ext in (".idx", ".pack"):
            try:
                os.rename(packs.pack_path(objects.packs_dir, pack_id, ext), os.path.join(aside, pack_id + ext))
            except FileNotFoundError:
                pass
        packs.fsync_dir(aside)
        packs.fsync_dir(os.path.dirname(packs.pack_path(objects.packs_dir, pack_id, ".pack")))
        said.append(f"fsck: pack {pack_id} was damaged ({len(bad[pack_id])} object(s) unreadable): its "
                    f"{copied} sound object(s) copied into a new pack, the damaged file kept as "
                    f".envgit/objects/{ASIDE}/{pack_id}.pack")
    return said


# -- 5. what stays lost -------------------------------------------------------------------

def _unrestorable(objects: ObjectStore, project) -> list[str]:
    import sqlite3

    from ..journal import Journal
    try:
        j = Journal(project.journal, readonly=True)
        try:
            dropped = j.dropped_snapshots()
            steps = [(s.id, s.snapshot["tree"]) for s in j.steps()
                     if s.id not in dropped and s.snapshot and s.snapshot.get("tree")]
        finally:
            j.close()
    except (sqlite3.DatabaseError, OSError):
        return []
    said: list[str] = []
    trees: dict[bytes, tuple] = {}
    files: dict[bytes, bool] = {}
    for n, tree in steps:
        lacks, count = _lacking(objects, bytes.fromhex(tree), trees, files)
        if count:
            names = ", ".join(os.fsdecode(p) or "/" for p in lacks[:_NAMED])
            more = f" and {count - _NAMED} more" if count > _NAMED else ""
            said.append(f"fsck: step {n} stays unrestorable: it lacks {names}{more} (`envgit restore "
                        f"{n} --target DIR` writes its other paths)")
    return said


def _lacking(objects: ObjectStore, root: bytes, trees: dict, files: dict) -> tuple[list, int]:
    """(paths under the tree whose content the store lacks, the first _NAMED; how many), each
    tree's answer kept in `trees` (steps share most of theirs). An explicit stack: a step
    chooses how deep its tree is."""
    stack = [[root, _entries(objects, root), 0, [], 0, b""]]
    while True:
        frame = stack[-1]
        oid, entries, i, out, count, _ = frame
        if entries is not None and i < len(entries):
            e = entries[i]
            frame[2] += 1
            if e.type == DIR:
                if e.oid not in trees:
                    stack.append([e.oid, _entries(objects, e.oid), 0, [], 0, e.name])
                    continue
                sub = trees[e.oid]
                _add(frame, e.name, sub)
            elif e.type in (FILE, EXEC) and not _whole(objects, e, files):
                _add(frame, e.name, ([b""], 1))
            continue
        result = (out, count) if entries is not None else ([b""], 1)
        trees[oid] = result
        stack.pop()
        if not stack:
            return result
        _add(stack[-1], frame[5], result)


def _add(frame: list, name: bytes, sub: tuple) -> None:
    paths, count = sub
    frame[4] += count
    room = _NAMED - len(frame[3])
    if room > 0:
        frame[3] += [name + b"/" + p if p else name for p in paths[:room]]


def _entries(objects: ObjectStore, oid: bytes):
    try:
        return decode_tree(objects.get(oid, TREE))
    except (CorruptObject, StoreError):
        return None


def _whole(objects: ObjectStore, e, files: dict) -> bool:
    if not e.chunked:
        return e.oid in objects.index
    if e.oid not in files:
        try:
            files[e.oid] = all(cid in objects.index for cid, _ in decode_chunks(objects.get(e.oid, CHUNKS)))
        except (CorruptObject, StoreError):
            files[e.oid] = False
    return files[e.oid]
