"""The session daemon's protocol: the ops a client may ask for, as the table `OPS` (op name ->
its handler, given the session, the request and the connection), and `dispatch`, which checks
what every request shares and calls the op's handler (issue 25: the daemon by composition).

Protocol: frames (see client.py: length + marshal'd dict, bounded by frames.py) over the unix socket
`.envgit/daemon.sock` (mode 0600, in `.envgit/`, which no sandbox can see). A client keeps its connection open
for the length of its step; a connection that closes with its step still open marks the step `interrupted`.

  {"op": "begin", "argv", "cwd", "env", "pid", "session"?, "tool_call_id"?, "publish"?, "learn"?}
      -> {"step", "bwrap": [...], "env": {...}, "published"?, "notices"?}   run it, then send `end`
      "learn": true runs the step in learn mode (`envgit learn -- CMD`: learn.py); refused
      with an error when the policy says `learn: forbid`
      "publish": ports the step publishes (["5173", "8000:8080"], sandbox/publish.py),
      listened for on the host's 127.0.0.1 before the step begins; "published" says where
      -> {"step", "refused": "message"}               a shell rule refused it (recorded)
      -> {"error": "message", "exit": 2}              bad policy or input (nothing recorded)
  {"op": "end", "step", "exit_code", "signal", "duration_ms", "marks"?, "extra"?, "dns"?}
      -> {"ok": true, "marks": [...], "snapshot": {...}}   after the snapshot is taken
      "dns": {"names", "queries"}, what the step asked its resolver (sandbox/resolver.py)
A step that is not a command (an MCP execution, an agent's file edit) is begun with
"record_only": true (no sandbox is built; the caller did the work under the policy) and may
carry events before its end:
  {"op": "event", "step", "kind": "mcp-call"|"file-op"|"note", "body"}  -> {"ok": true}
A long-lived sandboxed helper (the MCP REPL) gets its command line without being a step:
  {"op": "spec", "argv", "cwd", "env", "session"?, "step"?, "inner"?, "read"?, "write"?, "protect"?,
   "set_env"?}
      -> {"bwrap", "env"}
      with "step" (an open record-only step), the helper's network goes through the gate as
      that step's; with "inner": true, the session's inner control socket (inner.py) is bound
      in at /run/envgit/control.sock, through which a shim inside asks for steps; "read" and
      "write" add host paths (an agent's own binary and config dir), "set_env" variables
  {"op": "baseline"}  -> {"tree"}: snapshot the project now if no step has yet (agents' launch)
  {"op": "warm"}  -> {"ok", "warmed", "ms"?}: read and store a large project's files before its
      first step (`envgit init`, which does not wait for the reply): no step, no journal row;
      step 1's baseline is still taken at step 1, and re-reads only what changed since
  {"op": "ask", "step", "question": {method, host, path, kind, rule, …}}
      -> {"answer", "who", "how"}: hold a recorded step's action (an MCP tool call whose
      client cannot elicit) for `envgit approve`; no answer in network.ask_timeout is a deny
  {"op": "rewind", "step" | "undo": true, "paths"?, "policy"?, "apply": bool, "uid"}
      -> the preview; with apply, done (progress pushes while it writes). Before a step or
      rewind begins with no step running, changes made outside envgit since the last snapshot
      are recorded as a step of their own (outside.py)
  {"op": "adopt", "branch": "r<R>" | "N", "tree"?, "policy"?, "apply": bool, "uid"}
      -> the preview; with apply, done: the working tree becomes the branch's (adopt.py)
  {"op": "snapshot"}  -> {"tree"}: the working tree now (for `envgit diff` against it)
  {"op": "gc", "keep": [step ids]}  -> {"freed", "dropped": [step ids]}
  {"op": "sandbox", "step", "pidns"} -> {"ok"}: a step with network ("bind" in its begin or
      spec reply) ties its proxy credentials to its sandbox's pid namespace, sent by the client
      after bwrap made it and before the command runs (bwrap --block-fd); the gate refuses
      a credential that is not tied
A step's cwd (begin, spec) must be inside the project: else the reply is an error. `end`'s
reply carries "notices", lines the client prints after the step (a nested envgit.yaml or
.envgit the step made: marked policy-file-written).
  {"op": "pending"} -> {"asks": [...]}: questions waiting for a person
  {"op": "answer", "id", "answer": "allow"|"allow-rule"|"deny", "how"?, "uid",
   "remember"?: true | {"for_s"?: seconds, "path"?: "/glob"}, "or_once"?: true}
      -> {"ok", "step", "grant"?: {...}}: "how" names the channel ("envgit approve", "ui", …);
      "remember" (with "allow" only) also records a grant (grants.py) for exactly the effect
      asked about, for for_s seconds (default grants.DEFAULT_FOR_S, 8 h); "path" widens a
      request's path to a glob that must include the path asked (recorded as a widening).
      A question that cannot be remembered (a credential's host, not a network request, a
      bad path) is an error and the question stays pending, unanswered; with "or_once" (the
      terminal's [m]) it is allowed once instead, the reason in its "how"
  {"op": "grants", "all"?: bool} -> {"grants": [grant.to_json()…]}: live ones (all: every one)
  {"op": "grant-revoke", "id", "uid", "how"?} -> {"grant": {...}}
  {"op": "hello", "protocol"} -> {"ok": true, "protocol"}: a client's first request
      (client.connect), answered at once; a connection whose hello named another protocol
      (another build of envgit) gets OTHER_BUILD for every op but status and stop
  {"op": "status"}  -> {"pid", "session", "live": [step ids], "version",
                        "steps": [{"id", "argv", "published": [[host port, step port]…]}…]}
  {"op": "stop"}    -> {"ok": true}, then the daemon exits
  {"op": "learn", "action": "on"|"off"|"status", "session"?}
      -> {"on", "since", "sessions": [...], "forbidden"?}: learn mode for every step of this
      daemon, or (with "session") for one agent session's steps (learn.py)
A request may carry "rid"; its reply then carries the same "rid". While a step runs, the
daemon also pushes frames to that step's client, each with a "push" key:
  {"push": "ask", "id", "question", "timeout"}   a request of the step waits for a person
  {"push": "asked", "id", "answer", "who"}       that question was answered (or timed out)
  {"push": "notice", "text"}                     a line for the step's stderr (a denial)
  {"push": "progress", "text", "done"?, "total"?, "unit"?, "what"?}
                                                 how far a long operation (gc) has got

The handlers reach the session (server.py's Session) only through what they are given:
this module imports no other part of the daemon but adopt.py, heldends.py, learn.py, steps.py, gcop.py and
client.py.
"""

import os
from collections.abc import Awaitable, Callable
from typing import Any

from .. import __version__
from . import adopt, gcop, heldends, learn, steps
from .client import PROTOCOL

WRITE_OPS = frozenset(("begin", "event", "rewind", "adopt", "gc", "baseline"))
POLICY_OPS = frozenset(("begin", "spec", "baseline", "warm", "ask", "rewind", "adopt", "snapshot", "gc"))

# An op's handler: (session, request, connection) -> the reply
Handler = Callable[[Any, dict, Any], Awaitable[dict]]


async def dispatch(sess, msg, conn=None):
    op = msg.get("op")
    step = msg.get("step")
    if step is not None and (type(step) is not int or step < 0):     # a frame is anyone's bytes
        return {"error": f"envgit daemon: {op!r}: `step` must be a step number (a whole number), "
                         f"not {type(step).__name__} {str(step)[:40]!r}", "exit": 2}
    bad = wrong_field(op, msg)
    if bad:
        return {"error": f"envgit daemon: {op!r}: {bad}", "exit": 2}
    if (sess.unrecorded or sess.orphans_pending) and op in WRITE_OPS:
        heldends.flush(sess)        # raises while the disk is still full: said as such
        heldends.close_orphans(sess)
    if op in POLICY_OPS:
        await sess.load_policy_off_loop()
    handler = OPS.get(op)
    if handler is None:
        return {"error": f"unknown op {op!r}", "exit": 2}
    return await handler(sess, msg, conn)


# --- each op's request, typed ------------------------------------------------------------
# The fields an op reads and the type each must have when present (None always allowed: the
# handler says what a missing one means). A frame is anyone's bytes: a field of the wrong type
# is refused here, in one line, before any handler reads it. `end` is not here on purpose: a
# step always ends, so its handler leaves a wrong-typed value out rather than refusing.

def _list_of(kind):
    return lambda v: isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in v)


def _str_dict(v):
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


_STRS = (_list_of(str), "a list of text")
_STR = (lambda v: isinstance(v, str), "text")
_INT = (_int, "a whole number")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_OBJ = (lambda v: isinstance(v, dict), "an object")
_ENV = (_str_dict, "an object of text values")
_PORTS = (_list_of((int, str)), "a list of ports (5173 or \"8000:8080\")")

REQUESTS: dict[str, dict] = {
    "begin": {"argv": _STRS, "cwd": _STR, "env": _ENV, "pid": _INT, "uid": _INT, "session": _STR,
              "tool_call_id": _STR, "publish": _PORTS, "record_only": _BOOL, "marks": _STRS,
              "origin": _STR, "home": _STR, "learn": _BOOL},
    "spec": {"argv": _STRS, "cwd": _STR, "env": _ENV, "session": _STR, "inner": _BOOL,
             "read": _STRS, "write": _STRS, "protect": _STRS, "set_env": _ENV},
    "event": {"kind": _STR, "body": _OBJ},
    "ask": {"question": _OBJ},
    "rewind": {"undo": _BOOL, "paths": _STRS, "policy": _BOOL, "apply": _BOOL, "uid": _INT},
    "adopt": {"branch": _STR, "tree": _STR, "policy": _BOOL, "apply": _BOOL, "uid": _INT},
    "answer": {"answer": _STR, "how": _STR, "uid": _INT, "or_once": _BOOL},
    "grant-revoke": {"id": _STR, "how": _STR, "uid": _INT},
    "grants": {"all": _BOOL},
    "sandbox": {"pidns": _INT},
    "hello": {"protocol": _INT},
    "learn": {"action": _STR, "session": _STR},
}


def wrong_field(op, msg) -> str | None:
    """What is wrong with a field of `op`'s request (None: nothing REQUESTS checks)."""
    for name, (ok, want) in REQUESTS.get(op, {}).items():
        value = msg.get(name)
        if value is not None and not ok(value):
            return f"`{name}` must be {want}, not {type(value).__name__} {str(value)[:40]!r}"
    return None


async def _begin(sess, msg, conn):
    return await steps.begin(sess, msg, conn)


async def _end(sess, msg, conn):
    return await steps.end(sess, msg)


async def _event(sess, msg, conn):
    return steps.event(sess, msg)


async def _spec(sess, msg, conn):
    return await sess.spec(msg)


async def _baseline(sess, msg, conn):
    """An agent's launch: the directory as it starts."""
    await steps.settle(sess, sess.policy(), before="agent", conn=conn)
    return {"tree": sess.last_tree}


async def _warm(sess, msg, conn):
    """`envgit init` of a large project: its first snapshot's reading, ahead of step 1."""
    return await steps.warm(sess, sess.policy())


async def _sandbox(sess, msg, conn):
    """The client saw the step's sandbox start."""
    if msg.get("step") in sess.live and sess.gate is not None and isinstance(msg.get("pidns"), int):
        sess.gate.bind_step(msg["step"], msg["pidns"])
        return {"ok": True}
    return {"error": "envgit: sandbox needs a running step with network and its pidns", "exit": 2}


async def _ask(sess, msg, conn):
    return await sess.asks.ask_op(msg)


async def _answer(sess, msg, conn):
    return sess.asks.answer(msg)


async def _pending(sess, msg, conn):
    return sess.asks.pending()


async def _grants(sess, msg, conn):
    return sess.asks.grants_op(msg)


async def _grant_revoke(sess, msg, conn):
    return sess.asks.grant_revoke(msg)


async def _rewind(sess, msg, conn):
    return await sess.rewind(msg, conn)


async def _adopt(sess, msg, conn):
    return await adopt.op(sess, msg, conn)


async def _snapshot(sess, msg, conn):
    return await sess.snapshot_now(msg)


async def _gc(sess, msg, conn):
    return await gcop.collect(sess, msg, conn)


async def _hello(sess, msg, conn):
    """A new connection's first word (client.connect)."""
    return {"ok": True, "protocol": PROTOCOL}


async def _status(sess, msg, conn):
    steps = [{"id": step, "argv": info.argv, "published": info.published.listing() if info.published else []}
             for step, info in sorted(sess.live.items())]
    return {"pid": os.getpid(), "session": sess.id, "live": sorted(sess.live), "steps": steps,
            "version": __version__}


async def _stop(sess, msg, conn):
    """What it could not record is said to its terminal."""
    return {"ok": True, **await heldends.finish(sess)}


OPS: dict[str, Handler] = {
    "begin": _begin, "end": _end, "event": _event, "spec": _spec, "baseline": _baseline, "warm": _warm,
    "sandbox": _sandbox, "ask": _ask, "answer": _answer, "pending": _pending,
    "grants": _grants, "grant-revoke": _grant_revoke, "rewind": _rewind, "adopt": _adopt, "snapshot": _snapshot,
    "gc": _gc, "hello": _hello, "status": _status, "stop": _stop, "learn": learn.op,
}
