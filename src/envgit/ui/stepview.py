"""One step as the page shows it: what changed (envgit diff's own parts: view/diffs.py's
`Part`, `unified_lines`; `.git` as git sees it, snapshot/gitview.py), the policy it ran under
against the current one, and what a row of the timeline says about it.

Contents of paths the policy denies to steps are withheld (view/secrets.py `Secrets`), as
`envgit diff` withholds them; the page has no --show-secrets. A generated directory (a
virtualenv, node_modules, build output, what the project's .gitignore ignores: view/generated.py)
is one line with its count and size; its files are shown on asking (`under`).
"""

import hashlib
import os
from types import SimpleNamespace

from ..view.names import agent_of, session_short, what_ran

FILES_WITH_TEXT = 200           # files whose diff text a page shows; the rest by name
FILES_LISTED = 2000             # files a page names; past it, a count (`envgit diff` lists all)
TEXT_BUDGET = 2 << 20           # characters of diff text on one page


def row(s) -> dict:
    """What the timeline shows of a step."""
    snap = s.snapshot or {}
    if s.status == "running":
        exit_ = "running"
    elif s.status == "interrupted":
        exit_ = "interrupted"
    else:
        exit_ = "-" if s.exit_code is None else str(s.exit_code)
    return {"id": s.id, "started_at": s.started_at, "exit": exit_, "failed": exit_ not in ("0", "-", "running"),
            "duration": duration(s.duration_ms), "session": s.session or "", "session_short": session_short(s.session),
            "agent": agent_of(s.session), "tool_call_id": s.tool_call_id or "", "marks": list(s.marks),
            "command": what_ran(s), "requests": len(s.requests),
            "changes": {k: snap.get(k) or 0 for k in ("added", "modified", "deleted")},
            "running": s.status == "running"}


def duration(ms) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.0f} m {ms / 1000 % 60:02.0f} s"


def changes(project, j, s, tree_before, under=None) -> dict:
    """{"from", "to", "files": [...], "folded": [generated directories], "git": [lines per
    repository], "error"}: the step's diff, each generated directory folded to one line
    (`folded`: path, files, bytes); `under`: only the files below that path, none folded."""
    from ..daemon.snapshots import display
    from ..snapshot import Store
    from ..snapshot.gitview import new_budget
    from ..view import generated
    from ..view.diffs import Part, new_work, unified_lines
    from ..view.errors import Refused
    from ..view.secrets import Secrets
    snap = s.snapshot or {}
    to = snap.get("tree")
    out = {"from": tree_before, "to": to, "files": [], "folded": [], "git": [], "error": None, "more": 0,
           "under": under}
    if not to:
        out["error"] = snap.get("error") or "this step has no snapshot"
        return out
    if s.id in j.dropped_snapshots():
        out["error"] = "its snapshot was dropped by `envgit gc`"
        return out
    try:
        secrets = Secrets(project, False)
    except Refused as e:            # a policy that does not load: nothing is shown that may be secret
        out["error"] = f"{e}"
        return out
    store = Store(project.state_path("objects"))
    try:
        args = SimpleNamespace(paths=[], raw=False, stat=False)
        part = Part(store, args, secrets, {"from": "before", "to": f"step {s.id}", "from_tree": tree_before,
                                          "to_tree": to, "outside": False, "step": s.id}, new_budget())
        if under is None:
            out["git"] = [{"gitdir": r.gitdir, "lines": r.lines()} for r in part.repos]
        ignore = generated.Ignore(_gitignore(store, to)) if under is None else None
        folded: dict[str, dict] = {}
        budget, work = TEXT_BUDGET, new_work()
        for c in part.listed:
            if (c.new_type or c.old_type) == "dir":
                continue
            path = display(c.path)
            if under is not None and not generated.under(path, under):
                continue
            key = generated.fold_key(path, ignore) if under is None else None
            if key is not None:             # one line for the directory: no content read
                g = folded.setdefault(key, {"path": key, "files": 0, "bytes": 0})
                g["files"] += 1
                g["bytes"] += (c.new_size if c.new_size is not None else c.old_size) or 0
                continue
            if len(out["files"]) == FILES_LISTED:
                out["more"] += 1
                continue
            f = {"path": path, "status": c.status, "old_size": c.old_size,
                 "new_size": c.new_size, "withheld": None, "lines": None, "not_shown": None}
            why = part.withheld(c)
            if why:
                f["withheld"] = why
            elif len(out["files"]) < FILES_WITH_TEXT and budget > 0:
                lines = unified_lines(store, tree_before, to, c, work)
                if isinstance(lines, str):
                    f["not_shown"] = lines
                    if lines.startswith("too much"):    # past diffs.DIFF_WORK: what shows it anyway
                        f["shows_it"] = f"envgit diff --full -- {f['path']}"
                else:
                    budget -= sum(len(x) for x in lines)
                    f["lines"] = [(_kind(x), x.rstrip("\n")) for x in lines]
            out["files"].append(f)
        out["folded"] = [{**g, "size": size(g["bytes"])} for _, g in sorted(folded.items())]
    except Exception as e:
        from ..view.errors import operational
        said = operational(e)
        if said is None:
            raise
        out["error"] = said[0]
    finally:
        store.close()
    return out


def _gitignore(store, tree) -> bytes | None:
    """The project's top .gitignore as the step left it (None: none, or unreadable)."""
    from ..snapshot import CorruptObject, StoreError
    try:
        return store.read_file(tree, b".gitignore")
    except (OSError, ValueError, StoreError, CorruptObject):
        return None


def size(n: int) -> str:
    """A byte count for a person: 812 bytes, 3.4 MB."""
    if n < 1000:
        return f"{n} bytes"
    x = float(n)
    for unit in ("KB", "MB", "GB"):
        x /= 1000
        if x < 1000 or unit == "GB":
            break
    return f"{x:.1f} {unit}"


def _kind(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "ctx")


def policy(project, s, tree_before) -> dict:
    """The policy the step ran under ({"sha256", "current", "same", "diff": lines or None,
    "note"}): its text is looked for in the snapshots before and after the step (envgit.yaml
    is read-only inside, so one of them holds it unless it changed meanwhile)."""
    import difflib

    from ..inert import inert_line
    from ..paths import POLICY_FILE
    from ..snapshot import CorruptObject, Store, StoreError
    try:
        with open(project.policy, "rb") as f:
            current = f.read()
    except OSError:
        current = b""
    now = hashlib.sha256(current).hexdigest()
    out = {"sha256": s.policy_sha256, "current": now, "same": s.policy_sha256 == now, "diff": None, "note": None}
    if out["same"] or not s.policy_sha256:
        return out
    old = None
    store = Store(project.state_path("objects"))
    try:
        for tree in ((s.snapshot or {}).get("tree"), tree_before):
            if not tree:
                continue
            try:
                data = store.read_file(tree, os.fsencode(POLICY_FILE))
            except (OSError, ValueError, StoreError, CorruptObject):   # absent, or damaged: not found
                continue
            if hashlib.sha256(data).hexdigest() == s.policy_sha256:
                old = data
                break
    finally:
        store.close()
    if old is None:
        out["note"] = "the text of that policy is in no snapshot around this step"
        return out
    try:
        lines = difflib.unified_diff(old.decode().splitlines(True), current.decode().splitlines(True),
                                     f"envgit.yaml (step {s.id})", "envgit.yaml (now)")
    except UnicodeDecodeError:
        out["note"] = "the policy is not UTF-8 text"
        return out
    out["diff"] = [(_kind(x), inert_line(x).rstrip("\n")) for x in lines]
    return out
