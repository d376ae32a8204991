"""Byte encodings of trees and chunk indexes (docs/FORMAT.md, "Tree", "Chunked file index")."""

import struct
from typing import NamedTuple

from .ids import ID_LEN, CorruptObject

FILE, EXEC, SYMLINK, DIR = 1, 2, 3, 4
TYPE_NAMES = {FILE: "file", EXEC: "exec", SYMLINK: "symlink", DIR: "dir"}
FLAG_CHUNKED = 1

TREE_MAGIC = b"envgit-tree-1\n"
CHUNKS_MAGIC = b"envgit-chunks-1\n"

_NAME_LEN = struct.Struct("<H")
_FIXED = struct.Struct("<BBHQ")   # type, flags, mode, size
_CHUNK = struct.Struct(f"<{ID_LEN}sI")


class Entry(NamedTuple):
    """One name in a directory. `oid` is the content id (files, dirs); `target` the link (symlinks).
    A tuple, not a dataclass: a snapshot makes one per file it re-encodes (4x cheaper to build)."""
    name: bytes
    type: int
    mode: int
    size: int
    oid: bytes | None = None
    chunked: bool = False
    target: bytes | None = None


def encode_entry(name: bytes, typ: int, mode: int, size: int, oid: bytes | None = None,
                 chunked: bool = False, target: bytes | None = None) -> bytes:
    """One entry's bytes in a tree (a tree is TREE_MAGIC and its entries' bytes in name order).
    A symlink needs its `target`, anything else its `oid` (TypeError without, as joining None
    would raise)."""
    if typ == SYMLINK:
        if target is None:
            raise TypeError(f"symlink entry {name!r} without a target")
        return b"".join((_NAME_LEN.pack(len(name)), name, _FIXED.pack(SYMLINK, 0, mode, len(target)), target))
    if oid is None:
        raise TypeError(f"{TYPE_NAMES.get(typ, typ)} entry {name!r} without a content id")
    return b"".join((_NAME_LEN.pack(len(name)), name,
                     _FIXED.pack(typ, FLAG_CHUNKED if chunked else 0, mode, size), oid))


def encode_tree(entries: list[Entry]) -> bytes:
    """`entries` must already be sorted by name (the caller sorts once, while listing). An
    Entry's fields are encode_entry's arguments, in order."""
    return TREE_MAGIC + b"".join([encode_entry(*e) for e in entries])


def decode_tree(data: bytes, parts: list | None = None) -> list[Entry]:
    """Parse and validate a tree; raises CorruptObject on any malformation. With `parts`, each
    entry's own bytes (as encode_entry makes them) are appended to it as well."""
    if not data.startswith(TREE_MAGIC):
        raise CorruptObject("tree: bad magic")
    entries: list[Entry] = []
    pos, prev = len(TREE_MAGIC), None
    start = pos
    try:
        while pos < len(data):
            if parts is not None and entries:
                parts.append(data[start:pos])
            start = pos
            (nlen,) = _NAME_LEN.unpack_from(data, pos)
            pos += 2
            name = data[pos:pos + nlen]
            pos += nlen
            typ, flags, mode, size = _FIXED.unpack_from(data, pos)
            pos += _FIXED.size
            if len(name) != nlen or not name or b"/" in name or b"\0" in name or name in (b".", b".."):
                raise CorruptObject(f"tree: bad name {name!r}")
            if prev is not None and name <= prev:
                raise CorruptObject(f"tree: entries not sorted at {name!r}")
            if typ == SYMLINK:
                target = data[pos:pos + size]
                pos += size
                if len(target) != size or flags:
                    raise CorruptObject(f"tree: bad symlink {name!r}")
                entries.append(Entry(name, typ, mode, size, target=target))
            elif typ in (FILE, EXEC, DIR):
                oid = data[pos:pos + ID_LEN]
                pos += ID_LEN
                if len(oid) != ID_LEN or flags & ~FLAG_CHUNKED or (typ == DIR and flags):
                    raise CorruptObject(f"tree: bad entry {name!r}")
                entries.append(Entry(name, typ, mode, size, oid, bool(flags & FLAG_CHUNKED)))
            else:
                raise CorruptObject(f"tree: unknown type {typ} for {name!r}")
            prev = name
    except struct.error:
        raise CorruptObject("tree: truncated") from None
    if parts is not None and entries:
        parts.append(data[start:pos])
    return entries


def encode_chunks(chunks: list[tuple[bytes, int]]) -> bytes:
    return CHUNKS_MAGIC + b"".join(_CHUNK.pack(oid, n) for oid, n in chunks)


def decode_chunks(data: bytes) -> list[tuple[bytes, int]]:
    body = memoryview(data)[len(CHUNKS_MAGIC):]
    if not data.startswith(CHUNKS_MAGIC) or len(body) % _CHUNK.size or not body:
        raise CorruptObject("chunk index: malformed")
    return [(bytes(oid), n) for oid, n in _CHUNK.iter_unpack(body)]
