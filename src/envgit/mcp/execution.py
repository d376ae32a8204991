"""One `execute`: a record-only step around running the code in the REPL, with every upstream
tool call judged by `mcp.rules`, performed, and recorded, and the flows measured:
bytes in (tool results into the sandbox, plus what the code read itself) and bytes out
(what goes back to the model, capped by `mcp.max_return_bytes`)."""

import json
import os
import time
from dataclasses import dataclass, field

import anyio

from .repl import ReplError
from .rules import decide_tool
from .upstream import UpstreamError

ARGV = ["envgit", "mcp", "execute"]
# an execution that runs longer is stopped and its REPL restarted
EXEC_TIMEOUT_S = float(os.environ.get("ENVGIT_MCP_EXEC_TIMEOUT", "120"))
ERROR_MAX = 2000           # an error message reaches the model whole up to this size
RETURNED_HEAD = 2000       # what the journal keeps of the text the model got
MARK_FLOW = "read-much-return-little"


@dataclass
class Ask:
    """A tool call waiting for a person; the MCP handler answers it (elicitation or refusal)."""
    server: str
    tool: str
    rule: str
    args: dict
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: str = "deny"          # allow | deny
    how: str = ""

    @property
    def question(self) -> str:
        args = json.dumps(self.args, ensure_ascii=False)
        return (f"envgit: the code wants to call {self.server}.{self.tool}({args[:500]}"
                f"{'…' if len(args) > 500 else ''}), which {self.rule} holds for a person. Allow it?")

    def settle(self, answer: str, how: str):
        if not self.answered.is_set():
            self.answer, self.how = answer, how
            self.answered.set()


@dataclass
class Outcome:
    text: str
    is_error: bool
    step: int | None


class Execution:
    """Runs in the server's task group (not the request's), so that with the 2026-07-28
    protocol it can outlive the request that returned an elicitation and resume on the retry."""

    def __init__(self, code, reset, sess, settings, ask_timeout):
        self.code, self.reset, self.sess = code, reset, sess
        self.settings, self.ask_timeout = settings, ask_timeout
        self._send, self._events = anyio.create_memory_object_stream(16)
        self.calls: list[dict] = []
        self.asked = False

    async def next_event(self):
        """The next Ask to answer, or the Outcome."""
        return await self._events.receive()

    async def run(self):
        try:
            outcome = await self._recorded()
        except Exception as e:          # the model gets a reason, never a hang
            outcome = Outcome(f"envgit mcp: {type(e).__name__}: {e}", True, None)
        await self._send.send(outcome)

    async def _recorded(self) -> Outcome:
        rec = await self.sess.daemon.open()
        try:
            try:
                step = await rec.begin(ARGV, self.sess.cwd, self.sess.session_id)
            except Exception as e:       # fail closed: code that cannot be recorded does not run
                return Outcome(f"envgit mcp: the step could not be recorded, so the code did not run: {e}",
                               True, None)
            self.rec = rec
            t0 = time.monotonic()
            done, failure = None, None
            async with self.sess.repl_lock:
                try:
                    repl = await self.sess.repl(self.reset)
                    done = await repl.run(self.code, self._on_call, EXEC_TIMEOUT_S)
                except ReplError as e:
                    failure = str(e)
            ms = round((time.monotonic() - t0) * 1000, 3)
            text, is_error, flows = self._result(done, failure)
            marks = self._marks(flows)
            await rec.end(1 if is_error else 0, ms, marks, {
                "code": self.code, "reset": self.reset, "calls": len(self.calls), **flows,
                "error": failure or (done.error if done else None),
                "returned_head": text[:RETURNED_HEAD]})
            return Outcome(text, is_error, step)
        finally:
            rec.close()

    # --- upstream calls -------------------------------------------------------------------

    async def _on_call(self, msg):
        server, tool, args = msg.get("server"), msg.get("tool"), msg.get("args")
        if not isinstance(args, dict):
            return "error", f"{server}.{tool} takes one object of named arguments"
        decision = decide_tool(self.settings["rules"], server, tool)
        record = {"server": server, "tool": tool, "decision": decision.action, "rule": decision.rule,
                  "args_bytes": _size(args), "result_bytes": 0, "duration_ms": 0}
        verdict = decision.action
        if verdict == "ask":
            verdict, record["how"] = await self._ask(Ask(server, tool, decision.rule, args))
            record["answer"] = verdict
        if verdict == "deny":
            record["error"] = f"refused by {decision.rule}"
            await self._record(record)
            why = f": {record['how']}" if record.get("how") else ""
            return "error", f"envgit: {server}.{tool} was refused by {decision.rule} of the policy{why}"
        t0 = time.monotonic()
        try:
            value = await self.sess.upstreams.call(server, tool, args)
            record["result_bytes"] = _size(value)
            reply = ("ok", value)
        except UpstreamError as e:
            record["error"] = str(e)[:ERROR_MAX]
            reply = ("error", str(e)[:ERROR_MAX])
        record["duration_ms"] = round((time.monotonic() - t0) * 1000, 3)
        await self._record(record)
        return reply

    async def _ask(self, ask: Ask) -> tuple[str, str]:
        self.asked = True
        await self._send.send(ask)
        with anyio.move_on_after(self.ask_timeout):
            await ask.answered.wait()
        ask.settle("deny", f"no answer in {self.ask_timeout} s")
        # the question and its answer are on the step whichever way it was answered, with the
        # channel: an answer by elicitation is the agent's client's, not a person's proof
        channel = ("daemon" if ask.how.startswith("the MCP client did not declare") else
                   "timeout" if ask.how.startswith("no answer in") else "elicitation")
        await self.rec.event("note", {"type": "mcp-ask", "server": ask.server, "tool": ask.tool,
                                      "rule": ask.rule, "question": ask.question,
                                      "answer": ask.answer, "how": ask.how, "channel": channel,
                                      "who": "agent-client" if channel == "elicitation" else None,
                                      "at": time.time()})
        return ask.answer, ask.how

    async def ask_elsewhere(self, ask: Ask) -> tuple[str, str]:
        """The client cannot elicit: the question waits in `envgit pending` for `envgit approve`
        or `envgit deny` (the daemon applies network.ask_timeout, then denies)."""
        try:
            r = await self.rec.request({"op": "ask", "step": self.rec.step, "question": {
                "method": "MCP", "host": ask.server, "path": "/" + ask.tool, "kind": "mcp tool call",
                "rule": ask.rule, "reason": ask.question}})
        except Exception as e:            # no daemon to ask: fail closed
            return "deny", f"{_why_elsewhere()} and the daemon could not ask ({e})"
        return r["answer"], f"{_why_elsewhere()}; {r['how']} ({r['who']})"

    async def _record(self, record):
        self.calls.append(record)
        await self.rec.event("mcp-call", record)

    # --- what goes back -----------------------------------------------------------------

    def _result(self, done, failure):
        cap = self.settings["max_return_bytes"]
        upstream_in = sum(c["result_bytes"] for c in self.calls)
        files_in = done.read_bytes if done else None
        if done is None:
            text, is_error, printed = f"envgit mcp: {failure}"[:ERROR_MAX], True, 0
        else:
            parts = [done.output] if done.output else []
            if done.value is not None:
                parts.append(done.value if not parts or parts[-1].endswith("\n") else "\n" + done.value)
            body = "".join(parts).encode()
            printed = done.output_bytes + (len(done.value.encode()) if done.value is not None else 0)
            text = body[:cap].decode(errors="ignore")
            if printed > cap:
                text += (f"\n[envgit: cut at {cap} of {printed} bytes (mcp.max_return_bytes): "
                         "print or return less, e.g. a count, sample(x, 5) or schema(x)]")
            is_error = done.error is not None
            if is_error:
                text += ("\n" if text and not text.endswith("\n") else "") + done.error[:ERROR_MAX]
        flows = {"bytes_in": upstream_in + (files_in or 0), "bytes_in_upstream": upstream_in,
                 "bytes_in_files": files_in, "bytes_out": len(text.encode()),
                 "bytes_printed": printed, "cut": printed > cap}
        return text, is_error, flows

    def _marks(self, flows):
        marks = []
        if (flows["bytes_in"] >= self.settings["flag_bytes_in"]
                and flows["bytes_out"] <= self.settings["flag_bytes_out"]):
            marks.append(MARK_FLOW)
        if any(c["decision"] == "deny" or c.get("answer") == "deny" for c in self.calls):
            marks.append("denied-tool")
        if self.asked:
            marks.append("asked")
        return marks


def _size(value) -> int:
    return len(value.encode()) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False).encode())


def _why_elsewhere() -> str:
    import os
    if os.environ.get("ENVGIT_MCP_ASKS") == "elsewhere":
        return "asked of the person, not the MCP client (a server run for an agent's sandbox)"
    return "the MCP client did not declare elicitation"
