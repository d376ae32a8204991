"""The bits of git's smart-HTTP receive-pack protocol the gate needs: the ref updates a push
asks for (shown to the person who answers an ask) and a status report that rejects them.

A plain 403 on the pack POST makes git print `error: RPC failed; HTTP 403` and then a
misleading `Everything up-to-date`. A receive-pack status report rejecting each ref makes it
print `! [remote rejected] main -> main (<reason>)`, readable for person and model alike.
"""

from ..policy.receivepack import RefUpdate

RESULT_TYPE = "application/x-git-receive-pack-result"
_MAX_COMMANDS = 10_000


def _pkt_lines(data: bytes):
    """pkt-line payloads up to the first flush (None for a flush), bounded."""
    i = 0
    for _ in range(_MAX_COMMANDS):
        if i + 4 > len(data):
            return
        try:
            n = int(data[i:i + 4], 16)
        except ValueError:
            return
        if n == 0:
            yield None
            return
        if n < 4 or i + n > len(data):
            return
        yield data[i + 4:i + n]
        i += n


def parse_commands(body: bytes) -> tuple[list[RefUpdate], set[str]]:
    """The ref updates at the start of a receive-pack request and the capabilities asked for,
    read leniently: for the rejection report only (what a push may do is judged by
    policy.receivepack, strictly)."""
    updates, caps = [], set()
    for line in _pkt_lines(body or b""):
        if line is None:
            break
        line, _, capstr = line.rstrip(b"\n").partition(b"\0")
        if capstr:
            caps |= set(capstr.decode("ascii", "replace").split())
        parts = line.decode("utf-8", "replace").split(" ")
        if len(parts) == 3 and len(parts[0]) in (40, 64) and len(parts[1]) in (40, 64):
            updates.append(RefUpdate(*parts))
    return updates, caps


def pkt(payload: bytes) -> bytes:
    return b"%04x" % (len(payload) + 4) + payload


def rejection(body: bytes, reason: str, message: str = "") -> bytes | None:
    """A receive-pack result rejecting every ref of the push in `body` with `reason`, and
    `message` shown by git as `remote: …`; None when `body` names no ref to reject."""
    updates, caps = parse_commands(body)
    if not updates:
        return None
    reason = " ".join(reason.split())           # one line: it ends a pkt-line
    report = pkt(b"unpack ok\n") + b"".join(
        pkt(f"ng {u.ref} {reason}\n".encode()) for u in updates) + b"0000"
    if "side-band-64k" not in caps and "side-band" not in caps:
        return report
    size = 65515 if "side-band-64k" in caps else 995
    out = b"".join(pkt(b"\2" + line.encode() + b"\n") for line in message.splitlines() if line)
    out += b"".join(pkt(b"\1" + report[i:i + size]) for i in range(0, len(report), size))
    return out + b"0000"
