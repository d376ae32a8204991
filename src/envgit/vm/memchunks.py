"""A step's memory stream kept as chunks shared by every snapshot of the project
(docs/FORMAT.md, "VM memory snapshots"): a guest that changed a few pages between two steps
costs the chunks holding those pages, not the whole stream again.

  .envgit/vm/chunks/<2 hex>/<64 hex>   a chunk, named by its BLAKE3 hash; written once, under a
                                       temporary name and renamed, never changed
  .envgit/vm/mem/<step>/memory.chunks  the stream's chunks in order: a first line
                                       "envgit memory chunks 1", then "<hash> <length>" a line

Where a chunk ends follows the stream's own records (`cuts`): QEMU writes each RAM page as an
8-byte word (the page's offset in its RAM block, and flags) and its 4 KiB, or a zero page as
the word and one byte; a chunk ends before the record of a page whose number is a multiple of
8, once it holds 16 KiB, so a group of pages that did not change is the same chunk from one
step's stream to the next, wherever the pages before it moved. Bytes that are not page records
(the stream's header, the device state at its end) are cut every 128 KiB. The cut decides only
what is shared: any cut reads back the same stream.

A restore writes the chunks in order into a pipe QEMU reads (`stream_into`). gc removes the
chunks no kept snapshot lists (`sweep`); fsck re-hashes each listed chunk (`verify`).
"""

import fcntl
import mmap
import os
import struct
from bisect import bisect_right
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate, islice

import blake3

LIST = "memory.chunks"
PAGES = "memory.pages"      # where each RAM page is in the stream (migstream.index): postcopy.py
HEADER = "envgit memory chunks 1"
MIN, MAX, GROUP_PAGES = 16 << 10, 128 << 10, 8
PAGE = 4096
FLAG_ZERO, FLAG_PAGE, FLAG_CONTINUE = 0x02, 0x08, 0x20     # QEMU's RAM_SAVE_FLAG_*
GROUP = 64                  # chunks read and hashed as one task (a task per chunk costs more
GROUPS_AHEAD = 4            # than reading it), and groups read ahead of the one being written
WRITE_BATCH = 1 << 20       # the pipe's depth
F_SETPIPE_SZ = 1031


def root(vm_state: str) -> str:
    """The chunk store under the project's `.envgit/vm` (`vm_state`)."""
    return os.path.join(vm_state, "chunks")


def chunk_path(croot: str, h: str) -> str:
    return os.path.join(croot, h[:2], h)


def digest(data) -> str:
    return blake3.blake3(data).hexdigest()


def _record(buf, p: int, n: int) -> tuple[int, int] | None:
    """(length, page number) of a RAM page record at `p`, or None if `p` holds none."""
    if p + 8 > n:
        return None
    word = int.from_bytes(buf[p:p + 8], "big")
    flags = word & 0xFFF
    kind = flags & ~FLAG_CONTINUE
    if kind == FLAG_PAGE:
        body = PAGE
    elif kind == FLAG_ZERO:
        body = 1
    else:
        return None
    head = 8 if flags & FLAG_CONTINUE else 9 + buf[p + 8] if p + 9 <= n else n + 1
    length = head + body
    return (length, word >> 12) if p + length <= n else None


def _in_sync(buf, p: int, n: int) -> bool:
    """Three page records in a row start at `p` (one could be a page's bytes by chance)."""
    for _ in range(3):
        rec = _record(buf, p, n)
        if rec is None:
            return p == n
        p += rec[0]
    return True


def cuts(buf):
    """(start, end) of each chunk of the stream in `buf`, in order (the rule: module doc)."""
    n, start, p = len(buf), 0, 0
    while p < n:
        if _in_sync(buf, p, n):
            while (rec := _record(buf, p, n)) is not None:
                length, page = rec
                if (page % GROUP_PAGES == 0 and p - start >= MIN) or p - start + length > MAX:
                    if p > start:
                        yield start, p
                        start = p
                p += length
            if p >= n:
                break
        # not a page record: the next place one could start (its flags' byte a page's or a
        # zero page's with the continue bit), cut every MAX bytes meanwhile
        q = p + 1
        while q < n:
            hits = [h for h in (buf.find(b"\x28", q + 7), buf.find(b"\x22", q + 7)) if h >= 0]
            if not hits:
                q = n
                break
            q = min(hits) - 7
            if _in_sync(buf, q, n):
                break
            q += 1
        while q - start > MAX:
            yield start, start + MAX
            start += MAX
        p = q
    if n > start:
        yield start, n


def store(croot, stream_path, list_path) -> dict:
    """Cut the stream at `stream_path` into chunks (writing those not stored yet, or stored
    with other bytes: a damaged one is written anew rather than listed again), write its list
    at `list_path`, make both durable, and remove the stream: {"bytes", "chunks", "stored",
    "list_hash"} (stored: bytes of chunks written new; list_hash: the list's BLAKE3, which
    meta.json keeps so a list changed or torn afterwards is never read as this stream's)."""
    lines, total, stored = [HEADER], 0, 0
    with open(stream_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf: mmap.mmap | bytes = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else b""
    try:
        with memoryview(buf) as view:
            for a, b in cuts(buf):
                with view[a:b] as piece:
                    h = digest(piece)
                    p = chunk_path(croot, h)
                    if not _holds(p, piece):
                        os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
                        tmp = f"{p}.{os.getpid()}.part"
                        with open(tmp, "wb") as out:
                            out.write(piece)
                        os.replace(tmp, p)
                        stored += b - a
                lines.append(f"{h} {b - a}")
                total += b - a
        pages = _page_index(buf)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
    text = ("\n".join(lines) + "\n").encode()
    with open(list_path + ".part", "wb") as f:
        f.write(text)
    os.replace(list_path + ".part", list_path)
    got = {"bytes": total, "chunks": len(lines) - 1, "stored": stored, "list_hash": digest(text)}
    if isinstance(pages, str):
        got["pages_unread"] = pages     # why the stream has no page index: restored whole
    else:
        pages_path = os.path.join(os.path.dirname(list_path), PAGES)
        with open(pages_path + ".part", "wb") as f:
            f.write(pages)
        os.replace(pages_path + ".part", pages_path)
        got["pages_hash"] = digest(pages)
    _sync(croot)            # the chunks and the lists on disk before meta.json and `ok` are
    os.remove(stream_path)
    return got


def _page_index(buf) -> bytes | str:
    """The stream's page index (migstream.py), or why there is none (a stream it does not take
    apart: a restore of it then reads the whole stream)."""
    from . import migstream
    try:
        return migstream.index(migstream.parse(buf))
    except (migstream.NotReadable, struct.error, IndexError, UnicodeDecodeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"[:300]


def _holds(path, piece) -> bool:
    """Is the chunk at `path` there with exactly these bytes? (A size check alone would keep
    a chunk a flipped byte damaged, and list it again in every later snapshot.)"""
    try:
        with open(path, "rb") as f:
            return f.read(len(piece) + 1) == piece
    except FileNotFoundError:
        return False


def _sync(path):
    """Everything written on the filesystem holding `path` made durable: syncfs(2), one call
    for thousands of new chunks (an fsync each would cost seconds); sync(2) where libc has
    no syncfs."""
    import ctypes
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)        # this process's own: libc's syncfs
        if getattr(libc, "syncfs", None) is None or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def list_matches(list_path, expected: str | None) -> bool:
    """Is the list at `list_path` the one its snapshot recorded (meta.json's list_hash)? No
    hash recorded is no match: a meta.json that lost its key (one flipped bit in its name)
    must not turn the check off."""
    if not isinstance(expected, str) or not expected:
        return False
    with open(list_path, "rb") as f:
        return digest(f.read()) == expected


def read_list(list_path) -> list[tuple[str, int]]:
    """The (hash, length) of a stream's chunks, in order; ValueError when the list is damaged."""
    with open(list_path) as f:
        lines = f.read().splitlines()
    if not lines or lines[0] != HEADER:
        raise ValueError(f"{list_path}: not a list of memory chunks")
    out = []
    for n, line in enumerate(lines[1:], 2):
        h, _, length = line.partition(" ")
        if len(h) != 64 or not length.isdigit():
            raise ValueError(f"{list_path}:{n}: not '<hash> <length>'")
        out.append((h, int(length)))
    return out


def stream_into(croot, list_path, fd: int, errors: list) -> None:
    """Write the stream the list names into `fd` (a pipe's end, closed here), chunk by chunk,
    each checked against its name first: a damaged one ends the stream there, so QEMU's
    restore fails rather than resume a guest with a page that is not what was written; what
    was wrong is appended to `errors`. Ends early, quietly, when the reader (QEMU) goes away.
    Chunks are read and hashed ahead on two threads (both release the GIL), 64 at a time, into
    a pipe made a megabyte deep."""
    try:
        try:
            fcntl.fcntl(fd, F_SETPIPE_SZ, WRITE_BATCH)
        except OSError:
            pass
        listed = read_list(list_path)
        groups = iter([listed[i:i + GROUP] for i in range(0, len(listed), GROUP)])
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="vm-restore-read") as pool:
            ahead = deque(pool.submit(_load, croot, g) for g in islice(groups, GROUPS_AHEAD))
            while ahead:
                data, damaged = ahead.popleft().result()
                for g in islice(groups, 1):
                    ahead.append(pool.submit(_load, croot, g))
                _write_all(fd, data)            # what is whole before a damaged chunk
                if damaged is not None:
                    errors.append(f"memory chunk {damaged} is damaged (its bytes do not hash to its "
                                  "name); `envgit fsck` lists the snapshots that use it")
                    for f in ahead:
                        f.cancel()
                    return
    except BrokenPipeError:
        pass
    except (OSError, ValueError) as e:
        errors.append(f"the memory snapshot's chunks: {e}")
    finally:
        os.close(fd)


def _whole(croot, h, length) -> bytes | None:
    """Chunk `h`'s bytes, or None when they are not what its name and list say (OSError when
    it cannot be read)."""
    with open(chunk_path(croot, h), "rb") as f:
        data = f.read()
    return data if len(data) == length and digest(data) == h else None


def _load(croot, group) -> tuple[bytes, str | None]:
    """A group of chunks' bytes joined, up to the first whose bytes are not what its name and
    list say (named second, else None)."""
    parts: list[bytes] = []
    for h, length in group:
        data = _whole(croot, h, length)
        if data is None:
            return b"".join(parts), h
        parts.append(data)
    return b"".join(parts), None


def first_damaged(croot, listed) -> str | None:
    """The first listed chunk (in list order) that is missing or not its hash, else None: every
    chunk read and hashed, 64 to a task on two threads (both release the GIL)."""
    groups = [listed[i:i + GROUP] for i in range(0, len(listed), GROUP)]
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="vm-restore-check") as pool:
        for damaged in pool.map(lambda g: _first_damaged_in(croot, g), groups):
            if damaged is not None:
                return damaged
    return None


def _first_damaged_in(croot, group) -> str | None:
    for h, length in group:
        try:
            if _whole(croot, h, length) is None:
                return h
        except OSError:
            return h                    # missing or unreadable
    return None


class Reader:
    """Bytes of a stream by their offset in it, read from its chunks, each chunk hashed when
    read (ValueError naming a damaged one). Keeps the chunk read last: a restore reads mostly
    in order."""

    def __init__(self, croot, listed):
        self.croot = croot
        self.listed = listed
        self.starts = list(accumulate((n for _, n in listed), initial=0))
        self.cached: tuple[int, bytes] | None = None

    def read(self, off: int, n: int) -> bytes:
        out = []
        while n > 0:
            i = bisect_right(self.starts, off) - 1
            if i < 0 or i >= len(self.listed):
                raise ValueError(f"stream offset {off} is past the snapshot's chunks")
            data = self._chunk(i)
            piece = data[off - self.starts[i]:off - self.starts[i] + n]
            out.append(piece)
            off, n = off + len(piece), n - len(piece)
        return b"".join(out)

    def _chunk(self, i: int) -> bytes:
        if self.cached is not None and self.cached[0] == i:
            return self.cached[1]
        h, length = self.listed[i]
        data = _whole(self.croot, h, length)
        if data is None:
            raise ValueError(f"memory chunk {h} is damaged (its bytes do not hash to its name); "
                             "`envgit fsck` lists the snapshots that use it")
        self.cached = (i, data)
        return data


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def verify(croot, list_path) -> list[str]:
    """fsck: each listed chunk is there, of its length and its hash."""
    try:
        listed = read_list(list_path)
    except (OSError, ValueError) as e:
        return [str(e)]
    problems = []
    for h, length in listed:
        try:
            data = _whole(croot, h, length)
        except OSError as e:
            problems.append(f"memory chunk {h} is missing ({e.strerror})")
            continue
        if data is None:
            problems.append(f"memory chunk {h} is damaged (its bytes do not hash to its name)")
    return problems


def sweep(croot, lists) -> int:
    """Remove every chunk none of `lists` (list files of the snapshots kept) names, and
    leftovers of a killed write; returns the bytes freed. Nothing is removed while a list
    does not read (fsck says which): its chunks would go with it. The caller makes sure no
    stream is being stored meanwhile (host.py: under the machine's lock, after the background
    snapshot's end)."""
    keep: set[str] = set()
    for p in lists:
        try:
            keep.update(h for h, _ in read_list(p))
        except (OSError, ValueError):
            return 0
    freed = 0
    for p in _chunk_files(croot):
        if os.path.basename(p) not in keep:
            try:
                freed += os.lstat(p).st_blocks * 512
                os.remove(p)
            except OSError:
                pass
    return freed


def _chunk_files(croot):
    """The chunk store's files (and leftovers of a killed write): only in its own two-hex
    directories, never through a link (a directory of the store that is a link to elsewhere
    is not the store's), never anything that is not a regular file."""
    try:
        tops = list(os.scandir(croot))
    except (FileNotFoundError, NotADirectoryError):
        return
    for top in tops:
        if len(top.name) != 2 or not top.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(top.path))
        except OSError:
            continue
        for e in entries:
            if e.name.startswith(top.name) and e.is_file(follow_symlinks=False):
                yield e.path


def usage(croot) -> int:
    total = 0
    for p in _chunk_files(croot):
        try:
            total += os.lstat(p).st_blocks * 512
        except OSError:
            pass
    return total
