"""Attacks on `envgit ui`, the page (issue 14): a request without the token, a foreign Host
(DNS rebinding), a cross-site form or fetch, text a step chose carrying HTML and terminal
escapes, path traversal in the static route, and a step reaching for the page's port from
inside its sandbox; last, the red team's (round 14): a diff that wedges the step page, and a
new question that moves the keyboard focus to "Allow once". The oracles: a canary or a marker
in what came back, a marker a script injected would set, the project's file that a forged
rewind would change, the page's answer in time, what reached the server.

The page runs as the attacker's user (root: what it serves does not depend on it); the browser
is Debian's Chromium, headless, as the test's own user."""

import http.server
import shutil
import threading
import time

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers
from uikit import UI, browser, have_browser, wait_for

needs_browser = pytest.mark.skipif(not have_browser(), reason="Chromium and chromedriver are not installed")
MARK = "MARKER-4c1e-step-text"


def _step_with_marker(a):
    r = a.run(f"echo {MARK} > kept.txt", check=True)
    return r


def test_no_token_no_data(attacker):
    a = attacker
    _step_with_marker(a)
    with UI(a) as ui:
        good = ui.get("/")[2]
        assert MARK in good                              # the oracle works
        bad = ["/", "/steps/1", "/events", "/asks", "/static/ui.js",
               "/?token=", "/?token=" + ui.token[:-1], "/?token=" + ui.token + "x",
               "/?TOKEN=" + ui.token, "/?tok=" + ui.token, f"/?token=wrong&token={ui.token}",
               "/steps/1?x=" + ui.token]
        for path in bad:
            status, _, body = ui.get(path, token=False)
            assert status == 403 and MARK not in body and "kept.txt" not in body, path
        for header in ("wrong", ui.token.upper(), ""):
            status, _, body = ui.get("/", token=False, headers={"X-Envgit-Token": header})
            assert status == 403 and MARK not in body, header


def test_foreign_host_is_refused(attacker):
    """DNS rebinding: a name the attacker controls resolved to 127.0.0.1 reaches the port, with
    that name in Host. Only the exact address the page was served at is answered."""
    a = attacker
    _step_with_marker(a)
    with UI(a) as ui:
        for host in (f"rebind.attacker.example:{ui.port}", f"localhost:{ui.port}", f"[::1]:{ui.port}",
                     f"127.0.0.1:{ui.port + 1}", "127.0.0.1", f"127.0.0.1:{ui.port}@evil",
                     f"127.0.0.2:{ui.port}", f"0x7f000001:{ui.port}", ""):
            status, _, body = ui.request("GET", "/steps/1", headers={"Host": host})
            assert status in (400, 403) and MARK not in body, host


class _Hostile(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _hostile_site(html):
    """Another site on 127.0.0.1 (another port: another origin) serving `html`."""
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    srv = _Hostile(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@needs_browser
def test_cross_site_requests_cannot_rewind(attacker):
    """A page on another origin that even knows the token: a form post, a no-cors fetch and a
    fetch with the token header (which needs a CORS preflight) must not change anything."""
    a = attacker
    a.run("echo one > a.txt", check=True)
    a.run("echo two > a.txt", check=True)
    with UI(a) as ui:
        target = ui.link("/steps/1/rewind")
        html = f"""<!doctype html><body>
<form id=f method=POST action="{target}" enctype="text/plain"><input name='{{"policy":false,"x":"' value='"}}'></form>
<script>
fetch("{target}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}})
  .catch(() => 0).finally(() =>
fetch("{target}", {{method: "POST",
                    headers: {{"Content-Type": "application/json", "X-Envgit-Token": "{ui.token}"}}, body: "{{}}"}})
  .catch(() => 0).finally(() => {{ document.title = "sent"; document.getElementById("f").submit(); }}));
</script></body>"""
        srv = _hostile_site(html)
        try:
            with browser() as b:
                b.get(f"http://127.0.0.1:{srv.server_address[1]}/")
                wait_for(lambda: b.title == "sent" or "refused" in b.page_source, what="the forged requests")
                wait_for(lambda: "refused" in b.find_element("tag name", "body").text, what="the form's refusal")
        finally:
            srv.shutdown()
            srv.server_close()
        assert (a.root / "a.txt").read_text() == "two\n"          # the oracle: nothing rewound
        assert "rewind" not in a.envgit("log").stdout


@needs_browser
def test_step_controlled_text_runs_no_script(attacker):
    """Every place a step's choice reaches the page: file and directory names, file contents
    (the diff), the command line, a git branch name, names looked up, the cwd."""
    a = attacker
    payload = "<img src=x onerror=\"window.__pwned=1;document.title='PWNED'\">"
    script = "<script>window.__pwned=2</script>"
    svg = "<svg onload=\"window.__pwned=3\">"
    d = "<iframe onload='parent.__pwned=4'>"          # names: no slash
    steps = [
        ["sh", "-c", 'printf "%s\\n" "$1" "$2" > "$3"; mkdir -p "$4"; echo x > "$4/$5"', "sh",
         script, "\x1b]8;;http://evil.example\x07link\x1b]8;;\x07", payload, d, "\x1b[2Jname\u202e"],
        ["sh", "-c", f"git checkout -q -b '{svg.replace(' ', '')}' 2>/dev/null; "
                     "git -c user.email=a@b -c user.name=a commit -q --allow-empty -m \"$1\" ; "
                     "getent hosts \"$1\" >/dev/null; true", "sh", script],
    ]
    for argv in steps:
        r = a.envgit("run", "--", *argv)
        assert r.returncode == 0, r.stderr
    (a.root / "sub").mkdir(exist_ok=True)
    a.own(a.root / "sub")
    with UI(a) as ui, browser() as b:
        for path, params in (("/", {}), ("/steps/1", {}), ("/steps/2", {}), ("/steps/2/rewind", {}),
                             ("/", {"q": script}), ("/", {"path": payload}), ("/", {"mark": svg})):
            b.get(ui.link(path, **params))
            wait_for(lambda: b.find_element("tag name", "h1"), what=f"the page {path}")
            assert b.execute_script("return window.__pwned") is None, path          # no script ran
            assert b.title != "PWNED", path
            assert not b.find_elements("css selector", "main img, main svg, main iframe, main script"), path
            assert "\x1b" not in b.find_element("tag name", "body").text, path
        b.get(ui.link("/steps/1"))
        text = b.find_element("tag name", "main").text
        assert payload in text and script in text and "\\x1b]8;;" in text


def test_static_route_serves_its_two_files_only(attacker):
    a = attacker
    with UI(a) as ui:
        assert ui.get("/static/ui.js")[0] == 200 and ui.get("/static/ui.css")[0] == 200
        home = str(a.home).lstrip("/")
        tries = ["/static/../guard.py", "/static/..%2fguard.py", "/static/%2e%2e%2fapp.py",
                 "/static/..%2f..%2f..%2f..%2f..%2f..%2f" + home.replace("/", "%2f") + "%2f.ssh%2fid_ed25519",
                 "/static/%2f" + home.replace("/", "%2f") + "%2f.ssh%2fid_ed25519",
                 "/static/ui.js%00.py", "/static/ui.js/..%2f..%2fguard.py", "/static//etc/passwd",
                 "/static/....//....//etc/passwd", "/static/%252e%252e%252fapp.py",
                 "/../../../../" + home + "/.ssh/id_ed25519", "/static/templates/base.html",
                 "/static/__init__.py"]
        for path in tries:
            status, _, body = ui.get(path)
            assert status in (400, 404) and CANARY not in body and "import" not in body \
                and "root:" not in body, (path, status, body[:200])


def test_a_step_cannot_reach_the_page(attacker):
    """Loopback inside a step is the step's own network namespace: the page's port is not
    there, even for a step that was handed the URL with its token."""
    a = attacker
    with UI(a) as ui:
        r = a.run(f"curl -s -m 5 -o got.html -w '%{{http_code}}' '{ui.url}'; echo \" rc=$?\"; "
                  f"python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
                  f"print('py', s.connect_ex(('127.0.0.1', {ui.port})))\" 2>&1 || true")
        out = r.stdout
        assert "rc=0" not in out and " 200" not in out, out + r.stderr
        assert "py 0" not in out, out
        got = (a.root / "got.html").read_text() if (a.root / "got.html").exists() else ""
        assert "Timeline" not in got and ui.token not in got


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
def test_a_step_with_network_cannot_reach_the_page_through_the_gate(attacker):
    """With the network on, the step's way out is the gate, which refuses the host's loopback
    (a port not named in network.allow): asked directly, through the proxy, or as a tunnel."""
    a = attacker
    with servers() as (git, stub), UI(a) as ui:
        netproject(a, git, stub)
        url = ui.url
        r = a.run(f"curl -s -m 8 -o g1 -w '%{{http_code}}' '{url}'; echo \" rc=$?\"; "
                  f"curl -s -m 8 --noproxy '' -o g2 -w '%{{http_code}}' '{url}'; echo \" rc=$?\"; "
                  f"curl -s -m 8 -p --noproxy '' -o g3 -w '%{{http_code}}' '{url}'; echo \" rc=$?\"; "
                  "cat g1 g2 g3 2>/dev/null | head -c 2000", timeout=120)
        out = r.stdout
        assert out.count(" rc=") == 3, out + r.stderr
        assert "Timeline" not in out and " 200 rc" not in out and "data-token" not in out, out + r.stderr


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
def test_a_policy_that_opens_the_pages_port_still_gives_a_step_nothing(attacker):
    """A person's policy may name a host loopback port for a dev server; if the page happens to
    be on it, a step reaches the page through the loopback forwarder, with the right Host even,
    and still gets a 403 and no data: the token is the key, and the step does not have it."""
    from kit.ports import free_port
    a = attacker
    _step_with_marker(a)
    port = free_port()
    a.write_policy(f"version: 1\nnetwork:\n  allow: [\"127.0.0.1:{port}\"]\n")
    with UI(a, "--port", str(port)) as ui:
        assert ui.port == port and MARK in ui.get("/")[2]
        r = a.run(f"for p in / /steps/1 /static/ui.js /events '/?token=guess'; do "
                  f"curl -s -m 8 -w ' %{{http_code}}\\n' \"http://127.0.0.1:{port}$p\"; done", timeout=120)
        codes = [line.rsplit(" ", 1)[-1] for line in r.stdout.splitlines() if line.strip()]
        assert codes == ["403"] * 5, r.stdout + r.stderr              # reached, and refused
        assert MARK not in r.stdout and "kept.txt" not in r.stdout


# --- a diff that wedges the step page -------------------------------------------------------

WRITE = ("python3 -c 'import random, sys\n"
         "random.seed(int(sys.argv[1]))\n"
         "open(\"big.txt\", \"w\").write(\"\".join(\"%d\\n\" % random.randrange(2500) for _ in range(230000)))\n' ")


def test_step_page_answers_despite_a_quadratic_diff(attacker):
    """The red team's case (round 14): a step wedged the step page with a diff that is cheap to
    write and very expensive to show. The page (ui/stepview.py) diffed every changed text file
    up to 1 MiB a side with difflib before its 2 MiB text budget was looked at. difflib's
    matcher is quadratic when lines repeat often but stay under its "popular line" cut-off (1%
    of the lines): a step writes a file of ~250k short lines drawn from ~2,500 values, and the
    next step writes another such file. One view of the second step's page then spent minutes
    of CPU in the server (a thread per view: a few reloads take both cores and every worker),
    and the person never saw what the step changed. `envgit diff` shares the code
    (view/diffs.py unified_lines). Oracle: the server's answer to GET /steps/N within a
    bound a person would wait."""
    a = attacker
    a.run(WRITE + "1 && wc -c big.txt", check=True, timeout=120)
    r = a.run(WRITE + "2 && wc -c big.txt", check=True, timeout=120)
    size = int(r.stdout.split()[0])
    assert size < 1 << 20                     # under the 1 MiB the page still diffs
    with UI(a) as ui:
        assert ui.get("/steps/1")[0] == 200   # the page works
        t0 = time.monotonic()
        try:
            status, _, body = ui.get("/steps/2", timeout=45)
        except TimeoutError:
            status, body = None, ""
        took = time.monotonic() - t0
        assert status == 200 and "big.txt" in body, (
            f"the step page did not answer in {took:.0f} s: a step's 2 files of {size} bytes "
            "wedge the page (difflib on repeated lines)")


# --- a new question moving the keyboard's focus ----------------------------------------------

ASK_API = ("irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
           "    action: ask\n    name: api-write\n")


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
@needs_browser
def test_a_new_question_does_not_move_the_focus_to_allow(attacker, gate_servers):
    """The red team's case (round 14): when the asks panel was redrawn while a button in it had
    the focus, ui.js focused the FIRST button of the new panel: the first question's "Allow
    once". A step decides when the panel is redrawn (it sends another asked-about request
    whenever it likes). A person answering with the keyboard (the page is meant to be keyboard
    navigable) tabs to "Deny" on question 1; the step sends request 2; the focus was then on
    "Allow once" of question 1, and the Enter meant for "Deny" allowed the request. Oracle: the
    server's record (the POST the person meant to deny arrived)."""
    from selenium.webdriver.common.keys import Keys
    git, stub = gate_servers
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    result = {}

    def step():
        result["r"] = attacker.run(
            f"curl -s -o /dev/null -X POST --data-binary one https://{api}/api/one & sleep 8; "
            f"curl -s -o /dev/null -X POST --data-binary two https://{api}/api/two & wait", timeout=120)
    with UI(attacker) as ui, browser() as b:
        b.get(ui.url)
        t = threading.Thread(target=step)
        t.start()
        try:
            deny = wait_for(lambda: b.find_element("css selector", 'button[data-answer="deny"]'),
                            timeout=40, what="question 1's Deny button")
            b.execute_script("arguments[0].focus()", deny)         # the person tabbed to Deny
            assert b.switch_to.active_element.get_attribute("data-answer") == "deny"
            wait_for(lambda: len(b.find_elements("css selector", "article.ask")) >= 2, timeout=40,
                     what="the step's second question")
            time.sleep(0.5)
            focused = b.switch_to.active_element.get_attribute("data-answer")
            b.switch_to.active_element.send_keys(Keys.ENTER)       # ... and presses Enter
            wait_for(lambda: "Question" in b.find_element("id", "flash").text, timeout=20, what="the answer")
            said = b.find_element("id", "flash").text
            for a in b.find_elements("css selector", 'button[data-answer="deny"]'):   # the rest: no
                try:
                    a.click()
                except Exception:
                    pass
        finally:
            t.join(150)
    posts = [q["path"] for q in stub.requests if q["method"] == "POST"]
    assert "/api/one" not in posts, (
        f"the person pressed Enter on Deny; a new question moved the focus to {focused!r} and the "
        f"page said {said!r}: the server received {posts}")
