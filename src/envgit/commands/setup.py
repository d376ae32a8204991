"""Setting a project up and looking at the machine: init, demo, policy, doctor, daemon."""

import errno
import os
import stat
import sys

from ..inert import inert
from ..paths import POLICY_FILE, find_project
from . import Usage, command, json_flag, out


def add_parsers(sub, argparse):
    s = command(sub, "init", help="write envgit.yaml and .envgit/ in this directory",
                example="cd myproject && envgit init")
    s.add_argument("--force", action="store_true", help="overwrite an existing envgit.yaml")
    json_flag(s)
    s.set_defaults(fn=cmd_init)

    s = command(sub, "demo", help="a scripted agent against a local git remote: push denied, "
                "history destroyed, rewind recovers it (about 5 s, no API key)",
                example=["envgit demo", "envgit demo --keep /tmp/envgit-demo"])
    s.add_argument("--keep", metavar="DIR", help="build the demo in DIR and leave it there to explore")
    s.add_argument("--policy", metavar="FILE", help="run the demo under this envgit.yaml instead ({remote} in it "
                   "stands for the demo remote's host:port)")
    s.add_argument("--json", action="store_true", help="one JSON record per step, then the result")
    s.set_defaults(fn=cmd_demo)

    s = command(sub, "doctor", help="what this machine is missing, with the fix for each",
                example=["envgit doctor", "envgit doctor --json"])
    json_flag(s)
    s.set_defaults(fn=cmd_doctor)

    s = command(sub, "policy", help="check, show, describe, replay or suggest the policy",
                example=["envgit policy check", "envgit policy show", "envgit policy presets",
                         "envgit policy replay candidate.yaml", "envgit policy suggest"])
    s.set_defaults(fn=cmd_policy)
    psub = s.add_subparsers(dest="policy_cmd", metavar="ACTION", required=True)
    x = command(psub, "check", help="validate envgit.yaml (and your defaults): every error, each "
                "with file:line:col and the fix", example=["envgit policy check",
                "envgit policy check --json"])
    json_flag(x)
    x = command(psub, "show", help="the effective policy, defaults merged, with sources",
                example=["envgit policy show", "envgit policy show --json"])
    json_flag(x)
    command(psub, "schema", help="the JSON Schema of envgit.yaml",
            example="envgit policy schema > envgit.schema.json")
    x = command(psub, "protected", help="the escape routes: files a program outside the sandbox "
                "obeys, read-only to a step or marked when changed", example="envgit policy protected")
    json_flag(x)
    x = command(psub, "presets", help="the network presets and the irreversible rules, each with "
                "what it matches (hosts, methods, paths)",
                example=["envgit policy presets", "envgit policy presets --json"])
    json_flag(x)
    from .replay import add_parser as add_replay
    add_replay(psub, command)
    from .suggest import add_parser as add_suggest
    add_suggest(psub, command)

    s = command(sub, "daemon", help="the session daemon (plumbing)",
                example=["envgit daemon status", "envgit daemon stop"])
    s.set_defaults(fn=cmd_daemon)
    dsub = s.add_subparsers(dest="daemon_cmd", metavar="ACTION", required=True)
    command(dsub, "status", help="start it if needed and print its state (JSON)", example="envgit daemon status")
    command(dsub, "stop", help="stop it (the next command starts a new one)", example="envgit daemon stop")


# --- demo --------------------------------------------------------------------------------

def cmd_demo(args):
    from ..demo import main
    return main(args)


# --- init --------------------------------------------------------------------------------

def _state_outside(root, state, said) -> bool:
    """On a host whose steps run with Landlock, the state goes outside the project, `.envgit`
    a symlink to it (paths.external_state): True when `.envgit` is that link."""
    from ..paths import external_state
    from ..sandbox import backend
    ext = external_state(root)
    if os.path.islink(state) and os.path.isdir(ext):
        return True
    if not backend.host_is_landlock():
        return False
    if os.path.lexists(state):
        return _move_state_out(root, state, ext, said)
    os.makedirs(ext, mode=0o700, exist_ok=True)
    os.symlink(ext, state)
    said.append(f"made {state} a link to {ext}: steps run with Landlock here, which cannot keep "
                "a directory inside the project from them")
    return True


def _move_state_out(root, state, ext, said) -> bool:
    """A project made where steps ran in bubblewrap keeps its state inside it; on a Landlock
    host `envgit init` moves it out (journal, snapshots and all), when no daemon holds it."""
    from ..daemon.client import lock_held
    from ..paths import Project
    why = None
    if os.path.islink(state) or not os.path.isdir(state) or os.path.lexists(ext):
        why = f"{ext} exists already" if os.path.lexists(ext) else f"{state} is not a directory"
    elif lock_held(Project(root)):
        why = "its session daemon is running: `envgit daemon stop`, then `envgit init` again"
    if why:
        print(f"envgit: {state} is inside the project, and on this host a step can write it (steps "
              f"run with Landlock, not bubblewrap); it was not moved out ({why})", file=sys.stderr)
        return False
    os.makedirs(os.path.dirname(ext), mode=0o700, exist_ok=True)
    try:
        os.rename(state, ext)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        import shutil
        tmp = ext + ".moving"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(state, tmp, symlinks=True)      # whole first: a crash leaves the original
        os.rename(tmp, ext)
        shutil.rmtree(state)
    os.symlink(ext, state)
    said.append(f"moved {state} to {ext} and made it a link there: steps run with Landlock here, "
                "which cannot keep a directory inside the project from them")
    return True


def cmd_init(args):
    from ..policy import defaults
    root = os.path.realpath(os.getcwd())
    home = os.path.realpath(os.path.expanduser("~"))
    if root in ("/", home) and not args.force:
        raise Usage(f"{root} is {'/' if root == '/' else 'your home directory'}: as a project, all of it "
                    "would be visible and writable to every step; run `envgit init` in a project's "
                    "directory (or pass --force)")
    said = []                           # what was done, line by line (the text answer)
    policy = os.path.join(root, POLICY_FILE)
    wrote = not os.path.exists(policy) or args.force
    if not wrote and not args.json:     # --json says it as wrote_policy: false
        print(f"envgit: {policy} exists; keeping it (use --force to overwrite)", file=sys.stderr)
    else:
        from ..atomicfile import write_atomic
        write_atomic(policy, defaults.TEMPLATE)     # whole or absent, never through a planted link
        said.append(f"wrote {policy}")
    state = os.path.join(root, ".envgit")
    link = _state_outside(root, state, said)
    os.makedirs(state, mode=0o700, exist_ok=True)
    gi = os.path.join(root, ".gitignore")
    fd = _open_regular(gi, os.O_RDWR | os.O_APPEND)
    if fd is None:
        lines = []
        fd = _open_regular(gi, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL)
    else:
        with os.fdopen(os.dup(fd), "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    # `.envgit/` matches a directory only; the link of a Landlock host needs `.envgit`
    names = (".envgit", "/.envgit") if link else (".envgit", ".envgit/", "/.envgit", "/.envgit/")
    ignored = not any(line.strip() in names for line in lines)
    if ignored and fd is None:          # a symlink, FIFO or directory a step left: not followed
        print(f"envgit: {gi} is not a regular file; add .envgit/ to your ignore rules yourself",
              file=sys.stderr)
        ignored = False
    elif ignored:
        entry = ".envgit" if link else ".envgit/"
        os.write(fd, (b"\n" if lines and lines[-1] != "" else b"") + entry.encode() + b"\n")
        said.append(f"added {entry} to {gi}")
    if fd is not None:
        os.close(fd)
    warming = _warm_if_large(root)
    if warming:
        said.append(f"reading the project's files (over {WARM_AT:,}) for its first snapshot in the "
                    "background: the first step waits only for what is left")
    if args.json:
        out({"root": root, "policy": policy, "wrote_policy": wrote, "state": state,
             "gitignore": gi, "added_to_gitignore": ignored, "warming": warming})
        return 0
    for line in said:
        print(line)
    print(f"initialised envgit in {root}; next: envgit run -- CMD")
    return 0


WARM_AT = 10_000     # entries: below this a project's first snapshot is a fraction of a second


def _warm_if_large(root: str) -> bool:
    """A project of over WARM_AT entries: its first snapshot (every file read and stored) is
    begun now by the session daemon (op `warm`), which init starts and does not wait for; the
    first step's baseline then re-reads only what changed since. Whether it was begun: a
    daemon that cannot start now is said by the first step, as without this."""
    if not _at_least(root, WARM_AT):
        return False
    from ..daemon.client import DaemonError, connect
    try:
        conn = connect(find_project())
        try:
            conn.send({"op": "warm"})
        finally:
            conn.close()
    except (DaemonError, OSError):
        return False
    return True


def _at_least(root: str, n: int) -> bool:
    """Does the tree under `root` hold at least `n` entries? (Stops counting there; never
    follows a symlink; a directory it cannot read counts as empty.)"""
    seen, stack = 0, [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    seen += 1
                    if seen >= n:
                        return True
                    if e.is_dir(follow_symlinks=False) and e.name != ".envgit":
                        stack.append(e.path)
        except OSError:
            continue
    return False


def _open_regular(path, flags):
    """A descriptor on `path` if it is a regular file, else None: never through a symlink
    (O_NOFOLLOW), never blocking on a FIFO (O_NONBLOCK), so what a step left in the project
    under that name is not written through."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


# --- policy ------------------------------------------------------------------------------

def cmd_policy(args):
    from ..policy import PolicyError, json_schema, load_policy, render
    if args.policy_cmd == "schema":
        out(json_schema())
        return 0
    if args.policy_cmd == "presets":
        from ..policy.presetinfo import presets_json, render_presets
        if args.json:
            out(presets_json())
        else:
            sys.stdout.write(render_presets())
        return 0
    if args.policy_cmd == "protected":
        from ..policy.defaults import ESCAPE_ROUTES, render_escape_routes
        if args.json:
            out([{"path": p, "action": action, "why": why} for p, action, why in ESCAPE_ROUTES])
        else:
            sys.stdout.write(render_escape_routes())
        return 0
    project = find_project()
    if args.policy_cmd == "replay":
        from .replay import cmd_replay
        return cmd_replay(args, project)
    if args.policy_cmd == "suggest":
        from .suggest import cmd_suggest
        return cmd_suggest(args, project)
    try:
        pol = load_policy(project.policy)
    except PolicyError as e:
        if args.policy_cmd == "check" and len(e.errors) > 1:
            return _every_error(args, e.errors)
        raise Usage(str(e)) from None
    if args.policy_cmd == "check":
        from ..sandbox.tracked import tracked_denied, warning
        tracked = tracked_denied(pol, project.root, os.path.expanduser("~"))
        if args.json:
            out({"ok": True, "policy": project.policy, "sha256": pol.sha256,
                 "defaults": pol.user_path or None,
                 "tracked_denied": tracked, "warnings": [warning(tracked)] if tracked else []})
            return 0
        print(f"{project.policy}: ok (sha256 {pol.sha256[:12]})")
        if pol.user_path:
            print(f"  read over your defaults {pol.user_path} (sha256 {pol.user_sha256[:12]})")
        if tracked:
            print(f"warning: {inert(warning(tracked))}")
    elif args.json:
        out(pol.to_json())
    else:
        sys.stdout.write(render(pol))
    return 0


def _every_error(args, errors) -> int:
    """`policy check` on a policy with several errors: each on a line of its own (file:line:col:
    message and fix), in the order of the files' lines; with --json, the error document whose
    `error` holds those lines."""
    from . import EXIT_USAGE
    lines = [str(e) for e in sorted(errors, key=lambda e: (str(e.path), e.line, e.col))]
    if args.json:
        out({"error": "\n".join(lines), "exit": EXIT_USAGE})
    else:
        for line in lines:
            print(f"envgit: {inert(line)}", file=sys.stderr)
        print(f"envgit: {len(lines)} errors; no step runs until each is fixed", file=sys.stderr)
    return EXIT_USAGE


# --- doctor ------------------------------------------------------------------------------

def cmd_doctor(args):
    from ..doctor import run_checks
    checks = run_checks()
    if args.json:
        out([c.__dict__ for c in checks])
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("MISS" if c.required else "warn")
            print(f"{mark}  {c.name}: {c.detail}")
            if not c.ok and c.fix:
                print(f"      fix: {c.fix}")
    return 1 if any(c.required and not c.ok for c in checks) else 0


# --- daemon (plumbing) -------------------------------------------------------------------

def _wait_for_exit(project, timeout_s=60.0) -> None:
    """After `stop` is answered the daemon still finishes its session (an auto-push under way,
    30 s at most; a VM's last snapshot, 20 s; the journal): done when it lets go of
    daemon.lock, which it holds for its life. Then the directory is the caller's to remove or
    copy."""
    import fcntl
    import time
    try:
        fd = os.open(project.state_path("daemon.lock"), os.O_RDONLY)
    except OSError:
        return
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except OSError:
                time.sleep(0.02)
    finally:
        os.close(fd)


def cmd_daemon(args):
    from ..daemon.client import DaemonError, connect
    project = find_project()
    try:
        conn = connect(project, start=args.daemon_cmd == "status", any_build=True)
    except DaemonError as e:
        if args.daemon_cmd == "stop":
            print("no daemon running")
            return 0
        raise Usage(str(e), 1) from None
    reply = conn.request({"op": args.daemon_cmd})
    if args.daemon_cmd == "status":         # which build answers: None from before protocol numbers
        reply["protocol"] = conn.greeting.get("protocol")
    if args.daemon_cmd == "stop":
        _wait_for_exit(project)
    out(reply)
    if reply.get("notice"):         # a stop on a full disk: what is not in the journal (heldends.py)
        print(inert(reply["notice"]), file=sys.stderr)
        return 1 if reply.get("lost") else 0
    return 0
