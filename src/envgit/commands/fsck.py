"""fsck: verify the journal chain and the snapshot store; --repair salvages a damaged journal."""

import os

from ..inert import inert
from ..paths import find_project
from . import EXIT_DAEMON, Usage, command, json_flag, open_journal, out, progress


def add_parsers(sub, argparse):
    s = command(sub, "fsck", help="verify the journal chain (and the snapshot store)",
                example=["envgit fsck", "envgit fsck --json", "envgit fsck --repair"])
    json_flag(s)
    s.add_argument("--repair", action="store_true", help="rebuild a damaged journal.sqlite keeping "
                   "every entry that can still be read (the damaged file is kept beside it)")
    s.add_argument("--remote", metavar="NAME", help="check a remote's bucket instead: every object "
                   "opened and re-hashed, every machine's chain and head checked")
    s.set_defaults(fn=cmd_fsck)


# --- fsck --------------------------------------------------------------------------------

def cmd_fsck(args):
    if args.remote is not None:
        from .remote import fsck_remote
        return fsck_remote(args)
    project = find_project()
    if args.repair:
        return _fsck_repair(project, args)
    return _verify(project, args)


def _verify(project, args, repaired=None):
    """Check the journal chain and the store; `repaired`: what --repair did (said first)."""
    import sqlite3
    try:
        j = open_journal(project)
        problems = j.verify() if j else []
        trees = j.live_trees() if j else []
    except sqlite3.DatabaseError as e:
        return _fsck_damaged(project, e, args, repaired)
    if os.path.isdir(project.state_path("objects")):
        from ..snapshot import Store
        store = Store(project.state_path("objects"))
        with progress(unit="pack", desc="fsck: re-hashing packs") as bar:
            def advance(done, total):
                bar.total = total
                bar.update(done - bar.n)
            problems += store.fsck(trees, advance)
    from ..branch.check import problems as branch_problems
    problems += branch_problems(project, j.steps() if j else [], trees)
    from ..vm import memstore  # the VM tier's memory snapshots (backend: vm)
    mem_problems, notes = memstore.check(project, {s.id for s in j.steps()} if j else None)
    problems += mem_problems
    if args.json:
        out({"ok": not problems, "problems": problems, "snapshots_checked": len(trees),
             "repaired": repaired})
    else:
        if repaired:
            print(repaired)
        for n in notes:
            print(inert(n))
        for p in problems:
            print(inert(p))
        print(f"fsck: ok ({len(trees)} snapshot(s), journal chain intact)" if not problems
              else f"fsck: {len(problems)} problem(s)")
    return 1 if problems else 0


def _damage(project):
    from ..journal import HeadRecord
    from ..journal.salvage import inspect
    head = HeadRecord(project.state_path("journal.head")).read() or {}
    return inspect(project.journal, head.get("seq", 0))


def _fsck_damaged(project, error, args, repaired=None):
    """The journal file itself is damaged: say what, and how to go on."""
    d = _damage(project)
    if not d.damaged:               # it read whole this time: the error was elsewhere
        d.error = str(error)
    text = d.summary(".envgit/journal.sqlite")
    if args.json:
        out({"ok": False, "problems": [text], "snapshots_checked": 0, "repaired": repaired})
    else:
        if repaired:
            print(repaired)
        print(inert(text))
        print("fsck: the journal is damaged")
    return 1


def _fsck_repair(project, args):
    """`fsck --repair`: rebuild a damaged journal.sqlite from every readable row (no daemon may
    hold it), record what could not be kept, then verify as fsck does."""
    import fcntl

    from ..journal import Journal, reseal
    from ..journal.salvage import ranges, rebuild
    if not os.path.exists(project.journal):
        if args.json:
            out({"ok": True, "problems": [], "snapshots_checked": 0, "repaired": None})
        else:
            print("fsck: no journal yet; nothing to repair")
        return 0
    repaired = None
    with open(project.state_path("daemon.lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Usage("a session daemon holds the journal; `envgit daemon stop`, then "
                        "`envgit fsck --repair`", EXIT_DAEMON) from None
        d = _damage(project)
        if d.damaged:
            kept_as = rebuild(project.journal, d)
            j = Journal(project.journal)            # records a lost tail itself, if any
            j.rebuild_open_steps()
            if d.unreadable:
                j.append(0, "lost", {
                    "entries": [d.unreadable[0], d.unreadable[-1]], "missing": d.unreadable,
                    "last_step": j.floor, "head_hash": "",
                    "reason": f"journal.sqlite was damaged ({d.error}); fsck --repair kept "
                              f"{len(d.rows)} entries and could not read entries {ranges(d.unreadable)}"})
            resealed = reseal.repair(j)             # rows read whole that still do not verify
            j.close()
            repaired = (f"fsck: rebuilt the journal: kept {len(d.rows)} of {d.highest} entries"
                        + (f"; could not keep entries {ranges(d.unreadable)} (recorded as lost)"
                           if d.unreadable else "")
                        + f"; the damaged file is kept as {os.path.basename(kept_as)}"
                        + (f"\n{resealed}" if resealed else ""))
        else:
            j = Journal(project.journal)
            repaired = reseal.repair(j)             # rows changed, deleted or renumbered: set aside
            problems = [p for p in j.verify() if "open steps" in p]
            if problems:
                j.rebuild_open_steps()
                repaired = "fsck: rebuilt the table of open steps from the entries"
            j.close()
        from ..snapshot.heal import repair_store  # the store's damaged objects (snapshot/heal.py)
        repaired = "\n".join(x for x in (repaired, *repair_store(project)) if x) or None
    return _verify(project, args, repaired)
