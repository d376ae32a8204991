"""The command section of a git smart-HTTP receive-pack request (a push), read strictly: what
the push asks the server to do, or why that cannot be known.

    push = read_push(body)        # body: the start of the POST to …/git-receive-pack
    push.updates                  # (RefUpdate(old, new, ref), …) in the order sent
    push.options                  # push options (`git push -o …`), which servers act on
    push.doubt                    # "" when the whole command section was read

The request is `*shallow (command-list | push-cert) [push-options] pack` (git's
pack-protocol.txt): pkt-lines up to a flush, then, with the push-options capability, option
pkt-lines up to a flush. Anything else a line could be, a section that does not end within the
bytes given, or a signed push (its commands live inside a certificate) is doubt: git's own
receive-pack dies on a line it cannot read, so refusing those refuses no real push.
"""

from dataclasses import dataclass

MAX_LINES = 100_000
_ZERO = frozenset("0")
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class RefUpdate:
    old: str
    new: str
    ref: str

    @property
    def action(self) -> str:
        return "create" if set(self.old) == _ZERO else "delete" if set(self.new) == _ZERO else "update"

    def to_json(self) -> dict:
        return {"ref": self.ref, "old": self.old, "new": self.new, "action": self.action}


@dataclass(frozen=True)
class Push:
    updates: tuple = ()
    capabilities: frozenset = frozenset()
    options: tuple = ()
    doubt: str = ""


class _Doubt(ValueError):
    pass


def _pkt_lines(data: bytes, start: int):
    """(payload or None for a flush, offset after it), from `start`; _Doubt on anything else."""
    i = start
    for _ in range(MAX_LINES):
        head = data[i:i + 4]
        if len(head) < 4:
            raise _Doubt("the push's command list does not end within the part of the body "
                         "the gate reads")
        try:
            n = int(head, 16)
        except ValueError:
            raise _Doubt(f"the push's command list has a malformed pkt-line ({head!r})") from None
        if n == 0:
            yield None, i + 4
            return
        if n < 4:
            raise _Doubt(f"the push's command list has a special pkt-line {head.decode()!r}")
        if i + n > len(data):
            raise _Doubt("the push's command list does not end within the part of the body "
                         "the gate reads")
        yield data[i + 4:i + n], i + n
        i += n
    raise _Doubt(f"the push has more than {MAX_LINES} command lines")


def _oid(text: str) -> bool:
    return len(text) in (40, 64) and set(text) <= _HEX


def _command(line: bytes) -> RefUpdate:
    try:
        parts = line.decode("utf-8").removesuffix("\n").split(" ")
    except UnicodeDecodeError:
        raise _Doubt("a ref update of the push is not UTF-8") from None
    if len(parts) != 3 or not _oid(parts[0]) or not _oid(parts[1]) or not parts[2].startswith("refs/"):
        raise _Doubt(f"the push has a line that is not a ref update: {line[:120]!r}")
    return RefUpdate(*parts)


def read_push(body: bytes) -> Push:
    """The push a receive-pack request body asks for (see the module doc)."""
    try:
        return _read(body or b"")
    except _Doubt as e:
        return Push(doubt=str(e))


def _read(body: bytes) -> Push:
    updates: list[RefUpdate] = []
    caps: frozenset[str] = frozenset()
    end = 0
    for line, after in _pkt_lines(body, 0):
        if line is None:
            end = after                 # where the push options start
            break
        if line.startswith(b"shallow ") and not updates:
            continue
        if line.startswith(b"push-cert"):
            raise _Doubt("a signed push (its ref updates are inside a push certificate) is not "
                         "read by the gate")
        if not updates:
            line, _, capstr = line.partition(b"\0")
            caps = frozenset(capstr.decode("ascii", "replace").split())
        elif b"\0" in line:
            raise _Doubt("a ref update of the push carries a second capability list")
        updates.append(_command(line))
    options = []
    if updates and "push-options" in caps:
        for line, _ in _pkt_lines(body, end):
            if line is None:
                break
            try:
                options.append(line.decode("utf-8").removesuffix("\n"))
            except UnicodeDecodeError:
                raise _Doubt("a push option is not UTF-8") from None
    return Push(tuple(updates), caps, tuple(options))
