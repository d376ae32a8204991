"""The object layer: put/get/has of content-addressed objects over pack files."""

import json
import os
import queue
import threading
from collections import OrderedDict

import zstandard

from . import damaged_list, missing, packs
from .ids import BLOB, CHUNKS, KIND_NAMES, TREE, CorruptObject, object_id, verify
from .packs import FLAG_ZSTD, RECORD, Location, StoreFull

FORMAT_VERSION = 1
_TINY = 64            # below this zstd cannot save 5%: store raw without trying
_MIN_SAVING = 0.95    # keep the compressed form only if it is at most 95% of the raw size
_SAMPLE = 64 << 10    # a big object whose first 64 KiB do not compress is stored raw untried
_BATCH_BYTES = 1 << 20
_BATCH_COUNT = 256
_THREAD_COMPRESSES = 256 << 10
_REMEMBERED_ENTRIES = 1 << 20   # entries of big trees kept for diffing (their bytes are shared)
# Pack files kept open for reading, least recently used closed first. Every step seals a pack
# and the daemon reads its trees back, so an unbounded cache held one descriptor per step for
# the daemon's life and hit the process's limit after ~20,000 steps (every later snapshot and
# rewind then failed with EMFILE).
MAX_OPEN_PACKS = 64


class StoreError(Exception):
    pass


class MissingObject(StoreError):
    pass


class ObjectStore:
    """Objects in packs under `path` (layout in docs/FORMAT.md). One writer at a time."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.packs_dir = os.path.join(self.path, "packs")
        self.tmp_dir = os.path.join(self.path, "tmp")
        os.makedirs(self.packs_dir, exist_ok=True)
        os.makedirs(self.tmp_dir, exist_ok=True)
        self._check_config()
        self.index: dict[bytes, Location] = {}
        self.pack_entries: dict[str, list[tuple]] = {}   # pack id -> its index entries
        self.index_problems: list[str] = []
        # Damaged copies, remembered across processes in the file `damaged` (one "<object id>
        # <pack id>" a line): a copy in that list is never in the index, so `has` says no and
        # the next snapshot holding that content stores it afresh, whoever found the damage
        # (a restore, fsck, another read). `damaged` holds their ids; `news` those that
        # a snapshot has not yet acted on (Store.snapshot, StatCache.forget_objects).
        self.damaged: set[bytes] = set()
        self.bad_copies: set[tuple[bytes, str]] = set()
        self.news: set[bytes] = set()
        self._damaged_stamp = None
        # Packs this process cannot read from (index unreadable, or pack gone): a miss reports
        # their objects as damaged copies (missing.py), once per pack.
        self.unusable_packs: dict[str, list | None] = {}
        self.reported_packs: set[str] = set()
        self.rescanned_at = float("-inf")
        self._load_indexes()
        self.refresh_damaged()
        self._fds: OrderedDict[str, int] = OrderedDict()     # pack id -> fd, oldest use first
        self._fd_lock = threading.Lock()    # an fd is only used under it: eviction closes fds
        self._zd = zstandard.ZstdDecompressor()
        self._zc = _compressor()     # the caller's thread (small objects)
        self.written_objects = self.written_bytes = 0   # counters for a snapshot's stats
        # Writing: the caller hashes (it needs the id at once); a background thread compresses,
        # appends and seals, so disk and zstd time overlap with reading and chunking. The
        # thread takes batches in order, so records land in the order they were put.
        self._pending: set[bytes] = set()      # put but not yet known sealed (main thread only)
        self._batch: list[tuple] = []
        self._batch_bytes = 0
        self._thread: _PackThread | None = None
        # Big trees by id -> [their entries' bytes, that as a frozenset or None]: a diff of two
        # versions of a 40k-entry directory is then a set difference, not two decodes.
        self._trees: OrderedDict[bytes, list] = OrderedDict()
        self._trees_entries = 0

    # -- layout ---------------------------------------------------------------------------
    def _check_config(self) -> None:
        config = os.path.join(self.path, "config")
        try:
            with open(config, "rb") as f:
                meta = json.load(f)
        except FileNotFoundError:
            meta = {"format": "envgit-store", "version": FORMAT_VERSION}
            packs.write_file_atomically(self.tmp_dir, config, json.dumps(meta).encode() + b"\n")
        except ValueError as e:
            raise StoreError(f"{config}: not an envgit store config ({e})") from None
        if meta.get("format") != "envgit-store" or meta.get("version") != FORMAT_VERSION:
            raise StoreError(f"{config}: unsupported store format {meta!r} "
                             f"(this envgit reads version {FORMAT_VERSION})")

    def _load_indexes(self) -> None:
        for sub in sorted(os.listdir(self.packs_dir)):
            d = os.path.join(self.packs_dir, sub)
            for name in sorted(os.listdir(d)):
                if name.endswith(".idx"):
                    self._load_index(os.path.join(d, name), name[:-4])

    def _load_index(self, path: str, pack_id: str) -> None:
        try:
            with open(path, "rb") as f:
                found_id, entries = packs.decode_index(f.read())
            if found_id != pack_id:
                raise ValueError(f"names pack {found_id}")
        except (OSError, ValueError) as e:
            self.index_problems.append(f"pack index {pack_id}: {e}")
            if os.path.exists(packs.pack_path(self.packs_dir, pack_id, ".pack")):
                missing.unusable(self, pack_id)
            return
        if not os.path.exists(packs.pack_path(self.packs_dir, pack_id, ".pack")):
            self.index_problems.append(f"pack {pack_id}: missing (its index lists {len(entries)} objects)")
            missing.unusable(self, pack_id, entries)
            return
        self.add_pack(pack_id, entries)

    def add_pack(self, pack_id: str, entries: list[tuple]) -> None:
        self.pack_entries[pack_id] = entries
        index = self.index
        bad = self.bad_copies
        for oid, kind, flags, _, offset, raw_len, stored_len in entries:
            if bad and (oid, pack_id) in bad:
                continue                 # a copy found damaged: never read again
            index[oid] = (pack_id, offset, kind, flags, raw_len, stored_len)

    # -- writing --------------------------------------------------------------------------
    def has(self, oid: bytes) -> bool:
        return oid in self.index or oid in self._pending

    def put(self, kind: int, data, oid: bytes | None = None) -> bytes:
        """Store `data` as an object of `kind` (no-op if present); returns its id. The object is
        durable and readable after flush()."""
        if oid is None:
            oid = object_id(kind, data)
        if oid in self.index or oid in self._pending:
            return oid
        self._pending.add(oid)
        # Small objects are compressed here: handing each to the thread costs more than zstd.
        stored, flags = stored_form(self._zc, data) if len(data) < _THREAD_COMPRESSES else (data, None)
        self._batch.append((oid, kind, len(data), stored, flags))
        self._batch_bytes += len(data)
        if self._batch_bytes >= _BATCH_BYTES or len(self._batch) >= _BATCH_COUNT:
            self._send()
        return oid

    def _send(self) -> None:
        if self._thread is None:
            self._thread = _PackThread(self)
        self._thread.check()
        self._thread.jobs.put(self._batch)
        self._batch, self._batch_bytes = [], 0

    def flush(self) -> None:
        """Seal what was put: its objects become durable and readable. Raises what writing met
        (StoreFull for a full disk); the unsealed objects are then dropped."""
        if self._batch:
            self._send()
        if self._thread is not None:
            try:
                self._thread.barrier(seal=True)
            finally:
                self._pending.clear()

    def abort(self) -> None:
        """Drop what was put but not sealed (after an error): those objects were never visible."""
        self._batch, self._batch_bytes = [], 0
        if self._thread is not None:
            try:
                self._thread.barrier(seal=False)
            except Exception:
                pass
        self._pending.clear()

    # -- remembered trees -----------------------------------------------------------------
    def remember_tree(self, oid: bytes, parts: list) -> None:
        """Keep a big tree's entry bytes (encoding.encode_entry each, in order) for tree_parts()."""
        if oid in self._trees:
            self._trees.move_to_end(oid)
            return
        self._trees[oid] = [parts, None]
        self._trees_entries += len(parts)
        while self._trees_entries > _REMEMBERED_ENTRIES and len(self._trees) > 1:
            _, (old, _) = self._trees.popitem(last=False)
            self._trees_entries -= len(old)

    def tree_entry_set(self, oid: bytes) -> frozenset | None:
        """The entries' bytes of a remembered tree, as a set (None: not remembered)."""
        held = self._trees.get(oid)
        if held is None or not self.has(oid):
            return None
        self._trees.move_to_end(oid)
        if held[1] is None:
            held[1] = frozenset(held[0])
        return held[1]

    # -- reading --------------------------------------------------------------------------
    def get(self, oid: bytes, kind: int | None = None) -> bytes:
        """The object's bytes, re-hashed; CorruptObject if they do not match the id.

        A damaged copy is never used twice: another copy in another pack (gc and a re-put can
        leave two) is used instead if it is sound; if none is, the object is dropped from the
        index (`quarantine`), so the next snapshot of the same content stores it afresh
        instead of pointing at the damaged copy again."""
        if oid in self._pending:
            self.flush()
        loc = self.index.get(oid)
        if loc is None:
            loc = missing.find_late(self, oid)
        if loc is None:
            missing.report(self)      # the daemon may still hold it: it must stop reusing it
            raise MissingObject(f"object {oid.hex()} is not in the store")
        if kind is not None and loc[2] != kind:
            raise CorruptObject(f"object {oid.hex()} is a {KIND_NAMES.get(loc[2], loc[2])}, "
                                f"expected a {KIND_NAMES[kind]}")
        try:
            return self._read(oid, loc)
        except (CorruptObject, MissingObject):       # (missing: its pack file is gone)
            bad = [loc[0]]
            for other in self._other_copies(oid, loc[0]):
                try:
                    data = self._read(oid, other)
                except MissingObject:
                    continue
                except CorruptObject:
                    bad.append(other[0])
                    continue
                self.index[oid] = other
                self.quarantine(oid, bad)
                return data
            self.quarantine(oid, bad)
            raise

    def quarantine(self, oid: bytes, pack_ids=()) -> None:
        """Forget a damaged object's copies in `pack_ids` (all of them if none are named): the
        index moves to another copy if there is one, else `has` says no, so the content is
        stored again when next seen. The damaged copies are added to the `damaged` file."""
        if not pack_ids:
            loc = self.index.get(oid)
            pack_ids = [loc[0]] if loc is not None else []
        self.quarantine_copies({(oid, p) for p in pack_ids})
        if oid not in self.index:
            self.damaged.add(oid)
            self.news.add(oid)

    def quarantine_copies(self, copies: set[tuple[bytes, str]]) -> None:
        """Forget these (object id, pack id) copies and add them to the `damaged` file at once."""
        copies = set(copies) - self.bad_copies
        self._drop_copies(copies)
        lost = {oid for oid, _ in copies if oid not in self.index}
        self.damaged |= lost
        self.news |= lost
        if copies:
            damaged_list.record(self, copies)

    def refresh_damaged(self) -> set[bytes]:
        """Read the `damaged` file again if another process changed it (one stat when none
        did); drops the copies it names from the index. Returns the ids now without a copy."""
        copies = damaged_list.read_if_changed(self)
        if not copies:
            return set()
        new = copies - self.bad_copies
        self._drop_copies(new)
        lost = {oid for oid, _ in new if oid not in self.index}
        self.damaged |= lost
        self.news |= lost
        return lost

    def _drop_copies(self, copies: set) -> None:
        self.bad_copies |= copies
        for oid, pack_id in copies:
            loc = self.index.get(oid)
            if loc is None or loc[0] != pack_id:
                continue
            others = [o for o in self._other_copies(oid, pack_id) if (oid, o[0]) not in self.bad_copies]
            if others:
                self.index[oid] = others[0]
            else:
                del self.index[oid]

    def take_news(self) -> set[bytes]:
        """The damaged ids learnt since the last call, still without a sound copy."""
        news, self.news = self.news, set()
        return {oid for oid in news if oid not in self.index}

    def _other_copies(self, oid: bytes, but: str) -> list:
        return [(pid, e[4], e[1], e[2], e[5], e[6]) for pid, entries in self.pack_entries.items()
                if pid != but for e in entries if e[0] == oid]

    def _read(self, oid: bytes, loc: Location) -> bytes:
        pack_id, offset, okind, flags, raw_len, stored_len = loc
        record = self._pread(pack_id, RECORD.size + stored_len, offset)
        if len(record) != RECORD.size + stored_len or record[:32] != oid:
            raise CorruptObject(f"object {oid.hex()}: pack {pack_id} is damaged at offset {offset}")
        data = record[RECORD.size:]
        if flags & FLAG_ZSTD:
            try:
                data = self._zd.decompress(data, max_output_size=raw_len)
            except zstandard.ZstdError as e:
                raise CorruptObject(f"object {oid.hex()}: cannot decompress ({e})") from None
        if len(data) != raw_len:
            raise CorruptObject(f"object {oid.hex()}: wrong length")
        verify(okind, oid, data)
        return data

    def read_record(self, oid: bytes) -> tuple[Location, bytes]:
        """The stored (possibly compressed) bytes as they are in the pack, unverified (gc copies
        them after get() verified the same copy)."""
        loc = self.index[oid]
        return loc, self._pread(loc[0], loc[5], loc[1] + RECORD.size)

    def _pread(self, pack_id: str, n: int, offset: int) -> bytes:
        """`n` bytes of pack `pack_id` at `offset`; the fd is held under the lock, so no other
        thread closes it (or reuses its number) in between."""
        with self._fd_lock:
            return os.pread(self._fd(pack_id), n, offset)

    def _fd(self, pack_id: str) -> int:
        """The pack's open fd (caller holds _fd_lock); at most MAX_OPEN_PACKS stay open."""
        fd = self._fds.get(pack_id)
        if fd is not None:
            self._fds.move_to_end(pack_id)
            return fd
        try:
            fd = os.open(packs.pack_path(self.packs_dir, pack_id, ".pack"), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingObject(f"pack {pack_id} is gone (its index is still there); "
                                "the objects it held are missing") from None
        self._fds[pack_id] = fd
        while len(self._fds) > MAX_OPEN_PACKS:
            os.close(self._fds.popitem(last=False)[1])
        return fd

    def open_packs(self) -> int:
        """How many pack files are open for reading now (bounded by MAX_OPEN_PACKS)."""
        return len(self._fds)

    def forget_pack(self, pack_id: str) -> None:
        with self._fd_lock:
            fd = self._fds.pop(pack_id, None)
            if fd is not None:
                os.close(fd)
        for entry in self.pack_entries.pop(pack_id, ()):
            loc = self.index.get(entry[0])
            if loc is not None and loc[0] == pack_id:
                del self.index[entry[0]]

    def close(self) -> None:
        self.flush()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=3, write_checksum=False, write_content_size=True)


def stored_form(zc: zstandard.ZstdCompressor, data) -> tuple[bytes, int]:
    """(bytes to store, flags): compressed when that saves at least 5%."""
    if len(data) < _TINY or (len(data) > 4 * _SAMPLE and not _saves(zc, data[:_SAMPLE])):
        return data, 0
    packed = zc.compress(data)
    if len(packed) <= len(data) * _MIN_SAVING:
        return packed, FLAG_ZSTD
    return data, 0


def _saves(zc, sample) -> bool:
    return len(zc.compress(sample)) <= len(sample) * _MIN_SAVING


class _PackThread:
    """The one thread that appends to packs. Errors are kept and raised in the caller's thread."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self.jobs: queue.Queue = queue.Queue(maxsize=16)    # bounded: at most ~16 MiB in flight
        self.error: BaseException | None = None
        self.writer: packs.PackWriter | None = None
        self.zc = _compressor()
        self.thread = threading.Thread(target=self._run, name="envgit-packs", daemon=True)
        self.thread.start()

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def barrier(self, seal: bool) -> None:
        """Wait until everything sent is written; then seal (or drop) the open pack."""
        done = threading.Event()
        self.jobs.put(("barrier", seal, done))
        done.wait()
        self.check()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if isinstance(job, tuple):
                _, seal, done = job
                try:
                    if seal and self.error is None:
                        self._seal()
                except BaseException as e:
                    self.error = e
                finally:
                    self._drop()
                    done.set()
                continue
            if self.error is not None:
                continue                      # discard until the caller sees the error
            try:
                for item in job:
                    self._append(*item)
            except BaseException as e:
                self.error = e
                self._drop()

    def _append(self, oid: bytes, kind: int, raw_len: int, stored, flags: int | None) -> None:
        objects = self.objects
        if flags is None:
            stored, flags = stored_form(self.zc, stored)
        if self.writer is None:
            self.writer = packs.PackWriter(objects.tmp_dir, objects.packs_dir)
        try:
            self.writer.add(oid, kind, flags, raw_len, stored)
        except OSError:
            self.writer = None                # it removed its temporary file
            raise
        objects.written_bytes += len(stored)
        objects.written_objects += 1
        if self.writer.size >= packs.SEAL_AT:
            self._seal()

    def _seal(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            self.objects.add_pack(*writer.seal())

    def _drop(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.abort()


__all__ = ["ObjectStore", "StoreError", "MissingObject", "CorruptObject", "StoreFull", "BLOB", "CHUNKS", "TREE"]
