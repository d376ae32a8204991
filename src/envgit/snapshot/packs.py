"""Pack files and their indexes (docs/FORMAT.md, "Pack file", "Pack index").

A pack is appended to as a temporary file and becomes visible only when sealed: fsync, rename
into packs/, then the same for its index. A sealed pack is never written again.
"""

import errno
import os
import struct

from blake3 import blake3

from .. import faults
from .ids import ID_LEN

PACK_MAGIC = b"envgit-pack-1\n"
IDX_MAGIC = b"envgit-idx-1\n"
RECORD = struct.Struct(f"<{ID_LEN}sBBHII")        # id, kind, flags, reserved, raw len, stored len
IDX_ENTRY = struct.Struct(f"<{ID_LEN}sBBHQII")    # id, kind, flags, reserved, offset, raw, stored
FLAG_ZSTD = 1
SEAL_AT = 16 << 20
_FLUSH_AT = 1 << 20


class StoreFull(OSError):
    """The disk filled up while writing; the store is still valid (the partial pack is gone)."""


# Where an object lives: (pack id hex, offset of its record header, kind, flags, raw len, stored len).
# A plain tuple: a store holds hundreds of thousands of them.
Location = tuple[str, int, int, int, int, int]


def pack_path(packs_dir: str, pack_id: str, ext: str) -> str:
    return os.path.join(packs_dir, pack_id[:2], pack_id + ext)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(tmp_dir: str, final: str, data: bytes) -> None:
    """Write, fsync, rename, fsync the directory: `final` is either absent or complete."""
    tmp = os.path.join(tmp_dir, f"{os.getpid()}-{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.rename(tmp, final)
    except OSError as e:
        _remove_quietly(tmp)
        raise _full(e) from e
    fsync_dir(os.path.dirname(final))


class PackWriter:
    """One pack being written. Appends are buffered (one write syscall per ~1 MiB, not per object)."""

    def __init__(self, tmp_dir: str, packs_dir: str):
        self.tmp_dir, self.packs_dir = tmp_dir, packs_dir
        self.tmp_path = os.path.join(tmp_dir, f"{os.getpid()}-{os.urandom(6).hex()}.pack")
        self.fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.hasher = blake3()
        self.size = 0
        self.entries: list[tuple] = []      # IDX_ENTRY fields
        self.pending: set[bytes] = set()    # ids in this pack (not readable until sealed)
        self.buffer: list[bytes] = []
        self.buffered = 0
        self._append(PACK_MAGIC)

    def add(self, oid: bytes, kind: int, flags: int, raw_len: int, stored) -> None:
        self.entries.append((oid, kind, flags, 0, self.size, raw_len, len(stored)))
        self.pending.add(oid)
        self._append(RECORD.pack(oid, kind, flags, 0, raw_len, len(stored)))
        self._append(stored)

    def _append(self, data) -> None:
        self.buffer.append(data)
        self.buffered += len(data)
        self.size += len(data)
        if self.buffered >= _FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        pieces, self.buffer, self.buffered = self.buffer, [], 0
        try:
            _write_pieces(self.fd, pieces)       # writev: no joining copy of big chunks
        except OSError as e:
            self.abort()
            raise _full(e) from e
        for piece in pieces:
            self.hasher.update(piece)

    def seal(self) -> tuple[str, list[tuple]]:
        """Make the pack durable and visible; returns (pack id, index entries)."""
        self._flush()
        pack_id = self.hasher.hexdigest()
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            final = pack_path(self.packs_dir, pack_id, ".pack")
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.rename(self.tmp_path, final)
            fsync_dir(os.path.dirname(final))
        except OSError as e:
            self.abort()
            raise _full(e) from e
        entries = sorted(self.entries)
        faults.point("pack-sealed-no-index")     # a pack without its index: invisible, gc's
        write_file_atomically(self.tmp_dir, pack_path(self.packs_dir, pack_id, ".idx"),
                              encode_index(pack_id, entries))
        return pack_id, entries

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        _remove_quietly(self.tmp_path)


def encode_index(pack_id: str, entries: list[tuple]) -> bytes:
    body = b"".join([IDX_MAGIC, bytes.fromhex(pack_id), struct.pack("<I", len(entries))]
                    + [IDX_ENTRY.pack(*e) for e in entries])
    return body + blake3(body).digest()


def decode_index(data: bytes) -> tuple[str, list[tuple]]:
    """-> (pack id, entries); raises ValueError when the index is malformed or its checksum fails."""
    head = len(IDX_MAGIC) + ID_LEN + 4
    if len(data) < head + ID_LEN or not data.startswith(IDX_MAGIC):
        raise ValueError("not a pack index")
    body, checksum = data[:-ID_LEN], data[-ID_LEN:]
    if blake3(body).digest() != checksum:
        raise ValueError("index checksum mismatch")
    pack_id = data[len(IDX_MAGIC):len(IDX_MAGIC) + ID_LEN].hex()
    (count,) = struct.unpack_from("<I", data, head - 4)
    if len(body) - head != count * IDX_ENTRY.size:
        raise ValueError("index length does not match its count")
    return pack_id, list(IDX_ENTRY.iter_unpack(memoryview(body)[head:]))


def scan_pack(data: bytes):
    """Yield (offset, id, kind, flags, raw_len, stored bytes) of every record; ValueError if torn."""
    if not data.startswith(PACK_MAGIC):
        raise ValueError("not a pack file")
    pos = len(PACK_MAGIC)
    while pos < len(data):
        if pos + RECORD.size > len(data):
            raise ValueError(f"truncated record header at offset {pos}")
        oid, kind, flags, _, raw_len, stored_len = RECORD.unpack_from(data, pos)
        start = pos + RECORD.size
        if start + stored_len > len(data):
            raise ValueError(f"truncated record at offset {pos}")
        yield pos, oid, kind, flags, raw_len, data[start:start + stored_len]
        pos = start + stored_len


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_pieces(fd: int, pieces: list) -> None:
    views = [memoryview(p) for p in pieces]
    while views:
        n = os.writev(fd, views[:1024])          # IOV_MAX
        while views and n >= len(views[0]):
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]


def _full(e: OSError) -> OSError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(e.errno, "the disk is full: the snapshot was not stored (the store is "
                         "unchanged and valid; free some space and retry)", e.filename)
    return e


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
