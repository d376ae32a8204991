"""The object layer: put/get/has of content-addressed objects over pack files."""

import json
import os

import zstandard

from . import packs
from .ids import BLOB, CHUNKS, KIND_NAMES, TREE, CorruptObject, object_id, verify
from .packs import FLAG_ZSTD, RECORD, Location, StoreFull

FORMAT_VERSION = 1
_TINY = 64            # below this zstd cannot save 5%: store raw without trying
_MIN_SAVING = 0.95    # keep the compressed form only if it is at most 95% of the raw size


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
        self._load_indexes()
        self._writer: packs.PackWriter | None = None
        self._fds: dict[str, int] = {}
        self._zc = zstandard.ZstdCompressor(level=3, write_checksum=False, write_content_size=True)
        self._zd = zstandard.ZstdDecompressor()
        self.written_objects = self.written_bytes = 0   # counters for a snapshot's stats

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
            raise StoreError(f"{config}: unsupported store format {meta!r} (this envgit reads version {FORMAT_VERSION})")

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
            return
        if not os.path.exists(packs.pack_path(self.packs_dir, pack_id, ".pack")):
            self.index_problems.append(f"pack {pack_id}: missing (its index lists {len(entries)} objects)")
            return
        self.add_pack(pack_id, entries)

    def add_pack(self, pack_id: str, entries: list[tuple]) -> None:
        self.pack_entries[pack_id] = entries
        index = self.index
        for oid, kind, flags, _, offset, raw_len, stored_len in entries:
            index[oid] = (pack_id, offset, kind, flags, raw_len, stored_len)

    # -- writing --------------------------------------------------------------------------
    def has(self, oid: bytes) -> bool:
        return oid in self.index or (self._writer is not None and oid in self._writer.pending)

    def put(self, kind: int, data, oid: bytes | None = None) -> bytes:
        """Store `data` as an object of `kind` (no-op if present); returns its id."""
        if oid is None:
            oid = object_id(kind, data)
        if self.has(oid):
            return oid
        stored, flags = data, 0
        if len(data) >= _TINY:
            packed = self._zc.compress(data)
            if len(packed) <= len(data) * _MIN_SAVING:
                stored, flags = packed, FLAG_ZSTD
        if self._writer is None:
            self._writer = packs.PackWriter(self.tmp_dir, self.packs_dir)
        try:
            self._writer.add(oid, kind, flags, len(data), stored)
        except OSError:
            self._writer = None          # it removed its temporary file
            raise
        self.written_bytes += len(stored)
        self.written_objects += 1
        if self._writer.size >= packs.SEAL_AT:
            self.flush()
        return oid

    def flush(self) -> None:
        """Seal the pack being written, if any: its objects become durable and readable."""
        writer, self._writer = self._writer, None
        if writer is not None:
            pack_id, entries = writer.seal()
            self.add_pack(pack_id, entries)

    def abort(self) -> None:
        """Drop the unsealed pack (after an error): its objects were never visible."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()

    # -- reading --------------------------------------------------------------------------
    def get(self, oid: bytes, kind: int | None = None) -> bytes:
        """The object's bytes, re-hashed; CorruptObject if they do not match the id."""
        if self._writer is not None and oid in self._writer.pending:
            self.flush()
        loc = self.index.get(oid)
        if loc is None:
            raise MissingObject(f"object {oid.hex()} is not in the store")
        pack_id, offset, okind, flags, raw_len, stored_len = loc
        if kind is not None and okind != kind:
            raise CorruptObject(f"object {oid.hex()} is a {KIND_NAMES.get(okind, okind)}, "
                                f"expected a {KIND_NAMES[kind]}")
        record = os.pread(self._fd(pack_id), RECORD.size + stored_len, offset)
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
        """The stored (possibly compressed) bytes as they are in the pack, unverified (gc copies them)."""
        loc = self.index[oid]
        return loc, os.pread(self._fd(loc[0]), loc[5], loc[1] + RECORD.size)

    def _fd(self, pack_id: str) -> int:
        fd = self._fds.get(pack_id)
        if fd is None:
            fd = self._fds[pack_id] = os.open(packs.pack_path(self.packs_dir, pack_id, ".pack"), os.O_RDONLY)
        return fd

    def forget_pack(self, pack_id: str) -> None:
        fd = self._fds.pop(pack_id, None)
        if fd is not None:
            os.close(fd)
        for entry in self.pack_entries.pop(pack_id, ()):
            loc = self.index.get(entry[0])
            if loc is not None and loc[0] == pack_id:
                del self.index[entry[0]]

    def close(self) -> None:
        self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


__all__ = ["ObjectStore", "StoreError", "MissingObject", "CorruptObject", "StoreFull", "BLOB", "CHUNKS", "TREE"]
