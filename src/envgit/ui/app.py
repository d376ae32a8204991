"""The page's routes (Starlette), rendered on the server (Jinja2, autoescape on).

Reads go to the journal (read-only, query.py) and the snapshot store (read-only, stepview.py);
answers to asks and rewinds go to the session daemon with the same requests the CLI sends
(`answer` with how: ui; view/requests.py `rewind_message`). Every view is plain HTML that works
without JavaScript; ui.js adds the live updates (server-sent events) and the buttons, which
POST with the token in a header (guard.py).

Everything a step chose (commands, paths, hosts, refs, diff text) reaches the HTML through
Jinja's autoescape, after `finalize` has made it inert (inert.py: escapes, bidirectional
controls and other controls shown as \\x1b, \\u202e): a browser is a screen a step must not
be able to fake either.
"""

import asyncio
import json
import os
import time
from importlib import resources
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..inert import inert_line
from ..view import policyfigures
from . import query, stepview
from .guard import Guard

POLL_S = 0.5                    # how often a live page looks at the journal's head and the asks
STREAM_S = 600                  # a stream ends after this long; the browser reconnects (Last-Event-ID)
ROUTES_LISTED = 50              # escape routes a step page names (an install writes hundreds)
ASSETS = {"ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}


def _finalize(value):
    """Every `{{ … }}` value: text made inert (controls as escapes; tabs kept) before it is
    escaped for HTML; markup the templates built themselves is left alone."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return inert_line(value).replace("\n", "\\n")
    return value


class Page:
    """What every route shares: the project, the token, the templates."""

    def __init__(self, project, token: str):
        self.project, self.token = project, token
        self.env = Environment(loader=PackageLoader("envgit.ui", "templates"), autoescape=True,
                               finalize=_finalize, trim_blocks=True, lstrip_blocks=True)
        self.env.filters.update(isotime=_isotime, jsontext=lambda v: json.dumps(v, ensure_ascii=False))
        self.env.globals.update(url=self.url, token=token, project=os.path.basename(project.root),
                                known_marks=query.KNOWN_MARKS)

    def url(self, where: str, /, **params) -> str:
        """A link on the page: every one carries the token (there is no cookie: guard.py)."""
        params = {k: v for k, v in params.items() if v not in (None, "")}
        return where + "?" + urlencode({**params, "token": self.token})

    def render(self, name: str, **ctx) -> str:
        return self.env.get_template(name).render(**ctx)

    def html(self, name: str, status=200, **ctx) -> HTMLResponse:
        return HTMLResponse(self.render(name, **ctx), status_code=status)

    # --- asks (the daemon holds them: nothing waits without one) --------------------------

    def pending(self) -> list[dict]:
        """The questions waiting for a person, each with its step's command."""
        from ..daemon.client import DaemonError, connect
        try:
            conn = connect(self.project, start=False)
        except DaemonError:
            return []
        try:
            asks = conn.request({"op": "pending"}).get("asks") or []
        except (DaemonError, OSError):
            return []
        finally:
            conn.close()
        out = []
        with query.journal(self.project.journal) as j:
            for a in asks:
                s = j.step(a.get("step")) if j is not None and isinstance(a.get("step"), int) else None
                out.append({**a, "question": a.get("question") or {},
                            "command": stepview.row(s)["command"] if s else "",
                            "waiting_s": max(0, int(time.time() - (a.get("asked_at") or time.time())))})
        return out


def make_app(project, token: str, host: str, port: int):
    page = Page(project, token)

    def timeline(request):
        f = query.Filters.from_query(request.query_params)
        before = _int(request.query_params.get("before"))
        n = _int(request.query_params.get("n")) or query.PAGE
        with query.journal(project.journal) as j:
            if j is None:
                steps, older, sessions, head = [], None, [], 0
            else:
                head = query.head_seq(j)
                steps, older = query.page(j, f, before, n)
                sessions = query.sessions(j)
        return page.html("timeline.html", rows=[stepview.row(s) for s in steps], older=older,
                         filters=f, first=before is None, sessions=sessions, head=head,
                         asks=page.pending(), n=n if n != query.PAGE else None,
                         figures=policyfigures.day(project) if before is None and head else None)

    def step(request):
        n = request.path_params["n"]
        if _int(n) is None:             # past what the journal can hold: no such step
            return page.html("missing.html", status=404, what="this step")
        under = _under(request)
        with query.journal(project.journal) as j:
            s = j.step(n) if j is not None else None
            if s is None:
                return page.html("missing.html", status=404, what=f"step {n}")
            before = query.tree_before(j, s)
            changes = stepview.changes(project, j, s, before, under)
            head = query.head_seq(j)
        asks = [a for a in page.pending() if a.get("step") == n]
        return page.html("step.html", s=s, row=stepview.row(s), changes=changes, asks=asks, head=head,
                         policy=stepview.policy(project, s, before), routes_listed=ROUTES_LISTED)

    def step_files(request):
        """The files under one folded directory of a step, as a fragment (ui.js puts it in
        the folded line when it is opened)."""
        n, under = request.path_params["n"], _under(request)
        if _int(n) is None or under is None:
            return Response("name a step and a directory (under=)", status_code=400, media_type="text/plain")
        with query.journal(project.journal) as j:
            s = j.step(n) if j is not None else None
            if s is None:
                return Response("no such step", status_code=404, media_type="text/plain")
            changes = stepview.changes(project, j, s, query.tree_before(j, s), under)
        return page.html("files.html", changes=changes)

    def rewind_plan(request):
        from ..view.errors import Refused
        from ..view.requests import ask_daemon, rewind_message
        n = request.path_params["n"]
        if _int(n) is None:
            return page.html("missing.html", status=404, what="this step")
        restore_policy = request.query_params.get("policy") == "1"
        try:
            plan = ask_daemon(project, rewind_message(n, policy=restore_policy))
        except Refused as e:
            return page.html("rewind.html", status=409, n=n, plan=None, error=str(e), restore_policy=restore_policy)
        except Exception as e:
            return page.html("rewind.html", status=500, n=n, plan=None, error=_operational(e),
                             restore_policy=restore_policy)
        return page.html("rewind.html", n=n, plan=plan, error=None, restore_policy=restore_policy)

    async def rewind_apply(request):
        from ..view.errors import Refused
        from ..view.requests import ask_daemon, rewind_message
        n = request.path_params["n"]
        body = await _json(request)
        if body is None or _int(n) is None:
            return JSONResponse({"error": "send a JSON object, for a step that exists"}, status_code=400)
        msg = {**rewind_message(n, policy=body.get("policy") is True), "apply": True}
        try:
            done = await run_in_threadpool(ask_daemon, project, msg)
        except Refused as e:
            return JSONResponse({"error": str(e)}, status_code=409)
        except Exception as e:
            return JSONResponse({"error": _operational(e)}, status_code=500)
        return JSONResponse({"rewind_step": done.get("rewind_step"), "undo_step": done.get("undo_step"),
                             "counts": done.get("counts"),
                             "url": page.url(f"/steps/{done.get('rewind_step')}")})

    async def answer(request):
        aid = request.path_params["aid"]
        body = await _json(request)
        choice = (body or {}).get("answer")
        if _int(aid) is None:
            return JSONResponse({"error": "no such question"}, status_code=400)
        if choice not in ("allow", "remember", "deny"):
            return JSONResponse({"error": "answer allow, remember or deny"}, status_code=400)
        reply = await run_in_threadpool(_answer, project, aid, choice)
        return JSONResponse(reply, status_code=200 if "error" not in reply else 409)

    def asks_fragment(request):
        return page.html("asks.html", asks=page.pending())

    async def events(request):
        from sse_starlette import EventSourceResponse
        f = query.Filters.from_query(request.query_params)
        only = _int(request.query_params.get("step"))
        seq = _int(request.headers.get("last-event-id")) or _int(request.query_params.get("since"))
        return EventSourceResponse(_stream(request, page, f, only, seq), ping=15, send_timeout=30)

    def compare(request):
        """Branches side by side (branch/compare.py), chosen on the page: `ids` repeated."""
        from ..branch.compare import CompareError, branch_list, load_sides
        from ..branch.registry import BadRecord
        chosen = [i for i in request.query_params.getlist("ids") if i][:8]
        ctx: dict = {"branches": [], "chosen": chosen, "sides": [], "files": [], "marks": [], "error": None}
        try:
            ctx["branches"] = branch_list(project)
            if len(chosen) >= 2:
                from ..branch.compare import file_matrix
                sides = load_sides(project, chosen)
                ctx["sides"] = [x.summary() for x in sides]
                ctx["files"] = file_matrix(sides)
                ctx["marks"] = sorted({m for x in ctx["sides"] for m in x["marks"]})
            elif chosen:
                ctx["error"] = "choose at least two"
        except (CompareError, BadRecord) as e:
            ctx["error"] = str(e)
        return page.html("compare.html", **ctx)

    def asset(request):
        name = request.path_params["name"]
        if name not in ASSETS:          # a fixed list: no path from the request reaches a file
            return Response("not found", status_code=404, media_type="text/plain")
        data = resources.files("envgit.ui").joinpath("static", name).read_bytes()
        return Response(data, media_type=ASSETS[name])

    routes = [
        Route("/", timeline),
        Route("/steps/{n:int}", step),
        Route("/steps/{n:int}/files", step_files, methods=["GET"]),
        Route("/steps/{n:int}/rewind", rewind_plan, methods=["GET"]),
        Route("/steps/{n:int}/rewind", rewind_apply, methods=["POST"]),
        Route("/asks", asks_fragment, methods=["GET"]),
        Route("/asks/{aid:int}", answer, methods=["POST"]),
        Route("/events", events),
        Route("/compare", compare),
        Route("/static/{name}", asset),
    ]

    async def not_found(request, exc):
        return page.html("missing.html", status=404, what="this page")

    app = Starlette(routes=routes, exception_handlers={404: not_found})
    return Guard(app, token, host, port)


def _answer(project, aid: int, choice: str) -> dict:
    """The daemon's `answer`, as `envgit approve`/`deny` send it, with how: ui. "remember"
    allows and asks the daemon to keep a grant for exactly what was asked (`remember: true`:
    the narrowest scope for the default time, daemon/grants.py; a question that cannot be
    remembered stays pending and the page says why)."""
    from ..daemon.client import DaemonError, connect
    msg = {"op": "answer", "id": aid, "answer": "deny" if choice == "deny" else "allow",
           "uid": os.getuid(), "how": "ui"}
    if choice == "remember":
        msg["remember"] = True
    try:
        conn = connect(project, start=False)
    except DaemonError:
        return {"error": "no session daemon is running, so nothing is waiting"}
    try:
        r = conn.request(msg)
    except (DaemonError, OSError) as e:
        return {"error": f"the session daemon did not answer: {e}"}
    finally:
        conn.close()
    if "error" in r:
        return {"error": str(r["error"]).removeprefix("envgit: ")}
    out = {"ok": True, "step": r.get("step"), "answer": msg["answer"], "grant": None}
    grant = r.get("grant")
    if choice == "remember" and isinstance(grant, dict):
        out["grant"] = grant.get("id")
        out["expires_at"] = grant.get("expires_at")
    return out


async def _stream(request, page: Page, f, only, seq):
    """Server-sent events: `step` (a row, rendered as the page renders it) for every step
    with new entries, `asks` (the panel) whenever the pending questions change. Bounded: one
    look every POLL_S, at most NEW_MAX steps a look, and the stream ends after STREAM_S (the
    browser's EventSource reconnects, carrying the last seq it saw as Last-Event-ID)."""
    def look(seq):
        with query.journal(page.project.journal) as j:
            if j is None:
                return [], 0
            if seq is None:
                return [], query.head_seq(j)
            steps, upto = query.changed_since(j, seq, f)
            if only is not None:
                steps = [s for s in steps if s.id == only]
            return steps, upto

    deadline = time.monotonic() + STREAM_S
    shown_asks = None
    while time.monotonic() < deadline:
        if await request.is_disconnected():
            return
        steps, upto = await run_in_threadpool(look, seq)
        for s in steps:
            html = page.render("row.html", r=stepview.row(s))
            yield {"event": "step", "id": str(upto), "data": json.dumps({"id": s.id, "html": html})}
        if seq is None or upto > seq:
            seq = upto
            if not steps:
                yield {"event": "seq", "id": str(seq), "data": str(seq)}
        asks = await run_in_threadpool(page.pending)
        if only is not None:
            asks = [a for a in asks if a.get("step") == only]
        key = [(a["id"], a.get("step")) for a in asks]
        if key != shown_asks:
            shown_asks = key
            yield {"event": "asks", "data": json.dumps({"count": len(asks),
                                                        "html": page.render("asks.html", asks=asks)})}
        await asyncio.sleep(POLL_S)


async def _json(request):
    try:
        body = json.loads(await request.body() or b"{}")
    except (ValueError, RecursionError):    # not JSON, or nested past what the parser can walk
        return None
    return body if isinstance(body, dict) else None


def _isotime(t):
    from ..view.names import iso_utc
    try:
        return iso_utc(t) or ""
    except (TypeError, ValueError, OverflowError):
        return str(t)


def _under(request) -> str | None:
    """The `under` parameter: a directory of the step's tree, as its changes name it."""
    v = request.query_params.get("under")
    return v.strip("/") if v and v.strip("/") else None


def _int(text):
    try:
        v = int(text)
    except (TypeError, ValueError):
        return None
    return v if 0 <= v < (1 << 62) else None


def _operational(e: Exception) -> str:
    from ..view.errors import operational
    said = operational(e)
    if said is None:
        raise e
    return said[0]
