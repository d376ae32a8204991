"""The frames spoken on the VM tier's two byte streams: the guest agent's virtio-serial port
(host daemon <-> guest agent) and a step's stream socket (`envgit run` <-> host daemon).

Standard library only, and only `struct`/`os`: `envgit run` (the hot path) and the guest's
Python 3.11 both import it (it is copied into the guest's root as is).

A frame: kind (1 byte), channel (u32: which step on the agent port, 0 on a step socket),
length (u32), payload. Control payloads (RUN, EXIT, PUT headers) are UTF-8 JSON on the agent
port, read by the daemon and the agent only; the hot path never parses JSON.

A file (PUT host -> guest, CHANGE guest -> host) is sent sparse, by `file_pieces`: only its
data, at their offsets. Without it a 2 GiB file of a few bytes (`truncate -s 2G`) crossed as
2 GiB of zeros and landed as 2 GiB of real disk on the host, or filled the guest's RAM.
"""

import errno
import os
import struct

HEAD = struct.Struct("!BII")
MAX_PAYLOAD = 16 << 20
CHUNK = 1 << 20          # file contents are sent in frames of at most this much

# host -> guest (agent port) and client -> daemon (step socket)
RUN = 1          # JSON {argv, cwd, env, tty, rows, cols}
STDIN = 2
STDIN_EOF = 3
SIGNAL = 4       # u32 signal number
WINSIZE = 5      # u16 rows, u16 cols
PUT = 6          # JSON header "\n" data: a file, directory, symlink or removal in the guest's copy
COLLECT = 7      # JSON {}: the guest's changes since the last sync (answered by CHANGE frames + DONE)
PING = 8
HELLO = 9        # step socket: the step's token
SYNCED = 10      # JSON {}: the host's copy and the guest's agree now (the guest takes its manifest)
NET_OPEN = 11     # guest -> host: a connection to the guest's proxy port opened (channel >= NET_BASE)
NET_DATA = 12     # both ways: its bytes
NET_CLOSE = 13    # both ways: its end
SETUP = 14        # JSON {root, time_ns, seed}: what is this machine's own (after a boot or restore)
NET_BASE = 1 << 31
# guest -> host and daemon -> client
STDOUT = 33
STDERR = 34
EXIT = 35        # u32 exit code, u32 signal number (0: none)
CHANGE = 36      # JSON header "\n" data: one path the guest changed
DONE = 37        # end of a COLLECT / PUT batch / PING answer
ERROR = 38       # UTF-8 text


def pack(kind: int, payload: bytes = b"", channel: int = 0) -> bytes:
    return HEAD.pack(kind, channel, len(payload)) + payload


class Reader:
    """Frames out of a byte stream read in pieces (a blocking fd or bytes fed in)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes):
        self.buf += data

    def frames(self):
        while len(self.buf) >= HEAD.size:
            kind, channel, n = HEAD.unpack_from(self.buf)
            if n > MAX_PAYLOAD:
                raise ValueError(f"frame of {n} bytes")
            if len(self.buf) < HEAD.size + n:
                return
            payload = bytes(self.buf[HEAD.size:HEAD.size + n])
            del self.buf[:HEAD.size + n]
            yield kind, channel, payload


def file_pieces(fd: int):
    """(offset, data, last, size) to send for the regular file open at `fd`, as frames of at
    most CHUNK bytes: its data extents (SEEK_DATA/SEEK_HOLE) minus blocks that are all zeros,
    so holes stay holes. The first piece is always at offset 0 (it may be empty): a receiver
    takes offset 0 as "a new file, truncate it". The last always ends at `size`, with one
    zero byte when the file ends in a hole: a receiver writes each piece at its offset and a
    gap reads as zeros, so even an agent older than `size` (one resumed from a memory snapshot
    taken before an upgrade) ends with the right length; a newer one truncates to `size`."""
    size = os.fstat(fd).st_size
    pieces = _data(fd, size)
    prev = next(pieces, None)
    if prev is None or prev[0] != 0:
        if prev is not None:
            yield 0, b"", False, size
        else:
            prev = (0, b"")
    for piece in pieces:
        yield prev[0], prev[1], False, size
        prev = piece
    off, data = prev
    if size and off + len(data) < size:
        yield off, data, False, size
        off, data = size - 1, b"\0"
    yield off, data, True, size


def _data(fd, size):
    """(offset, bytes) of the file's non-zero blocks, in order."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as e:
            if e.errno == errno.ENXIO:          # no data after `pos`: a hole to the end
                return
            start, end = pos, size              # no SEEK_DATA here: all data, zeros still skipped
        off = start
        while off < end:
            data = os.pread(fd, min(CHUNK, end - off), off)
            if not data:                        # shrunk while read
                return
            if data.count(0) != len(data):
                yield off, data
            off += len(data)
        pos = max(end, pos + 1)


def write_piece(fd: int, offset: int, data: bytes, size: int | None):
    """A piece from `file_pieces` into the file open at `fd` (a gap before it stays a hole);
    `size`: the last piece's, the file's length."""
    os.lseek(fd, offset, os.SEEK_SET)
    write_all(fd, data)
    if size is not None:
        os.ftruncate(fd, size)


def write_all(fd: int, data: bytes):
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            import select
            select.select([], [fd], [], 1.0)
            continue
        view = view[n:]


def exit_payload(code: int, sig: int) -> bytes:
    return struct.pack("!II", code & 0xFFFFFFFF, sig)


def read_exit(payload: bytes) -> tuple[int, int]:
    return struct.unpack("!II", payload[:8])
