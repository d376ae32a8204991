"""Reading frames from clients of the daemon socket within fixed bounds.

A frame is a 4-byte length and a `marshal` dump (client.py). `marshal.loads` trusts the
counts it reads: a 9-byte frame announcing a list of 2**31-1 items makes it allocate 16 GiB
before it finds the data missing (7-27 s of every other step stalled). So a frame is walked
first (`check_marshal`, iterative, no allocation): every count must fit in the bytes that are
left (each item takes at least one byte) and only plain value types may appear; only then is
it handed to marshal, whose allocations are then bounded by the frame's length.

The other bounds of the socket (serve.py applies them):
  IN_FRAME_MAX    a client's frame (argv and env of a step are far below it)
  BUDGET          bytes of frames larger than SMALL being read at once, over all connections
                  (20 clients each half-way through a big frame cost at most this, not 20
                  frames); a frame up to SMALL never waits (MAX_CONNS * SMALL bounds those)
  FRAME_S         a frame, once its length is read, arrives whole within this
  FIRST_FRAME_S   a new connection says something within this
  QUIET_S         a connection with no step open and no request in progress that says nothing
                  for this long is closed (it neither keeps the daemon up nor holds a slot)
  MAX_CONNS       connections at once; past it a new one gets an error frame and is closed
"""

import asyncio
import os


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


IN_FRAME_MAX = 16 * 1024 * 1024
BUDGET = 64 * 1024 * 1024
FRAME_S = _env_float("ENVGIT_FRAME_TIMEOUT", 30)
FIRST_FRAME_S = _env_float("ENVGIT_FIRST_FRAME_TIMEOUT", 10)
QUIET_S = _env_float("ENVGIT_QUIET_TIMEOUT", 120)
MAX_CONNS = int(_env_float("ENVGIT_MAX_CONNS", 256))
SMALL = 256 * 1024
THREAD_AT = 256 * 1024          # frames larger than this are checked and decoded off the loop

_FIXED = {ord(c): n for c, n in (("N", 0), ("F", 0), ("T", 0), ("i", 4), ("g", 8), ("r", 4))}
_SIZED = {ord(c) for c in "sutaA"}          # bytes and str: 4-byte length, then the bytes
_SHORT = {ord(c) for c in "zZ"}             # short ASCII str: 1-byte length
_SEQ = {ord(c) for c in "([<>"}             # tuple, list, set, frozenset: 4-byte count
_SMALL_TUPLE = ord(")")
_DICT, _NULL, _LONG = ord("{"), ord("0"), ord("l")
FLAG_REF = 0x80


def check_marshal(body: bytes) -> None:
    """Raise ValueError unless `body` is one marshal'd plain value whose counts all fit in
    the frame (so loading it allocates in proportion to its length)."""
    end = len(body)
    pos = 0
    # each open container: the items still to read, or -1 for a dict (until its NULL; an
    # even/odd count of items read says whether a key or a value comes next)
    stack = [1]
    in_dict = [0]
    while stack:
        if stack[-1] == 0:
            stack.pop()
            in_dict.pop()
            continue
        if pos >= end:
            raise ValueError("frame ends inside a value")
        t = body[pos] & ~FLAG_REF
        pos += 1
        if stack[-1] == -1:
            if t == _NULL:
                if in_dict[-1] % 2:
                    raise ValueError("dict ends after a key")
                stack[-1] = 0
                continue
            in_dict[-1] += 1
        else:
            stack[-1] -= 1
        if t in _FIXED:
            pos += _FIXED[t]
        elif t in _SIZED or t == _LONG or t in _SEQ:
            if pos + 4 > end:
                raise ValueError("frame ends inside a length")
            n = int.from_bytes(body[pos:pos + 4], "little", signed=True)
            pos += 4
            if t == _LONG:
                n = abs(n) * 2
            if n < 0 or n > end - pos:
                raise ValueError("a count larger than the frame")
            if t in _SEQ:
                if n:
                    stack.append(n)
                    in_dict.append(0)
            else:
                pos += n
        elif t in _SHORT:
            if pos >= end:
                raise ValueError("frame ends inside a length")
            pos += 1 + body[pos]
        elif t == _SMALL_TUPLE:
            if pos >= end:
                raise ValueError("frame ends inside a length")
            n = body[pos]
            pos += 1
            if n > end - pos:
                raise ValueError("a count larger than the frame")
            if n:
                stack.append(n)
                in_dict.append(0)
        elif t == _DICT:
            stack.append(-1)
            in_dict.append(0)
        else:
            raise ValueError(f"type {chr(t)!r} is not a plain value")
        if pos > end:
            raise ValueError("frame ends inside a value")
        if len(stack) > 200:
            raise ValueError("nested too deeply")
    if pos != end:
        raise ValueError("bytes after the value")


class Budget:
    """Bytes of frames being read, over all connections: a frame waits for room (at most
    FRAME_S), so many clients part-way through big frames cannot grow the daemon past it."""

    def __init__(self, total=BUDGET):
        self.total, self.used = total, 0
        self.cond = asyncio.Condition()

    async def take(self, n) -> bool:
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(lambda: self.used + n <= self.total), FRAME_S)
            except TimeoutError:
                return False
            self.used += n
            return True

    async def give(self, n):
        async with self.cond:
            self.used -= n
            self.cond.notify_all()
