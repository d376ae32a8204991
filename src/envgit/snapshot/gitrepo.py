"""One repository's git state on one side of the git view (snapshot/gitview.py): its refs (HEAD,
loose refs, `packed-refs`, linked worktrees' HEAD), its objects found loose or in a pack and
checked against their ids as git checks them, its shallow boundary and its index (versions 2-4; a
split index's shared part merged in). At most MAX_REFS refs and MAX_INDEX_ENTRIES index entries.
"""

import hashlib
import struct
from collections import OrderedDict

from .encoding import DIR, EXEC, FILE
from .gitbudget import Budget
from .gitobjects import (
    _TYPE_NAMES,
    MAX_DELTA_DEPTH,
    MAX_OBJECT,
    Unreadable,
    _apply_delta,
    _loose,
    _Pack,
    _Snapshot,
    varint_offset,
)

MAX_REFS = 100_000
MAX_INDEX = 256 << 20        # bytes of an index file (git's, or a pack's .idx: ~9M objects)
MAX_INDEX_ENTRIES = 1_000_000   # entries read of one index (Chromium's has ~500k)


class _Repo:
    def __init__(self, snap: _Snapshot, gitdir: bytes):
        self.snap, self.gitdir = snap, gitdir
        self.problems: list[str] = []
        self.hash_len = 20
        self._packs: list | None = None
        self._cache: OrderedDict = OrderedDict()     # (pack, offset) -> (type, data)
        self._cached_bytes = 0

    def path(self, rel: bytes) -> bytes:
        return self.gitdir + b"/" + rel

    # refs
    def refs(self) -> dict[str, str]:
        """name -> value (hex id or "ref: target") of HEAD, loose refs, packed-refs and linked
        worktrees' HEAD."""
        out: dict[str, str] = {}
        packed = self.snap.read(self.path(b"packed-refs"))
        for line in (packed or b"").splitlines():
            if line[:1] in (b"#", b"^") or b" " not in line:
                continue
            oid, _, name = line.partition(b" ")
            out[_text(name.strip())] = _text(oid.strip())
        self._loose_refs(b"refs", out)
        head = self.snap.read(self.path(b"HEAD"), 4096)
        if head is not None:
            out["HEAD"] = _text(head.strip())
        for name, e in self.snap.listdir(self.path(b"worktrees")).items():
            if e.type == DIR:
                h = self.snap.read(self.path(b"worktrees/" + name + b"/HEAD"), 4096)
                if h is not None:
                    out[f"worktrees/{_text(name)}/HEAD"] = _text(h.strip())
        if self.snap.entry(self.path(b"reftable")) is not None:
            self.problems.append(f"{_text(self.gitdir)}: reftable refs are not read")
        if len(out) > MAX_REFS:
            self.problems.append(f"{_text(self.gitdir)}: over {MAX_REFS} refs; only the first read")
            out = dict(sorted(out.items())[:MAX_REFS])
        for v in out.values():
            if _is_hex(v) and len(v) in (40, 64):
                self.hash_len = len(v) // 2
                break
        return out

    def _loose_refs(self, rel: bytes, out: dict) -> None:
        stack = [rel]
        while stack and len(out) <= MAX_REFS:
            d = stack.pop()
            for name, e in self.snap.listdir(self.path(d)).items():
                sub = d + b"/" + name
                if e.type == DIR:
                    stack.append(sub)
                elif e.type in (FILE, EXEC) and not name.endswith(b".lock") and e.size <= 4096:
                    value = self.snap.read(self.path(sub), 4096)
                    if value is not None and value.strip():
                        out[_text(sub)] = _text(value.strip().splitlines()[0])

    def resolve(self, refs: dict, name: str) -> str | None:
        value = refs.get(name)
        for _ in range(5):
            if value is None or not value.startswith("ref: "):
                break
            value = refs.get(value[5:].strip())
        return value if value is not None and _is_hex(value) else None

    # objects
    def has(self, oid: str) -> bool:
        if self.snap.is_file(self.path(b"objects/" + oid[:2].encode() + b"/" + oid[2:].encode())):
            return True
        raw = bytes.fromhex(oid)
        return any(p.find(raw) is not None for p in self.packs())

    def get(self, oid: str) -> tuple[int, bytes]:
        """(git type code: 1 commit, 2 tree, 3 blob, 4 tag; the object's bytes)."""
        where = self._locate(oid)
        if where is None:
            raise KeyError(oid)
        typ, data = where if isinstance(where[0], int) else self.at(*where)
        # git's own check: an object is the one its id names (a step could write a pack or
        # a loose file that says otherwise, and diff would show another commit's message)
        h = hashlib.sha256() if len(oid) == 64 else hashlib.sha1()
        h.update(_TYPE_NAMES[typ] + b" %d\0" % len(data))
        h.update(data)
        if h.hexdigest() != oid:
            raise Unreadable(f"object {oid[:12]}: its content does not match its id")
        return typ, data

    def _locate(self, oid: str):
        """A loose object's (type, bytes), or (pack, offset), or None."""
        f = self.snap.open(self.path(b"objects/" + oid[:2].encode() + b"/" + oid[2:].encode()))
        if f is not None:
            return _loose(f.read(0, min(f.size, MAX_OBJECT)))
        raw = bytes.fromhex(oid)
        for p in self.packs():
            off = p.find(raw)
            if off is not None:
                return p, off
        return None

    def packs(self) -> list:
        if self._packs is None:
            self._packs = []
            d = self.path(b"objects/pack")
            for name in sorted(self.snap.listdir(d)):
                if not name.endswith(b".idx"):
                    continue
                pack = self.snap.open(d + b"/" + name[:-4] + b".pack")
                idx = self.snap.read(d + b"/" + name, MAX_INDEX)
                if pack is None:
                    continue
                if idx is None:
                    self.problems.append(f"{_text(self.path(b'objects/pack/' + name))}: over {MAX_INDEX} bytes")
                    continue
                try:
                    self._packs.append(_Pack(_text(name), idx, pack, self.hash_len))
                except (Unreadable, struct.error, IndexError) as e:
                    self.problems.append(f"{_text(self.path(b'objects/pack/' + name))}: {e}")
            if self.snap.entry(self.path(b"objects/info/alternates")) is not None:
                self.problems.append(f"{_text(self.gitdir)}: objects in alternates are not read")
        return self._packs

    def at(self, pack: "_Pack", offset: int) -> tuple[int, bytes]:
        """The object at `offset` in `pack`, its delta chain followed iteratively (a chain may
        be thousands deep, and a REF_DELTA may name its own id: bounded, never recursive)."""
        chain: list[tuple[tuple[str, int], bytes]] = []   # [(cache key, delta bytes)] from the object to its base
        spent = 0
        while True:
            key = (pack.name, offset)
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                break
            if len(chain) > MAX_DELTA_DEPTH:
                raise Unreadable(f"a delta chain deeper than {MAX_DELTA_DEPTH} in {pack.name}")
            typ, size, base, data_at = pack.header(offset, self.hash_len)
            spent += size
            if spent > 4 * MAX_OBJECT:
                raise Unreadable(f"a delta chain inflating past {4 * MAX_OBJECT} bytes in {pack.name}")
            data = pack.inflate(data_at, size)
            if typ in (1, 2, 3, 4):
                got = (typ, data)
                self._keep(key, got)
                break
            if typ not in (6, 7):
                raise Unreadable(f"object type {typ} at {offset} in {pack.name}")
            chain.append((key, data))
            if typ == 6:
                offset = base
                continue
            where = self._locate(base.hex())
            if where is None:
                raise KeyError(base.hex())
            if isinstance(where[0], int):
                got = where
                break
            pack, offset = where
        for key, delta in reversed(chain):
            got = (got[0], _apply_delta(got[1], delta))
            self._keep(key, got)
        return got

    def _keep(self, key, got) -> None:
        self._cache[key] = got
        self._cached_bytes += len(got[1])
        while self._cached_bytes > (32 << 20) and len(self._cache) > 1:
            _, (_, old) = self._cache.popitem(last=False)
            self._cached_bytes -= len(old)

    def shallow(self) -> set[str]:
        data = self.snap.read(self.path(b"shallow"), MAX_OBJECT)
        return {_text(line.strip()) for line in (data or b"").splitlines() if line.strip()}

    # index
    def index_differs(self, other: "_Repo") -> bool:
        """Do the two sides' index files differ? By stored id, nothing read: an index of 200k
        entries takes seconds to parse, and a step can leave a hundred repositories. (A split
        index's shared part is named by its own hash: the same index names the same one.)"""
        a, b = self.snap.entry(self.path(b"index")), other.snap.entry(other.path(b"index"))
        return not ((a is None) == (b is None) and (a is None or (a.type, a.oid) == (b.type, b.oid)))

    def index(self) -> dict:
        data = self.snap.read(self.path(b"index"), MAX_INDEX)
        if data is None:
            return {}
        budget = self.snap.budget
        entries, shared = _parse_index(data, self.hash_len, budget)
        if shared:
            base = self.snap.read(self.path(b"sharedindex." + shared.encode()), MAX_INDEX)
            if base is not None:
                entries = {**_parse_index(base, self.hash_len, budget)[0], **entries}
        return entries



def _parse_index(data: bytes, hash_len: int, budget: "Budget | None" = None) -> tuple[dict, str | None]:
    """path -> ((stage, mode, object id), …) of every entry; and a split index's shared id.
    At most MAX_INDEX_ENTRIES entries; the budget is checked as it goes."""
    if data[:4] != b"DIRC":
        raise Unreadable("not an index file")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise Unreadable(f"index version {version}")
    if count > MAX_INDEX_ENTRIES:
        raise Unreadable(f"{count} entries, over the {MAX_INDEX_ENTRIES} read")
    out: dict[bytes, tuple[tuple[int, int, str], ...]] = {}    # path -> its (stage, mode, id)s
    pos, prev = 12, b""
    fixed = 40 + hash_len
    for i in range(count):
        if budget is not None and not i & 4095:
            budget.check()
        start = pos
        mode = struct.unpack(">I", data[pos + 24:pos + 28])[0]
        oid = data[pos + 40:pos + 40 + hash_len].hex()
        flags = struct.unpack(">H", data[pos + fixed:pos + fixed + 2])[0]
        pos += fixed + 2
        if version >= 3 and flags & 0x4000:
            pos += 2
        if version == 4:
            strip, pos = varint_offset(data, pos)
            end = data.index(b"\0", pos)
            name = prev[:len(prev) - strip] + data[pos:end]
            pos = end + 1
        else:
            end = data.index(b"\0", pos)
            name = data[pos:end]
            pos = start + ((end - start + 8) & ~7)
        if pos > len(data):
            raise Unreadable("a truncated index")
        out[name] = tuple(sorted(out.get(name, ()) + (((flags >> 12) & 3, mode, oid),)))
        prev = name
    shared = None
    while pos + 8 <= len(data) - hash_len:
        sig, size = data[pos:pos + 4], struct.unpack(">I", data[pos + 4:pos + 8])[0]
        if sig == b"link" and size >= hash_len:
            shared = data[pos + 8:pos + 8 + hash_len].hex()
        pos += 8 + size
    return out, shared


def _text(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


def _is_hex(s: str) -> bool:
    return len(s) in (40, 64) and all(c in "0123456789abcdef" for c in s)

