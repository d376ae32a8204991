"""Journal segments and heads on a remote (docs/FORMAT.md, "Journal segments", "Head"):
their plaintexts, and the chain a reader builds from them."""

import hashlib
import json
from json.encoder import encode_basestring_ascii as _esc

import zstandard

from ..journal import GENESIS, entry_hash

SEGMENT_FORMAT = "envgit-segment-1"
HEAD_FORMAT = "envgit-head-1"
MAX_ENTRIES = 20_000
MERGE_RUN = 32          # this many small segments in a row are rewritten as one


def encode_segment(project, machine, rows, after_head: int) -> bytes:
    """rows: (seq, step, kind, at_ns, body, prev, hash) in seq order, contiguous."""
    head = {"format": SEGMENT_FORMAT, "project": project, "machine": machine,
            "first": rows[0][0], "last": rows[-1][0], "after_head": after_head}
    lines = [json.dumps(head, sort_keys=True)] + [json.dumps(list(r), separators=(",", ":")) for r in rows]
    return zstandard.ZstdCompressor(level=3).compress("\n".join(lines).encode())


class BadSegment(Exception):
    pass


def decode_segment(data: bytes, project, machine, first, last) -> tuple[dict, list]:
    """(header, rows) of a segment's plaintext, checked against the name it was read under."""
    try:
        text = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30).decode()
        top, _, rest = text.partition("\n")
        head = json.loads(top)
        # one document for all the lines: one call into the C decoder, not one per entry
        rows = json.loads("[" + rest.replace("\n", ",") + "]") if rest else []
    except (zstandard.ZstdError, UnicodeDecodeError, ValueError) as e:
        raise BadSegment(f"not a journal segment ({e})") from None
    if not isinstance(head, dict) or head.get("format") != SEGMENT_FORMAT:
        raise BadSegment("not a journal segment (unknown format)")
    if ((head.get("project"), head.get("machine"), head.get("first"), head.get("last"))
            != (project, machine, first, last)):
        raise BadSegment(f"its header names {head.get('project')}/{head.get('machine')} entries "
                         f"{head.get('first')}-{head.get('last')}, not its own name")
    if len(rows) != last - first + 1 or any(not isinstance(r, list) or len(r) != 7 for r in rows):
        raise BadSegment(f"holds {len(rows)} entries, its name says {last - first + 1}")
    return head, rows


def _fast_hash(seq, step, kind, at, body, prev) -> str:
    """journal.entry_hash, without building a list for json.dumps: the same bytes when every
    number is an int and every text a str (checked; anything else goes the slow way)."""
    if type(seq) is int and type(step) is int and type(at) is int and type(kind) is str \
            and type(body) is str and type(prev) is str:
        text = f"[{seq},{step},{_esc(kind)},{at},{_esc(body)},{_esc(prev)}]"
        return hashlib.sha256(text.encode()).hexdigest()
    return entry_hash(seq, step, kind, at, body, prev)


def check_rows(rows, prev: str, where: str) -> tuple[list[str], str]:
    """Problems of contiguous rows whose first follows `prev`: each hash recomputed, each prev
    the hash before it. Returns (problems, the last hash)."""
    problems = []
    expect = rows[0][0] if rows else 0
    for seq, step, kind, at, body, p, h in rows:
        if seq != expect:
            problems.append(f"{where}: entry {expect} is missing (next is {seq})")
        if p != prev:
            problems.append(f"{where}: entry {seq} does not follow entry {seq - 1} (chain broken)")
        try:
            ok = _fast_hash(seq, step, kind, at, body, p) == h
        except (TypeError, ValueError):
            ok = False
        if not ok:
            problems.append(f"{where}: entry {seq} ({kind} of step {step}) was changed after it was written")
        prev, expect = h, seq + 1
    return problems, prev


def chain(ranges, upto: int) -> tuple[list[tuple[int, int]], int]:
    """The segments a reader uses: from entry 1, the longest segment starting at each point
    that ends at or before `upto`. Returns (the chain, the first seq it could not reach, or
    upto + 1 when it reached the end)."""
    by_first: dict[int, int] = {}
    for first, last in ranges:
        if last <= upto and last > by_first.get(first, 0):
            by_first[first] = last
    out, at = [], 1
    while at <= upto:
        last = by_first.get(at)
        if last is None:
            break
        out.append((at, last))
        at = last + 1
    return out, at


def encode_head(project, machine, version, seq, h, step, packs, pushed_at, branch=None) -> bytes:
    head = {"format": HEAD_FORMAT, "project": project, "machine": machine, "version": version,
            "seq": seq, "hash": h, "step": step, "packs": packs, "pushed_at": pushed_at}
    if branch is not None:      # a fork branch's push: whose branch it is (docs/FORMAT.md, "Head")
        head["branch"] = branch
    return json.dumps(head, sort_keys=True).encode()


def decode_head(data: bytes, project, machine) -> dict:
    try:
        head = json.loads(data)
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != HEAD_FORMAT:
        raise BadSegment("not a head")
    if (head.get("project"), head.get("machine")) != (project, machine):
        raise BadSegment(f"names {head.get('project')}/{head.get('machine')}, not its own place")
    for k in ("version", "seq", "step", "packs"):
        if type(head.get(k)) is not int or head[k] < 0:
            raise BadSegment(f"its {k} is not a count")
    if not isinstance(head.get("hash"), str):
        raise BadSegment("no hash")
    branch = head.get("branch")
    if branch is not None and not (isinstance(branch, dict) and isinstance(branch.get("parent"), str)
                                   and all(type(branch.get(k)) is int for k in ("id", "from_step"))
                                   and isinstance(branch.get("from_tree"), str)):
        raise BadSegment("its branch is not a fork branch's record")
    return head


__all__ = ["GENESIS"]
