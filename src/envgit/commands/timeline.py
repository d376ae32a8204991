"""Reading the journal: log (the timeline) and show (one step whole)."""

import os

from ..inert import inert
from ..paths import find_project
from ..view.names import origin, what_ran
from . import (
    STEP_HELP,
    Usage,
    agent_of,
    command,
    iso_utc,
    json_flag,
    open_journal,
    out,
    resolve_step,
    session_short,
    step_ref,
)
from .args import since
from .steplist import LOG_LINES, print_steps, step_json


def add_parsers(sub, argparse):
    s = command(sub, "log", help="the step timeline",
                example=["envgit log -n 10", "envgit log --session claude:3fa2 --since 2h",
                         "envgit log --mark denied,irreversible",
                         "envgit log --json | jq '.[-1].exit_code'"])
    json_flag(s)
    s.add_argument("--session", metavar="ID",
                   help="only this session's steps: its id, or the column's AGENT:TAG")
    s.add_argument("--since", metavar="WHEN", type=since,
                   help="only steps begun since then: a duration back (30m, 2h, 7d) or an "
                        "ISO-8601 time (2026-12-01, 2026-12-01T09:30:00Z)")
    s.add_argument("--mark", metavar="M[,M]", type=lambda t: {m for m in t.split(",") if m},
                   help="only steps carrying one of these marks (denied, asked, irreversible, "
                        "credential-misuse, outside, rewind, …: the log's [brackets])")
    s.add_argument("-n", type=_count(argparse), metavar="N", help="only the last N steps")
    s.add_argument("--no-trunc", action="store_true",
                   help="every line of every command (a terminal shows the first "
                        f"{LOG_LINES} wrapped lines)")
    s.add_argument("--remote", metavar="NAME", help="read the steps from a remote's bucket "
                   "(the chain verified) instead of this project's journal")
    s.add_argument("--project", metavar="NAME", help="with --remote: which project (default: this one's name)")
    s.add_argument("--machine", metavar="NAME", help="with --remote: which machine (default: this one, "
                   "or the only one)")
    s.set_defaults(fn=cmd_log)

    s = command(sub, "show", help="one step whole",
                example=["envgit show 12", "envgit show last", "envgit show last~1 --json"])
    s.add_argument("step", type=step_ref, help=STEP_HELP)
    json_flag(s)
    s.set_defaults(fn=cmd_show)


def _count(argparse):
    def count(text):
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 1 or more")
        return min(int(text), (1 << 63) - 1)      # more than any journal holds: all of them
    return count


# --- log ---------------------------------------------------------------------------------

def _pick_session(j, wanted) -> str:
    """The session id `--session` names: an id, or the AGENT:TAG the log's column shows."""
    sessions = []
    for s in j.steps() if j else []:
        if s.session not in sessions:
            sessions.append(s.session)
    if wanted in sessions:
        return wanted
    found = [x for x in sessions if session_short(x) == wanted or x.endswith("-" + wanted)]
    if len(found) == 1:
        return found[0]
    listed = ", ".join(f"{x} ({session_short(x)})" for x in sessions[-5:]) or "none yet"
    if found:
        raise Usage(f"--session {inert(wanted)} names {len(found)} sessions; give the whole id: "
                    + ", ".join(found))
    raise Usage(f"no such session {inert(wanted)!s}; the latest sessions: {listed}")


def cmd_log(args):
    if args.remote is not None:
        from .remote import log_remote
        return log_remote(args)
    if args.project is not None or args.machine is not None:
        raise Usage("--project and --machine name what to read from a remote: add --remote NAME")
    project = find_project()
    j = open_journal(project)
    session = _pick_session(j, args.session) if args.session is not None else None
    if args.since is not None or args.mark:
        steps = []                      # newest first, stopping at --since or at N matches
        for s in j.steps_newest_first(session) if j else ():
            if args.since is not None and s.started_ns < args.since:
                break
            if args.mark and not args.mark.intersection(s.marks):
                continue
            steps.append(s)
            if args.n and len(steps) == args.n:
                break
        steps = steps[::-1]
    else:
        steps = j.steps(session=session, last=args.n or None) if j else []
    if args.json:
        out([step_json(s) for s in steps])
        return 0
    if not steps:
        print("no steps yet: envgit run -- CMD" if not (session or args.since or args.mark)
              else "no steps match")
        return 0
    print_steps(steps, args)
    return 0


# --- show --------------------------------------------------------------------------------

def cmd_show(args):
    project = find_project()
    j = open_journal(project)
    n = resolve_step(j, args.step)
    s = j.step(n) if j else None
    if s is None:
        raise Usage(f"no step {n}; `envgit log` lists them")
    if args.json:
        out(step_json(s))
        return 0
    print(f"step {s.id}  ({s.status})")
    print(f"  command   {what_ran(s)}")
    print(f"  cwd       {inert(s.cwd)}")
    print(f"  started   {s.started_at}")
    print(f"  ended     {s.ended_at or '-'}")
    print(f"  exit      {s.exit_code if s.exit_code is not None else '-'}"
          + (f" ({inert(s.signal)})" if s.signal else ""))
    print(f"  duration  {s.duration_ms if s.duration_ms is not None else '-'} ms")
    print(f"  policy    sha256 {s.policy_sha256}")
    print(f"  user      {inert(s.user)}   session {inert(s.session)} ({agent_of(s.session)})")
    if s.tool_call_id:
        print(f"  tool call {inert(s.tool_call_id)}")
    if s.marks:
        print(f"  marks     {inert(', '.join(s.marks))}")
    _show_sandbox(s)
    opened = {r.get("path"): r for r in s.denied_reads}
    for p in s.denied_paths:        # opened: the daemon saw the step open its placeholder
        r = opened.get(p)
        print(f"  denied    {inert(p)}" + (f"  (opened; deny '{inert(r.get('rule'))}', {inert(r.get('where'))})"
                                             if r else ""))
    for p in s.escape_routes:       # a file a program outside the sandbox obeys (escape-route-written)
        print(f"  escape    {inert(p)}")
    if s.dns_names:                 # looked up inside: the resolver said "does not exist" to each
        print(f"  looked up {inert(', '.join(s.dns_names))} ({s.dns_queries} lookups, none answered)")
    for r in s.requests:
        answer = f", {r['answer']} by {r.get('answered_by')} ({r.get('answered_how')})" if r.get("answer") else ""
        if r.get("kind") == "signing":      # a signature made at the gate (proxy/sshsign.py)
            sig = r.get("signed") or {}
            what = (f"{sig.get('kind')} {str(sig.get('object', ''))[:12]} '{sig.get('subject', '')}' by "
                    f"{sig.get('author', '')}" if sig else f"{r.get('path', '').lstrip('/')}: {r.get('reason', '')}")
            print(inert(f"  signed    {r.get('decision', '?'):5} {what}{answer}"))
            continue
        where = origin(r.get("scheme", ""), r.get("host", ""), r.get("port"))
        print(inert(f"  request   {r.get('decision', '?'):5} {r.get('method', '')} {where}"
                    f"{r.get('path', '')} -> {r.get('status', '-')}  ({r.get('rule', '')}{answer})"))
    for a in s.approvals:
        q = a.get("question", {})
        at = iso_utc(a.get("at")) if isinstance(a.get("at"), (int, float)) else a.get("at")
        print(inert(f"  approval  {a.get('answer')} {q.get('method')} {q.get('host')}{q.get('path')} "
                    f"by {a.get('who')} ({a.get('how')})" + (f" at {at}" if at else "")))
    for e in s.events:
        detail = " ".join(f"{k}={v}" for k, v in e.items() if k != "kind" and not isinstance(v, (dict, list)))
        print(inert(f"  event     {e['kind']} {detail}"))
    _show_mcp(s.extra or {})
    snap = s.snapshot or {}
    if snap.get("tree"):
        left = snap.get("left_out", {})
        print(f"  snapshot  {snap['tree'][:12]}  +{snap['added']} ~{snap['modified']} -{snap['deleted']} "
              f"files, {snap['ms']:.1f} ms" + (f"; left out {left['count']} ({left['bytes']} bytes)"
                                               if left.get("count") else ""))
        for p in snap.get("paths", [])[:20]:
            print(f"            {p['status'][0].upper()} {inert(p['path'])}")
        if snap.get("diff_error"):
            print(f"            {inert(snap['diff_error'])}")
    elif snap.get("error"):
        print(f"  snapshot  {inert(snap['error'])}")
    mem = s.memory or {}
    if mem.get("background"):               # backend: vm, written while the guest ran on
        print(f"  memory    {_background_memory(project, s.id)}, guest paused "
              + (f"{mem['pause_ms']:.0f} ms" if mem.get("pause_ms") is not None else "(QEMU did not say how long)")
              + f" ({inert(str(mem.get('accel', '?')).upper())})")
        print(f"            method: {inert(str(mem.get('method', '')))}")
    elif mem.get("pause_ms") is not None:      # backend: vm
        print(f"  memory    {mem.get('bytes', 0) / 1e6:.1f} MB ({mem.get('ram_bytes', 0) / 1e6:.1f} MB RAM "
              f"touched + {mem.get('device_bytes', 0) / 1e3:.0f} KB device state), guest paused "
              f"{mem['pause_ms']:.0f} ms ({inert(str(mem.get('accel', '?')).upper())})")
        if mem.get("method"):
            print(f"            method: {inert(str(mem['method']))}")
    up = mem.get("came_up")
    if isinstance(up, dict):            # the step the machine came up for
        print(f"  machine   {_came_up(up)}")
    elif mem.get("restored"):
        print(f"  memory    restored from step {mem.get('from_step')}, {mem.get('restore_ms', 0):.0f} ms "
              f"to running{pages_way(mem)}")
    elif mem.get("error") or mem.get("reason"):
        print(f"  memory    {inert(str(mem.get('error') or mem.get('reason')))}")
    return 0


def _background_memory(project, step) -> str:
    """What became of a memory snapshot written in the background: its meta says, once whole."""
    from ..vm import memstore
    d = memstore.path(project, step)
    if not memstore.complete(d):
        return ("not kept (the daemon stopped before it was written whole, or gc removed it)"
                if not os.path.isdir(d) else "being written, or left unfinished by a daemon that stopped")
    try:
        meta = memstore.read_meta(d)
    except (OSError, ValueError):
        return "unreadable (`envgit fsck` says more)"
    return (f"{meta.get('bytes', 0) / 1e6:.1f} MB (every page the guest touched, and its device "
            f"state), written in {meta.get('write_ms', 0) / 1000:.1f} s while the guest ran")


def pages_way(mem) -> str:
    """Which way a restore's pages came (qemu.py `restore`'s "ram")."""
    return {"postcopy": "; pages sent as the guest asked for them (postcopy)",
            "stream": "; the whole stream read first", "reflink": "; RAM file reflinked",
            "copy": "; RAM file copied"}.get(str(mem.get("ram") or ""), "")


def _came_up(up) -> str:
    how, ms = up.get("how"), (up.get("ms") or 0) / 1000
    accel = inert(str(up.get("accel") or "?").upper())
    if how == "restored":
        text = f"restored from the booted guest kept in the cache in {ms:.1f} s (no boot, {accel})"
    elif how == "resumed":
        text = f"resumed from step {up.get('from_step')}'s memory snapshot in {ms:.1f} s ({accel}){pages_way(up)}"
    else:
        why = f": {inert(str(up['accel_why']))}" if up.get("accel_why") else ""
        text = f"booted in {ms:.1f} s ({accel}{why})"
        if up.get("kept_failed"):
            text += f"; the kept booted guest did not restore ({inert(str(up['kept_failed']))}), replaced"
        elif up.get("kept"):
            text += "; kept in the cache for the next fresh start"
    return text


def _show_sandbox(s):
    """A step not run under bubblewrap's namespaces: which sandbox, what it could not do."""
    if not isinstance(s.sandbox, dict):
        return
    print(inert(f"  sandbox   {s.sandbox.get('backend')} (weaker than bubblewrap's namespaces):"))
    for w in s.sandbox.get("weaker") or []:
        print(inert(f"            - {w}"))
    kept = [p for e in s.events if e.get("type") == "sandbox" for p in e.get("not_enforced") or []]
    if kept:
        print(inert(f"            not hidden or kept read-only here: {', '.join(kept[:12])}"
                    + (f" and {len(kept) - 12} more" if len(kept) > 12 else "")))


def _show_mcp(extra):
    """An MCP execution's own (mcp/execution.py records it on the step's end): its code, how
    many tool calls it made, the bytes in and out; nothing for another step."""
    if not isinstance(extra.get("code"), str):
        return
    ins = extra.get("bytes_in")
    parts = [f"in {ins}" + (f" (upstream {extra.get('bytes_in_upstream')}, files {extra.get('bytes_in_files')})"
                            if ins is not None else ""),
             f"out {extra.get('bytes_out')}"]
    if extra.get("cut"):
        parts.append(f"printed {extra.get('bytes_printed')}, cut")
    print(f"  calls     {extra.get('calls', 0)} tool calls" + (", fresh REPL" if extra.get("reset") else ""))
    print(inert(f"  bytes     {', '.join(parts)}"))
    if extra.get("error"):
        print(inert(f"  error     {extra['error']}"))
    print("  code")
    for line in extra["code"].splitlines()[:200] or [""]:
        print(inert(f"    {line}"))
