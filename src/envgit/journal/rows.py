"""What a journal entry may hold: one table of kinds and the types of their known keys, used
both ways. Writing, `check_entry` refuses an entry that does not fit (nothing is written);
reading, `read_body` gives back only the keys that fit, and the list of what did not, so a
row edited by hand, or written by a buggy or hostile peer before this check existed, is
skipped field by field and named by fsck instead of crashing every reader.

Unknown keys are kept (a producer may add its own); unknown kinds are refused on the way in
and ignored on the way out. Standard library only.
"""

import json


def _str(v):
    return isinstance(v, str)


def _opt_str(v):
    return v is None or isinstance(v, str)


def _bool(v):
    return type(v) is bool


def _int(v):
    return type(v) is int


def _opt_int(v):
    return v is None or type(v) is int


def _opt_num(v):
    return v is None or (type(v) in (int, float) and v == v)


def _strs(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _ints(v):
    return isinstance(v, list) and all(type(x) is int for x in v)


def _obj(v):
    return isinstance(v, dict)


_HEX = "0123456789abcdef"


def _tree(v):
    return type(v) is str and len(v) == 64 and not v.strip(_HEX)


def _opt_tree(v):
    return v is None or _tree(v)


def _snapshot(v):
    """A step's snapshot summary: a tree and its counts, or the error that stopped it."""
    if not isinstance(v, dict):
        return False
    if "tree" not in v:
        return isinstance(v.get("error"), str)
    left = v.get("left_out", {})
    if not (_tree(v["tree"]) and type(v.get("added")) is int and type(v.get("modified")) is int
            and type(v.get("deleted")) is int and type(v.get("bytes", 0)) is int
            and type(v.get("ms")) in (int, float) and type(left) is dict
            and type(left.get("count", 0)) is int and type(left.get("bytes", 0)) is int):
        return False
    paths = v.get("paths", [])
    if type(paths) is not list:
        return False
    for p in paths:          # a loop, not all(): the fold reads every step's (up to 200 each)
        if type(p) is not dict or type(p.get("path")) is not str or type(p.get("status")) is not str \
                or not p["status"]:
            return False
    return True


def _baseline(v):
    return isinstance(v, dict) and _tree(v.get("tree")) and _opt_num(v.get("ms"))


def _rewind(v):
    return (isinstance(v, dict) and _opt_int(v.get("to_step")) and _tree(v.get("target_tree"))
            and _opt_tree(v.get("undo_tree")) and _opt_int(v.get("undo_step"))
            and _opt_int(v.get("undoes")) and (v.get("paths") is None or _strs(v.get("paths")))
            and (v.get("policy") is None or _bool(v.get("policy"))))


def _lost_range(v):
    return _ints(v) and len(v) == 2


def _links(v):
    """A `reseal` entry's re-joins of the chain (journal/reseal.py)."""
    return isinstance(v, list) and all(
        isinstance(x, dict) and _int(x.get("seq")) and _int(x.get("after"))
        and _str(x.get("prev")) and _str(x.get("after_hash")) for x in v)


def _port_pairs(v):
    return isinstance(v, list) and all(
        isinstance(x, list) and len(x) == 2 and all(type(p) is int and 0 < p < 65536 for p in x) for x in v)


def _denied_reads(v):
    """An end's placeholders of denied paths the step opened (daemon/denials.py)."""
    return isinstance(v, list) and all(
        isinstance(x, dict) and set(x) == {"path", "rule", "where"} and all(_str(y) for y in x.values())
        for x in v)


def _named(v):
    return isinstance(v, list) and all(
        isinstance(x, dict) and _int(x.get("seq")) and _opt_int(x.get("step"))
        and _opt_str(x.get("kind")) and _str(x.get("why")) for x in v)


# A path list in an entry holds at most LISTED_MAX paths, and `<key>_more` says how many more
# there were: a step chooses how many files it writes, and an entry must stay small enough to
# be written whole, also into the space kept for a full disk (daemon/heldends.py).
LISTED_MAX = 1000


def listed(key: str, paths: list) -> dict:
    """{key: at most LISTED_MAX of `paths`, key_more: the rest's count}; {} for none."""
    if not paths:
        return {}
    more = len(paths) - LISTED_MAX
    return {key: list(paths[:LISTED_MAX]), **({f"{key}_more": more} if more > 0 else {})}


KINDS = {
    "begin": {"argv": _strs, "cwd": _str, "session": _str, "user": _str, "pid": _opt_int,
              "policy_sha256": _str, "tool_call_id": _opt_str, "marks": _strs,
              "baseline": _baseline, "rewind": _rewind, "origin": _str, "published": _port_pairs,
              "learn": _bool, "sandbox": _obj},
    "end": {"exit_code": _opt_int, "signal": _opt_str, "duration_ms": _opt_num, "marks": _strs,
            "denied_paths": _strs, "escape_routes": _strs, "snapshot": _snapshot, "extra": _obj,
            "error": _str, "refused_by": _str, "policy_files": _strs, "dns_names": _strs,
            "dns_queries": _opt_int, "taken_back": _strs, "found_step": _opt_int,
            "denied_reads": _denied_reads,
            **{f"{k}_more": _int for k in ("denied_paths", "escape_routes", "taken_back", "policy_files",
                                           "denied_reads")}},
    "interrupted": {"reason": _str, "snapshot": _snapshot, "escape_routes": _strs, "taken_back": _strs,
                    **{f"{k}_more": _int for k in ("escape_routes", "taken_back")}},
    # A step of its own, one entry long: what changed outside envgit since the last snapshot
    # (the person's editor, their own git), recorded before the next step or rewind begins.
    "outside": {"snapshot": _snapshot, "session": _str, "user": _str, "since_step": _opt_int,
                "before": _str, "sandboxes_alive": _int, "setuid_stripped": _strs},
    "request": {"method": _str, "scheme": _str, "host": _str, "path": _str, "decision": _str,
                "error": _str},
    "approval": {"question": _obj, "granted_by": _opt_str},
    # Remembered grants (daemon/grants.py), project entries: the grant whole, and its revocation.
    "grant": {"id": _str, "scope": _obj, "who": _str, "how": _str, "at": _opt_num,
              "expires_at": _opt_num, "step": _opt_int, "ask": _opt_int},
    "grant-revoke": {"id": _str, "who": _str, "how": _str, "at": _opt_num},
    "mcp-call": {},
    "file-op": {},
    "note": {},
    "gc": {"dropped": _ints, "kept": _ints, "freed": _opt_int},
    "gc-done": {"freed": _int},
    "lost": {"entries": _lost_range, "last_step": _int, "head_hash": _str, "reason": _str,
             "rewritten": _bool, "head_damaged": _bool},
    # `envgit fsck --repair` set rows that did not verify aside and re-joined the chain past them
    "reseal": {"set_aside": _ints, "missing": _ints, "links": _links, "named": _named,
               "closed": _ints, "reason": _str},
}
PROJECT_KINDS = {"gc", "gc-done", "lost", "grant", "grant-revoke", "reseal"}      # entries of step 0, the project's own


def check_entry(step, kind, body) -> str:
    """The canonical text of the body; ValueError saying what is wrong if the entry may not be
    written (the caller's mistake, or a peer's: nothing is written then)."""
    if kind not in KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    if type(step) is not int or step < 0 or (step == 0) != (kind in PROJECT_KINDS):
        raise ValueError(f"a {kind} entry cannot belong to step {step!r}")
    if not isinstance(body, dict):
        raise ValueError(f"the body of a {kind} entry must be an object, not {type(body).__name__}")
    bad = [k for k, ok in KINDS[kind].items() if k in body and not ok(body[k])]
    if bad:
        raise ValueError(f"{kind} entry: wrong type for {', '.join(sorted(bad))}")
    try:
        text = canonical(body)
        text.encode()
    except (TypeError, ValueError, UnicodeEncodeError) as e:
        raise ValueError(f"{kind} entry: not plain JSON ({e})") from None
    return text


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def read_body(kind, text) -> tuple[dict | None, list[str]]:
    """(the body with only the keys that fit, what was wrong): None when the row is unusable
    whole (not JSON, not an object, a kind nobody writes)."""
    if kind not in KINDS:
        return None, [f"unknown kind {kind!r}"]
    try:
        body = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None, ["its body is not valid JSON"]
    if not isinstance(body, dict):
        return None, ["its body is not a JSON object"]
    bad = [k for k, ok in KINDS[kind].items() if k in body and not ok(body[k])]
    if bad:
        bad.sort()
        body = {k: v for k, v in body.items() if k not in bad}
        return body, [f"wrong type for {', '.join(bad)} (left out when read)"]
    return body, []
