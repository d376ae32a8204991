"""Object kinds and ids: BLAKE3, one hash mode per kind (docs/FORMAT.md, "Object ids")."""

from blake3 import blake3

BLOB, CHUNKS, TREE = 1, 2, 3
KIND_NAMES = {BLOB: "blob", CHUNKS: "chunk index", TREE: "tree"}

# derive_key contexts: they separate the kinds, so a file whose bytes happen to be a valid tree
# encoding still gets a different id than that tree.
_CONTEXTS = {CHUNKS: "envgit 2025-12 chunk index v1", TREE: "envgit 2025-12 tree v1"}

# blake3's own threads pay off only on big inputs (measured: no gain at 1 MiB on 2 cores).
_THREADED_FROM = 8 << 20

ID_LEN = 32


class CorruptObject(Exception):
    """An object's bytes do not hash to its id (or cannot be decoded)."""


def object_id(kind: int, data) -> bytes:
    """The 32-byte id of an object of this kind with these bytes."""
    if kind == BLOB:
        threads = blake3.AUTO if len(data) >= _THREADED_FROM else 1
        return blake3(data, max_threads=threads).digest()
    return blake3(data, derive_key_context=_CONTEXTS[kind]).digest()


def verify(kind: int, oid: bytes, data) -> None:
    if object_id(kind, data) != oid:
        raise CorruptObject(f"{KIND_NAMES.get(kind, kind)} {oid.hex()}: content does not match its id")
