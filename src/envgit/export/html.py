"""A session's steps as one static HTML file: inline CSS, no script, no request anywhere
(a reviewer opens it offline, without envgit). Every text a step, an agent or a server chose
goes through `_t` (html.escape, quotes too, and controls made visible by inert()), and the page
forbids scripts with its own Content-Security-Policy, so a command named `<script>` is text."""

import html

from ..inert import inert

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;background:#fff}
h1{font-size:1.4em}table{border-collapse:collapse;width:100%;margin:.5em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}code,pre{font:12px/1.3 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
.mark{display:inline-block;border-radius:3px;padding:0 4px;margin:0 2px;background:#eee;font-size:12px}
.m-denied,.m-credential-misuse,.m-refused{background:#f8d0d0}.m-irreversible{background:#ffe2a8}
.m-asked{background:#d8e6ff}.m-escape-route-written{background:#f0c0f0}
details{border:1px solid #ddd;margin:.5em 0;padding:.3em .6em}summary{cursor:pointer}
.deny{color:#a00}.allow{color:#060}.small{color:#666;font-size:12px}
"""


def _t(value) -> str:
    return html.escape(inert("" if value is None else str(value)), quote=True)


def _marks(marks) -> str:
    return "".join(f'<span class="mark m-{_t(m) if str(m).replace("-", "").isalnum() else "x"}">{_t(m)}</span>'
                   for m in marks)


def _cmd(rec) -> str:
    from ..view.names import shell_line
    return shell_line(rec["argv"]) if rec["argv"] else ("(changes made outside envgit)"
                                                        if "outside" in rec["marks"] else "")


def _requests(reqs) -> str:
    if not reqs:
        return ""
    rows = "".join(
        f"<tr><td>{_t(q.get('method'))}</td><td>{_t(q.get('host'))}</td><td>{_t(q.get('port'))}</td>"
        f"<td><code>{_t(q.get('path'))}</code></td><td>{_t(q.get('status'))}</td>"
        f"<td>{_t(q.get('bytes_up'))} / {_t(q.get('bytes_down'))}</td>"
        f"<td class=\"{'deny' if 'deny' in (q.get('decision'), q.get('answer')) else 'allow'}\">"
        f"{_t(q.get('decision'))}{' → ' + _t(q.get('answer')) if q.get('answer') else ''}</td>"
        f"<td>{_t(q.get('rule'))}</td><td>{_t(q.get('credential'))}</td></tr>" for q in reqs)
    return ("<h4>Requests</h4><table><tr><th>method</th><th>host</th><th>port</th><th>path</th>"
            "<th>status</th><th>bytes up / down</th><th>decision</th><th>rule</th><th>credential</th></tr>"
            + rows + "</table>")


def _approvals(apps) -> str:
    if not apps:
        return ""
    rows = []
    for a in apps:
        q = a["question"] or {}
        grant = a.get("grant")
        scope = ""
        if grant:
            from ..view.names import grant_line
            scope = f"grant {_t(grant['id'])}: {_t(grant_line(grant))}"
        rows.append(f"<tr><td>{_t(q.get('method'))} {_t(q.get('host'))}<code>{_t(q.get('path'))}</code> "
                    f"<span class=small>{_t(q.get('kind'))}</span></td>"
                    f"<td class=\"{'allow' if a['answer'] == 'allow' else 'deny'}\">{_t(a['answer'])}</td>"
                    f"<td>{_t(a['who'])}</td><td>{_t(a['channel'])}: {_t(a['how'])}</td><td>{_t(a['at'])}</td>"
                    f"<td>{scope}</td></tr>")
    return ("<h4>Approvals</h4><table><tr><th>asked about</th><th>answer</th><th>who</th><th>how</th>"
            "<th>when</th><th>grant</th></tr>" + "".join(rows) + "</table>")


def _files(rec) -> str:
    if not rec["files_changed"]:
        return ""
    items = "".join(f"<li><code>{_t(f['status'])} {_t(f['path'])}</code></li>" for f in rec["files_changed"])
    more = "<li>… (more, not listed by the snapshot)</li>" if rec["files_truncated"] else ""
    return f"<h4>Files changed</h4><ul>{items}{more}</ul>"


def render(records, title: str) -> str:
    """The report: a summary table of the steps, then each step's details, all static."""
    records = list(records)
    rows, details = [], []
    for r in records:
        exit_ = r["status"] if r["status"] != "done" else ("-" if r["exit_code"] is None else r["exit_code"])
        rows.append(f"<tr><td><a href=\"#s{int(r['step'])}\">{int(r['step'])}</a></td>"
                    f"<td>{_t((r['started_at'] or '')[:19].replace('T', ' '))}</td><td>{_t(exit_)}</td>"
                    f"<td>{_t(r['duration_ms'])}</td><td>{_t(r['agent'])}</td>"
                    f"<td><code>{_t(_cmd(r))}</code></td><td>{_marks(r['marks'])}</td></tr>")
        details.append(
            f"<details id=\"s{int(r['step'])}\"><summary>step {int(r['step'])}: <code>{_t(_cmd(r))}</code> "
            f"{_marks(r['marks'])}</summary>"
            f"<p class=small>cwd <code>{_t(r['cwd'])}</code> · session {_t(r['session'])} · tool call "
            f"{_t(r['tool_call_id'])} · policy {_t((r['policy_sha256'] or '')[:12])} · snapshot "
            f"{_t((r['snapshot'] or '')[:12])} · signal {_t(r['signal'])}</p>"
            + _requests(r["requests"]) + _approvals(r["approvals"]) + _files(r)
            + (f"<h4>Denied paths named</h4><p><code>{_t(', '.join(r['denied_paths']))}</code></p>"
               if r["denied_paths"] else "")
            + "</details>")
    asked = sum(len(r["approvals"]) for r in records)
    denied = sum(1 for r in records for q in r["requests"] if "deny" in (q.get("decision"), q.get("answer")))
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>{_t(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{_t(title)}</h1><p>{len(records)} steps · {asked} approvals · {denied} requests denied</p>"
            "<table><tr><th>step</th><th>started (UTC)</th><th>exit</th><th>ms</th><th>agent</th>"
            "<th>command</th><th>marks</th></tr>" + "".join(rows) + "</table>"
            + "".join(details) + "</body></html>\n")
