"""What `envgit policy replay`, `envgit policy suggest`, `envgit stats` and the page share:
the journal's request records by step, a policy's text loaded as envgit.yaml would be, the
records decided again by a policy, the suggestion with its replay, and the counts of asks and
denials (per hour, and what the suggestion would have saved). Reads the journal and
envgit.yaml; the one thing written is a text to load, for a moment, as a hidden file beside
envgit.yaml (load_text: the same project, defaults and organisation above it), by `policy
suggest` and `policy replay --against` only: the counts stats and the page show load nothing."""

import os
import time

from .errors import Refused
from .names import CHANNELS, channel_of


def recorded(j, since_ns=None, steps=None) -> list[tuple[int, list[dict]]]:
    """[(step, [request record, ...])] from the journal's request entries, in order."""
    from ..journal.rows import read_body
    if j is None:
        return []
    lo, hi = steps or (0, (1 << 63) - 1)
    with j.lock:
        rows = j.db.execute(
            "SELECT step, body FROM entries WHERE kind = 'request' AND at_ns >= ? AND step BETWEEN ? AND ? "
            "ORDER BY seq", (min(since_ns or 0, (1 << 63) - 1), lo, hi)).fetchall()
    by_step: dict[int, list[dict]] = {}
    for step, text in rows:
        body, _ = read_body("request", text)
        if body:
            by_step.setdefault(step, []).append(body)
    return sorted(by_step.items())


def load_text(project, text: str, label: str):
    """The policy `text` holds, loaded as envgit.yaml would be (from a file beside it: the same
    project, your defaults and the organisation's policy above it); errors name `label`."""
    import tempfile

    from ..policy import PolicyError, load_policy
    fd, tmp = tempfile.mkstemp(prefix=".envgit.yaml.", suffix=".candidate", dir=project.root)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            pol = load_policy(tmp)
        except PolicyError as e:
            raise Refused(errors_text(e).replace(tmp, label)) from None
        pol.path = label
        return pol
    finally:
        os.unlink(tmp)


def errors_text(e) -> str:
    """A PolicyError's text: each of its errors on a line, in the file's order."""
    return "\n".join(str(x) for x in sorted(e.errors, key=lambda x: (str(x.path), x.line, x.col))) \
        if len(e.errors) > 1 else str(e)


def rebased(policy, steps) -> list[tuple[int, list[dict]]]:
    """`steps` with each record's decision the one `policy` makes (policy/replay.judge, the
    gate's code); a record it cannot judge keeps the recorded one (and stays cannot-replay)."""
    from ..policy.replay import judge
    out = []
    for step, records in steps:
        recs = []
        for rec in records:
            d = judge(policy, rec).now
            recs.append(rec if d is None else {
                **rec, "decision": d.action, "rule": d.rule, "kind": d.kind, "reason": d.reason,
                "irreversible": d.irreversible, "answer": None})
        out.append((step, recs))
    return out


def compute(project, since_ns=None, steps=None):
    """(policy, text, suggestion, candidate or None, replay summary, saved): everything
    `suggest` and `stats` show. Raises Refused when envgit.yaml does not load."""
    from ..policy import PolicyError, load_policy
    from ..policy.replay import replay
    from ..policy.suggest import suggest
    from ..policy.yamledit import EditError
    try:
        with open(project.policy, encoding="utf-8") as f:
            text = f.read()
        policy = load_policy(project.policy)
    except PolicyError as e:
        raise Refused(errors_text(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise Refused(f"{project.policy}: cannot be read ({e}); run `envgit policy check`") from None
    from .requests import open_journal
    records = recorded(open_journal(project), since_ns, steps)
    try:
        sug = suggest(policy, text, records)
    except EditError as e:
        raise Refused(f"{project.policy}: {e}, where the suggestion would go; add what "
                      "`envgit policy replay` shows refused by hand") from None
    if not sug.changed:
        return policy, text, sug, None, None, {"asks": 0, "denials": 0}
    candidate = load_text(project, sug.text, os.path.basename(project.policy) + " (suggested)")
    # what the change itself newly allows: the suggestion against the policy in force
    summary = replay(candidate, rebased(policy, records))["summary"]
    return policy, text, sug, candidate, summary, saved(candidate, records)


def saved(candidate, records) -> dict:
    """The recorded asks and denials (learn mode's would-have-beens among them) the candidate
    would have allowed: judged again by the gate's code."""
    from ..policy.replay import judge
    from ..policy.suggest import effective
    out = {"asks": 0, "denials": 0}
    for _, recs in records:
        for rec in recs:
            eff = effective(rec)
            then = eff.get("decision")
            if then in ("ask", "deny"):
                now = judge(candidate, eff).now
                if now is not None and now.action == "allow":
                    out["asks" if then == "ask" else "denials"] += 1
    return out


HOUR_NS = 3_600_000_000_000


def suggested(project, since_ns: int) -> dict | None:
    """What the suggested change to envgit.yaml would have saved over the same window: the
    recorded asks and denials it allows (saved), the suggestion taken into the loaded policy
    in memory (policy/suggest.as_policy: nothing is written to count); None when envgit.yaml
    does not load or cannot take the suggestion."""
    from ..policy import PolicyError, load_policy
    from ..policy.suggest import as_policy, suggest
    from ..policy.yamledit import EditError
    from .requests import open_journal
    try:
        with open(project.policy, encoding="utf-8") as f:
            text = f.read()
        policy = load_policy(project.policy)
        records = recorded(open_journal(project), since_ns)
        sug = suggest(policy, text, records)
    except (PolicyError, EditError, OSError, UnicodeDecodeError):
        return None
    counts = saved(as_policy(policy, sug), records) if sug.changed else {"asks": 0, "denials": 0}
    return {"lines": len(sug.lines), "asks_saved": counts["asks"], "denials_saved": counts["denials"]}


def day(project) -> dict:
    """The page's figures: the last day's asks and denials, the busiest hour of each, and
    what the suggested policy would have saved of them."""
    from .requests import open_journal
    since = time.time_ns() - 24 * HOUR_NS
    s = collect(open_journal(project), since)
    return {"asks": s["asks"], "denials": s["denials"],
            "asks_peak": max((h["asks"] for h in s["asks_per_hour"]), default=0),
            "denials_peak": max((h["denials"] for h in s["denials_per_hour"]), default=0),
            "suggested": suggested(project, since)}


def collect(j, since_ns: int) -> dict:
    """The figures, from the journal's approval, request and MCP-ask entries since `since_ns`."""
    from ..journal.rows import read_body
    rows = []
    if j is not None:               # no journal: nothing ran, nothing was asked
        with j.lock:
            rows = j.db.execute(
                "SELECT step, kind, at_ns, body FROM entries WHERE at_ns >= ? AND kind IN "
                "('approval', 'request', 'note') ORDER BY seq", (min(since_ns, (1 << 63) - 1),)).fetchall()
    per_hour: dict[int, int] = {}
    denied_per_hour: dict[int, int] = {}
    channels = {c: 0 for c in CHANNELS}
    by_who: dict[str, int] = {}
    answers = {"allow": 0, "deny": 0}
    grants: dict[str, int] = {}
    denials = irreversible = 0
    asked_steps = set()
    for step, kind, at, text in rows:
        body, _ = read_body(kind, text)
        if not body:
            continue
        if kind == "request":
            if body.get("decision") == "deny" or body.get("answer") == "deny":
                denials += 1
                denied_per_hour[at // HOUR_NS] = denied_per_hour.get(at // HOUR_NS, 0) + 1
            elif body.get("irreversible") and (body.get("decision") == "allow" or body.get("answer") == "allow"):
                irreversible += 1
            continue
        if kind == "note":
            # an MCP tool call's ask: counted here only when the agent's client answered it
            # (elicitation) or nobody did; one put to `envgit approve` has its approval entry
            if body.get("type") != "mcp-ask" or body.get("channel") == "daemon" or \
                    str(body.get("how", "")).startswith("the MCP client did not declare"):
                continue
        ch = channel_of(body)
        channels[ch] += 1
        answer = "allow" if body.get("answer") in ("allow", "allow-rule") else "deny"
        answers[answer] += 1
        if ch == "grant":
            grants[body.get("granted_by") or "?"] = grants.get(body.get("granted_by") or "?", 0) + 1
            continue                    # nobody was asked
        who = "agent-client" if ch == "elicitation" else str(body.get("who") or "?")
        by_who[who] = by_who.get(who, 0) + 1
        hour = at // HOUR_NS
        per_hour[hour] = per_hour.get(hour, 0) + 1
        asked_steps.add(step)
    return {
        "since_at": since_ns, "until_at": time.time_ns(),
        "asks": sum(per_hour.values()),
        "asks_per_hour": [{"hour_at": h * HOUR_NS, "asks": n} for h, n in sorted(per_hour.items())],
        "denials_per_hour": [{"hour_at": h * HOUR_NS, "denials": n} for h, n in sorted(denied_per_hour.items())],
        "steps_asked": len(asked_steps),
        "answered_by": by_who, "answered_how": channels, "answers": answers,
        "grants_used": sum(grants.values()), "grant_uses": grants,
        "denials": denials, "irreversible_allows": irreversible,
    }


