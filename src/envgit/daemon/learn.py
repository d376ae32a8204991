"""Learn mode in the session daemon: which steps run in it, the `learn` op that switches it,
and what a learn step's terminal is told. What the gate does in learn mode is policy/learn.py's.

Who can switch it on: only a client of `.envgit/daemon.sock` (the person's `envgit learn`,
`envgit claude --learn`, `envgit codex --learn`), which no sandbox can reach. A step's begin
asks for learn mode with `"learn": true` (`envgit learn -- CMD`); one asked for over an
agent's inner socket (inner.py: `origin: inner`) never gets it that way, only through the
session it belongs to. Nothing is read from a file or an environment variable, and the state
lives in this process: it ends with the daemon (`envgit daemon stop`, or idle)."""

import time

from ..policy import learn as rules


class LearnState:
    """What is in learn mode: every step of this daemon (`envgit learn on`), and the agent
    sessions started with --learn (by their session id)."""

    def __init__(self) -> None:
        self.everything: float | None = None        # since when, or None: off
        self.sessions: dict[str, float] = {}        # agent session -> since when
        self.told: set[str] = set()                 # "*" or sessions whose first step was told
        self.offs = 0                               # how many times `learn off` was said

    def on_for(self, session: str) -> bool:
        return self.everything is not None or session in self.sessions


def for_step(sess, msg: dict, session: str) -> bool:
    """Does the step `msg` begins run in learn mode?"""
    asked = msg.get("learn") is True and msg.get("origin") != "inner"
    return asked or sess.learn.on_for(session)


def begin_notice(sess, msg: dict, session: str) -> str | None:
    """The line the first step of a learn session (and every `envgit learn -- CMD`) says."""
    key = "*" if sess.learn.everything is not None else session
    if msg.get("learn") is not True:
        if key in sess.learn.told:
            return None
        sess.learn.told.add(key)
    return ("LEARN MODE IS ON: what the policy would deny (a host not in network.allow, a method "
            "or path network.l7 does not list) is let through and recorded; irreversible rules, "
            "secrets and credentials apply as always" +
            ("" if msg.get("learn") is True else "; `envgit learn off` ends it"))


def end_notice(info, step: int) -> str:
    """Every learn step's summary: learn mode was on, and what it let through."""
    learned = [r["learn"] for r in info.requests if isinstance(r.get("learn"), dict)]
    if not learned:
        return "learn mode was on: nothing needed it (the policy allowed every request)"
    counts: dict[str, int] = {}
    for lesson in learned:
        counts[lesson["rule"]] = counts.get(lesson["rule"], 0) + 1
    by = ", ".join(f"{rule} x{n}" for rule, n in sorted(counts.items()))
    return (f"learn mode was on: {len(learned)} request{'s' if len(learned) != 1 else ''} the "
            f"policy would have refused went through ({by}); `envgit show {step}` lists them")


def ended(sess, session: str | None) -> None:
    """Learn mode off: for the steps running now too (of `session`, or all), not only the next
    ones; the gate judges their next request without it."""
    for step, info in sess.live.items():
        if info.learn and session in (None, info.session):
            info.learn = False
            if sess.gate is not None:
                sess.gate.stop_learning(step)


def still(sess, step: int, offs: int) -> bool:
    """After a learn step's begin has made it live: is it still in learn mode? A `learn off`
    said while its begin was awaiting (the first snapshot, the gate's start) found it in no
    list of running steps; it ends learn mode for this step too."""
    info = sess.live.get(step)
    if info is None or not info.learn or sess.learn.offs == offs:
        return info is not None and info.learn
    info.learn = False
    if sess.gate is not None:
        sess.gate.stop_learning(step)
    return False


async def op(sess, msg, conn):
    """{"op": "learn", "action": "on"|"off"|"status", "session"?} -> {"on", "sessions",
    "forbidden"?}; "on" under a policy that forbids it is an error saying why and how."""
    action, session = msg.get("action") or "status", msg.get("session")
    if action not in ("on", "off", "status"):
        return {"error": f"envgit: learn: unknown action {action!r} (on, off or status)", "exit": 2}
    state = sess.learn
    try:
        refused = rules.refusal(sess.policy())
    except Exception as e:              # a policy that does not load: said as begin says it
        return {"error": f"envgit: {e}", "exit": 2}
    if action == "on":
        if refused:
            return {"error": refused, "exit": 2}
        if session:
            state.sessions.setdefault(session, time.time())
            state.told.discard(session)
        elif state.everything is None:
            state.everything = time.time()
            state.told.discard("*")
    elif action == "off":
        if session:
            state.sessions.pop(session, None)
        else:
            state.everything = None
            state.sessions.clear()
        state.offs += 1
        ended(sess, session)
    reply = {"on": state.everything is not None, "since": state.everything,
             "sessions": sorted(state.sessions)}
    if refused:
        reply["forbidden"] = refused
    return reply
