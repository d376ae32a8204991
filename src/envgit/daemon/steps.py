"""A step's life in the session daemon: `begin` (the policy's verdict on its command line, its
sandbox's command line, or the VM's step), `end` (its snapshot, the checks after it, its end
entry), `interrupted` (a step whose client went away), `event` (what a record-only step
carries). Functions of the session (server.py's `Session`), as rewind.py's and outside.py's
are: they use its journal, snapshotter, live steps and gate, and import no other part of the
daemon that imports them.
"""

import asyncio
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

from .. import faults
from ..inert import inert
from ..journal import JournalError
from ..journal.rows import listed
from ..policy import PolicyError, decide_command, marks
from ..policy import learn as learn_rules
from ..policy.ports import PublishError
from ..sandbox import backend, resolver, routes
from ..sandbox.masks import shown
from ..sandbox.network import Net
from ..sandbox.publish import ports
from ..sandbox.spec import build
from . import degraded, learn, netadvice, special_bits, statelink, takeback
from . import outside as outside_changes
from .asks import user_name
from .heldends import disk_full_notice, log_line
from .livestep import LiveStep
from .publish import Published
from .serve import EXIT_DISK_FULL
from .snapshots import SnapshotFailed

# How long a first snapshot runs before its progress is shown (a test sets 0: shown at once,
# whatever the machine's speed)
PROGRESS_AFTER_S = float(os.environ.get("ENVGIT_PROGRESS_AFTER", "1.0"))


async def begin(sess, msg, conn=None, run_argv=None):
    """`run_argv`: what the sandbox runs when it is not `argv` itself, for the daemon's own
    callers only (never from the wire): inner.py runs an agent's shell command followed by
    the agent's own cwd bookkeeping, recorded as the command alone."""
    argv, cwd = msg.get("argv"), msg.get("cwd")
    if not argv or not isinstance(argv, list) or not cwd:
        return {"error": "envgit run needs a command: envgit run [--] CMD [ARGS…]", "exit": 2}
    outside = outside_project(cwd, sess.project.root)
    if outside:
        return {"error": outside, "exit": 2}
    if (relinked := statelink.repair(sess.project, None)):     # a Landlock host's state link
        log_line(f"envgit daemon: before a step: {relinked}")
    try:
        pol = sess.policy()
    except PolicyError as e:
        return {"error": f"envgit: {e}", "exit": 2}
    except OSError as e:
        return {"error": f"envgit: {sess.project.policy}: {e.strerror}", "exit": 2}
    session = msg.get("session") or sess.id
    head = {"argv": argv, "cwd": cwd, "session": session, "pid": msg.get("pid"),
            "user": user_name(msg.get("uid")), "policy_sha256": pol.sha256,
            "tool_call_id": msg.get("tool_call_id")}
    if msg.get("origin") == "inner":       # asked for from inside a sandbox (inner.py)
        head["origin"] = "inner"
    learning, offs = learn.for_step(sess, msg, session), sess.learn.offs
    if learning:
        refused = learn_rules.refusal(pol)
        if refused:
            return {"error": refused, "exit": 2}
        head["learn"] = True
    if (refused := degraded.begin(sess, pol, head, learning)):   # a host without user namespaces
        return refused
    verdict = decide_command(pol, argv)
    if verdict.action == "deny":
        step = sess.journal.begin_step({**head, "marks": ["refused"]})
        text = f"envgit: refused by {verdict.rule}" + (f": {verdict.reason}" if verdict.reason else "") + \
            "\n(a courtesy rule: the network gate is what stops the action itself)"
        sess.journal.append(step, "end", {"exit_code": 126, "signal": None, "duration_ms": 0,
                                          "marks": ["refused"], "refused_by": verdict.rule})
        return {"step": step, "refused": text}
    # A record of an edit the agent already made (copilot's, an inner `record`) is that
    # edit: what changed since the last step is its, not the person's.
    await settle(sess, pol, "agent-edit" not in (msg.get("marks") or []), conn=conn)
    if sess.pending_baseline:       # step 1 carries what the directory was before it
        head["baseline"], sess.pending_baseline = sess.pending_baseline, None
    if msg.get("record_only"):
        step = sess.journal.begin_step({**head, "marks": list(msg.get("marks") or [])})
        sess.live[step] = LiveStep(argv=argv, policy=pol, conn=conn,
                                   routes=routes.before_step(sess.scan), tree_before=sess.last_tree,
                                   agent_session="agent-session" in (msg.get("marks") or []),
                                   learn=learning)
        return {"step": step}
    # Ports the step publishes are listened for before it begins: one taken is said at once,
    # and no step is recorded for a command that did not run.
    try:
        published = await publish_ports(sess, pol, msg.get("publish"))
    except PublishError as e:
        return {"error": f"envgit: {e}", "exit": 125}
    if published and published.pairs:
        head["published"] = published.listing()
    try:
        step = sess.journal.begin_step(head)
    except BaseException:           # not begun (a full disk): nor listened for
        if published:
            published.close()
        raise
    sess.starting += 1              # begun, not yet live: a rewind waits for it too
    try:
        net = await net_for(sess, pol, step, learning)
        tmp, own_tmp = step_tmp(sess, session, step)
        spec = build(pol, sess.project.root, cwd, run_argv or argv, msg.get("env") or {},
                     sess.project.state, tmp, sess.scan,
                     {"ENVGIT_STEP": str(step), "ENVGIT_SESSION": session}, net,
                     home=msg.get("home"),
                     publish=(published.directory, [p for _, p in published.pairs]) if published else None,
                     masks=(masks := sess.denials.take(step)))
        sess.denials.watch(masks)
    except Exception as e:          # never leave a begun step without an end
        sess.denials.release(step)
        if sess.gate is not None:
            sess.gate.close_step(step)
        if published:
            published.close()
        sess.journal.append(step, "interrupted", {"reason": f"sandbox set-up failed: {e}"})
        return {"error": f"envgit: could not set up the sandbox: {e}", "exit": 125}
    finally:
        sess.starting -= 1
    if head.get("sandbox"):         # what this step's view hides or keeps read-only, not enforced
        from ..sandbox.landlock_run import not_enforced
        sess.journal.append(step, "note", {"type": "sandbox", "from": "daemon", "backend": "landlock",
                                           "not_enforced": not_enforced(spec.argv)})
    if spec.withheld_env:           # env.pass let a credential's real value in: said, not passed
        sess.journal.append(step, "note", {
            "type": "env-withheld", "from": "daemon", "variables": spec.withheld_env,
            "reason": "held a credential's real value: the placeholder is there instead "
                      "(an AWS session token's variable is dropped)"})
    if pol.backend == "vm":
        reply = await vm_begin(sess, step, pol, spec, argv, cwd, own_tmp, conn, net)
        if step in sess.live:
            sess.live[step].learn, sess.live[step].session = learning, session
            learn.still(sess, step, offs)
        return reply
    sess.live[step] = LiveStep(masked=spec.masked + spec.denied_literal, argv=argv,
                               home=spec.env.get("HOME", ""), policy=pol, conn=conn, tmp=own_tmp,
                               routes=routes.before_step(sess.scan), tree_before=sess.last_tree,
                               published=published, learn=learning, session=session)
    learning = learn.still(sess, step, offs)
    notices = [inert(n) for n in published.skipped] if published and published.skipped else []
    if learning and (said := learn.begin_notice(sess, msg, session)):
        notices.insert(0, said)
    return {"step": step, "bwrap": spec.argv, "env": spec.env, "bind": net is not None,
            **({"published": published.listing()} if published and published.pairs else {}),
            **({"notices": notices} if notices else {})}


async def publish_ports(sess, pol, asked):
    """The ports the step publishes (the policy's network.publish and the client's -p),
    listened for on the host; None when there are none. PublishError says why not."""
    asked = list(asked) if isinstance(asked, list) else []
    values = list(pol.network_publish) + asked
    if not values:
        return None
    if pol.backend == "vm":
        raise PublishError("publishing a port is not supported with backend: vm yet; run the "
                           "server with backend: bwrap, or reach it from inside the VM")
    pairs = ports(values, pol.network_allow)
    # The policy's ports are every step's: one a running step of this project already holds
    # (its dev server) is left to it, and one another program holds is said, not a failure.
    # A port the client asked for (-p) must be had, or the step does not begin.
    held = {h: n for n, info in sess.live.items() if info.published for h, _ in info.published.pairs}
    from_policy = {h for h, _ in ports(pol.network_publish, pol.network_allow)}
    from_client = {h for h, _ in ports(asked, pol.network_allow)}
    for h, s in pairs:
        if h in from_client and h in held:
            raise PublishError(f"cannot publish port {s} at 127.0.0.1:{h}: step {held[h]} of this project, "
                               f"still running, publishes it; choose another host port: -p {h + 1}:{s}")
    pairs = [(h, s) for h, s in pairs if h not in held]
    if not pairs:
        return None
    published = Published(sess.project.state_path("publish", secrets.token_hex(6)), pairs)
    await published.open(optional=frozenset(from_policy - from_client))
    return published


async def vm_begin(sess, step, pol, spec, argv, cwd, own_tmp, conn, net):
    """backend: vm: the step runs in the project's microVM (vm/host.py); the client gets
    the step's stream socket instead of a bwrap command line."""
    from ..vm.host import VMHost
    if sess.vm is None:
        sess.vm = VMHost(sess.project, log_line)
    masked = spec.masked + spec.denied_literal
    loop = asyncio.get_running_loop()

    def progress(text):             # on the VM's thread: the loop sends it
        if conn is not None:
            loop.call_soon_threadsafe(sess.push_to, conn, {
                "push": "progress", "what": "vm", "text": f"VM: {text}"})
    try:
        notices = await asyncio.to_thread(sess.vm.ensure, pol, progress)
        if net is not None:         # the guest's connections reach the gate from this process
            sess.gate.bind_step(step, os.stat("/proc/self/ns/pid").st_ino)
        vm = await asyncio.to_thread(sess.vm.prepare, step, argv, cwd, spec.env, pol, masked, net,
                                     spec.protected)
    except Exception as e:          # never leave a begun step without an end
        if sess.gate is not None:
            sess.gate.close_step(step)
        drop_tmp(own_tmp)
        sess.journal.append(step, "interrupted", {"reason": f"the VM could not start: {e}"})
        return {"error": f"envgit: the VM could not start: {e} (`envgit doctor` checks QEMU "
                         "and the guest image)", "exit": 125}
    sess.live[step] = LiveStep(masked=masked, argv=argv, home=spec.env.get("HOME", ""),
                               policy=pol, conn=conn, tmp=own_tmp,
                               routes=routes.before_step(sess.scan),
                               tree_before=sess.last_tree, vm=True, protected=spec.protected)
    return {"step": step, "vm": vm, "notices": [inert(n) for n in notices]}


async def net_for(sess, pol, step, learning=False):
    """The way out for `step`'s sandbox: None without network.allow (no network at all)
    unless it runs in learn mode, else the gate (started on the first step that needs it) and
    credentials for the step."""
    if not pol.network_allow and not learning:
        return None
    if sess.gate is None:
        await start_gate(sess)
    if sess.gate is None:          # it could not start: no network, said in daemon.log
        return None
    sess.gate.ask_timeout = pol.ask_timeout
    port = None
    if backend.host_is_landlock():     # no network namespace to bridge: the gate's TCP port
        if sess.gate_task is not None and not await sess.gate_task or sess.gate.tcp_address is None:
            return None
        port = sess.gate.tcp_address[1]
    return Net(str(sess.gate.socket_path), str(sess.certs_dir), sess.gate.open_step(step, learning), port)


async def settle(sess, pol, look_outside=True, before="step", conn=None):
    """Before a step: the first step's baseline, or, when no step runs, the changes made
    outside envgit since the last one, recorded as their own step (outside.py); when only
    agents' session steps run, the escape routes changed from outside alone (the agent's own
    edits are in the directory too, and are a step's). The baseline of a big project takes a
    while: `conn`'s client is shown its progress."""
    async with sess.tree_lock:
        if sess.last_tree is None:
            # While a warm-up still reads the project, its counters are the progress shown (the
            # baseline waits for it, then re-reads only what changed since it read it).
            counters = sess.warming if sess.warming is not None else {}
            await with_progress(sess, asyncio.to_thread(ensure_baseline, sess, pol, counters),
                                     counters, conn)
        elif look_outside and not sess.live and not sess.tree_unknown:
            await asyncio.to_thread(outside_changes.record, sess, pol, before)
        elif look_outside and (agents := outside_changes.agent_sessions_only(sess.live)):
            await asyncio.to_thread(outside_changes.record_routes, sess, pol, before, agents)


async def with_progress(sess, work, counters, conn, after_s=None, every_s=0.5):
    """Await a snapshot (`work`) whose walk keeps `counters` current; once it has run for
    `after_s`, push its progress to `conn` every `every_s` (the client shows it on a
    terminal). A snapshot done within `after_s` pushes nothing."""
    after_s = PROGRESS_AFTER_S if after_s is None else after_s
    task = asyncio.ensure_future(work)
    t0 = time.monotonic()
    while True:
        if conn is not None and time.monotonic() - t0 >= after_s:
            files, size = counters.get("files_hashed", 0), counters.get("bytes_hashed", 0)
            sess.push_to(conn, {
                "push": "progress", "what": "first snapshot", "unit": "file", "done": files,
                "total": None, "text": f"first snapshot: {files} files read ({size / 1e6:.0f} MB)"})
        done, _ = await asyncio.wait({task}, timeout=every_s)
        if done:
            return task.result()


async def warm(sess, pol) -> dict:
    """Before a large project's first step (`envgit init` asks, and does not wait): its files
    read and stored, and the stat cache filled, by a snapshot that is nobody's tree. The
    baseline is still taken when step 1 begins (what the directory is then), but finds every
    file unchanged since this read in the cache. Nothing once a step has been taken."""
    if sess.last_tree is not None or sess.warming is not None:
        return {"ok": True, "warmed": False}
    counters: dict = {}
    sess.warming = counters
    try:
        summary = await asyncio.to_thread(sess.snapshotter.take, pol, None, counters, diff=False)
    finally:
        sess.warming = None
    return {"ok": True, "warmed": True, "ms": summary["ms"]}


def ensure_baseline(sess, pol, counters=None):
    """Before the project's first step: the tree it starts from (an agent's adapter asks
    for it at launch, before the agent's first edit, with op `baseline`)."""
    if sess.last_tree is None:
        base = sess.snapshotter.take(pol, None, counters, diff=False)   # only its tree is kept
        sess.last_tree = base["tree"]
        sess.pending_baseline = {"tree": base["tree"], "ms": base["ms"]}


async def end(sess, msg):
    """A step's end: the snapshot, the checks after it (policy/marks.py: its marks and the
    notices its terminal is shown), the end entry, then what is taken back (takeback.py)."""
    step = msg.get("step")
    info = sess.live.get(step)
    if info is None:
        return {"error": f"step {step} is not running", "exit": 2}
    if sess.gate is not None:
        sess.gate.close_step(step)
    sess.asks.end_step(step)
    sess.denials.release(step)      # what it opened of its placeholders, said before its end
    relinked = statelink.repair(sess.project, step)      # a Landlock host's state link
    if info.agent_session and (agents := outside_changes.agent_sessions_only(sess.live)):
        # the routes the person changed since the session's last step are not its own
        async with sess.tree_lock:
            await asyncio.to_thread(outside_changes.record_routes, sess, info.policy, "agent-end",
                                    agents, step)
    vm_after = memory = None
    if info.vm and sess.vm is not None:     # the guest's changes onto the host first
        try:
            vm_after = await asyncio.to_thread(sess.vm.after, step, info.policy, info.masked,
                                               info.protected)
        except Exception as e:
            vm_after = {"error": f"the guest's changes were not all taken: {e}"}
    summary = await take_after(sess, info.policy)
    if info.vm and sess.vm is not None:     # memory beside the files (vm/memstore.py)
        try:                                # whatever it meets, the step still ends
            memory = await asyncio.to_thread(sess.vm.snapshot, step)
        except Exception as e:
            memory = {"error": f"memory snapshot failed: {e}"}
    faults.point("step-snapshotted")        # objects sealed, the end entry not yet written
    del sess.live[step]
    drop_tmp(info.tmp)
    if info.published:              # the person's way in ends with the step
        info.published.close()
    escapes, tool_files, back = escape_routes_written(info, summary, sess.project.root, sess.scan)
    # the session's own notices, taken before the next await lets another step's settle add one
    notices = sess.tracked_denied_notice(info) + sess.outside_notices + ([relinked] if relinked else [])
    sess.outside_notices = []
    found = marks.Found(
        step=step, summary=summary, requests=info.requests, client_marks=msg.get("marks") or [],
        denied=sorted({shown(p) for p in marks.mentioned(info.argv, info.masked, sess.project.root, info.home)}
                      | set(info.denied_reads)),     # as the placeholders name them (masks.py)
        escapes=escapes, tool_files=tool_files, vm_after=vm_after, memory=memory,
        taken_back=back,
        unreached=unreached_notices(sess, info, dns := dns_summary(msg.get("dns"))),
        policy_files=marks.policy_files_written(summary),
        stripped=await special_bits.after_step(sess.project.root, summary))
    said, told = marks.after_step(found)
    notices += told + ([learn.end_notice(info, step)] if info.learn else [])
    # What the client says is checked here: a value of the wrong type is left out rather
    # than refused, so the step always ends (journal/rows.py would refuse the whole entry).
    entry = {
        "exit_code": typed(msg.get("exit_code"), int), "signal": typed(msg.get("signal"), str),
        "duration_ms": typed(msg.get("duration_ms"), (int, float)), "marks": said,
        "denied_paths": [], **listed("denied_paths", found.denied), "snapshot": summary,
        **listed("denied_reads", list(info.denied_reads.values())),
        **listed("escape_routes", escapes), **listed("taken_back", back),
        **({"extra": msg["extra"]} if isinstance(msg.get("extra"), dict) else {}),
        **({"dns_names": dns["names"], "dns_queries": dns["queries"]} if dns else {}),
        **listed("policy_files", found.policy_files),
        **({"memory": memory} if memory else {})}
    try:
        recorded = sess.record(step, "end", entry)
    except JournalError as e:       # e.g. an `extra` that is not plain JSON: end without it
        entry.pop("extra", None)
        recorded = sess.record(step, "end", {**entry, "error": f"the step's extra data was not kept: {e}"})
    if back:                        # after the step's end: a step of its own (takeback.py)
        _, taken = await takeback.take_back(sess, step, info, back)
        notices += taken
    if recorded:
        sess.autopush.step_ended()  # in the background (remote/auto.py): never slows a step
    if not recorded:                # said once, with what was and was not recorded
        notices = [n for n in notices if not n.startswith("snapshot failed")]
        notices.append(disk_full_notice(step, entry))
    # the paths a notice names are the step's choice: inert before any terminal (inert.py)
    reply = {"ok": True, "marks": said, "snapshot": summary, "notices": [inert(n) for n in notices]}
    if not recorded:
        reply.update(error="envgit: " + notices[-1], exit=EXIT_DISK_FULL)
    return reply


async def take_after(sess, pol):
    """The snapshot after a step; {"error": why} if it could not be taken (the step still
    ends, with the cause recorded, and the next step's snapshot starts afresh)."""
    try:
        # against the tree taken just before, read and replaced under the snapshot lock
        summary = await asyncio.to_thread(sess.snapshotter.take, pol, None, None, sess)
    except (OSError, SnapshotFailed) as e:     # disk full, permissions, a damaged store
        sess.tree_unknown = True
        return {"error": f"snapshot failed: {e}"}
    except Exception as e:          # a bug must not leave the step open for ever either
        import traceback
        traceback.print_exc()       # to daemon.log
        sess.tree_unknown = True
        return {"error": f"snapshot failed: {type(e).__name__}: {e}"}
    sess.tree_unknown = False
    return summary


async def interrupted(sess, step, reason):
    info = sess.live.get(step)
    if info is None:
        return
    if sess.gate is not None:
        sess.gate.close_step(step)
    sess.asks.end_step(step)
    sess.denials.release(step)
    if info.published:
        info.published.close()
    relinked = statelink.repair(sess.project, step)
    summary = await take_after(sess, info.policy)
    if sess.live.pop(step, None) is not None:
        drop_tmp(info.tmp)
        # An interrupted step's escape routes are taken back as an ended one's: what it wrote
        # before its client went away is as much the host's to run later.
        escapes, _, back = escape_routes_written(info, summary, sess.project.root, sess.scan)
        sess.record(step, "interrupted", {"reason": reason, "snapshot": summary, **listed("escape_routes", escapes),
                                          **listed("taken_back", back)})
        if back:
            await takeback.take_back(sess, step, info, back)
        if relinked:
            log_line(f"envgit daemon: step {step}: {relinked}")


def event(sess, msg):
    step, kind = msg.get("step"), msg.get("kind")
    if step not in sess.live:
        return {"error": f"step {step} is not running", "exit": 2}
    if kind not in ("mcp-call", "file-op", "note"):
        return {"error": f"unknown event kind {kind!r}", "exit": 2}
    body = msg.get("body") or {}
    if not isinstance(body, dict):
        return {"error": f"envgit: an event body must be an object, not {type(body).__name__}", "exit": 2}
    try:
        sess.journal.append(step, kind, body)
    except JournalError as e:
        return {"error": f"envgit: {e}", "exit": 2}
    return {"ok": True}


def session_tmp(sess, session):
    d = sess.project.state_path("sessions", session, "tmp")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def step_tmp(sess, session, step):
    """A step's /tmp: its own, empty, removed after it (so no step can leave a poisoned
    cache or script for the next one; the pip/npm caches pointed there go with it). A
    step of an agent whose own sandbox is alive (its inner socket) shares that sandbox's
    session /tmp: the agent and its commands are one actor, and Claude Code reads back
    files its commands write there (the cwd it tracks)."""
    if session in sess.inner:
        return session_tmp(sess, session), None
    d = sess.project.state_path("step-tmp", str(step))
    os.makedirs(os.path.dirname(d), mode=0o700, exist_ok=True)
    remove_tree(d)                   # a leftover of a daemon that died mid-step
    os.mkdir(d, 0o700)
    return d, d


def unreached_notices(sess, info, dns) -> list[str]:
    """After a step: the hosts it looked up (its resolver answered "does not exist"), said
    once with the line of envgit.yaml that allows them, except those the gate's denial
    already said during the step; those network.allow has, looked up directly, said too."""
    if not dns:
        return []
    said = info.said
    hosts = [h for h in netadvice.wanted_hosts(dns["names"]) if h not in said]
    direct = netadvice.direct_lookups(info.policy, hosts)
    missing, withheld = netadvice.split_offered([h for h in hosts if h not in direct])
    out = [netadvice.advice(info.policy, missing, exact=info.agent_session)] if missing else []
    out += [netadvice.withheld_notice(withheld)] if withheld else []
    return out + ([netadvice.direct_advice(direct)] if direct else [])


async def start_gate(sess):
    """The proxy, started once per daemon, on the first step whose policy allows a host. It
    listens at once; mitmproxy's import and start-up (most of a second) go on in the
    background, and only a connection made before they end waits for them, so a first step
    that makes no request at once does not wait (bench/bench_first_step.py). The first
    session of a project waits for them: the session CA, which the sandbox's trust directory
    holds, is made there. If it cannot start, steps run with no network at all."""
    if sess.gate_failed:
        return
    sess.gate_failed = True            # one try per daemon; a success clears it
    try:
        from ..proxy import Gate, resolve_from_env, upstream_ca_from_env
        gate = Gate(sess.policy_for_gate, Path(sess.project.state_path("net")), resolve_from_env(), sess.record_request,
                    sess.asks.ask, upstream_ca=upstream_ca_from_env())
        await gate.listen()
        sess.gate_task = asyncio.ensure_future(_gate_started(sess, gate))
        if not gate.ca_ready() and not await sess.gate_task:
            return
        sess.certs_dir = gate.ca_bundle_dir()
        sess.gate = gate
        sess.gate_failed = False
    except Exception as e:
        _gate_failed(e)


async def _gate_started(sess, gate) -> bool:
    try:
        # Landlock steps reach it by a TCP port on 127.0.0.1 (sandbox/backend.py)
        await gate.start(tcp_port=0 if backend.host_is_landlock() else None)
        return True
    except Exception as e:
        _gate_failed(e)
        if sess.gate is gate:              # the steps it was handed to get no network
            sess.gate = None
        await gate.stop()
        return False


def _gate_failed(e):
    print(f"envgit daemon: the network gate did not start ({type(e).__name__}: {e}); "
          "steps run without network", flush=True)


def escape_routes_written(info, summary, project, scan):
    """Escape routes this step created or changed (sandbox/routes.py): a hook, a git config, an
    .envrc, an .npmrc… An existing protected one is read-only, so this is one created where
    none was, or (should the mounts ever be got round) one modified or deleted, or a `mark`
    route (a .pth file): any of them is said, with its path; and of those, the ones package
    managers write on every install (a venv's programs), said quietly; and those to take back
    (takeback.py). An ended step's and an interrupted one's alike: (escapes, tool files, back)."""
    try:
        escapes = routes.written(info.policy, project, info.home or "", scan,
                                 info.routes or {}, summary)
        tools = routes.tools_own(info.policy, project, info.home or "", scan, escapes)
    except Exception as e:              # never lose the step's end over it; say so
        return [f"(escape routes could not be checked: {type(e).__name__}: {e})"], [], []
    return escapes, tools, takeback.to_take_back(info.policy, project, escapes, scan) if escapes else []



def outside_project(cwd, root):
    """Why `cwd` cannot be a step's working directory (None: it can): every step of a
    session runs in its own project, under its policy, whichever adapter asks."""
    real = os.path.realpath(cwd) if isinstance(cwd, str) and os.path.isabs(cwd) else None
    if real is None or (real != root and not real.startswith(root + "/")):
        return (f"envgit: the working directory {cwd!r} is outside the project {root}; a step runs "
                "in its own project only (start the agent or `envgit run` in the other project)")
    return None


def dns_summary(value):
    """The client's account of the step's resolver (sandbox/resolver.py), checked: {"names":
    [str], "queries": int}, or None. A value of the wrong shape is left out, as with `end`'s
    other fields; the names are the step's choice, kept in their escaped (inert) form."""
    if not isinstance(value, dict):
        return None
    names = value.get("names")
    queries = value.get("queries")
    if not isinstance(names, list) or type(queries) is not int or queries < 0:
        return None
    names = [n[:resolver.MAX_NAME_CHARS] for n in names[:resolver.MAX_NAMES] if isinstance(n, str)]
    return {"names": names, "queries": queries} if names or queries else None



def typed(value, kind):
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def drop_tmp(tmp):
    """Remove a finished step's own /tmp, in a thread: a big one must not delay the reply."""
    if tmp:
        threading.Thread(target=remove_tree, args=(tmp,), daemon=True).start()


def remove_tree(path):
    """rmtree that also gets through the directories a step made unreadable (chmod 000): each
    is made its owner's again before it is listed, never through a symlink (no process of the
    step is left to swap one in: its pid namespace died with it)."""
    def enter(p):
        try:
            if not os.path.islink(p) and os.path.isdir(p):
                os.chmod(p, 0o700)
        except OSError:
            pass
    enter(path)
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                enter(e.path)
                stack.append(e.path)
    shutil.rmtree(path, ignore_errors=True)

