"""`envgit export --format ocsf`: the export records (records.py) as OCSF events, one JSON
object a line, for a SIEM (Open Cybersecurity Schema Framework, schema 1.7.0).

Each step record becomes, in time order within the step:
  Process Activity (1007, System Activity): Launch (1) at the step's start, Terminate (2) at its
    end (a step still running has no Terminate);
  HTTP Activity (4002, Network Activity): one per request the gate recorded, the activity the
    request's method (CONNECT 1, DELETE 2, GET 3, HEAD 4, OPTIONS 5, POST 6, PUT 7, TRACE 8,
    PATCH 9, any other 99 with its name);
  Web Resource Access Activity (6004, Application Activity): one per approval (a person's,
    a grant's, a timeout's or an MCP client's answer to an ask): Access Grant (1) or Access
    Deny (2).
Every event carries the base fields (class_uid, category_uid, activity_id, type_uid =
class_uid * 100 + activity_id, time in epoch milliseconds, severity_id, metadata.product,
metadata.version), `metadata.correlation_uid` = the step's `SESSION/STEP` (all of one step's
events share it), and what OCSF has no attribute for under `unmapped.envgit`. docs/JSON.md
"envgit export --format ocsf" lists every field.
"""

import json
import os
import shlex
import socket
from datetime import datetime

OCSF_VERSION = "1.7.0"

PROCESS_ACTIVITY = (1007, "Process Activity", 1, "System Activity")
HTTP_ACTIVITY = (4002, "HTTP Activity", 4, "Network Activity")
WEB_RESOURCE_ACCESS = (6004, "Web Resource Access Activity", 6, "Application Activity")

HTTP_METHODS = {"CONNECT": 1, "DELETE": 2, "GET": 3, "HEAD": 4, "OPTIONS": 5, "POST": 6,
                "PUT": 7, "TRACE": 8, "PATCH": 9}
SEVERITY = {1: "Informational", 2: "Low", 3: "Medium"}
# A step's marks that make its Terminate event more than informational.
NOTABLE_MARKS = {"irreversible", "escape-route-written", "policy-file-written", "outside", "rewind"}


def epoch_ms(iso: str | None) -> int | None:
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _ms(value) -> int | None:
    """OCSF durations are whole milliseconds (long_t)."""
    return None if value is None else int(round(value))


def _base(cls, activity_id, activity_name, time_ms, severity_id, rec, uid, device) -> dict:
    class_uid, class_name, category_uid, category_name = cls
    from .. import __version__
    return {
        "class_uid": class_uid, "class_name": class_name,
        "category_uid": category_uid, "category_name": category_name,
        "activity_id": activity_id, "activity_name": activity_name,
        "type_uid": class_uid * 100 + activity_id,
        "type_name": f"{class_name}: {activity_name}",
        "time": time_ms, "severity_id": severity_id, "severity": SEVERITY[severity_id],
        "metadata": {"version": OCSF_VERSION,
                     "product": {"name": "envgit", "vendor_name": "envgit", "version": __version__},
                     "uid": uid, "correlation_uid": f"{rec['session']}/{rec['step']}",
                     "log_name": "envgit journal", "profiles": ["security_control"]},
        "device": device,
        "actor": {"user": {"name": rec["user"]}, "app_name": rec["agent"],
                  "session": {"uid": rec["session"]}},
    }


def _process(rec) -> dict:
    argv = rec["argv"]
    p = {"cmd_line": shlex.join(argv), "user": {"name": rec["user"]},
         "working_directory": rec["cwd"]}
    if argv:
        p["name"] = os.path.basename(argv[0])
        p["file"] = {"name": os.path.basename(argv[0]), "path": argv[0], "type_id": 1}
    return p


def step_events(rec: dict, device: dict) -> list[dict]:
    """The OCSF events of one export record (records.record)."""
    out = []
    start = epoch_ms(rec["started_at"])
    step_info = {"step": rec["step"], "status": rec["status"], "marks": rec["marks"],
                 "policy_sha256": rec["policy_sha256"], "snapshot": rec["snapshot"],
                 "files_changed": len(rec["files_changed"]), "tool_call_id": rec["tool_call_id"],
                 "denied_paths": rec["denied_paths"], "escape_routes": rec["escape_routes"]}
    launch = _base(PROCESS_ACTIVITY, 1, "Launch", start, 1, rec,
                   f"{rec['session']}/{rec['step']}/launch", device)
    launch.update(process=_process(rec), unmapped={"envgit": step_info})
    out.append(launch)
    for i, q in enumerate(rec["requests"]):
        out.append(_request_event(rec, i, q, start, device))
    for i, a in enumerate(rec["approvals"]):
        out.append(_approval_event(rec, i, a, start, device))
    if rec["ended_at"] is not None:
        notable = NOTABLE_MARKS & set(rec["marks"])
        sev = 3 if notable else 2 if "refused" in rec["marks"] or rec["signal"] else 1
        end = _base(PROCESS_ACTIVITY, 2, "Terminate", epoch_ms(rec["ended_at"]), sev, rec,
                    f"{rec['session']}/{rec['step']}/terminate", device)
        ok = rec["exit_code"] == 0 and not rec["signal"]
        end.update(process=_process(rec), exit_code=rec["exit_code"],
                   status_id=1 if ok else 2, status="Success" if ok else "Failure",
                   duration=_ms(rec["duration_ms"]), start_time=start,
                   end_time=epoch_ms(rec["ended_at"]),
                   unmapped={"envgit": {**step_info, "signal": rec["signal"]}})
        out.append(end)
    return out


def let_out(q: dict) -> bool:
    """Did the gate let the request out: allowed by the policy, or asked and answered allow
    (by a person, a grant)?"""
    d = q.get("decision")
    return d == "allow" or d == "ask" and str(q.get("answer") or "").startswith("allow")


def _request_event(rec, i, q, step_start, device) -> dict:
    method = str(q.get("method") or "").upper()
    activity = HTTP_METHODS.get(method, 99)
    allowed = let_out(q)
    sev = 3 if q.get("irreversible") and allowed else 1 if allowed else 2
    ev = _base(HTTP_ACTIVITY, activity, method.title() if activity != 99 else method or "Other",
               epoch_ms(q.get("started_at")) or step_start, sev, rec,
               f"{rec['session']}/{rec['step']}/request/{i}", device)
    scheme, host, port, path = q.get("scheme"), q.get("host"), q.get("port"), q.get("path") or ""
    hp = f"[{host}]" if host and ":" in host else host
    ev.update(
        http_request={"http_method": method, "url": {
            "scheme": scheme, "hostname": host, "port": port, "path": path,
            "url_string": f"{scheme}://{hp}:{port}{path}"}},
        dst_endpoint={"hostname": host, "port": port},
        action_id=1 if allowed else 2, action="Allowed" if allowed else "Denied",
        disposition_id=1 if allowed else 2, disposition="Allowed" if allowed else "Blocked",
        traffic={"bytes_out": q.get("bytes_up") or 0, "bytes_in": q.get("bytes_down") or 0},
        duration=_ms(q.get("duration_ms")),
        unmapped={"envgit": {"step": rec["step"], **{k: q.get(k) for k in (
            "decision", "answer", "answered_by", "answered_how", "rule", "reason", "kind",
            "irreversible", "intercepted")}}})
    if q.get("status") is not None:
        ev["http_response"] = {"code": q["status"]}
    return ev


def _approval_event(rec, i, a, step_start, device) -> dict:
    granted = str(a.get("answer") or "").startswith("allow")
    q = a.get("question") or {}
    method, host, path = q.get("method"), q.get("host"), q.get("path") or ""
    ev = _base(WEB_RESOURCE_ACCESS, 1 if granted else 2, "Access Grant" if granted else "Access Deny",
               epoch_ms(a.get("at")) or step_start, 1, rec,
               f"{rec['session']}/{rec['step']}/approval/{i}", device)
    ev["actor"] = {**ev["actor"], "user": {"name": a.get("who") or "unknown"}}
    ev.update(
        web_resources=[{"name": f"{method} {host}{path}", "type": "MCP tool" if method == "MCP"
                        else "HTTP request", "url_string": f"{host}{path}"}],
        http_request={"http_method": method, "url": {"hostname": host, "path": path}},
        action_id=1 if granted else 2, action="Allowed" if granted else "Denied",
        disposition_id=1 if granted else 2, disposition="Allowed" if granted else "Blocked",
        unmapped={"envgit": {"step": rec["step"], **{k: a.get(k) for k in (
            "ask", "answer", "who", "how", "channel", "granted_by", "grant", "question")}}})
    return ev


def device() -> dict:
    """The machine the journal was exported on (envgit records steps where they run)."""
    return {"hostname": socket.gethostname(), "type_id": 0, "type": "Unknown"}


def pruned(obj):
    """OCSF leaves an absent attribute out rather than null: None values dropped at any depth
    (but inside `unmapped`, which carries the record's own fields as they are)."""
    if isinstance(obj, dict):
        return {k: v if k == "unmapped" else pruned(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [pruned(v) for v in obj]
    return obj


def write_ocsf(records, stream) -> None:
    """One OCSF event a line, ASCII-only JSON, in step order."""
    dev = device()
    for r in records:
        for ev in step_events(r, dev):
            stream.write(json.dumps(pruned(ev), ensure_ascii=True, separators=(",", ":")) + "\n")
