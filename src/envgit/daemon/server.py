"""The session daemon's server: `Session`, one per project, wiring the parts (the steps, the
network gate, snapshots, rewinds, the questions of asks.py), and `serve`, the daemon's start
and stop. The protocol it speaks, its ops and their replies, is protocol.py's (`OPS`); its
clients' connections and their frames are serve.py's.

Snapshots run in a worker thread, so a long one never stalls the event loop (and the proxy).
"""

import asyncio
import contextlib
import fcntl
import functools
import os
import secrets
import shutil
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

from .. import faults, steporder
from ..inert import inert, some
from ..journal import Journal, JournalError, disk_full
from ..journal.rows import listed
from ..paths import Project, UnixAddress
from ..policy import PolicyError, decide_command, load_policy
from ..remote.auto import AutoPush
from ..sandbox import kernel, resolver, routes
from ..sandbox.network import Net
from ..sandbox.projectscan import ProjectScan
from ..sandbox.spec import build
from ..sandbox.tracked import tracked_denied, warning
from ..snapshot import CorruptObject, StoreError
from . import heldends, netadvice, protocol, rewind, special_bits, takeback
from . import outside as outside_changes
from .asks import Asks, user_name
from .client import encode
from .grants import Grants
from .heldends import disk_full_notice, log_line
from .inner import InnerSocket
from .livestep import LiveStep
from .repair import mark_interrupted
from .serve import EXIT_DISK_FULL, Connections, raise_fd_limit
from .snapshots import SnapshotFailed, Snapshotter

IDLE_S = float(os.environ.get("ENVGIT_DAEMON_IDLE", "900"))
# How long a first snapshot runs before its progress is shown (a test sets 0: shown at once,
# whatever the machine's speed)
PROGRESS_AFTER_S = float(os.environ.get("ENVGIT_PROGRESS_AFTER", "1.0"))


class Session:
    def __init__(self, project: Project):
        self.project = project
        self.journal = Journal(project.journal)
        self.scan = ProjectScan(project.root)
        self.id = time.strftime("s%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        self.live: dict[int, LiveStep] = {}
        self._policy = None
        self._policy_key = None
        self._policy_error = None
        self._reloading = False
        self.unrecorded: list[tuple] = []   # (step, kind, body) a full disk held back, oldest first
        self.orphans_pending = False    # the start-up could not close orphaned steps (disk full)
        self.stopping = asyncio.Event()
        # the clients' connections (serve.py), each request dispatched by protocol.py
        self.conns = Connections(functools.partial(protocol.dispatch, self), self.interrupted,
                                 self.stopping)
        self.snapshotter = Snapshotter(project)
        # The newest tree in time, not the highest step's: steps run at once (steporder.py).
        newest = steporder.newest_tree(self.journal)
        self.last_tree = newest.tree if newest else None
        # Whether what changed since last_tree may be a step's own (its snapshot failed, it
        # was killed before one, the journal lost its entries): then it is not called outside.
        self.tree_unknown = bool(self.journal.lost_now) or steporder.newest_untreed(self.journal)
        self.pending_baseline = None   # taken, not yet written on a step
        self.outside_notices: list[str] = []   # said after the next step ends (outside.py: bits stripped)
        # Held while the directory is compared with last_tree (outside changes) and by a
        # rewind while it writes: no step begins halfway through either.
        self.tree_lock = asyncio.Lock()
        self.starting = 0               # steps begun and not yet live (their sandbox being built)
        self.gate = None               # the network gate, started by the first step needing it
        self.gate_failed = False
        self.certs_dir = None
        self.inner: dict[str, InnerSocket] = {}     # session -> its inner control socket
        self.grants = Grants(self.journal)       # remembered answers (grants.py), from the journal
        # the questions steps' requests raise, for a person (asks.py)
        self.asks = Asks(self.journal, self.grants, self.live, self.policy, self.push,
                         lambda: self.gate.ask_timeout if self.gate else None)
        self.vm = None                  # backend: vm: the project's machine (vm/host.py)
        self.autopush = AutoPush(project.root)   # remotes set --auto: pushed after each step

    # The policy is re-read whenever the file changes, so an edit applies to the next step:
    # parsed and checked once per change (a bad file's error is kept too, not re-parsed on
    # every call), and by `load_policy_off_loop` in a thread before a request uses it, so a
    # big or slow file never stalls the event loop (the other steps, the network gate).
    def policy(self):
        key = self._policy_stat()
        if key != self._policy_key:
            try:
                self._policy, self._policy_error = load_policy(self.project.policy), None
            except PolicyError as e:
                self._policy, self._policy_error = None, e
            self._policy_key = key
        if self._policy_error is not None:
            raise self._policy_error
        return self._policy

    def _policy_stat(self):
        from ..policy.org import stat_key  # the organisation policy binds too (org.py)
        try:
            st = os.stat(self.project.policy)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns, stat_key())

    def policy_for_gate(self):
        """The gate judges requests on the event loop: after an edit it keeps judging by the
        policy it has while the new one is parsed in a thread (a step begun after the edit
        waits for that parse in `dispatch`, so its requests are judged by the new policy)."""
        if self._policy is not None and self._policy_stat() != self._policy_key:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return self.policy()            # not on the loop: parsing here stalls nothing
            if not self._reloading:
                self._reloading = True
                loop.create_task(self._reload_policy())
            return self._policy
        return self.policy()

    async def _reload_policy(self):
        try:
            await self.load_policy_off_loop()
        finally:
            self._reloading = False

    async def load_policy_off_loop(self):
        if self._policy_stat() != self._policy_key:
            try:
                await asyncio.to_thread(self.policy)
            except PolicyError:
                pass                    # said by the request that uses it

    def session_tmp(self, session):
        d = self.project.state_path("sessions", session, "tmp")
        os.makedirs(d, mode=0o700, exist_ok=True)
        return d

    def step_tmp(self, session, step):
        """A step's /tmp: its own, empty, removed after it (so no step can leave a poisoned
        cache or script for the next one; the pip/npm caches pointed there go with it). A
        step of an agent whose own sandbox is alive (its inner socket) shares that sandbox's
        session /tmp: the agent and its commands are one actor, and Claude Code reads back
        files its commands write there (the cwd it tracks)."""
        if session in self.inner:
            return self.session_tmp(session), None
        d = self.project.state_path("step-tmp", str(step))
        os.makedirs(os.path.dirname(d), mode=0o700, exist_ok=True)
        remove_tree(d)                   # a leftover of a daemon that died mid-step
        os.mkdir(d, 0o700)
        return d, d

    # --- operations ---------------------------------------------------------------------

    async def begin(self, msg, conn=None, run_argv=None):
        """`run_argv`: what the sandbox runs when it is not `argv` itself, for the daemon's own
        callers only (never from the wire): inner.py runs an agent's shell command followed by
        the agent's own cwd bookkeeping, recorded as the command alone."""
        argv, cwd = msg.get("argv"), msg.get("cwd")
        if not argv or not isinstance(argv, list) or not cwd:
            return {"error": "envgit run needs a command: envgit run [--] CMD [ARGS…]", "exit": 2}
        outside = outside_project(cwd, self.project.root)
        if outside:
            return {"error": outside, "exit": 2}
        try:
            pol = self.policy()
        except PolicyError as e:
            return {"error": f"envgit: {e}", "exit": 2}
        except OSError as e:
            return {"error": f"envgit: {self.project.policy}: {e.strerror}", "exit": 2}
        session = msg.get("session") or self.id
        head = {"argv": argv, "cwd": cwd, "session": session, "pid": msg.get("pid"),
                "user": user_name(msg.get("uid")), "policy_sha256": pol.sha256,
                "tool_call_id": msg.get("tool_call_id")}
        if msg.get("origin") == "inner":       # asked for from inside a sandbox (inner.py)
            head["origin"] = "inner"
        verdict = decide_command(pol, argv)
        if verdict.action == "deny":
            step = self.journal.begin_step({**head, "marks": ["refused"]})
            text = f"envgit: refused by {verdict.rule}" + (f": {verdict.reason}" if verdict.reason else "") + \
                "\n(a courtesy rule: the network gate is what stops the action itself)"
            self.journal.append(step, "end", {"exit_code": 126, "signal": None, "duration_ms": 0,
                                              "marks": ["refused"], "refused_by": verdict.rule})
            return {"step": step, "refused": text}
        # A record of an edit the agent already made (copilot's, an inner `record`) is that
        # edit: what changed since the last step is its, not the person's.
        await self.settle(pol, "agent-edit" not in (msg.get("marks") or []), conn=conn)
        if self.pending_baseline:       # step 1 carries what the directory was before it
            head["baseline"], self.pending_baseline = self.pending_baseline, None
        if msg.get("record_only"):
            step = self.journal.begin_step({**head, "marks": list(msg.get("marks") or [])})
            self.live[step] = LiveStep(argv=argv, policy=pol, conn=conn,
                                       routes=routes.before_step(self.scan), tree_before=self.last_tree)
            return {"step": step}
        step = self.journal.begin_step(head)
        self.starting += 1              # begun, not yet live: a rewind waits for it too
        try:
            net = await self.net_for(pol, step)
            tmp, own_tmp = self.step_tmp(session, step)
            spec = build(pol, self.project.root, cwd, run_argv or argv, msg.get("env") or {},
                         self.project.state, tmp, self.scan,
                         {"ENVGIT_STEP": str(step), "ENVGIT_SESSION": session}, net,
                         home=msg.get("home"))
        except Exception as e:          # never leave a begun step without an end
            if self.gate is not None:
                self.gate.close_step(step)
            self.journal.append(step, "interrupted", {"reason": f"sandbox set-up failed: {e}"})
            return {"error": f"envgit: could not set up the sandbox: {e}", "exit": 125}
        finally:
            self.starting -= 1
        if spec.withheld_env:           # env.pass let a credential's real value in: said, not passed
            self.journal.append(step, "note", {
                "type": "env-withheld", "from": "daemon", "variables": spec.withheld_env,
                "reason": "held a credential's real value: the placeholder is there instead "
                          "(an AWS session token's variable is dropped)"})
        if pol.backend == "vm":
            return await self.vm_begin(step, pol, spec, argv, cwd, own_tmp, conn, net)
        self.live[step] = LiveStep(masked=spec.masked + spec.denied_literal, argv=argv,
                                   home=spec.env.get("HOME", ""), policy=pol, conn=conn, tmp=own_tmp,
                                   routes=routes.before_step(self.scan), tree_before=self.last_tree)
        return {"step": step, "bwrap": spec.argv, "env": spec.env, "bind": net is not None}

    async def vm_begin(self, step, pol, spec, argv, cwd, own_tmp, conn, net):
        """backend: vm: the step runs in the project's microVM (vm/host.py); the client gets
        the step's stream socket instead of a bwrap command line."""
        from ..vm.host import VMHost
        if self.vm is None:
            self.vm = VMHost(self.project, log_line)
        masked = spec.masked + spec.denied_literal
        loop = asyncio.get_running_loop()

        def progress(text):             # on the VM's thread: the loop sends it
            if conn is not None:
                loop.call_soon_threadsafe(self.push_to, conn, {
                    "push": "progress", "what": "vm", "text": f"VM: {text}"})
        try:
            notices = await asyncio.to_thread(self.vm.ensure, pol, progress)
            if net is not None:         # the guest's connections reach the gate from this process
                self.gate.bind_step(step, os.stat("/proc/self/ns/pid").st_ino)
            vm = await asyncio.to_thread(self.vm.prepare, step, argv, cwd, spec.env, pol, masked, net,
                                         spec.protected)
        except Exception as e:          # never leave a begun step without an end
            if self.gate is not None:
                self.gate.close_step(step)
            drop_tmp(own_tmp)
            self.journal.append(step, "interrupted", {"reason": f"the VM could not start: {e}"})
            return {"error": f"envgit: the VM could not start: {e} (`envgit doctor` checks QEMU "
                             "and the guest image)", "exit": 125}
        self.live[step] = LiveStep(masked=masked, argv=argv, home=spec.env.get("HOME", ""),
                                   policy=pol, conn=conn, tmp=own_tmp,
                                   routes=routes.before_step(self.scan),
                                   tree_before=self.last_tree, vm=True, protected=spec.protected)
        return {"step": step, "vm": vm, "notices": [inert(n) for n in notices]}

    async def net_for(self, pol, step):
        """The way out for `step`'s sandbox: None without network.allow (no network at all),
        else the gate (started on the first step that needs it) and credentials for the step."""
        if not pol.network_allow:
            return None
        if self.gate is None:
            await start_gate(self)
        if self.gate is None:          # it could not start: no network, said in daemon.log
            return None
        self.gate.ask_timeout = pol.ask_timeout
        return Net(str(self.gate.socket_path), str(self.certs_dir), self.gate.open_step(step))

    async def settle(self, pol, look_outside=True, before="step", conn=None):
        """Before a step: the first step's baseline, or, when no step runs, the changes made
        outside envgit since the last one, recorded as their own step (outside.py). The
        baseline of a big project takes a while: `conn`'s client is shown its progress."""
        async with self.tree_lock:
            if self.last_tree is None:
                counters = {}
                await self.with_progress(asyncio.to_thread(self.ensure_baseline, pol, counters),
                                         counters, conn)
            elif look_outside and not self.live and not self.tree_unknown:
                await asyncio.to_thread(outside_changes.record, self, pol, before)

    async def with_progress(self, work, counters, conn, after_s=None, every_s=0.5):
        """Await a snapshot (`work`) whose walk keeps `counters` current; once it has run for
        `after_s`, push its progress to `conn` every `every_s` (the client shows it on a
        terminal). A snapshot done within `after_s` pushes nothing."""
        after_s = PROGRESS_AFTER_S if after_s is None else after_s
        task = asyncio.ensure_future(work)
        t0 = time.monotonic()
        while True:
            if conn is not None and time.monotonic() - t0 >= after_s:
                files, size = counters.get("files_hashed", 0), counters.get("bytes_hashed", 0)
                self.push_to(conn, {
                    "push": "progress", "what": "first snapshot", "unit": "file", "done": files,
                    "total": None, "text": f"first snapshot: {files} files read ({size / 1e6:.0f} MB)"})
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()

    def ensure_baseline(self, pol, counters=None):
        """Before the project's first step: the tree it starts from (an agent's adapter asks
        for it at launch, before the agent's first edit, with op `baseline`)."""
        if self.last_tree is None:
            base = self.snapshotter.take(pol, None, counters)
            self.last_tree = base["tree"]
            self.pending_baseline = {"tree": base["tree"], "ms": base["ms"]}

    async def end(self, msg):
        step = msg.get("step")
        info = self.live.get(step)
        if info is None:
            return {"error": f"step {step} is not running", "exit": 2}
        if self.gate is not None:
            self.gate.close_step(step)
        self.asks.end_step(step)
        vm_after = memory = None
        if info.vm and self.vm is not None:     # the guest's changes onto the host first
            try:
                vm_after = await asyncio.to_thread(self.vm.after, step, info.policy, info.masked,
                                                   info.protected)
            except Exception as e:
                vm_after = {"error": f"the guest's changes were not all taken: {e}"}
        summary = await self._snapshot(info.policy)
        if info.vm and self.vm is not None:     # memory beside the files (vm/memstore.py)
            memory = await asyncio.to_thread(self.vm.snapshot, step)
        faults.point("step-snapshotted")        # objects sealed, the end entry not yet written
        del self.live[step]
        drop_tmp(info.tmp)
        denied = mentioned(info.argv, info.masked, self.project.root, info.home)
        marks = (["denied-read"] if denied else []) + request_marks(info.requests)
        if "error" in summary:
            marks.append("snapshot-failed")
        marks += [m for m in msg.get("marks") or [] if isinstance(m, str) and m not in marks]
        escapes = escape_routes_written(info, summary, self.project.root, self.scan)
        notices = self.tracked_denied_notice(info) + self.outside_notices
        self.outside_notices = []
        dns = dns_summary(msg.get("dns"))
        unreached = self.unreached_notices(info, dns)
        if unreached and "denied-net" not in marks:
            marks.append("denied-net")
        notices += unreached
        back = takeback.to_take_back(info.policy, self.project.root, escapes, self.scan) if escapes else []
        kept = [e for e in escapes if e not in back]
        if escapes:
            marks.append("escape-route-written")
        if back:
            notices.append("took back what it wrote to escape routes, files a program outside the "
                           "sandbox obeys (git, direnv, npm, an editor or agent): " + some(back)
                           + f"; the step's version is in its snapshot (envgit diff {step}); to let "
                           "steps write one, name it in envgit.yaml's escape_routes.allow")
        if kept:
            notices.append("WROTE AN ESCAPE ROUTE, a file a program outside the sandbox obeys "
                           "(git, direnv, npm, an editor or agent): " + some(kept)
                           + f"; review before running anything here: envgit diff {step}; "
                           f"undo: envgit rewind {step}")
        if "error" in summary:          # said on the step's terminal, not only in the journal
            notices.append(f"{summary['error']}; the step is recorded without a snapshot, and the "
                           "next step's snapshot is taken afresh")
        if vm_after and vm_after.get("refused"):
            notices.append("the VM's step changed paths the policy does not let a step write; they "
                           "were not copied to the project: " + ", ".join(vm_after["refused"][:20]))
        if vm_after and vm_after.get("kept"):
            notices.append("the VM's step removed directories that, on the host, still hold what "
                           "the guest never had (denied or protected files, a repository's .git); "
                           "they were left: " + ", ".join(vm_after["kept"][:20]))
        if vm_after and vm_after.get("edited"):
            notices.append("changed on the host while the VM's step ran: the person's version was "
                           "kept, the guest's not copied (the next step's guest gets the person's): "
                           + ", ".join(vm_after["edited"][:20]))
        if vm_after and vm_after.get("error"):
            notices.append(vm_after["error"])
        if memory and memory.get("error"):
            notices.append(memory["error"])
        policy_files = policy_files_written(summary)
        if policy_files:
            marks.append("policy-file-written")
            notices.append("policy-file-written: made or changed what would decide a project and "
                           "its policy (envgit will not use it: a project inside a project is "
                           "refused): " + some(policy_files))
        stripped = await special_bits.after_step(self.project.root, summary)
        if stripped:                    # the seccomp filter refuses these bits: a way round it
            marks.append("setuid-stripped")
            notices.append("setuid-stripped: a setuid or setgid bit the step's files had was "
                           "removed (a program anyone could run as their owner): " + ", ".join(stripped))
        # What the client says is checked here: a value of the wrong type is left out rather
        # than refused, so the step always ends (journal/rows.py would refuse the whole entry).
        end = {
            "exit_code": _typed(msg.get("exit_code"), int), "signal": _typed(msg.get("signal"), str),
            "duration_ms": _typed(msg.get("duration_ms"), (int, float)), "marks": marks,
            "denied_paths": [], **listed("denied_paths", denied), "snapshot": summary,
            **listed("escape_routes", escapes), **listed("taken_back", back),
            **({"extra": msg["extra"]} if isinstance(msg.get("extra"), dict) else {}),
            **({"dns_names": dns["names"], "dns_queries": dns["queries"]} if dns else {}),
            **listed("policy_files", policy_files),
            **({"memory": memory} if memory else {})}
        try:
            recorded = self.record(step, "end", end)
        except JournalError as e:       # e.g. an `extra` that is not plain JSON: end without it
            end.pop("extra", None)
            recorded = self.record(step, "end", {**end, "error": f"the step's extra data was not kept: {e}"})
        if back:                        # after the step's end: a step of its own (takeback.py)
            _, said = await takeback.take_back(self, step, info, back)
            notices += said
        if recorded:
            self.autopush.step_ended()  # in the background (remote/auto.py): never slows a step
        if not recorded:                # said once, with what was and was not recorded
            notices = [n for n in notices if not n.startswith("snapshot failed")]
            notices.append(disk_full_notice(step, end))
        # the paths a notice names are the step's choice: inert before any terminal (inert.py)
        reply = {"ok": True, "marks": marks, "snapshot": summary, "notices": [inert(n) for n in notices]}
        if not recorded:
            reply.update(error="envgit: " + notices[-1], exit=EXIT_DISK_FULL)
        return reply

    # --- a full disk: entries held until there is room, kept through a stop (heldends.py) --

    def record(self, step, kind, body) -> bool:
        return heldends.record(self, step, kind, body)

    def tracked_denied_notice(self, info):
        """Once a session: denied files git tracks are readable through its object store."""
        if getattr(self, "_told_tracked", False) or not info.home:
            return []
        self._told_tracked = True
        try:
            paths = tracked_denied(info.policy, self.project.root, info.home)
        except Exception:
            return []
        return [warning(paths)] if paths else []

    async def _snapshot(self, pol):
        """The snapshot after a step; {"error": why} if it could not be taken (the step still
        ends, with the cause recorded, and the next step's snapshot starts afresh)."""
        try:
            # against the tree taken just before, read and replaced under the snapshot lock
            summary = await asyncio.to_thread(self.snapshotter.take, pol, None, None, self)
        except (OSError, SnapshotFailed) as e:     # disk full, permissions, a damaged store
            self.tree_unknown = True
            return {"error": f"snapshot failed: {e}"}
        except Exception as e:          # a bug must not leave the step open for ever either
            import traceback
            traceback.print_exc()       # to daemon.log
            self.tree_unknown = True
            return {"error": f"snapshot failed: {type(e).__name__}: {e}"}
        self.tree_unknown = False
        return summary

    async def interrupted(self, step, reason):
        info = self.live.get(step)
        if info is None:
            return
        if self.gate is not None:
            self.gate.close_step(step)
        self.asks.end_step(step)
        summary = await self._snapshot(info.policy)
        if self.live.pop(step, None) is not None:
            drop_tmp(info.tmp)
            self.record(step, "interrupted", {"reason": reason, "snapshot": summary})

    def event(self, msg):
        step, kind = msg.get("step"), msg.get("kind")
        if step not in self.live:
            return {"error": f"step {step} is not running", "exit": 2}
        if kind not in ("mcp-call", "file-op", "note"):
            return {"error": f"unknown event kind {kind!r}", "exit": 2}
        body = msg.get("body") or {}
        if not isinstance(body, dict):
            return {"error": f"envgit: an event body must be an object, not {type(body).__name__}", "exit": 2}
        try:
            self.journal.append(step, kind, body)
        except JournalError as e:
            return {"error": f"envgit: {e}", "exit": 2}
        return {"ok": True}

    async def spec(self, msg):
        session = msg.get("session") or self.id
        try:
            pol = self.policy()
            net = None
            step = msg.get("step")
            if step is not None:
                if step not in self.live:
                    return {"error": f"envgit: step {step} is not running", "exit": 2}
                net = await self.net_for(pol, step)
            outside = outside_project(msg.get("cwd") or "", self.project.root)
            if outside:
                return {"error": outside, "exit": 2}
            # The agent's launch (this spec) fixes the home its inner steps' views are built on.
            inner = self.inner_socket(session, (msg.get("env") or {}).get("HOME")) if msg.get("inner") else None
            agent = {k: msg[k] for k in ("read", "write", "protect") if msg.get(k)}
            if msg.get("set_env"):
                agent["env"] = dict(msg["set_env"])
            sp = build(pol, self.project.root, msg["cwd"], msg["argv"], msg.get("env") or {},
                       self.project.state, self.session_tmp(session), self.scan,
                       {"ENVGIT_SESSION": session, **({"ENVGIT_STEP": str(step)} if step else {})},
                       net, inner, agent)
        except (PolicyError, KeyError, OSError) as e:
            return {"error": f"envgit: {e}", "exit": 2}
        return {"bwrap": sp.argv, "env": sp.env, "bind": net is not None}

    def inner_socket(self, session, home=None) -> str:
        if session not in self.inner:
            d = self.project.state_path("inner")
            os.makedirs(d, mode=0o700, exist_ok=True)
            path = os.path.join(d, f"{session}.sock")
            if len(os.fsencode(path)) > 100:      # an AF_UNIX path ends at 107 bytes
                import tempfile
                path = os.path.join(tempfile.mkdtemp(prefix="envgit-inner-"), "control.sock")
            self.inner[session] = InnerSocket(self, session, path, asyncio.get_running_loop(),
                                              home or os.path.expanduser("~"))
        return self.inner[session].path

    # --- the gate's callbacks ----------------------------------------------------------

    def record_request(self, step, rec):
        """Every request of a step, on the step; a denial also told on the step's stderr."""
        self.journal.append(step, "request", rec)
        info = self.live.get(step)
        if info is None:
            return
        info.requests.append(rec)
        if rec.get("decision") == "deny" or rec.get("answer") == "deny":
            # Said once a step: a client's retries of a denied host are not said again.
            said = info.said
            if rec.get("rule") in ("network.allow", "builtin:special-address") and not rec.get("answer"):
                entry = rec["host"] if rec.get("port") in (None, 80, 443) else f"{rec['host']}:{rec['port']}"
                if entry in said:
                    return
                said.add(entry)
                offered, withheld = netadvice.split_offered([entry])
                text = f"envgit: step {step}: " + (netadvice.advice(info.policy, offered)
                                                   if offered else netadvice.withheld_notice(withheld))
            else:
                if (rec.get("rule"), rec.get("method"), rec.get("host")) in said:
                    return
                said.add((rec.get("rule"), rec.get("method"), rec.get("host")))
                what = f" ({rec['kind']})" if rec.get("kind") else ""
                text = (f"envgit: denied {rec['method']} {rec['host']}{rec['path']}{what} by rule "
                        f"{rec['rule']} (said once a step)")
            self.push(info, {"push": "notice", "text": text})

    def unreached_notices(self, info, dns) -> list[str]:
        """After a step: the hosts it looked up (its resolver answered "does not exist"), said
        once with the line of envgit.yaml that allows them, except those the gate's denial
        already said during the step; those network.allow has, looked up directly, said too."""
        if not dns:
            return []
        said = info.said
        hosts = [h for h in netadvice.wanted_hosts(dns["names"]) if h not in said]
        direct = netadvice.direct_lookups(info.policy, hosts)
        missing, withheld = netadvice.split_offered([h for h in hosts if h not in direct])
        out = [netadvice.advice(info.policy, missing)] if missing else []
        out += [netadvice.withheld_notice(withheld)] if withheld else []
        return out + ([netadvice.direct_advice(direct)] if direct else [])

    def push(self, info: LiveStep | None, frame):
        """A frame for a live step's client (None: no step, nothing to tell)."""
        if info is None or self.push_to(info.conn, frame):
            return
        if info.stderr_fd is not None and frame.get("push") in ("notice", "ask"):
            # a step run for an inner-socket caller: tell its own stderr
            text = frame.get("text") or (f"envgit: step {frame['question'].get('step')} waits for approval: "
                                         f"envgit approve {frame['id']} / envgit deny {frame['id']}")
            try:
                os.write(info.stderr_fd, (inert(text) + "\n").encode())   # a host or path a step chose
            except OSError:
                pass

    def push_to(self, conn, frame) -> bool:
        """A frame for a request's own client (progress): False if it has gone."""
        if conn is not None and not conn.is_closing():
            conn.write(encode(frame))
            return True
        return False

    async def rewind(self, msg, conn=None):
        undo = msg.get("undo") is True
        step = None if undo else _typed(msg.get("step"), int)
        paths = msg.get("paths")
        if (step is None and not undo) or not (paths is None or (isinstance(paths, list)
                                                                and all(isinstance(p, str) for p in paths))):
            return {"error": "envgit: rewind needs a step number (or undo) and paths as text", "exit": 2}
        policy = msg.get("policy") is True
        try:
            if msg.get("apply"):
                loop = asyncio.get_running_loop()

                def progress(done, total):      # on the rewind's thread: the loop sends it
                    if conn is not None:
                        loop.call_soon_threadsafe(self.push_to, conn, {
                            "push": "progress", "what": "rewind", "unit": "path", "done": done,
                            "total": total, "text": f"rewind: {done}/{total} paths"})
                async with self.tree_lock:      # no step begins while the rewind writes
                    return await asyncio.to_thread(rewind.apply, self, step, undo, paths, policy,
                                                   user_name(msg.get("uid")), progress)
            return await asyncio.to_thread(rewind.preview, self, step, undo, paths, policy)
        except (rewind.RewindError, PolicyError) as e:
            return {"error": f"envgit: {e}", "exit": 2}
        except (StoreError, CorruptObject) as e:
            return {"error": f"envgit: {e}; `envgit fsck` lists what is damaged", "exit": 4}

    async def snapshot_now(self, msg):
        """The working tree as a tree id, for `envgit diff`; not recorded on any step."""
        try:
            summary = await asyncio.to_thread(self.snapshotter.take, self.policy(), None)
        except (OSError, PolicyError) as e:
            return {"error": f"envgit: snapshot failed: {e}", "exit": 1}
        return {"tree": summary["tree"]}

    async def gc(self, msg, conn=None):
        """Drop the snapshots outside the retention rule, then every object nothing kept reaches."""
        if self.live:
            return {"error": f"envgit: step {min(self.live)} is running; gc when no step runs", "exit": 2}
        last, within = msg.get("keep_last"), msg.get("keep_within_s")
        bad = gc_arguments_problem(last, within)
        if bad:
            return {"error": f"envgit: {bad}", "exit": 2}
        steps = self.journal.steps()
        dropped_before = self.journal.dropped_snapshots()
        with_tree = [s for s in steps if s.snapshot and s.snapshot.get("tree") and s.id not in dropped_before]
        keep = {s.id for s in with_tree}
        if last is not None or within is not None:
            keep = {with_tree[-1].id} if with_tree else set()
            if last:
                keep |= {s.id for s in with_tree[-last:]}
            if within is not None:
                cutoff = time.time_ns() - int(within * 1e9)
                keep |= {s.id for s in with_tree if s.started_ns >= cutoff}
        drop = [s.id for s in with_tree if s.id not in keep]
        roots = set(self.journal.live_trees(dropping=drop))
        if self.last_tree:
            roots.add(self.last_tree)
        loop = asyncio.get_running_loop()

        def progress(done, total):          # on the gc thread: hand the frame to the loop
            if conn is not None:
                loop.call_soon_threadsafe(self.push_to, conn,
                                          {"push": "progress", "text": f"repacked {done}/{total} packs",
                                           "done": done, "total": total, "unit": "pack",
                                           "what": "gc: repacking"})

        # The drop is journaled before the store deletes anything: a gc killed midway has
        # dropped exactly what its row says, and the next gc finishes the store's part.
        if drop:
            self.journal.append(0, "gc", {"dropped": drop, "kept": sorted(keep)})
        faults.point("gc-journaled")
        try:
            freed = await asyncio.to_thread(self.snapshotter.gc, roots, progress)
        except (StoreError, CorruptObject):
            # What gc found damaged is quarantined now: a snapshot of the directory (recorded on
            # no step) stores again whatever of it the directory still holds; then gc once more.
            try:
                await asyncio.to_thread(self.snapshotter.take, self.policy(), None)
                freed = await asyncio.to_thread(self.snapshotter.gc, roots, progress)
            except (StoreError, CorruptObject, SnapshotFailed, OSError, PolicyError) as e:
                return {"error": f"envgit: gc deleted nothing: {e}; `envgit fsck` lists what is "
                        "damaged (a kept snapshot must read back whole before gc can tell what it "
                        "reaches; `envgit gc --keep-last N` can drop the damaged steps)", "exit": 4}
        self.journal.append(0, "gc-done", {"freed": freed})
        from ..vm import memstore  # memory snapshots (backend: vm) follow their steps
        mem_freed, mem_dropped = await asyncio.to_thread(memstore.collect, self.project, keep)
        return {"dropped": drop, "freed": freed, "kept": sorted(keep),
                "memory_freed": mem_freed, "memory_dropped": mem_dropped}

    async def idle_watch(self):
        while not self.stopping.is_set():
            await asyncio.sleep(min(1.0, IDLE_S))
            # Only open steps and requests keep the daemon up (a connection with no step is
            # closed when silent, frames.QUIET_S); while none runs, packs are re-verified.
            busy = lambda: bool(self.live or self.conns.in_request)    # noqa: E731
            if not busy() and time.monotonic() - self.conns.last_activity > IDLE_S:
                self.stopping.set()
            elif not busy():
                await asyncio.to_thread(self.snapshotter.scrub, busy)    # snapshot/scrub.py


async def start_gate(sess):
    """The proxy, started once per daemon, on the first step whose policy allows a host
    (mitmproxy's import and start-up, ~0.7 s, are paid there, not per step). If it cannot
    start, steps still run, with no network at all."""
    if sess.gate_failed:
        return
    sess.gate_failed = True            # one try per daemon; a success clears it
    try:
        from ..proxy import Gate, resolve_from_env, upstream_ca_from_env
        gate = Gate(sess.policy_for_gate, Path(sess.project.state_path("net")), resolve_from_env(), sess.record_request,
                    sess.asks.ask, upstream_ca=upstream_ca_from_env())
        await gate.start()
        sess.certs_dir = gate.ca_bundle_dir()
        sess.gate = gate
        sess.gate_failed = False
    except Exception as e:
        print(f"envgit daemon: the network gate did not start ({type(e).__name__}: {e}); "
              "steps run without network", flush=True)


def escape_routes_written(info, summary, project, scan):
    """Escape routes this step created or changed (sandbox/routes.py): a hook, a git config, an
    .envrc, an .npmrc… An existing protected one is read-only, so this is one created where
    none was, or (should the mounts ever be got round) one modified or deleted, or a `mark`
    route (a .pth file): any of them is said, with its path."""
    try:
        return routes.written(info.policy, project, info.home or "", scan,
                              info.routes or {}, summary)
    except Exception as e:              # never lose the step's end over it; say so
        return [f"(escape routes could not be checked: {type(e).__name__}: {e})"]


def gc_arguments_problem(last, within):
    """What is wrong with gc's retention arguments (None: nothing). Checked here, not only
    by the CLI: nonsense such as a negative count would otherwise select steps to drop."""
    if last is not None and (type(last) is not int or last < 1):
        return f"gc --keep-last {last!r}: give a whole number of steps, 1 or more"
    if within is not None and (type(within) not in (int, float) or not within > 0
                               or within == float("inf")):
        return f"gc --keep-within {within!r}: give a duration greater than zero, e.g. 7d, 12h, 30m"
    return None


def policy_files_written(summary):
    """Paths the step created, changed or removed that name a policy or a project's state
    (`envgit.yaml`, `.envgit`) anywhere below the root: a nested project a step made for itself.
    (find_project refuses one; this says which step made it.)"""
    out = []
    for p in (summary or {}).get("paths", []):
        parts = p["path"].split("/")
        # (the root's envgit.yaml is read-only to a step: a change there is the person's)
        if len(parts) > 1 and (parts[-1] == "envgit.yaml" or ".envgit" in parts):
            out.append(p["path"])
    return out


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


def request_marks(requests):
    marks = []
    if any(r.get("decision") == "deny" or r.get("answer") == "deny" for r in requests):
        marks.append("denied-net")
    if any(r.get("decision") == "ask" for r in requests):
        marks.append("asked")
    if any(r.get("irreversible") for r in requests):
        marks.append("irreversible")
    if any(r.get("rule") == "credential-misuse" for r in requests):
        marks.append("credential-misuse")      # a placeholder sent where its credential may not go
    return marks


def _typed(value, kind):
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


def mentioned(argv, masked, root, home):
    """The denied paths a command line names: the part of 'which denied path did the step
    touch' that can be known without tracing the process."""
    text = " ".join(argv)
    out = []
    for p in masked:
        forms = {p}
        if p.startswith(root + "/"):
            forms.add(p[len(root) + 1:])
            forms.add(os.path.basename(p))
        if home and p.startswith(home + "/"):
            forms.add("~" + p[len(home):])
        if any(f and f in text for f in forms):
            out.append(p)
    return out


async def serve(project: Project):
    lock = open(project.state_path("daemon.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0                         # another daemon serves this project
    raise_fd_limit()
    try:
        sess = Session(project)
    except (OSError, sqlite3.OperationalError) as e:
        if not disk_full(e):
            raise
        # One line the waiting client shows (client.py reads daemon.log's last `envgit:` line
        # when the daemon it started exits), not a traceback after 30 s of waiting.
        log_line(f"envgit: the disk holding {project.state_path()} is full: the session daemon "
                 "cannot open the journal; free some space and run the command again")
        return 5
    except sqlite3.DatabaseError as e:
        log_line(f"envgit: the journal (.envgit/journal.sqlite) is damaged ({e}): no step can be "
                 "recorded; `envgit fsck` says what, `envgit fsck --repair` keeps every entry it can read")
        return 5
    kernel.ROOT_ONLY.warm()             # as root: the scan for root-only host files, now
    try:
        rewind.finish_interrupted(sess)
    except Exception as e:              # keep serving; `envgit fsck` and the log say what happened
        print(f"envgit daemon: could not finish an interrupted rewind: {e}", flush=True)
    try:
        if heldends.write_back(sess):   # a stop's held ends first, or their steps are orphans
            mark_interrupted(sess.journal, "the session daemon stopped before the step ended")
        else:
            sess.orphans_pending = True     # closed after the held ends, once there is room
    except sqlite3.DatabaseError as e:
        if not disk_full(e):
            log_line(f"envgit: the journal (.envgit/journal.sqlite) is damaged ({e}): no step can "
                     "be recorded; `envgit fsck` says what, `envgit fsck --repair` keeps every entry "
                     "it can read")
            sess.journal.close()
            return 5
        sess.orphans_pending = True
        log_line("envgit daemon: the disk is full: orphaned steps are closed once there is room")
    try:
        os.unlink(project.socket)
    except FileNotFoundError:
        pass
    old = os.umask(0o077)
    with UnixAddress(project.socket) as addr:
        server = await asyncio.start_unix_server(sess.conns.handle, path=addr)
    os.umask(old)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sess.stopping.set)
    watcher = asyncio.create_task(sess.idle_watch())
    print(f"envgit daemon {os.getpid()} serving {project.root} (session {sess.id})", flush=True)
    await sess.stopping.wait()
    server.close()
    watcher.cancel()
    try:
        os.unlink(project.socket)
    except FileNotFoundError:
        pass
    await heldends.finish(sess)         # done already when `envgit daemon stop` asked
    shutil.rmtree(project.state_path("sessions", sess.id), ignore_errors=True)
    for inner in sess.inner.values():
        inner.close()
    if sess.gate is not None:
        await sess.gate.stop()
    if sess.vm is not None:             # the VM's QEMU and its RAM file (in /dev/shm) go too
        await asyncio.to_thread(sess.vm.stop)
    with contextlib.suppress(OSError):  # a full disk: heldends.finish said the cache was not saved
        sess.snapshotter.close()
    with contextlib.suppress(sqlite3.Error):
        sess.journal.close()
    return 0


def main(argv=None):
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 1:
        print("usage: python -m envgit.daemon PROJECT_ROOT", file=sys.stderr)
        return 2
    return asyncio.run(serve(Project(os.path.realpath(argv[0]))))
