"""`envgit adopt ID` as the session daemon runs it: the main working tree becomes a branch's
tree, as one step, undoable with `envgit rewind --undo`.

An adopt is a rewind to a tree that may come from outside this journal (rewind.apply_target
does the work, in the order daemon/rewind.py gives: the undo point recorded, the begin entry
carrying `rewind` {to_step: null, target_tree, undo_tree, undo_step, adopt: {branch, kind…}},
the restore, the end). Before that, a fork branch's objects the main store lacks are copied in
(branch/adopt.py), so that everything the begin entry names is in the store when it is written:
a daemon killed after it finishes the adopt as it finishes any rewind (rewind.finish_interrupted).

  {"op": "adopt", "branch": "r<R>" | "N", "tree"?: the fork's tree (the CLI asked the branch's
   daemon for it), "policy"?, "apply": bool, "uid"}  -> the preview (with "adopt"); with apply,
   done (progress pushes while it writes)
"""

import asyncio

from .. import faults
from ..branch import adopt as found
from ..policy import PolicyError
from ..snapshot import CorruptObject, StoreError
from . import rewind
from .asks import user_name


async def op(sess, msg, conn=None) -> dict:
    branch, tree, policy = msg.get("branch"), msg.get("tree"), msg.get("policy") is True
    if not isinstance(branch, str):
        return {"error": "envgit: adopt needs a branch id (`envgit branches` lists them)", "exit": 2}
    try:
        if msg.get("apply"):
            return await rewind.applied(sess, conn, "adopt", apply, sess, branch, tree, policy,
                                        user_name(msg.get("uid")))
        return await asyncio.to_thread(preview, sess, branch, tree, policy)
    except (rewind.RewindError, found.AdoptError, PolicyError) as e:
        return {"error": f"envgit: {e}", "exit": 2}
    except (StoreError, CorruptObject) as e:
        return {"error": f"envgit: {e}; `envgit fsck` lists what is damaged (nothing was changed "
                "unless the reply said a step was recorded)", "exit": 4}


def target(sess, branch: str, tree) -> tuple[dict, dict | None]:
    """(the rewind target, what was copied into the main store or None). Refused before
    anything is written to the journal or the directory; a fork's objects are in the main
    store when it returns."""
    kind, n = found.parse(branch)
    journal = sess.journal
    problems, last = rewind.history(journal)
    rewind.undoable(problems, last, None)
    copied = None
    if kind == "rewound":
        b = found.rewound_branch(sess.project, journal, n)
        rewind.trust_history(journal, b["last_seq"], f"rewind step {n}", problems)
        tree_id, info = b["tree"], {"branch": branch, "kind": "rewound", "rewind_step": n, "steps": b["steps"]}
    else:
        rec = found.fork_branch(sess.project, n)
        tree_id = found.check_tree_id(tree)
        with sess.snapshotter.lock:         # the main store has one writer at a time
            copied = found.copy_tree(rec["dir"], sess.snapshotter.store.objects, tree_id)
        faults.point("adopt-copied")
        info = {"branch": branch, "kind": "fork", "dir": rec["dir"], "from_step": rec["from_step"]}
    return {"tree": tree_id, "to_step": None, "undoes": None, "policy": False, "adopt": info}, copied


def preview(sess, branch: str, tree, policy: bool) -> dict:
    t, copied = target(sess, branch, tree)
    _, shown, _ = rewind.plan(sess, t, None, policy)
    return {**shown, "adopt": t["adopt"], "copied": copied}


def apply(sess, branch: str, tree, policy: bool, user: str, progress=None) -> dict:
    """The adopt itself; the caller holds the session's tree lock."""
    rewind.idle(sess, "adopt")
    t, copied = target(sess, branch, tree)
    argv = ["envgit", "adopt", branch, *(["--policy"] if policy else [])]
    done = rewind.apply_target(sess, t, argv, None, policy, user, progress)
    return {**done, "adopt": t["adopt"], "copied": copied}
