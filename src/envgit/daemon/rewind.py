"""`envgit rewind N`: bring the project back to the snapshot after step N, as a step of its own.

Order of work, so that a kill at any instant loses nothing:
  1. snapshot the directory as it is (the undo point: `envgit rewind <this step>` returns to it)
  2. journal the intent: a `begin` entry carrying the target tree and the undo tree
  3. restore (idempotent: only what differs is written, through O_NOFOLLOW directory fds)
  4. snapshot again and journal the `end`
A rewind found open when a daemon starts is finished by restoring its target again.
Before anything is written, the journal's hash chain is verified up to the target's entries.
"""

from .. import faults
from ..policy import PolicyError
from ..snapshot import StoreError
from .snapshots import SnapshotFailed, display


class RewindError(Exception):
    pass


def target_tree(journal, n: int) -> str:
    step = journal.step(n)
    if step is None:
        raise RewindError(f"no step {n}; `envgit log` lists them")
    if n in journal.dropped_snapshots():
        raise RewindError(f"the snapshot of step {n} was dropped by `envgit gc`; pick a later step")
    if not step.snapshot or not step.snapshot.get("tree"):
        raise RewindError(f"step {n} has no snapshot ({step.status}); pick another step")
    trust_history(journal, step.last_seq, f"step {n}")
    return step.snapshot["tree"]


def trust_history(journal, seq: int, what: str) -> None:
    """Refuse, before anything is written, unless the hash chain verifies from the first entry
    through `seq` (the last entry of the target): a row edited to name another tree is found
    here, not after the directory was overwritten with it."""
    problems = journal.verify_through(seq)
    if problems:
        raise RewindError(f"the journal does not verify up to {what}, so its snapshot cannot be "
                          f"trusted; nothing was changed: {problems[0].removeprefix('journal: ')}"
                          + (f" (and {len(problems) - 1} more: `envgit fsck`)" if len(problems) > 1 else ""))


def irreversible_after(journal, n: int) -> list[str]:
    """A warning for every step after N that let an irreversible action out."""
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


def plan(sess, n: int, paths: list[str] | None) -> tuple[object, dict]:
    tree = target_tree(sess.journal, n)
    p = sess.snapshotter.plan_restore(sess.policy(), tree, paths)
    preview = {
        "step": n, "target_tree": tree, "undo_tree": p.current_tree_id,
        "write": [{"path": display(i.path), "type": i.type, "size": i.size} for i in p.write],
        "delete": [{"path": display(i.path), "type": i.type} for i in p.delete],
        "keep": [{"path": display(k[0]), "reason": k[2]} for k in p.keep],
        "warnings": irreversible_after(sess.journal, n),
    }
    return p, preview


def apply(sess, n: int, paths: list[str] | None, user: str) -> dict:
    if sess.live:
        raise RewindError(f"step {min(sess.live)} is running; rewind when no step runs")
    p, preview = plan(sess, n, paths)
    pol = sess.policy()
    step = sess.journal.begin_step({
        "argv": ["envgit", "rewind", str(n), *(["--", *paths] if paths else [])],
        "cwd": sess.project.root, "session": sess.id, "user": user, "policy_sha256": pol.sha256,
        "marks": ["rewind"],
        "rewind": {"to_step": n, "target_tree": preview["target_tree"],
                   "undo_tree": preview["undo_tree"], "paths": paths or None}})
    faults.point("rewind-begun")
    try:
        sess.snapshotter.restore(p)
    except (StoreError, OSError) as e:
        sess.journal.append(step, "end", {"exit_code": 1, "marks": ["rewind", "refused"],
                                          "error": str(e)})
        if isinstance(e, StoreError):
            raise                       # the store is damaged: said as such (exit 4)
        raise RewindError(str(e)) from None
    faults.point("rewind-restored")
    summary = snapshot_after(sess, pol, preview["undo_tree"])
    sess.journal.append(step, "end", {"exit_code": 0, "marks": ["rewind"], "snapshot": summary})
    return {**preview, "rewind_step": step, "snapshot": summary}


def snapshot_after(sess, pol, undo_tree) -> dict:
    """The snapshot after a restore; a failure is recorded on the rewind (the restore itself is
    done), never left to keep the rewind open."""
    try:
        return sess.snapshotter.take(pol, undo_tree)
    except (SnapshotFailed, OSError) as e:
        return {"error": f"snapshot failed: {e}"}


def finish_interrupted(sess) -> list[int]:
    """Complete every rewind a killed daemon left open; returns their step ids."""
    done = []
    for s in sess.journal.open_steps():
        info = s.rewind
        if not info:
            continue
        try:
            trust_history(sess.journal, s.last_seq, f"the interrupted rewind (step {s.id})")
            pol = sess.policy()
            snap = sess.snapshotter
            snap.restore(snap.plan_restore(pol, info["target_tree"], info.get("paths")))
        except (RewindError, StoreError, PolicyError, OSError) as e:
            # Closed, not left open: an open rewind would be retried (and fail) by every command.
            sess.journal.append(s.id, "end", {
                "exit_code": 1, "marks": ["rewind", "not-finished"],
                "error": f"the rewind was interrupted and could not be finished: {e}; the directory "
                         f"may be partly rewound: `envgit rewind {info['to_step']}` again, or "
                         f"`envgit rewind {s.id - 1}` to go back"})
            continue
        summary = snapshot_after(sess, pol, info["undo_tree"])
        sess.journal.append(s.id, "end", {"exit_code": 0, "marks": ["rewind", "finished-after-crash"],
                                          "snapshot": summary})
        done.append(s.id)
    return done
