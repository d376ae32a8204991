"""remote add/set/list/remove, push, audit; and the remote halves of `log --remote`,
`restore --from`, `fsck --remote` (their parsers live with the local commands).

Everything here imports envgit.remote (and so boto3 and cryptography) only when it runs: the
parsers cost nothing to `envgit --help`."""

import contextlib
import os
import re
import sys

from ..inert import inert
from . import EXIT_FAILED, Usage, command, json_flag, out, progress, session_short, shell_line


def add_parsers(sub, argparse):
    s = command(sub, "remote", help="remotes on S3-compatible object storage (push, audit, restore --from)",
                example=["envgit remote add ci s3://bucket/envgit --endpoint https://s3.example.internal",
                         "envgit remote set ci --auto", "envgit remote list"])
    rsub = s.add_subparsers(dest="remote_cmd", metavar="ACTION", required=True)
    a = command(rsub, "add", help="add a remote: make (or import) its key and check the bucket",
                example=["envgit remote add ci s3://bucket/envgit --endpoint https://s3.example.internal",
                         "envgit remote add ci s3://bucket/envgit --key-file ./ci.key   # a second machine"])
    a.add_argument("name", help="the remote's name (A-Z a-z 0-9 . _ -)")
    a.add_argument("url", help="s3://BUCKET/PREFIX")
    a.add_argument("--endpoint", metavar="URL", help="an S3-compatible server's URL (default: AWS S3)")
    a.add_argument("--region", help="the bucket's region (default us-east-1)")
    a.add_argument("--key-file", metavar="FILE", help="the remote's key, made by `remote add` on "
                   "another machine (every machine reading or writing the remote needs it)")
    a.add_argument("--auto", action="store_true", help="push after every step (the session daemon, in the background)")
    a.add_argument("--policy", metavar="OBJECT", help="the organisation policy: this object below "
                   "the remote's prefix binds every project here (fetched now and by each push)")
    json_flag(a)
    a.set_defaults(fn=cmd_remote_add)
    st = command(rsub, "set", help="change a remote's settings",
                 example=["envgit remote set ci --auto", "envgit remote set ci --no-auto"])
    st.add_argument("name")
    st.add_argument("--auto", action=argparse.BooleanOptionalAction, default=None,
                    help="push after every step (the session daemon, in the background)")
    st.add_argument("--endpoint", metavar="URL")
    st.add_argument("--region")
    st.add_argument("--policy", metavar="OBJECT", help="the organisation policy's object below the "
                    "remote's prefix (fetched now); '' stops using one")
    json_flag(st)
    st.set_defaults(fn=cmd_remote_set)
    ls = command(rsub, "list", help="the remotes configured for this user", example="envgit remote list --json")
    json_flag(ls)
    ls.set_defaults(fn=cmd_remote_list)
    rm = command(rsub, "remove", help="forget a remote (its key file is kept; the bucket is untouched)",
                 example="envgit remote remove ci")
    rm.add_argument("name")
    json_flag(rm)
    rm.set_defaults(fn=cmd_remote_remove)

    p = command(sub, "push", help="upload to a remote what it lacks of this project (resumable)",
                example=["envgit push ci", "envgit push ci --json"])
    p.add_argument("name", help="the remote")
    p.add_argument("--repair", action="store_true", help="fetch and check every object this machine "
                   "pushed, and upload again what is damaged (a push alone repairs what changed since "
                   "this machine last pushed, and what is missing)")
    p.add_argument("--no-branches", action="store_true", help="push this project only, not its fork "
                   "branches (each is pushed as <project>.envgit-<id>)")
    json_flag(p)
    p.set_defaults(fn=cmd_push)

    au = command(sub, "audit", help="every project's and machine's steps on a remote, one table",
                 example=["envgit audit --remote ci --since 1d --mark denied,irreversible",
                          "envgit audit --remote ci --json"])
    au.add_argument("--remote", required=True, metavar="NAME")
    from .args import since
    au.add_argument("--since", metavar="WHEN", type=since,
                    help="only steps begun since then: 30m, 2h, 7d or an ISO-8601 time")
    au.add_argument("--mark", metavar="MARK,…", help="only steps with one of these marks "
                    "(`denied` matches denied-net, denied-read…; `irreversible` also an irreversible request)")
    au.add_argument("--project", metavar="NAME", help="only this project")
    au.add_argument("--machine", metavar="NAME", help="only this machine")
    json_flag(au)
    au.set_defaults(fn=cmd_audit)


def said(fn):
    """A remote's operational failure as one `envgit:` line (exit 1), never a traceback."""
    def wrapped(args):
        from ..branch.registry import BadRecord
        from ..remote import RemoteError
        try:
            return fn(args)
        except (RemoteError, BadRecord) as e:       # (a branch record: which project is this)
            raise Usage(str(e), EXIT_FAILED) from None
    return wrapped


# --- remote add/set/list/remove ----------------------------------------------------------------

@said
def cmd_remote_add(args):
    from ..remote import RemoteError, layout
    from ..remote.crypto import Sealer, Unopenable, new_key
    from ..remote.s3 import Bucket
    layout.check_name(args.name, "remote name")
    if args.name in layout.names():
        raise Usage(f"remote {args.name} exists; `envgit remote set {args.name} …` changes it, "
                    f"`envgit remote remove {args.name}` forgets it")
    r = layout.Remote(args.name, args.url, args.endpoint, args.region, args.auto)
    kpath = layout.key_path(args.name)
    if args.key_file:
        try:
            text = open(args.key_file).read().strip()
            key = bytes.fromhex(text)
        except (OSError, ValueError) as e:
            raise Usage(f"{args.key_file}: cannot read a remote key ({e})") from None
        if len(key) != 32:
            raise Usage(f"{args.key_file}: not a remote key (64 hex digits)")
        made = False
    elif os.path.exists(kpath):
        key, made = r.key(), False          # kept by an earlier `remote remove`
    else:
        key, made = new_key(), True
    sealer, bucket = Sealer(key), Bucket(r)
    from ..remote import layout as L
    data = bucket.get(L.CONFIG)
    if data is None:
        name = L.CONFIG
        import json
        bucket.put(name, sealer.seal(name, json.dumps({"format": "envgit-remote", "version": 1}).encode()))
        data = bucket.get(name)
    try:
        sealer.open(L.CONFIG, data or b"")
    except Unopenable:
        raise RemoteError(f"{args.url} already holds an envgit remote made with another key; "
                          f"give its key with --key-file (from the machine that added it: {kpath} there)") from None
    if made or args.key_file:
        layout.write_private(kpath, key.hex().encode() + b"\n")
    said_policy = _org_policy(r, args.policy) if args.policy else None
    r.save()
    if said_policy and not args.json:
        print(said_policy, file=sys.stderr)
    if args.json:
        out({"name": r.name, **r.to_json(), "key": kpath, "key_made": made})
        return 0
    print(f"added remote {r.name} ({inert(r.url)}" + (f" at {inert(r.endpoint)}" if r.endpoint else "") + ")")
    print(f"its key is {kpath} (mode 0600): back it up now (a password manager, `cat {kpath}`);")
    print("without it nothing on the remote can be read. On another machine: copy the key there and")
    print(f"  envgit remote add {r.name} {shell_line([r.url])}"
          + (f" --endpoint {shell_line([r.endpoint])}" if r.endpoint else "") + " --key-file KEYFILE")
    return 0


@said
def cmd_remote_set(args):
    from ..remote import layout
    r = layout.load(args.name)
    if args.auto is not None:
        r.auto = args.auto
    if args.endpoint is not None:
        r.endpoint = args.endpoint or None
    if args.region is not None:
        r.region = args.region or None
    if args.policy is not None:
        from ..remote import orgpolicy
        said_policy = _org_policy(r, args.policy) if args.policy else \
            ("no organisation policy from this remote" if orgpolicy.forget(r.name) else None)
        if said_policy and not args.json:
            print(said_policy, file=sys.stderr)
    r.save()
    if args.json:
        out({"name": r.name, **r.to_json()})
    else:
        print(f"remote {r.name}: {inert(r.url)}" + (f" at {inert(r.endpoint)}" if r.endpoint else "")
              + (", pushed after every step" if r.auto else ""))
    return 0


@said
def cmd_remote_list(args):
    from ..remote import layout
    rs = [layout.load(n) for n in layout.names()]
    if args.json:
        out([{"name": r.name, **r.to_json(), "key": layout.key_path(r.name)} for r in rs])
        return 0
    if not rs:
        print("no remotes yet: envgit remote add NAME s3://BUCKET/PREFIX --endpoint URL")
    for r in rs:
        print(f"{r.name}\t{inert(r.url)}" + (f"\t{inert(r.endpoint)}" if r.endpoint else "")
              + ("\tauto" if r.auto else ""))
    return 0


@said
def cmd_remote_remove(args):
    from ..remote import layout
    layout.load(args.name)
    layout.remove(args.name)
    from ..remote import orgpolicy
    if orgpolicy.forget(args.name) and not args.json:
        print("its organisation policy no longer applies here", file=sys.stderr)
    if args.json:
        out({"name": args.name, "key": layout.key_path(args.name)})
    else:
        print(f"forgot remote {args.name}; its key stays in {layout.key_path(args.name)} (the bucket is untouched)")
    return 0


def _org_policy(r, obj):
    """Fetch the remote's organisation policy object (remote/orgpolicy.py); its error is one line."""
    from ..policy import PolicyError
    from ..remote import orgpolicy
    try:
        return orgpolicy.fetch(r, obj)
    except PolicyError as e:
        raise Usage(str(e), EXIT_FAILED) from None


def _refresh_org_policy(r):
    """After a push: the organisation policy fetched again; a bad or missing object leaves the
    last good copy in use, said on stderr."""
    from ..policy import PolicyError
    from ..remote import orgpolicy
    try:
        said = orgpolicy.refresh(r)
    except PolicyError as e:
        print(f"envgit: the organisation policy was not updated: {e} (the last copy fetched "
              "stays in use)", file=sys.stderr)
        return
    if said and "unchanged" not in said:
        print(said, file=sys.stderr)


# --- push --------------------------------------------------------------------------------------

@said
def cmd_push(args):
    from ..paths import Project, find_project
    from ..remote import layout
    from ..remote.push import push
    from .remotebranches import fork_roots, identity
    project = find_project()
    r = layout.load(args.name)
    todo = [(None, project)] + ([] if args.no_branches else
                                [(n, Project(d)) for n, d in fork_roots(project)])
    pushed = []
    for n, p in todo:
        name, branch = identity(p.root)
        got = dict(push(p, r, progress=None if args.json else progress, repair=args.repair,
                        name=name, branch=branch))
        pushed.append({**got, "branch": n})
        if not args.json:
            print(("pushed " if n is None else f"pushed branch {n} as ") +
                  f"{got['project']}/{got['machine']} to {r.name}: {got['packs']} pack(s) "
                  f"({got['bytes']} bytes), {got['entries']} journal entr(ies) in {got['segments']} "
                  f"segment(s); head {got['head']} at entry {got['seq']} ({got['ms']:.0f} ms)")
    _refresh_org_policy(r)
    if args.json:
        out({**{k: v for k, v in pushed[0].items() if k != "branch"}, "branches": pushed[1:]})
    return 0


def auto_push(root: str) -> int:
    """`python -m envgit.commands.remote ROOT`: what the daemon's auto-push runs after a step,
    at low priority, in a process of its own (no lock, no GIL shared with the daemon): push
    the project to every remote set --auto. Failures go to stderr (the daemon's log)."""
    from ..paths import Project
    from ..remote import RemoteError, layout
    from ..remote.push import push
    code = 0
    from .remotebranches import identity
    for r in layout.auto_remotes():
        try:
            name, branch = identity(root)
            push(Project(root), r, name=name, branch=branch)
            _refresh_org_policy(r)
        except RemoteError as e:
            print(f"envgit: auto-push to {r.name}: {e}", file=sys.stderr)
            code = 1
    return code


# --- reading a remote: log --remote, restore --from, fsck --remote, audit -----------------------

def _open(name):
    from ..remote import layout
    from ..remote.push import open_remote
    r = layout.load(name)
    bucket, sealer = open_remote(r)
    return r, bucket, sealer


def _target_outside(text: str, force: bool) -> str:
    """restore's target rules (restoreplan.restore_target); outside any project, only the emptiness."""
    from ..paths import NoProject, find_project
    from .restoreplan import restore_target
    try:
        project = find_project()
    except NoProject:
        project = None
    if project is not None:
        return restore_target(project, text, force)
    target = os.path.abspath(text)
    if os.path.lexists(target):
        if not os.path.isdir(target):
            raise Usage(f"{text}: not a directory")
        if os.listdir(target) and not force:
            raise Usage(f"{text}: not empty; pick a new or empty directory, or --force to write into it")
    return os.path.realpath(target)


_LEFTOVER = re.compile(rb"\.envgit-restore\.[0-9a-f]{12}\.tmp\Z")


def _drop_leftovers(target: str) -> None:
    """The temporary files a killed restore left in `target` (snapshot/restore.py's names,
    nothing else), found without following a symlink."""
    for d, dirs, files in os.walk(os.fsencode(target)):
        for name in files + [n for n in dirs if os.path.islink(os.path.join(d, n))]:
            if _LEFTOVER.match(name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(d, name))


def _beside(target: str) -> str:
    """A new hidden directory beside `target` (its parents made), to be renamed to it."""
    import secrets
    parent, leaf = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    path = os.path.join(parent, f".{leaf}.envgit-restore-{secrets.token_hex(6)}")
    os.mkdir(path)
    return path


def _here():
    from ..paths import NoProject, find_project
    from .remotebranches import identity
    try:
        return identity(find_project().root)[0]
    except NoProject:
        return None


@said
def log_remote(args):
    """`envgit log --remote NAME [--project] [--machine]`: the steps of one project and
    machine as the bucket has them, the chain verified (problems said on stderr, exit 1)."""
    from ..remote.read import MachineView, pick_machine
    from .steplist import print_steps, step_json
    r, bucket, sealer = _open(args.remote)
    p, m = pick_machine(bucket, r, args.project, args.machine, _here(), sealer)
    from . import remotebranches
    view = MachineView(bucket, sealer, p, m, r.name)
    steps = view.steps()
    if args.session is not None:
        steps = [s for s in steps if args.session in (s.session, session_short(s.session))
                 or (s.session or "").endswith("-" + args.session)]
    if args.since is not None:
        steps = [s for s in steps if s.started_ns >= args.since]
    if args.n:
        steps = steps[-args.n:]
    every = view.steps()
    branches = remotebranches.listed(remotebranches.on_remote(bucket, sealer, p, m), every)
    if args.json:
        out({"project": p, "machine": m, "problems": view.problems, "steps": [step_json(s) for s in steps],
             "branch": (view.head or {}).get("branch"), "branches": branches})
    else:
        for problem in view.problems:
            print(f"envgit: {inert(problem)}", file=sys.stderr)
        print(f"# {p}/{m} on {r.name}"
              + (f", head {view.head['version']} at entry {view.head['seq']}" if view.head else ""))
        if (view.head or {}).get("branch"):
            b = view.head["branch"]
            print(f"# branch {b['id']} of {b['parent']}, forked at its step {b['from_step']}")
        for b in branches:
            print(f"# {remotebranches.line(b)}")
        print_steps(steps, args)
    return 1 if view.problems else 0


@said
def restore_from(args):
    """`envgit restore --from NAME STEP --target DIR [--project] [--machine]`: the tree of a
    step of any machine, fetched from the bucket, written as `restore` writes a local one."""
    from ..remote.read import MachineView, pick_machine, remote_objects
    from ..snapshot.restore import apply_plan
    from .restoreplan import plan as restore_plan
    r, bucket, sealer = _open(args.remote_from)
    p, m = pick_machine(bucket, r, args.project, args.machine, _here(), sealer)
    view = MachineView(bucket, sealer, p, m, r.name)
    if view.problems:
        raise Usage(f"remote {r.name}, {p}/{m}: {view.problems[0]}; `envgit fsck --remote {r.name}` "
                    "lists every problem", EXIT_FAILED)
    steps = {s.id: s for s in view.steps()}
    ref = str(args.step)
    if ref.isdigit():
        n = int(ref)
    else:
        from ..steporder import ranked  # `last`: the newest tree in time, as locally
        back = int(ref[5:]) if ref.startswith("last~") else 0
        order = [x.step for x in ranked(view.rows)]
        if len(order) < back + 1:
            raise Usage(f"no step {ref}: {p}/{m} has {len(order)} step(s) on {r.name}")
        n = order[back]
    s = steps.get(n)
    if s is None:
        raise Usage(f"no step {n} in {p}/{m} on {r.name}; `envgit log --remote {r.name}` lists them")
    if n in view.dropped():
        raise Usage(f"the snapshot of step {n} was dropped by `envgit gc` before it was pushed")
    tree = (s.snapshot or {}).get("tree")
    if not tree:
        raise Usage(f"step {n} has no snapshot ({s.status}); pick another step")
    target = _target_outside(args.target, args.force)
    problems: list[str] = []
    objects = remote_objects(bucket, sealer, view, problems)
    try:
        class _S:
            pass
        store = _S()
        store.objects = objects
        plan = restore_plan(store, tree, target, [os.fsencode(x).strip(b"/") for x in args.paths], args.force, n)
        objects.prefetch(i.oid for i in plan.write if i.oid)
        # A new target is written as a hidden directory beside it and renamed into place at the
        # end: a restore that fails (a full disk, a pack missing) leaves no partial tree (a
        # `.env` and half the files) that looks like the step's.
        # An existing empty target is replaced the same way (rename(2) replaces an empty
        # directory): a kill -9 midway leaves it empty, never half written.
        created = not os.path.lexists(target) or (os.path.isdir(target) and not os.listdir(target))
        into = _beside(target) if created else target
        if not created:                 # --force into a tree: what a killed run left goes first
            _drop_leftovers(target)
        try:
            with progress(len(plan.write) + len(plan.delete), "path", "restore") as bar:
                apply_plan(objects, into, plan, lambda done, total: bar.update(done - bar.n))
            if created:
                os.rename(into, target)
        except BaseException as e:
            if created:
                import shutil
                shutil.rmtree(into, ignore_errors=True)
            if problems:
                raise Usage(f"remote {r.name}: {problems[0]}", EXIT_FAILED) from None
            if isinstance(e, OSError):
                raise Usage(f"{target}: the restore stopped ({e.strerror or e}); " + (
                    "nothing was left there; free space or pick another --target, then run it again"
                    if created else "part of the tree was written into it; free space, then run it "
                    "again with --force"), EXIT_FAILED) from None
            raise
    finally:
        objects.close()
    files = sum(1 for i in plan.write if i.type in ("file", "exec"))
    size = sum(i.size for i in plan.write if i.type in ("file", "exec"))
    if args.json:
        out({"remote": r.name, "project": p, "machine": m, "step": n, "tree": tree, "target": target,
             "files": files, "bytes": size})
    else:
        print(f"restored step {n} of {p}/{m} from {r.name} (tree {tree[:12]}) into {inert(target)}: "
              f"{files} file(s), {size} bytes")
    return 0


@said
def fsck_remote(args):
    """`envgit fsck --remote NAME`: every machine's chain, head and index checked, every pack
    fetched, opened and re-hashed with every object in it, every snapshot tree walked."""
    from ..remote import layout
    from ..remote.crypto import Sealer
    from ..remote.push import check_key, config_problem
    from ..remote.read import MachineView, machines, remote_objects, vanished
    from ..remote.s3 import Bucket
    from ..snapshot import maintenance
    r = layout.load(args.remote)
    bucket, sealer = Bucket(r), Sealer(r.key())
    problems, checked = [], {"machines": 0, "packs": 0, "snapshots": 0, "entries": 0}
    data = bucket.get(layout.CONFIG)
    problem, key_ok = config_problem(bucket, sealer, data) if data is not None else (None, False)
    if not key_ok:                  # no config, or nothing opens: not this key's remote
        check_key(bucket, sealer)
    problems += [problem] if problem else []     # altered, the rest still checked
    found = machines(bucket)
    problems += vanished(r.name, found)
    with progress(len(found), "machine", f"fsck {r.name}") as bar:
        for p, m in found:
            view = MachineView(bucket, sealer, p, m, r.name, deep=True)
            problems += view.problems
            objects = remote_objects(bucket, sealer, view, problems)
            try:
                packs = sorted(objects.pack_entries.items())
                fetched = bucket.map(objects.fetch, [pid for pid, _ in packs])
                for (pack_id, entries), ok in zip(packs, fetched, strict=True):
                    if ok:
                        name = layout.pack_name(p, m, objects.names[pack_id])
                        problems += [f"{name}: {x}" for x in maintenance._check_pack(objects, pack_id, entries)]
                trees = view.live_trees()
                problems += [f"{p}/{m}: {x}" for x in maintenance._check_reachable(
                    objects, [bytes.fromhex(t) for t in trees])]
            finally:
                objects.close()
            checked["machines"] += 1
            checked["packs"] += len(packs)
            checked["snapshots"] += len(trees)
            checked["entries"] += len(view.rows)
            bar.update(1)
    problems = list(dict.fromkeys(problems))
    if args.json:
        out({"ok": not problems, "problems": problems, "remote": r.name, **checked})
    else:
        for x in problems:
            print(inert(x))
        print(f"fsck {r.name}: ok ({checked['machines']} machine(s), {checked['packs']} pack(s), "
              f"{checked['entries']} journal entries, {checked['snapshots']} snapshot(s))" if not problems
              else f"fsck {r.name}: {len(problems)} problem(s)")
    return 1 if problems else 0


@said
def cmd_audit(args):
    """Every project and machine on the remote, their steps in one table (oldest first)."""
    from ..journal import utc
    from ..remote.read import MachineView, machines, vanished
    r, bucket, sealer = _open(args.remote)
    wanted = [w.strip() for w in (args.mark or "").split(",") if w.strip()]
    every = machines(bucket)
    found = [(p, m) for p, m in every if (args.project in (None, p)) and (args.machine in (None, m))]
    views = bucket.map(lambda pm: MachineView(bucket, sealer, pm[0], pm[1], r.name), found)
    rows, problems = [], vanished(r.name, every, args.project, args.machine)
    for view in views:
        problems += view.problems
        for s in view.audit_rows():
            if args.since is not None and s["started_ns"] < args.since:
                continue
            if wanted and not _marked(s, wanted):
                continue
            rows.append(s)
    rows.sort(key=lambda s: (s["started_ns"], s["project"], s["machine"], s["id"]))
    if args.json:
        for s in rows:
            s["started_at"], s["ended_at"] = utc(s.pop("started_ns")), s["ended_ns"] and utc(s["ended_ns"])
            del s["ended_ns"], s["paths"]
        out({"remote": r.name, "problems": problems, "steps": rows})
        return 1 if problems else 0
    for x in problems:
        print(f"envgit: {inert(x)}", file=sys.stderr)
    if not rows:
        print("no steps match")
        return 1 if problems else 0
    pw = max(7, max(len(s["project"]) for s in rows))
    mw = max(7, max(len(s["machine"]) for s in rows))
    lines = [f"{'PROJECT':{pw}}  {'MACHINE':{mw}}  {'STEP':>6}  {'STARTED':19}  EXIT  MARKS  COMMAND"]
    for s in rows:
        exit_ = {"running": "run", "interrupted": "int"}.get(
            s["status"], "-" if s["exit_code"] is None else str(s["exit_code"]))
        what = shell_line(s["argv"]) if s["argv"] else (
            f"(changed outside envgit: {inert(', '.join(s['paths'])) or 'nothing listed'})"
            if "outside" in s["marks"] else "-")
        lines.append(f"{s['project']:{pw}}  {s['machine']:{mw}}  {s['id']:>6}  "
                     f"{utc(s['started_ns'])[:19].replace('T', ' ')}  "
                     f"{exit_:>4}  " + inert(",".join(s["marks"]) or "-") + "  " + what)
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if problems else 0


def _marked(s, wanted) -> bool:
    """`--mark`: a mark named, or one of its family (`denied` is denied-net, denied-read…);
    `irreversible` also a step with an irreversible request, `denied` one with a denied request
    or path."""
    for w in wanted:
        if any(m == w or m.startswith(w + "-") for m in s["marks"]):
            return True
        if w == "irreversible" and s["irreversible"]:
            return True
        if w == "denied" and (s["denied_paths"] or s["denied_requests"]):
            return True
    return False


def serve_pushes(root: str) -> int:
    """`python -m envgit.commands.remote --serve ROOT`: the daemon's resident push worker
    (remote/auto.py). A line "push" on its input pushes as auto_push does and answers "done
    N"; it ends at the end of its input (the daemon let it go, or stopped)."""
    print(f"envgit: auto-push worker {os.getpid()} started", file=sys.stderr, flush=True)
    for line in sys.stdin.buffer:
        if line.strip() != b"push":
            continue
        try:
            code = auto_push(root)
        except Exception as e:          # said in push.log; the worker serves on
            print(f"envgit: auto-push failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            code = 1
        sys.stdout.write(f"done {code}\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve_pushes(sys.argv[2]))
    sys.exit(auto_push(sys.argv[1]))
