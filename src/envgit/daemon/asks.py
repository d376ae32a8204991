"""The questions a step's requests raise, held for a person, and their answers (issue 25's
split of server.py: the daemon by composition).

A question is asked by the network gate (proxy/gate.py calls `ask`) or by a client (op `ask`:
an MCP tool call whose client cannot elicit); it waits, pushed to the step's client, until
`envgit approve`/`deny` (op `answer`), the gate's timeout, or the step's end (`end_step`: a
deny by `step-ended`). A question inside a live grant (grants.py) is allowed at once; an
answer may remember one (op `answer` with "remember"), and ops `grants` / `grant-revoke` list
and end them. The protocol's text for these ops is in protocol.py.

`Asks` reaches nothing of the session but the collaborators it is given: the journal, the
grants, the live steps (the session's dict, read only), the session's policy and push, and
the gate's current ask timeout.
"""

import asyncio
import time
from collections.abc import Callable

from ..policy import PolicyError
from .grants import DEFAULT_FOR_S, GrantError, Grants
from .livestep import LiveStep

STEP_ENDED, STEP_ENDED_HOW = "step-ended", "the step ended before an answer"


def user_name(uid):
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name if uid is not None else ""
    except KeyError:
        return str(uid)


class Asks:
    def __init__(self, journal, grants: Grants, live: dict[int, LiveStep], policy: Callable,
                 push: Callable[[LiveStep | None, dict], None], ask_timeout: Callable[[], float | None]):
        self.journal = journal
        self.grants = grants
        self.live = live                # the session's live steps: step -> its info (read only)
        self.policy = policy
        self.push = push
        self.ask_timeout = ask_timeout  # the gate's, or None without a gate
        self.waiting: dict[int, dict] = {}
        self.closed: dict[int, int] = {}        # question id -> its step, once the step ended
        self._ids = iter(range(1, 1 << 62))

    async def ask(self, step, question):
        """Hold a request for a person: the step's terminal (via its client) or
        `envgit approve` from another one. The gate applies the timeout. A question inside a
        live grant (grants.py) is allowed at once, the approval naming the grant."""
        info = self.live.get(step)
        try:
            pol = (info.policy if info else None) or self.policy()
        except PolicyError:
            pol = None                  # no policy to name credentials by: no grant applies
        grant = self.grants.match(question, pol) if pol is not None else None
        if grant is not None:
            grant.uses += 1
            self.journal.append(step, "approval", {"ask": None, "question": question, "answer": "allow",
                                                   "who": grant.who, "how": "grant",
                                                   "granted_by": grant.id, "at": time.time()})
            self.push(info, {"push": "notice", "text": f"envgit: step {step}: {question.get('method')} "
                             f"{question.get('host')}{question.get('path')} allowed by grant {grant.id} "
                             f"(envgit grants revoke {grant.id})"})
            return "allow", grant.who, f"grant {grant.id}"
        if step not in self.live:       # asked on its way in as its step ended: nothing to hold
            self.journal.append(step, "approval", {"ask": None, "question": question, "answer": "deny",
                                                   "who": STEP_ENDED, "how": STEP_ENDED_HOW, "at": time.time()})
            return "deny", STEP_ENDED, STEP_ENDED_HOW
        aid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[aid] = {"id": aid, "step": step, "question": question, "future": fut,
                             "asked_at": time.time()}
        info = self.live.get(step)
        self.push(info, {"push": "ask", "id": aid, "question": question,
                         "timeout": self.ask_timeout()})
        try:
            answer, who, how = await fut
        except asyncio.CancelledError:              # timed out in the gate
            self.journal.append(step, "approval", {"ask": aid, "question": question, "answer": "deny",
                                                   "who": "timeout", "how": "no answer in time",
                                                   "at": time.time()})
            self.push(info, {"push": "asked", "id": aid, "answer": "deny", "who": "timeout"})
            raise
        finally:
            self.waiting.pop(aid, None)
        self.journal.append(step, "approval", {"ask": aid, "question": question, "answer": answer,
                                               "who": who, "how": how, "at": time.time()})
        self.push(info, {"push": "asked", "id": aid, "answer": answer, "who": who})
        return answer, who, how

    async def ask_op(self, msg):
        step = msg.get("step")
        if step not in self.live or not isinstance(msg.get("question"), dict):
            return {"error": "envgit: ask needs a running step and a question", "exit": 2}
        timeout = self.policy().ask_timeout
        try:
            answer, who, how = await asyncio.wait_for(self.ask(step, {**msg["question"], "step": step}), timeout)
        except TimeoutError:
            return {"answer": "deny", "who": "timeout", "how": f"no answer within {timeout} s"}
        return {"answer": "allow" if answer in ("allow", "allow-rule") else "deny", "who": who, "how": how}

    def end_step(self, step):
        """A step's end answers its questions still waiting: deny, by `step-ended` (recorded
        by `ask` on the step). A request a process of the step left behind (a background curl,
        a long-lived helper such as the MCP REPL whose record-only step ended) is then never
        let out for a step that is over, nor left on the page looking live; an answer sent
        later is an error, so no grant can be made from it."""
        for aid, a in list(self.waiting.items()):
            if a["step"] != step:
                continue
            del self.waiting[aid]
            self.closed[aid] = step
            if not a["future"].done():
                a["future"].set_result(("deny", STEP_ENDED, STEP_ENDED_HOW))
        while len(self.closed) > 1000:         # only to name them in an error
            del self.closed[next(iter(self.closed))]

    def answer(self, msg):
        a = self.waiting.get(msg.get("id"))
        if a is None and msg.get("id") in self.closed:
            return {"error": f"envgit: question {msg.get('id')} was answered deny when its step "
                    f"{self.closed[msg.get('id')]} ended; `envgit pending` lists the waiting ones",
                    "exit": 2}
        if a is None:
            return {"error": f"envgit: no pending question {msg.get('id')}; `envgit pending` lists them",
                    "exit": 2}
        answer = msg.get("answer")
        if answer not in ("allow", "allow-rule", "deny"):
            return {"error": "envgit: answer allow, allow-rule or deny", "exit": 2}
        who, how = user_name(msg.get("uid")), msg.get("how") or "envgit approve"
        reply = {"ok": True, "step": a["step"]}
        remember = msg.get("remember")
        if remember not in (None, False) and not a["future"].done():
            if answer != "allow":
                return {"error": "envgit: only an allow can be remembered", "exit": 2}
            opts = remember if isinstance(remember, dict) else {}
            try:
                grant = self.grants.make(a["question"], who=who, how=how, step=a["step"], ask=a["id"],
                                         for_s=opts.get("for_s", DEFAULT_FOR_S), path=opts.get("path"),
                                         policy=self._policy_of(a["step"]))
            except GrantError as e:
                if msg.get("or_once") is not True:     # the terminal's [m]: allow once, say why
                    return {"error": f"envgit: {e}", "exit": 2}
                how = f"{how}; not remembered: {e}"
            else:
                reply["grant"] = grant.to_json()
                how = f"{how}; remembered as grant {grant.id}"
        if not a["future"].done():
            a["future"].set_result((answer, who, how))
        return reply

    def _policy_of(self, step):
        """The policy `step` began under; the session's now once it has ended."""
        info = self.live.get(step)
        return (info.policy if info else None) or self.policy()

    def grants_op(self, msg):
        now = time.time()
        return {"grants": [g.to_json() for g in self.grants.all.values() if msg.get("all") is True or g.live(now)]}

    def grant_revoke(self, msg):
        try:
            g = self.grants.revoke(msg.get("id"), who=user_name(msg.get("uid")),
                                   how=msg.get("how") or "envgit grants revoke")
        except GrantError as e:
            return {"error": f"envgit: {e}", "exit": 2}
        return {"grant": g.to_json()}

    def pending(self):
        return {"asks": [{k: v for k, v in a.items() if k != "future"} for a in self.waiting.values()]}
