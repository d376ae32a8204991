"""fsck (verify everything) and gc (drop what no kept root reaches)."""

import os
from typing import cast

import zstandard
from blake3 import blake3

from .. import faults
from . import packs
from .encoding import DIR, EXEC, FILE, decode_chunks, decode_tree
from .ids import BLOB, CHUNKS, KIND_NAMES, TREE, CorruptObject, object_id
from .objects import MissingObject, ObjectStore, StoreError
from .packs import FLAG_ZSTD


def fsck(objects: ObjectStore, root_ids: list[bytes], progress=None) -> list[str]:
    """Human-readable problems; empty when every pack, object and given root is sound.
    `progress(done_packs, total_packs)` after each pack re-hashed."""
    problems = list(objects.index_problems)
    packs_ = sorted(objects.pack_entries.items())
    for n, (pack_id, entries) in enumerate(packs_, 1):
        problems += _check_pack(objects, pack_id, entries)
        if progress:
            progress(n, len(packs_))
    problems += _check_reachable(objects, root_ids)
    return problems


def _check_pack(objects: ObjectStore, pack_id: str, entries: list[tuple]) -> list[str]:
    path = packs.pack_path(objects.packs_dir, pack_id, ".pack")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return [f"pack {pack_id}: cannot read ({e})"]
    problems = []
    if blake3(data).hexdigest() != pack_id:
        problems.append(f"pack {pack_id}: its content does not match its name (the file is damaged)")
    listed = {e[4]: e for e in entries}        # offset -> index entry
    zd = zstandard.ZstdDecompressor()
    try:
        records = list(packs.scan_pack(data))
    except ValueError as e:
        return problems + [f"pack {pack_id}: {e}"]
    for offset, oid, kind, flags, raw_len, stored in records:
        entry = listed.pop(offset, None)
        if entry is None or entry[:3] != (oid, kind, flags) or entry[5:] != (raw_len, len(stored)):
            problems.append(f"pack {pack_id}: record at offset {offset} does not match the index")
            continue
        try:
            raw = zd.decompress(stored, max_output_size=raw_len) if flags & FLAG_ZSTD else stored
        except zstandard.ZstdError:
            raw = b""
        if len(raw) != raw_len or object_id(kind, raw) != oid:
            problems.append(f"{KIND_NAMES.get(kind, kind)} {oid.hex()} in pack {pack_id} at offset "
                            f"{offset}: content does not match its id (corrupt)")
    for offset, entry in sorted(listed.items()):
        problems.append(f"pack {pack_id}: the index lists {entry[0].hex()} at offset {offset}, "
                        "the pack has no such record")
    return problems


def _check_reachable(objects: ObjectStore, root_ids: list[bytes]) -> list[str]:
    problems: list[str] = []
    try:
        mark(objects, root_ids, problems)
    except StoreError as e:
        problems.append(str(e))
    return problems


def mark(objects: ObjectStore, root_ids: list[bytes], problems: list | None = None) -> set[bytes]:
    """Every id reachable from the roots. With `problems`, records what is missing or broken and
    goes on; without, raises at the first."""
    seen: set[bytes] = set()
    todo = [(rid, TREE, "root") for rid in root_ids]
    while todo:
        oid, kind, where = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        try:
            if kind == BLOB:
                if oid not in objects.index:
                    raise MissingObject(f"blob {oid.hex()} is not in the store")
                continue
            data = objects.get(oid, kind)
            if kind == TREE:
                for e in decode_tree(data):
                    name = os.fsdecode(e.name)
                    path = f"{where}/{name}" if where != "root" else name
                    # (decode_tree gives every entry but a symlink its oid: the casts only
                    # tell mypy so)
                    if e.type == DIR:
                        todo.append((cast(bytes, e.oid), TREE, path))
                    elif e.type in (FILE, EXEC):
                        todo.append((cast(bytes, e.oid), CHUNKS if e.chunked else BLOB, path))
            else:
                chunks = decode_chunks(data)
                todo += [(cid, BLOB, where) for cid, _ in chunks]
        except (CorruptObject, MissingObject) as e:
            if problems is None:
                raise
            problems.append(f"{where}: {e}")
    return seen


def gc(objects: ObjectStore, keep_root_ids: list[bytes], progress=None) -> int:
    """Drop every object no kept root reaches; returns the bytes freed.

    Crash-safe whatever order kills and reruns come in, by construction (docs/FORMAT.md,
    crash-safety rule 4):
      - a pack every object of which is live, and the copy the index reads, stays as it is. A
        rerun after a kill therefore keeps the packs the killed run wrote, and should it write
        one again byte for byte (same name), that pack is never deleted;
      - an object with copies in several packs (a crash, a quarantined copy stored again) is
        read back first, so the index names a sound copy and the damaged one goes;
      - the live objects of the other packs that no staying pack holds are copied into new
        packs, sealed with their indexes, before anything is deleted;
      - a pack is deleted only after checking that every live object in it is held by a pack
        that stays; its index goes first, then the pack.
    """
    objects.flush()
    live = mark(objects, keep_root_ids)      # raises if a kept root is damaged: delete nothing then
    before = _store_bytes(objects)
    pack_ids = sorted(objects.pack_entries)
    _prefer_sound_copies(objects, live)
    index = objects.index
    whole = {p for p in pack_ids
             if all(e[0] in live and index.get(e[0], ("",))[0] == p for e in objects.pack_entries[p])}
    held = {e[0] for p in whole for e in objects.pack_entries[p]}
    doomed, written, writer = [], set(), None
    for n, pack_id in enumerate(pack_ids, 1):
        if pack_id not in whole:
            doomed.append(pack_id)
            for oid, *_ in objects.pack_entries[pack_id]:
                if oid not in live or oid in held:
                    continue
                held.add(oid)
                objects.get(oid)                   # re-verify before copying
                loc, stored = objects.read_record(oid)
                if writer is None:
                    writer = packs.PackWriter(objects.tmp_dir, objects.packs_dir)
                writer.add(oid, loc[2], loc[3], loc[4], stored)
                if writer.size >= packs.SEAL_AT:
                    written.add(_seal(objects, writer))
                    writer = None
        if progress:
            progress(n, len(pack_ids))
    if writer is not None:
        written.add(_seal(objects, writer))
    doomed = [p for p in doomed if p not in written]
    _check_nothing_live_is_lost(objects, live, doomed)
    faults.point("gc-sealed")
    for pack_id in doomed:
        objects.forget_pack(pack_id)
        for ext in (".idx", ".pack"):
            try:
                os.unlink(packs.pack_path(objects.packs_dir, pack_id, ext))
            except FileNotFoundError:
                pass
            faults.point("gc-deleted-" + ext[1:])
    _drop_leftovers(objects)
    return before - _store_bytes(objects)


def _prefer_sound_copies(objects: ObjectStore, live: set) -> None:
    """Read every live object that has more than one copy: get() moves the index to a sound
    copy when the one it names is damaged (and raises if none is: gc then deletes nothing)."""
    seen: set[bytes] = set()
    doubled: set[bytes] = set()
    for entries in objects.pack_entries.values():
        for e in entries:
            (doubled if e[0] in seen else seen).add(e[0])
    for oid in doubled & live:
        objects.get(oid)


def _seal(objects: ObjectStore, writer: packs.PackWriter) -> str:
    pack_id, entries = writer.seal()
    objects.add_pack(pack_id, entries)
    return pack_id


def _check_nothing_live_is_lost(objects: ObjectStore, live: set, doomed: list[str]) -> None:
    """The last check before gc deletes: every live object of a doomed pack is in a staying one."""
    gone = set(doomed)
    staying = {e[0] for p, entries in objects.pack_entries.items() if p not in gone for e in entries}
    lost = {e[0] for p in doomed for e in objects.pack_entries[p] if e[0] in live and e[0] not in staying}
    if lost:
        raise StoreError(f"gc stopped before deleting anything: {len(lost)} live object(s) (e.g. "
                         f"{min(lost).hex()}) would have no copy left")


def _drop_leftovers(objects: ObjectStore) -> None:
    """Packs that never got an index (a writer crashed between the renames) and temp files.
    A pack whose index is there but unreadable is kept: fsck names it, and the pack may be
    all that is left of what it holds."""
    for name in os.listdir(objects.tmp_dir):
        os.unlink(os.path.join(objects.tmp_dir, name))
        faults.point("gc-deleted-tmp")
    for sub in os.listdir(objects.packs_dir):
        d = os.path.join(objects.packs_dir, sub)
        names = set(os.listdir(d))
        for name in names:
            if name.endswith(".pack") and name[:-5] + ".idx" not in names \
                    and name[:-5] not in objects.pack_entries:
                os.unlink(os.path.join(d, name))
                faults.point("gc-deleted-orphan-pack")


def _store_bytes(objects: ObjectStore) -> int:
    total = 0
    for sub in os.listdir(objects.packs_dir):
        d = os.path.join(objects.packs_dir, sub)
        total += sum(os.stat(os.path.join(d, name)).st_size for name in os.listdir(d))
    return total
