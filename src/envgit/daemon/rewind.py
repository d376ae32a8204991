"""`envgit rewind N` / `envgit rewind --undo`: bring the project back to a tree, as a step of
its own, never losing what was there.

Order of work, so that a kill at any instant loses nothing:
  1. snapshot the directory as it is, once (the plan is made from that snapshot); if it differs
     from the last step's tree (edits made outside envgit since), record those as an `outside`
     step: the undo point is then always a step whose snapshot is exactly the directory as the
     rewind found it (`envgit rewind <that step>` or `envgit rewind --undo` returns to it)
  2. journal the intent: a `begin` entry carrying the target tree, the undo tree and step
  3. restore (idempotent: only what differs is written, through O_NOFOLLOW directory fds)
  4. snapshot again and journal the `end`
A rewind found open when a daemon starts is finished by restoring its target again.
Before anything is written, the journal's hash chain is verified up to the target's entries.
`envgit.yaml` at the root is the person's: it is left as it is unless the rewind is asked to
restore it (`policy`), and the plan says when it differs.
"""

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import faults, steporder
from ..journal.reseal import headless, named_steps  # steps `fsck --repair` set entries of aside
from ..paths import POLICY_FILE
from ..policy import PolicyError
from ..snapshot import StoreError
from . import outside
from .snapshots import SnapshotFailed, display

if TYPE_CHECKING:
    from ..snapshot import RestorePlan

POLICY_PATH = POLICY_FILE.encode()   # the one name (paths.py), as the store's bytes
LISTED = 1000               # paths listed in a plan (write, delete); the counts are always whole
PROGRESS_EVERY_S = 0.1      # progress frames at most this often


class RewindError(Exception):
    pass


def target_tree(journal, n: int, found=None) -> str:
    step = journal.step(n)
    if step is None or not step.snapshot or not step.snapshot.get("tree"):
        damaged = named_steps(journal).get(n) or (headless(journal, n) if step is None else None)
        if damaged:
            raise RewindError(f"{damaged}, so its snapshot cannot be trusted; nothing was changed: "
                              "pick another step, or `envgit restore` one into another directory")
    if step is None:
        raise RewindError(f"no step {n}; `envgit log` lists them")
    if n in journal.dropped_snapshots():
        raise RewindError(f"the snapshot of step {n} was dropped by `envgit gc`; pick a later step")
    if not step.snapshot or not step.snapshot.get("tree"):
        raise RewindError(f"step {n} has no snapshot ({step.status}); pick another step")
    back = taken_back(journal, n)
    if back is not None:                # what step n left standing, not the routes taken back
        step = back
    trust_history(journal, step.last_seq, f"step {n}", found)
    return step.snapshot["tree"]


TAKE_BACK_WITHIN = 64       # steps begun (in parallel sessions) between a step's end and its take-back


def taken_back(journal, n: int):
    """The `envgit take-back N` step (daemon/takeback.py) of step n, with a snapshot, or None."""
    for s in journal.steps_between(n + 1, n + TAKE_BACK_WITHIN):
        if s.argv == ["envgit", "take-back", str(n)] and s.snapshot and s.snapshot.get("tree"):
            return s
    return None


def trust_history(journal, seq: int, what: str, found=None) -> None:
    """Refuse, before anything is written, unless the hash chain verifies from the first entry
    through `seq` (the last entry of the target): a row edited to name another tree is found
    here, not after the directory was overwritten with it. `found`: history()'s problems,
    already read (filtered here as verify_through would)."""
    problems = journal.verify_through(seq) if found is None else [p for p in found if p.taints(seq)]
    if problems:
        raise RewindError(f"the journal does not verify up to {what}, so its snapshot cannot be "
                          f"trusted; nothing was changed: {problems[0].removeprefix('journal: ')}"
                          + (f" (and {len(problems) - 1} more: `envgit fsck`)" if len(problems) > 1 else "")
                          + _repair_hint(problems))


def _repair_hint(problems) -> str:
    """A damaged row (not a history found rewritten, which a repair cannot vouch for) is what
    `fsck --repair` sets aside; past a rewritten history, a snapshot can still be written elsewhere."""
    if all(p.until is not None for p in problems):
        return ("; `envgit restore N --target DIR` writes step N's snapshot into another directory "
                "without touching this one")
    return "; `envgit fsck --repair` sets the damaged entries aside and re-seals the journal"


def history(journal) -> tuple[list, int]:
    """(every problem of the chain through its last entry, that entry's seq): one walk serves
    the target's check and the undo point's (~0.8 s for 40,000 entries here)."""
    with journal.lock:
        last = journal.db.execute("SELECT MAX(seq) FROM entries").fetchone()[0] or 0
    return journal.problems(upto=last), last


def undoable(found, last, back_to) -> None:
    """Refuse a rewind whose own undo point would not verify: its entries are written after
    entry `last`, so a problem that taints it would make `rewind --undo` (and every rewind to a
    later step) refuse once the directory is overwritten: the latest work out of it, with no
    rewind to bring it back."""
    problems = [p for p in found if p.taints(last)]
    if problems:
        way = (f"run `envgit restore {back_to} --target DIR` to write step {back_to} into another "
               "directory without touching this one" if back_to is not None else "")
        raise RewindError(
            f"this rewind could not be undone: {problems[0].removeprefix('journal: ')}, so the journal "
            "would not verify up to the rewind's own undo point and `envgit rewind --undo` and rewinds "
            "to later steps would be refused afterwards; nothing was changed. Run `envgit fsck "
            "--repair` first (it sets the damaged entries aside and re-seals the journal)"
            + (f", or {way}" if way else ""))


def last_rewind(journal):
    """The newest rewind step (what `--undo` undoes), or None."""
    for s in journal.steps_newest_first():
        if s.rewind and s.rewind.get("undo_tree"):
            return s
    return None


def resolve(journal, step: int | None, undo: bool) -> dict:
    """What a rewind goes back to: {tree, to_step, undoes, policy (whether envgit.yaml is
    restored unless said otherwise)}. `undo`: the undo point of the newest rewind."""
    found, last = history(journal)  # read once: the target's history, then the undo point's
    if not undo:
        if step is None:            # (the server asks for one before it calls this)
            raise RewindError("a rewind needs a step number (or --undo)")
        tree = target_tree(journal, step, found)
        undoable(found, last, step)
        return {"tree": tree, "to_step": step, "undoes": None, "policy": False}
    r = last_rewind(journal)
    if r is None:
        raise RewindError("there is no rewind to undo; `envgit log` lists the steps")
    trust_history(journal, r.last_seq, f"the rewind of step {r.id}", found)
    info = r.rewind
    undoable(found, last, info.get("undo_step"))
    # Undoing a rewind that restored the policy puts the person's policy back too.
    return {"tree": info["undo_tree"], "to_step": info.get("undo_step"), "undoes": r.id,
            "policy": bool(info.get("policy"))}


def irreversible_after(journal, n: int | None) -> list[str]:
    """A warning for every step after N that let an irreversible action out."""
    if n is None:
        return []
    out = []
    for s in journal.steps():
        if s.id <= n:
            continue
        for r in s.irreversible:
            what = r.get("kind") or f"{r.get('method')} {r.get('path', '')}"
            out.append(f"step {s.id} {what} to {r.get('host')}: a rewind cannot take that back")
        if not s.irreversible and "irreversible" in s.marks:
            out.append(f"step {s.id} was marked irreversible: a rewind cannot take that back")
    return out


def crossed(journal, target) -> list[str]:
    """The steps a re-seal (`fsck --repair`) set entries of aside that this rewind goes to or
    across: between its target and where the directory was last brought (the newest rewind's
    target, else the newest step)."""
    named = named_steps(journal)
    if not named or target["to_step"] is None:
        return []
    newest = next(journal.steps_newest_first(), None)
    at = newest.id if newest else target["to_step"]
    if newest is not None and newest.rewind and newest.rewind.get("to_step") is not None:
        at = newest.rewind["to_step"]
    lo, hi = sorted((target["to_step"], at))
    return [text for n, text in sorted(named.items()) if lo <= n <= hi]


def _is_policy(path: bytes) -> bool:
    return path == POLICY_PATH or path.startswith(POLICY_PATH + b"/")


def keep_policy(p, restore_policy: bool) -> bool:
    """Whether the plan would change envgit.yaml; unless asked to, take it out of the plan."""
    differs = any(_is_policy(i.path) for i in p.write + p.delete)
    if differs and not restore_policy:
        p.write = [i for i in p.write if not _is_policy(i.path)]
        p.delete = [i for i in p.delete if not _is_policy(i.path)]
        p.keep.append((POLICY_PATH, 0, "the policy is yours: kept as it is (`--policy` restores it)"))
    return differs


def by_top(p) -> dict:
    """{top-level name: {"write": files, "delete": files, "dir": bool}}: the plan summarised by
    what is directly in the project (directories themselves are not counted, their files are)."""
    out: dict[str, dict] = {}
    for what, items in (("write", p.write), ("delete", p.delete)):
        for i in items:
            top = display(i.path.split(b"/", 1)[0])
            d = out.setdefault(top, {"write": 0, "delete": 0, "dir": False})
            if i.type == "dir":
                d["dir"] = True
            else:
                d[what] += 1
                d["dir"] = d["dir"] or b"/" in i.path
    return out


def git_summary(sess, p) -> list[dict]:
    """What the plan does to each repository's `.git`, as git sees it (refs moved, commits
    added and lost, index changed: snapshot/gitview.py), so that the plan says that instead of
    listing object files. Empty when the plan touches no gitdir."""
    if not any(i.path == b".git" or i.path.startswith(b".git/") or b"/.git/" in i.path
               for i in p.write + p.delete):
        return []
    try:
        repos = sess.snapshotter.git_view(p.current_tree_id, p.tree_id)
    except (StoreError, OSError) as e:
        return [{"gitdir": ".git", "problems": [f"not read: {e}"], "lines": [f"git: not read: {e}"]}]
    return [{**r.to_json(), "lines": r.lines()} for r in repos]


def plan(sess, target: dict, paths: list[str] | None, restore_policy: bool) -> "tuple[RestorePlan, dict, dict]":
    """(plan, preview, the snapshot summary of the directory as it is against the last tree)."""
    p, now = sess.snapshotter.plan_restore(sess.policy(), target["tree"], paths, sess.last_tree)
    differs = keep_policy(p, restore_policy)

    def listed(items, with_size):
        return [{"path": display(i.path), "type": i.type, **({"size": i.size} if with_size else {})}
                for i in items[:LISTED]]
    preview = {
        "step": target["to_step"], "undoes": target["undoes"],
        "target_tree": target["tree"], "undo_tree": p.current_tree_id,
        "counts": {"write": len(p.write), "delete": len(p.delete), "keep": len(p.keep)},
        "by_top": by_top(p), "git": git_summary(sess, p),
        "write": listed(p.write, True), "delete": listed(p.delete, False),
        "listed_whole": len(p.write) <= LISTED and len(p.delete) <= LISTED,
        "keep": [{"path": display(k[0]), "reason": k[2]} for k in p.keep],
        "policy": {"differs": differs, "restored": differs and restore_policy},
        # edits made since the last step, which the rewind records first (its undo point)
        "outside": None if now["tree"] == sess.last_tree else {
            k: now[k] for k in ("added", "modified", "deleted", "paths", "paths_truncated")},
        "warnings": irreversible_after(sess.journal, target["to_step"]) + crossed(sess.journal, target),
        "memory": memory_plan(sess, target["to_step"], paths),
    }
    return p, preview, now


def memory_plan(sess, to_step, paths):
    """backend: vm: whether the target step's memory snapshot brings its processes back."""
    try:
        pol = sess.policy()
    except PolicyError:
        return None
    if getattr(pol, "backend", "sandbox") != "vm" or paths or to_step is None:
        return None
    if sess.vm is not None:             # waits for the step's snapshot if it is being written
        return {"step": to_step, "available": sess.vm.has_memory(to_step)}
    from ..vm import memstore
    return {"step": to_step, "available": memstore.complete(memstore.path(sess.project, to_step))}


def preview(sess, step, undo, paths, restore_policy) -> dict:
    target = resolve(sess.journal, step, undo)
    _, shown, _ = plan(sess, target, paths, restore_policy or target["policy"])
    return shown


def apply(sess, step: int | None, undo: bool, paths: list[str] | None, restore_policy: bool, user: str,
          progress=None) -> dict:
    """The rewind itself. The caller holds the session's tree lock (no step begins meanwhile)."""
    idle(sess, "rewind")
    target = resolve(sess.journal, step, undo)
    restore_policy = restore_policy or target["policy"]
    name = ["--undo"] if undo else [str(step)]
    argv = ["envgit", "rewind", *name, *(["--policy"] if restore_policy and not target["policy"] else []),
            *(["--", *paths] if paths else [])]
    return apply_target(sess, target, argv, paths, restore_policy, user, progress)


async def applied(sess, conn, what: str, fn: "Callable[..., dict]", *args) -> dict:
    """`fn(*args, progress)` on a thread while no step may begin (the tree lock), its progress
    pushed to `conn`'s client: how a rewind and an adopt (adopt.py) write the directory."""
    import asyncio
    loop = asyncio.get_running_loop()

    def progress(done, total):      # on the worker thread: the loop sends it
        if conn is not None:
            loop.call_soon_threadsafe(sess.push_to, conn, {
                "push": "progress", "what": what, "unit": "path", "done": done,
                "total": total, "text": f"{what}: {done}/{total} paths"})
    async with sess.tree_lock:
        return await asyncio.to_thread(fn, *args, progress=progress)


def idle(sess, what: str) -> None:
    if sess.live or getattr(sess, "starting", 0):
        which = f"step {min(sess.live)} is running" if sess.live else "a step is starting"
        raise RewindError(f"{which}; {what} when no step runs")


def apply_target(sess, target: dict, argv: list[str], paths: list[str] | None, restore_policy: bool,
                 user: str, progress=None) -> dict:
    """Bring the directory to target["tree"] as one step recorded with `argv`, in the order the
    module's docstring gives. An adopt (daemon/adopt.py) comes here too: its target carries
    `adopt` (which branch), recorded in the step's `rewind`, and its objects are in the store."""
    p, shown, now = plan(sess, target, paths, restore_policy)
    undo_step = undo_point(sess, now)
    faults.point("rewind-undo-recorded")
    pol = sess.policy()
    adopt = target.get("adopt")
    rewind_step = sess.journal.begin_step({
        "argv": argv, "cwd": sess.project.root, "session": sess.id, "user": user, "policy_sha256": pol.sha256,
        "marks": ["rewind", "adopt"] if adopt else ["rewind"],
        "rewind": {"to_step": target["to_step"], "target_tree": target["tree"], "undo_tree": p.current_tree_id,
                   "undo_step": undo_step, "undoes": target["undoes"], "paths": paths or None,
                   "policy": restore_policy, **({"adopt": adopt} if adopt else {})}})
    faults.point("rewind-begun")
    try:
        sess.snapshotter.restore(p, throttled(progress))
    except (StoreError, OSError) as e:
        sess.journal.append(rewind_step, "end", {"exit_code": 1, "marks": ["rewind", "refused"], "error": str(e),
                                                 "snapshot": snapshot_after(sess, pol, p.current_tree_id)})
        if isinstance(e, StoreError):
            raise                       # the store is damaged: said as such (exit 4)
        raise RewindError(f"{e}; `envgit rewind {undo_step}` returns to where the rewind started") from None
    faults.point("rewind-restored")
    memory = None if adopt else vm_memory(sess, pol, target["to_step"], undo_step, rewind_step, paths)
    summary = snapshot_after(sess, pol, p.current_tree_id)
    sess.journal.append(rewind_step, "end", {"exit_code": 0, "marks": ["rewind", "adopt"] if adopt else ["rewind"],
                                             "snapshot": summary,
                                             **({"memory": memory} if memory else {})})
    return {**shown, "rewind_step": rewind_step, "undo_step": undo_step, "snapshot": summary,
            **({"memory": memory} if memory else {})}


def vm_memory(sess, pol, to_step, undo_step, rewind_step, paths):
    """backend: vm: the machine's memory back to `to_step`'s too (vm/host.py); a rewind of
    some paths only brings back files."""
    if getattr(pol, "backend", "sandbox") != "vm" or paths:
        return None
    from ..vm.host import VMHost
    if sess.vm is None:
        sess.vm = VMHost(sess.project)
    return sess.vm.rewind(pol, to_step, undo_step, rewind_step)


def undo_point(sess, now) -> int:
    """The step whose snapshot is the directory as the rewind found it: the last step's, or an
    `outside` step recorded now with the changes made since (the person's edits)."""
    if now["tree"] == sess.last_tree:
        last = steporder.newest_tree(sess.journal)      # newest in time: steps run at once
        if last is not None and last.tree == now["tree"] \
                and last.step not in sess.journal.dropped_snapshots():
            return last.step
    return outside.write(sess, now, "rewind")


def throttled(progress):
    """progress(done, total), called at most every PROGRESS_EVERY_S and at the end."""
    if progress is None:
        return None
    last = [0.0]

    def report(done, total):
        now = time.monotonic()
        if done == total or now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            progress(done, total)
    return report


def snapshot_after(sess, pol, undo_tree) -> dict:
    """The snapshot after a restore (it becomes the last tree); a failure is recorded on the
    rewind (the restore itself is done), never left to keep the rewind open."""
    try:
        summary = sess.snapshotter.take(pol, undo_tree)
    except (SnapshotFailed, OSError) as e:
        return {"error": f"snapshot failed: {e}"}
    sess.last_tree, sess.tree_unknown = summary["tree"], False
    return summary


def finish_interrupted(sess) -> list[int]:
    """Complete every rewind a killed daemon left open; returns their step ids."""
    done = []
    for s in sess.journal.open_steps():
        info = s.rewind
        if not info:
            continue
        undo = info.get("undo_step")
        back = f"`envgit rewind {undo}`" if undo else "`envgit rewind --undo`"
        try:
            trust_history(sess.journal, s.last_seq, f"the interrupted rewind (step {s.id})")
            pol = sess.policy()
            snap = sess.snapshotter
            # The directory as the kill left it, and whatever the person changed since (they
            # may have edited for hours before the next command): recorded as a step of its
            # own before the restore writes over it, so finishing the rewind loses nothing.
            now = snap.take(pol, sess.last_tree) if sess.last_tree else None
            found = None
            if now is not None and now["tree"] not in (sess.last_tree, info["target_tree"]):
                found = outside.write(sess, now, "rewind-finish")
            p, _ = snap.plan_restore(pol, info["target_tree"], info.get("paths"), sess.last_tree)
            keep_policy(p, bool(info.get("policy")))
            snap.restore(p)
        except (RewindError, StoreError, PolicyError, SnapshotFailed, OSError) as e:
            # Closed, not left open: an open rewind would be retried (and fail) by every command.
            # Its snapshot (when one can be taken) records the directory as the kill left it.
            try:
                after = snapshot_after(sess, sess.policy(), info.get("undo_tree"))
            except PolicyError as pe:
                after = {"error": f"snapshot failed: {pe}"}
            sess.journal.append(s.id, "end", {
                "exit_code": 1, "marks": ["rewind", "not-finished"], "snapshot": after,
                "error": f"the rewind was interrupted and could not be finished: {e}; the directory "
                         f"may be partly rewound: rewind again, or {back} to go back"})
            continue
        summary = snapshot_after(sess, pol, info.get("undo_tree"))
        end = {"exit_code": 0, "marks": ["rewind", "finished-after-crash"], "snapshot": summary}
        if found is not None:           # `envgit rewind FOUND` gives the directory back as it was
            end["found_step"] = found
            sess.outside_notices.append(
                f"an interrupted rewind (step {s.id}) was finished; the directory as the interruption "
                f"left it, with any change made since, is step {found}: `envgit rewind {found}` brings it back")
        sess.journal.append(s.id, "end", end)
        done.append(s.id)
    return done
