"""git's objects read from a snapshot's files, for the git view (snapshot/gitview.py): a stored
file read at offsets (only the chunks a read touches are fetched, so a 1 GiB pack is not restored
to find one commit), loose objects (zlib), packs through their `.idx` (v1 and v2) and git's
delta format. Bounded: an object at most MAX_OBJECT bytes inflated, a delta chain at most
MAX_DELTA_DEPTH links; what does not parse as git would is Unreadable, never anything else.
"""

import bisect
import struct
import zlib
from collections import OrderedDict

from .diff import read_tree
from .encoding import DIR, EXEC, FILE, decode_chunks
from .gitbudget import BUDGET_BYTES, BUDGET_SECONDS, Budget
from .ids import BLOB, CHUNKS

MAX_DELTA_DEPTH = 5_000     # git packs at most 4095 deep
MAX_OBJECT = 64 << 20       # bytes an object may inflate to


class Unreadable(Exception):
    """A git object or file that cannot be read as git would (the message says what)."""


# --- reading a snapshot ---------------------------------------------------------------------------

class _Snapshot:
    """Paths of one snapshot tree, its directories decoded once."""

    def __init__(self, store, tree_id: str | None):
        self.objects = store.objects
        self.root = bytes.fromhex(tree_id) if tree_id else None
        self._dirs: dict[bytes, dict] = {}
        self.budget = Budget(BUDGET_SECONDS, BUDGET_BYTES)   # git_changes gives both sides one

    def listdir(self, path: bytes) -> dict:
        """name -> Entry of the directory at `path` (b"": the root); {} if there is none."""
        got = self._dirs.get(path)
        if got is not None:
            return got
        if self.root is None:
            return {}
        # From the nearest directory listed before, down one level at a time: no recursion (a
        # step chooses how deep a `.git` lies).
        down = []
        while path and path not in self._dirs:
            down.append(path)
            path = path.rpartition(b"/")[0]
        got = self._dirs.get(path)
        if got is None:
            got = self._remember(b"", {e.name: e for e in read_tree(self.objects, self.root)})
        for path in reversed(down):
            e = got.get(path.rpartition(b"/")[2])
            got = {x.name: x for x in read_tree(self.objects, e.oid)} if e and e.type == DIR else {}
            self._remember(path, got)
        return got

    def _remember(self, path: bytes, listing: dict) -> dict:
        if len(self._dirs) > 4096:
            self._dirs.clear()
        self._dirs[path] = listing
        return listing

    def entry(self, path: bytes):
        parent, _, name = path.rpartition(b"/")
        return self.listdir(parent).get(name)

    def is_file(self, path: bytes) -> bool:
        e = self.entry(path)
        return e is not None and e.type in (FILE, EXEC)

    def is_dir(self, path: bytes) -> bool:
        e = self.entry(path)
        return e is not None and e.type == DIR

    def is_gitdir(self, path: bytes) -> bool:
        return self.is_file(path + b"/HEAD") and self.is_dir(path + b"/objects") and self.is_dir(path + b"/refs")

    def read(self, path: bytes, limit: int = MAX_OBJECT) -> bytes | None:
        """A regular file's bytes (None: no such file, or larger than `limit`)."""
        e = self.entry(path)
        if e is None or e.type not in (FILE, EXEC) or e.size > limit:
            return None
        self.budget.take(e.size)
        return _File(self.objects, e).read(0, e.size)

    def open(self, path: bytes):
        e = self.entry(path)
        return _File(self.objects, e, self.budget) if e is not None and e.type in (FILE, EXEC) else None


class _File:
    """Random access into a stored file: only the chunks a read touches are fetched."""

    def __init__(self, objects, entry, budget=None):
        self.objects, self.size, self.budget = objects, entry.size, budget
        if entry.chunked:
            self.chunks = decode_chunks(objects.get(entry.oid, CHUNKS))
            self.starts, pos = [], 0
            for _, n in self.chunks:
                self.starts.append(pos)
                pos += n
        else:
            self.chunks, self.whole = None, objects.get(entry.oid, BLOB)
        self._cache: OrderedDict = OrderedDict()

    def read(self, offset: int, n: int) -> bytes:
        if self.chunks is None:
            return self.whole[offset:offset + n]
        out, end = [], min(offset + n, self.size)
        i = bisect.bisect_right(self.starts, offset) - 1
        while offset < end and 0 <= i < len(self.chunks):
            data = self._chunk(i)
            piece = data[offset - self.starts[i]:end - self.starts[i]]
            out.append(piece)
            offset += len(piece)
            i += 1
        return b"".join(out)

    def _chunk(self, i: int) -> bytes:
        data = self._cache.get(i)
        if data is None:
            if self.budget is not None:
                self.budget.take(self.chunks[i][1])      # a pack's chunks, fetched as needed
            data = self.objects.get(self.chunks[i][0], BLOB)
            self._cache[i] = data
            if len(self._cache) > 8:
                self._cache.popitem(last=False)
        return data



class _Pack:
    def __init__(self, name: str, idx: bytes, pack: _File, hash_len: int):
        self.name, self.pack, self.hash_len = name, pack, hash_len
        mv = memoryview(idx)
        if idx[:4] == b"\377tOc":
            if struct.unpack(">I", idx[4:8])[0] != 2:
                raise Unreadable("pack index version is not 2")
            self.v2, base = True, 8
        else:
            self.v2, base = False, 0
        self.fanout = struct.unpack(">256I", mv[base:base + 1024])
        self.count = self.fanout[255]
        self.names_at = base + 1024
        need = self.names_at + self.count * (hash_len + (8 if self.v2 else 4))
        if len(idx) < need:
            raise Unreadable("pack index shorter than its fan-out says")
        self.idx = idx

    def _name(self, i: int) -> bytes:
        h = self.hash_len
        if self.v2:
            return self.idx[self.names_at + i * h:self.names_at + (i + 1) * h]
        at = self.names_at + i * (h + 4) + 4
        return self.idx[at:at + h]

    def find(self, oid: bytes) -> int | None:
        lo = self.fanout[oid[0] - 1] if oid[0] else 0
        hi = self.fanout[oid[0]]
        while lo < hi:
            mid = (lo + hi) // 2
            name = self._name(mid)
            if name == oid:
                return self._offset(mid)
            if name < oid:
                lo = mid + 1
            else:
                hi = mid
        return None

    def _offset(self, i: int) -> int:
        h, n = self.hash_len, self.count
        if not self.v2:
            at = self.names_at + i * (h + 4)
            return struct.unpack(">I", self.idx[at:at + 4])[0]
        at = self.names_at + n * h + n * 4 + i * 4
        off = struct.unpack(">I", self.idx[at:at + 4])[0]
        if off & 0x80000000:
            big = self.names_at + n * h + n * 8 + (off & 0x7FFFFFFF) * 8
            off = struct.unpack(">Q", self.idx[big:big + 8])[0]
        return off

    def header(self, offset: int, hash_len: int):
        """(type, inflated size, base: offset or id for deltas, where the zlib data starts)."""
        head = self.pack.read(offset, 32 + hash_len)
        if not head:
            raise Unreadable(f"offset {offset} past the end of {self.name}")
        c = head[0]
        typ, size, shift, i = (c >> 4) & 7, c & 15, 4, 1
        while c & 0x80:
            c = head[i]
            size |= (c & 0x7F) << shift
            shift += 7
            i += 1
        base: int | bytes | None = None
        if typ == 6:
            rel, i = varint_offset(head, i)
            base = offset - rel
            if rel <= 0 or base < 0:
                raise Unreadable(f"a delta base outside {self.name}")
        elif typ == 7:
            base = head[i:i + hash_len]
            i += hash_len
        if size > MAX_OBJECT:
            raise Unreadable(f"an object of {size} bytes in {self.name}")
        return typ, size, base, offset + i

    def inflate(self, at: int, size: int) -> bytes:
        d = zlib.decompressobj()
        out, got = [], 0
        step = max(4096, min(size + 64, 1 << 20))
        while not d.eof:
            chunk = self.pack.read(at, step)
            if not chunk:
                raise Unreadable(f"truncated object in {self.name}")
            at += len(chunk)
            piece = d.decompress(chunk, size + 1 - got)
            out.append(piece)
            got += len(piece)
            if got > size:
                raise Unreadable(f"an object larger than its header says in {self.name}")
            while d.unconsumed_tail and not d.eof:
                piece = d.decompress(d.unconsumed_tail, size + 1 - got)
                if not piece:
                    break
                out.append(piece)
                got += len(piece)
                if got > size:
                    raise Unreadable(f"an object larger than its header says in {self.name}")
        if got != size:
            raise Unreadable(f"an object shorter than its header says in {self.name}")
        return b"".join(out)


_TYPES = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
_TYPE_NAMES = {v: k for k, v in _TYPES.items()}


def _loose(stored: bytes) -> tuple[int, bytes]:
    d = zlib.decompressobj()
    data = d.decompress(stored, MAX_OBJECT + 64)
    head, nul, body = data.partition(b"\0")
    kind, _, size = head.partition(b" ")
    if not nul or kind not in _TYPES or not size.isdigit() or int(size) != len(body):
        raise Unreadable("a loose object that does not parse")
    return _TYPES[kind], body


def _varint(data: bytes, i: int) -> tuple[int, int]:
    val, shift = 0, 0
    while True:
        c = data[i]
        i += 1
        val |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return val, i


def _apply_delta(base: bytes, delta: bytes) -> bytes:
    try:
        src, i = _varint(delta, 0)
        dst, i = _varint(delta, i)
        if src != len(base) or dst > MAX_OBJECT:
            raise Unreadable("a delta for another base")
        out = bytearray()
        while i < len(delta):
            op = delta[i]
            i += 1
            if op & 0x80:
                off = size = 0
                for bit in range(4):
                    if op & (1 << bit):
                        off |= delta[i] << (8 * bit)
                        i += 1
                for bit in range(3):
                    if op & (0x10 << bit):
                        size |= delta[i] << (8 * bit)
                        i += 1
                size = size or 0x10000
                if off + size > len(base):
                    raise Unreadable("a delta copying past its base")
                out += base[off:off + size]
            elif op:
                out += delta[i:i + op]
                i += op
            else:
                raise Unreadable("a delta with a reserved opcode")
        if len(out) != dst:
            raise Unreadable("a delta of the wrong length")
        return bytes(out)
    except IndexError:
        raise Unreadable("a truncated delta") from None


def varint_offset(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (a pack's OFS_DELTA, index v4's prefix length): (value, next pos)."""
    c = data[pos]
    pos += 1
    val = c & 0x7F
    while c & 0x80:
        c = data[pos]
        pos += 1
        val = ((val + 1) << 7) | (c & 0x7F)
    return val, pos
