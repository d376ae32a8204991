"""One self-contained JSON record per step: everything a reader needs about the step without
the journal (the grant behind an approval is embedded whole, not named only).

`record(step, grants)` is the one builder; `envgit export --format jsonl` writes one record a
line, the HTML report (html.py) renders the same records, and other formats map them. The
keys are RECORD_KEYS, every one always present (docs/JSON.md, "envgit export").
"""

RECORD_KEYS = ("step", "session", "agent", "tool_call_id", "user", "argv", "cwd", "status",
               "exit_code", "signal", "started_at", "ended_at", "duration_ms", "policy_sha256",
               "marks", "requests", "approvals", "files_changed", "files_truncated", "snapshot",
               "denied_paths", "escape_routes", "events")
APPROVAL_KEYS = ("ask", "question", "answer", "who", "how", "channel", "at", "granted_by", "grant")
FILE_KEYS = ("path", "status")


def record(step, grants: dict) -> dict:
    """The record of one journal Step; `grants`: every grant by id (daemon/grants.py to_json)."""
    from ..view.names import agent_of, channel_of, iso_times
    snap = step.snapshot or {}
    approvals = []
    for a in step.approvals:
        gid = a.get("granted_by")
        approvals.append({"ask": a.get("ask"), "question": a.get("question") or {},
                          "answer": a.get("answer"), "who": a.get("who"), "how": a.get("how"),
                          "channel": channel_of(a), "at": a.get("at"), "granted_by": gid,
                          "grant": grants.get(gid) if gid else None})
    for e in step.events:       # an MCP tool call's ask answered by the agent's client
        if e.get("kind") == "note" and e.get("type") == "mcp-ask":
            approvals.append({"ask": None, "question": {"method": "MCP", "host": e.get("server"),
                                                        "path": "/" + str(e.get("tool")),
                                                        "rule": e.get("rule"), "reason": e.get("question")},
                              "answer": e.get("answer"), "who": e.get("who") or "agent-client",
                              "how": e.get("how"), "channel": channel_of(e), "at": e.get("at"),
                              "granted_by": None, "grant": None})
    return iso_times({
        "step": step.id, "session": step.session, "agent": agent_of(step.session),
        "tool_call_id": step.tool_call_id, "user": step.user, "argv": list(step.argv),
        "cwd": step.cwd, "status": step.status, "exit_code": step.exit_code, "signal": step.signal,
        "started_at": step.started_at, "ended_at": step.ended_at, "duration_ms": step.duration_ms,
        "policy_sha256": step.policy_sha256, "marks": list(step.marks),
        "requests": list(step.requests), "approvals": approvals,
        "files_changed": [{k: p.get(k) for k in FILE_KEYS} for p in snap.get("paths") or []],
        "files_truncated": bool(snap.get("paths_truncated")),
        "snapshot": snap.get("tree"),
        "denied_paths": list(step.denied_paths), "escape_routes": list(step.escape_routes),
        "events": [e for e in step.events if not (e.get("kind") == "note" and e.get("type") == "mcp-ask")],
    })


def records(journal, since_ns: int | None = None, session: str | None = None):
    """The records of the journal's steps, oldest first (started at or after `since_ns`, of
    `session`)."""
    from ..daemon.grants import read_all
    grants = {g.id: g.to_json() for g in read_all(journal)}
    if since_ns is None:
        steps = journal.steps(session=session)
    else:
        steps = []
        for s in journal.steps_newest_first(session):
            if s.started_ns < since_ns:
                break
            steps.append(s)
        steps.reverse()
    for s in steps:
        yield record(s, grants)
