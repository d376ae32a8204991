"""`envgit ui` end to end: the real `envgit ui` on 127.0.0.1, real steps (`envgit run`, bwrap),
their requests through the real gate to local HTTPS servers, and Debian's Chromium driving the
page headless (Selenium). The oracles are what the browser shows, what the journal recorded
(`envgit show --json`) and the project's files."""

import json
import shutil
import subprocess
import threading

import pytest

from conftest import Env, make_home
from gitserver import GitServer, HTTPSServer
from uikit import UI, browser, have_browser, wait_for

needs_browser = pytest.mark.skipif(not have_browser(), reason="Chromium and chromedriver are not installed "
                                   "(dev/run test installs them)")
needs_socat = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
NAMES = ("stub.example.test", "git.example.test")
CURL = "curl -s -o /dev/null -w '%{http_code}\\n'"


def _ok(method, path, headers, body):
    return 200, {"Content-Type": "application/json"}, b'{"data": {}}'


@pytest.fixture
def world(tmp_path):
    """A project with the network on: the stub server allowed, POSTs under /api/ asked."""
    with GitServer(root=tmp_path / "git") as git, \
            HTTPSServer(_ok, NAMES[:1], root=tmp_path / "stub", ca=git.ca) as stub:
        home = make_home(tmp_path)
        root = home / "proj"
        root.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
        env = Env(home, root, {"ENVGIT_RESOLVE": f"{git.resolve},{stub.resolve}",
                               "ENVGIT_UPSTREAM_CA": str(git.ca.cert_path)})
        env.envgit("init", check=True)
        env.write_policy(
            "version: 1\nnetwork:\n  ask_timeout: 30\n"
            f"  allow: [\"stub.example.test:{stub.port}\"]\n"
            "irreversible:\n  - preset: default\n"
            "  - net: {host: \"stub.example.test\", method: POST, path: \"/api/**\"}\n"
            "    action: ask\n    name: api-write\n")
        env.stub = stub
        env.api = f"https://stub.example.test:{stub.port}/api/one"
        try:
            yield env
        finally:
            env.stop()


def show(env, n="last"):
    return json.loads(env.envgit("show", str(n), "--json", check=True).stdout)


# --- who may talk to it (HTTP, no browser) ----------------------------------------------------

def test_refuses_without_the_token_and_with_a_foreign_host(proj):
    proj.run("echo secret-looking > f.txt", check=True)
    with UI(proj) as ui:
        status, headers, body = ui.get("/")
        assert status == 200 and "echo secret-looking" in body
        for h in ("content-security-policy", "x-frame-options", "x-content-type-options"):
            assert h in headers
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        for path in ("/", "/steps/1", "/events", "/static/ui.js", "/asks"):
            status, headers, body = ui.get(path, token=False)
            assert status == 403 and "secret-looking" not in body and "envgit" not in body.lower().replace(
                "envgit ui printed", ""), (path, body)
        assert ui.get("/?token=" + "x" * len(ui.token), token=False)[0] == 403
        for host in (f"evil.example:{ui.port}", f"localhost:{ui.port}", "127.0.0.1",
                     f"127.0.0.1:{ui.port}.evil.example"):
            status, _, body = ui.request("GET", "/", headers={"Host": host})
            assert status == 403 and "secret-looking" not in body, host


def test_changes_need_the_header_and_the_same_origin(proj):
    proj.run("echo one > a.txt", check=True)
    proj.run("echo two > a.txt", check=True)
    with UI(proj) as ui:
        tries = [
            ({"Origin": ui.base, "Content-Type": "application/json"}, 403),              # no header
            ({"X-Envgit-Token": ui.token, "Content-Type": "application/json"}, 403),      # no Origin
            ({"X-Envgit-Token": ui.token, "Origin": "http://evil.example", "Content-Type": "application/json"}, 403),
            ({"X-Envgit-Token": ui.token, "Origin": "null", "Content-Type": "application/json"}, 403),
            ({"X-Envgit-Token": ui.token, "Origin": ui.base, "Sec-Fetch-Site": "cross-site",
              "Content-Type": "application/json"}, 403),
            ({"X-Envgit-Token": ui.token, "Origin": ui.base,
              "Content-Type": "application/x-www-form-urlencoded"}, 415),                # a form
        ]
        for headers, want in tries:
            status, _, _ = ui.request("POST", "/steps/1/rewind", "{}", headers)
            assert status == want, headers
        assert ui.request("PUT", "/steps/1/rewind", "{}", {"X-Envgit-Token": ui.token, "Origin": ui.base})[0] == 405
        assert (proj.root / "a.txt").read_text() == "two\n"        # nothing was rewound
        # the same request from the page itself is let through (and rewinds)
        status, _, body = ui.post("/steps/1/rewind", {})
        assert status == 200, body
        assert (proj.root / "a.txt").read_text() == "one\n"


def test_timeline_pages_and_filters_from_sql(proj):
    for i in range(7):
        proj.run(f"echo {i} > f{i}.txt" + ("; exit 3" if i == 4 else ""))
    with UI(proj) as ui:
        _, _, body = ui.get("/?n=3")
        assert 'data-step="7"' in body and 'data-step="5"' in body and 'data-step="4"' not in body
        assert "before=5" in body                              # the link to the older page
        _, _, body = ui.get("/?n=3&before=5")
        assert 'data-step="4"' in body and 'data-step="2"' in body and 'data-step="5"' not in body
        _, _, body = ui.get("/?q=f4.txt")
        assert 'data-step="5"' in body and body.count('class="step') == 1   # step 5 ran `echo 4 > f4.txt`
        _, _, body = ui.get("/?path=f2.txt")
        assert 'data-step="3"' in body and body.count('class="step') == 1
        _, _, body = ui.get("/?host=nowhere.example")
        assert 'class="step' not in body and "No step matches" in body


# --- in the browser --------------------------------------------------------------------------

@needs_browser
def test_a_step_appears_without_reload_and_its_diff_shows(proj):
    proj.run("echo first > a.txt", check=True)
    with UI(proj) as ui, browser() as b:
        b.get(ui.url)
        wait_for(lambda: b.find_element("css selector", "#live").is_displayed(), what="the live stream")
        b.execute_script("window.notReloaded = 42")
        proj.run("printf 'hello\\nworld\\n' > b.txt", check=True)
        # the row comes as the step begins (running) and is redrawn as it ends
        wait_for(lambda: b.find_element("css selector", 'tr[data-step="2"] td.exit').text == "0",
                 what="step 2's finished row")
        assert "b.txt" in b.find_element("css selector", 'tr[data-step="2"]').text
        assert b.execute_script("return window.notReloaded") == 42          # no reload happened
        wait_for(lambda: b.find_element("css selector", 'tr[data-step="2"] td.num a').click() or True,
                 what="a click on step 2")
        wait_for(lambda: "Step 2" in b.find_element("tag name", "h1").text, what="the step page")
        diff = b.find_element("css selector", "pre.diff").text
        assert "+hello" in diff and "+world" in diff and "b/b.txt" in diff


@needs_browser
@needs_socat
def test_an_ask_is_approved_by_clicking_and_the_step_records_how_ui(world):
    env = world
    result = {}

    def step():
        result["r"] = env.run(f"{CURL} -X POST --data-binary x {env.api}; {CURL} {env.api.replace('/api/one', '/')}",
                              timeout=120)
    with UI(env) as ui, browser() as b:
        b.get(ui.url)
        t = threading.Thread(target=step)
        t.start()
        try:
            button = wait_for(lambda: b.find_element("css selector", 'button[data-answer="allow"]'),
                              timeout=40, what="the ask's Allow button")
            ask = b.find_element("css selector", ".ask").text
            assert "POST" in ask and "stub.example.test" in ask and "/api/one" in ask and "curl" in ask
            button.click()
            wait_for(lambda: "Allowed" in b.find_element("id", "flash").text, what="the answer")
        finally:
            t.join(150)
        assert result["r"].stdout.split() == ["200", "200"], result["r"].stdout + result["r"].stderr
        s = show(env)
        assert [a["how"] for a in s["approvals"]] == ["ui"] and s["approvals"][0]["answer"] == "allow"
        assert [r["method"] for r in env.stub.requests] == ["POST", "GET"]
        # the step page shows its requests and the approval
        b.get(ui.link(f"/steps/{s['id']}"))
        table = b.find_element("css selector", ".requests table").text
        assert "stub.example.test" in table and "POST" in table and "api-write" in table and "allow by" in table
        assert b.find_element("css selector", ".approvals td.how").text == "ui"


@needs_browser
@needs_socat
def test_allow_and_remember_lets_the_same_request_through_later(world):
    env = world
    with UI(env) as ui, browser() as b:
        b.get(ui.url)
        out = {}
        t = threading.Thread(target=lambda: out.update(r=env.run(f"{CURL} -X POST --data-binary x {env.api}",
                                                                 timeout=120)))
        t.start()
        try:
            wait_for(lambda: b.find_element("css selector", 'button[data-answer="remember"]'),
                     timeout=40, what="the ask's remember button").click()
            wait_for(lambda: "remembered as grant" in b.find_element("id", "flash").text, what="the grant")
        finally:
            t.join(150)
        assert out["r"].stdout.split() == ["200"], out["r"].stdout + out["r"].stderr
        first = show(env)
        assert first["approvals"][0]["how"].startswith("ui")
        # a second step: the same request passes without a question; another path is still asked
        r = env.run(f"{CURL} -X POST --data-binary x {env.api}", timeout=60)
        assert r.stdout.split() == ["200"], r.stdout + r.stderr
        second = show(env)
        assert second["approvals"] and second["approvals"][0].get("granted_by"), second["approvals"]
        assert [x["path"] for x in env.stub.requests] == ["/api/one", "/api/one"]
        b.get(ui.link(f"/steps/{second['id']}"))
        assert second["approvals"][0]["granted_by"] in b.find_element("css selector", ".approvals").text
        # outside the grant (another path): asked again on the page; denied there
        b.get(ui.url)
        t = threading.Thread(target=lambda: out.update(r=env.run(
            f"{CURL} -X POST --data-binary x {env.api.replace('/api/one', '/api/two')}", timeout=120)))
        t.start()
        try:
            ask = wait_for(lambda: b.find_element("css selector", ".ask"), timeout=40, what="the second ask")
            assert "/api/two" in ask.text
            ask.find_element("css selector", 'button[data-answer="deny"]').click()
            wait_for(lambda: "Denied" in b.find_element("id", "flash").text, what="the deny")
        finally:
            t.join(150)
        assert out["r"].stdout.split() != ["200"] and [x["path"] for x in env.stub.requests] == ["/api/one"] * 2
        assert [(a["answer"], a["how"]) for a in show(env)["approvals"]] == [("deny", "ui")]


@needs_browser
def test_rewind_from_the_page_restores_the_tree(proj):
    proj.run("echo one > a.txt && mkdir -p d && echo keep > d/k.txt", check=True)
    proj.run("echo two > a.txt && echo new > b.txt && rm d/k.txt", check=True)
    with UI(proj) as ui, browser() as b:
        b.get(ui.link("/steps/1"))
        b.find_element("link text", "Rewind to after this step…").click()
        plan = wait_for(lambda: b.find_element("tag name", "main").text, what="the plan")
        assert "a.txt" in plan and "b.txt" in plan and "d/k.txt" in plan
        assert (proj.root / "a.txt").read_text() == "two\n"       # looking at the plan changed nothing
        b.find_element("id", "rewind-confirm").click()
        wait_for(lambda: "Rewound" in b.find_element("id", "rewind-result").text, timeout=60, what="the rewind")
    assert (proj.root / "a.txt").read_text() == "one\n"
    assert (proj.root / "d" / "k.txt").read_text() == "keep\n"
    assert not (proj.root / "b.txt").exists()
    assert "rewind" in show(proj)["marks"]


HOSTILE_NAME = '<img id=pwn src=x onerror="window.__pwned=1;document.title=\'PWNED\'">'
HOSTILE_ARG = "<script>window.__pwned=2</script>\x1b]0;evil-title\x07\x1b[31m\u202eevil"


@needs_browser
def test_step_controlled_text_renders_inert(proj):
    r = proj.envgit("run", "--", "sh", "-c", 'printf "%s\\n" "$1" > "$2"; echo x > "$3"', "sh",
                    HOSTILE_ARG, HOSTILE_NAME, "x\x1b[2Jy\u202ez")
    assert r.returncode == 0, r.stderr
    with UI(proj) as ui, browser() as b:
        for path in ("/", "/steps/1"):
            b.get(ui.link(path))
            wait_for(lambda: b.find_element("tag name", "h1"), what="the page")
            assert b.execute_script("return window.__pwned") is None           # no script ran
            assert b.title != "PWNED"
            assert not b.find_elements("css selector", "#pwn, main script")     # no element was made
            text = b.find_element("tag name", "main").text
            assert "<script>window.__pwned=2</script>" in text and "\\x1b]0;evil-title\\x07" in text
            assert "\\u202e" in text and "\x1b" not in text and "\u202e" not in text
        files = b.find_element("css selector", ".files").text
        assert HOSTILE_NAME in files and "x\\x1b[2Jy\\u202ez" in files   # a file name, as escapes


def test_terminal_output_of_ui_is_one_url_line(proj):
    """`envgit ui` writes nothing a step chose to the terminal: its one line is the URL."""
    proj.envgit("run", "--", "sh", "-c", "echo x > \"$(printf 'a\\033[2Jb')\"")
    with UI(proj) as ui:
        assert ui.url.startswith("http://127.0.0.1:") and "\x1b" not in json.dumps(ui.info)
        from test_cli_conventions import documented_keys
        assert set(ui.info) == documented_keys()["ui"]             # docs/JSON.md says every key
        assert ui.info["host"] == "127.0.0.1" and ui.info["port"] == ui.port


def test_a_denied_path_is_listed_but_its_content_never_shown(proj):
    """A .env the person wrote between steps is recorded (an `outside` step): the page lists it
    with its content withheld, as `envgit diff` does."""
    from conftest import CANARY
    proj.run("echo one > a.txt", check=True)
    (proj.root / ".env").write_text(f"TOKEN={CANARY}\n")
    (proj.root / "a.txt").write_text(f"two {CANARY[:6]}\n")
    proj.run("true", check=True)
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    outside = [s for s in steps if "outside" in s["marks"]]
    assert outside, steps
    with UI(proj) as ui:
        for path in (f"/steps/{outside[0]['id']}", "/", "/?mark=outside", "/?path=.env"):
            status, _, body = ui.get(path)
            assert status == 200 and CANARY not in body, path
        body = ui.get(f"/steps/{outside[0]['id']}")[2]
        assert ".env" in body and "content withheld" in body and "deny_read" in body
        assert f"+two {CANARY[:6]}" in body                    # an allowed file's diff is shown


def test_the_policy_a_step_ran_under_is_diffed_against_the_current_one(proj):
    proj.run("echo one > a.txt", check=True)
    text = (proj.root / "envgit.yaml").read_text()
    proj.write_policy(text + "# a later line\n")
    proj.run("true", check=True)
    with UI(proj) as ui:
        body = ui.get("/steps/1")[2]
        assert "Policy then and now" in body and "+# a later line" in body
        body = ui.get("/steps/3")[2]
        assert "(the current policy)" in body and "Policy then and now" not in body


@needs_browser
@needs_socat
def test_a_push_ask_shows_the_repository_and_refs_and_a_deny_is_recorded(tmp_path):
    with GitServer(root=tmp_path / "git") as git:
        home = make_home(tmp_path)
        root = home / "proj"
        env = Env(home, root, {"ENVGIT_RESOLVE": git.resolve, "ENVGIT_UPSTREAM_CA": str(git.ca.cert_path)})
        hp = git.url.split("/")[2]
        subprocess.run(["git", "-c", f"http.curloptResolve={hp}:127.0.0.1", "clone", "-q", git.url, str(root)],
                       check=True, capture_output=True, env={"PATH": env.env["PATH"], "HOME": str(home),
                                                            "GIT_TERMINAL_PROMPT": "0",
                                                            "GIT_SSL_CAINFO": str(git.ca.cert_path)})
        for k, v in (("user.email", "a@example.test"), ("user.name", "a")):
            subprocess.run(["git", "-C", str(root), "config", k, v], check=True)
        env.envgit("init", check=True)
        env.write_policy(f"version: 1\nnetwork:\n  ask_timeout: 30\n  allow: [\"{hp}\"]\n"
                         "irreversible:\n  - preset: default\n  - rule: git-push\n    action: ask\n")
        before = git.refs()
        out = {}
        try:
            with UI(env) as ui, browser() as b:
                b.get(ui.url)
                t = threading.Thread(target=lambda: out.update(r=env.run(
                    "git checkout -q -b feature && echo f > f && git add f && git commit -qm f && "
                    "git push -q origin feature; echo push=$?", timeout=120)))
                t.start()
                try:
                    deny = wait_for(lambda: b.find_element("css selector", 'button[data-answer="deny"]'),
                                    timeout=40, what="the push's ask")
                    ask = b.find_element("css selector", ".ask").text
                    assert "refs/heads/feature" in ask and "create" in ask and "git push" in ask, ask
                    deny.click()
                    wait_for(lambda: "Denied" in b.find_element("id", "flash").text, what="the answer")
                finally:
                    t.join(150)
            assert "push=0" not in out["r"].stdout, out["r"].stdout
            assert git.refs() == before                                    # the oracle: nothing landed
            s = show(env)
            assert [(a["answer"], a["how"]) for a in s["approvals"]] == [("deny", "ui")]
        finally:
            env.stop()


@needs_browser
def test_static_views_read_without_javascript(proj):
    proj.run("printf 'alpha\\n' > a.txt", check=True)
    proj.run("printf 'beta\\n' > a.txt && exit 4")
    with UI(proj) as ui, browser(javascript=False) as b:
        b.get(ui.url)
        rows = b.find_elements("css selector", "tr.step")
        assert [r.get_attribute("data-step") for r in rows] == ["2", "1"]
        assert "4" in rows[0].find_element("css selector", "td.exit").text
        assert not b.find_element("id", "live").is_displayed()              # no live stream without JS
        b.find_element("css selector", 'select[name="mark"]')               # the filter is a plain form
        b.find_element("name", "q").send_keys("beta")
        b.find_element("css selector", "form.filters button[type=submit]").click()
        wait_for(lambda: [r.get_attribute("data-step") for r in b.find_elements("css selector", "tr.step")] == ["2"],
                 what="the filtered page")
        b.find_element("css selector", 'tr[data-step="2"] td.num a').click()
        diff = wait_for(lambda: b.find_element("css selector", "pre.diff").text, what="the diff")
        assert "-alpha" in diff and "+beta" in diff


@needs_browser
def test_keyboard_reaches_a_step_and_opens_it(proj):
    from selenium.webdriver.common.keys import Keys
    proj.run("echo x > k.txt", check=True)
    with UI(proj) as ui, browser() as b:
        b.get(ui.url)
        body = b.find_element("tag name", "body")
        for _ in range(40):
            body.send_keys(Keys.TAB) if b.switch_to.active_element == body else \
                b.switch_to.active_element.send_keys(Keys.TAB)
            el = b.switch_to.active_element
            if el.tag_name == "a" and "/steps/1?" in (el.get_attribute("href") or ""):
                break
        else:
            raise AssertionError("Tab never reached step 1's link")
        outline = b.execute_script("return getComputedStyle(document.activeElement).outlineStyle")
        assert outline not in ("none", ""), outline                        # the focus is visible
        el.send_keys(Keys.ENTER)
        wait_for(lambda: "Step 1" in b.find_element("tag name", "h1").text, what="the step page")


def test_the_browser_is_opened_without_the_token_on_its_command_line(proj, tmp_path):
    """Any local user reads a process's argv in /proc: the browser gets a file of the person's
    only, which redirects to the URL with the token."""
    import os
    import stat
    import time
    seen = tmp_path / "argv.txt"
    fake = tmp_path / "fake-browser"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\n"
                    f"for a; do cat \"${{a#file://}}\" >> {seen}.page; done\n"
                    "sleep 3\n")      # still running when the page is stopped: webbrowser waits for it
    fake.chmod(0o755)
    with UI(proj, open_browser=True, extra_env={"BROWSER": str(fake), "DISPLAY": ""}) as ui:
        wait_for(lambda: seen.exists() and seen.read_text().strip(), what="the browser's start")
        argv = seen.read_text()
        assert ui.token not in argv and argv.startswith("file://"), argv
        page = argv.strip().removeprefix("file://")
        mode = os.stat(page).st_mode
        assert stat.S_IMODE(mode) == 0o600 and stat.S_IMODE(os.stat(os.path.dirname(page)).st_mode) == 0o700
        wait_for(lambda: ui.token in (tmp_path / "argv.txt.page").read_text(), what="the redirect")
    deadline = time.monotonic() + 10
    while os.path.exists(page) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(page)                      # removed when the page stops


@needs_browser
def test_a_filtered_timeline_takes_only_matching_steps_live(proj):
    proj.run("echo keepme-0", check=True)
    with UI(proj) as ui, browser() as b:
        b.get(ui.link("/", q="keepme"))
        wait_for(lambda: b.find_element("css selector", "#live").is_displayed(), what="the live stream")
        proj.run("echo other", check=True)
        proj.run("echo keepme-2", check=True)
        wait_for(lambda: b.find_elements("css selector", 'tr[data-step="3"]'), what="the matching step")
        assert not b.find_elements("css selector", 'tr[data-step="2"]')
        assert [r.get_attribute("data-step") for r in b.find_elements("css selector", "tr.step")] == ["3", "1"]


def test_a_diff_deep_in_a_large_file_has_its_real_line_numbers_and_a_bounded_cost(proj):
    """Only the changed middle of a file goes to difflib (view/diffs.py unified_lines); its
    hunks still carry the file's line numbers. A middle too large to diff cheaply is listed
    without its text, on the page and in `envgit diff` alike."""
    proj.run("seq 5000 > n.txt && seq 30000 | sed 's/$/ x/' > big.txt", check=True)
    proj.run("sed -i 's/^4000$/four thousand/' n.txt && seq 30000 | sort -r > big.txt", check=True)
    with UI(proj) as ui:
        body = ui.get("/steps/2")[2]
        assert "@@ -3997,7 +3997,7 @@" in body and "-4000" in body and "+four thousand" in body
        assert "too much changed to diff here: 30000 lines -&gt; 30000 lines" in body
        assert "<code>envgit diff --full -- big.txt</code> from the step before" in body
    r = proj.envgit("diff", "1", "2", check=True)
    assert "@@ -3997,7 +3997,7 @@" in r.stdout and "too much changed to diff here" in r.stdout


def test_a_step_of_many_files_is_a_bounded_page_with_a_count(proj):
    """A step that writes more files than a page names (2,600 here; 30,000 alike, but slow to
    snapshot on a shared machine): the page names the first 2000 (stepview.FILES_LISTED) and
    counts the rest, instead of one entry (and diff) per file."""
    proj.run("mkdir many && cd many && seq 2600 | xargs touch", check=True, timeout=300)
    with UI(proj) as ui:
        status, _, body = ui.get("/steps/1", timeout=120)
    assert status == 200
    assert "… and 600 more files" in body, body[-3000:]
    assert body.count('class="file"') == 2000


def test_malformed_input_is_a_4xx_never_a_500(proj):
    """JSON nested past what the parser walks, a step number past what the journal can hold,
    a question number as big: the page answers 400 or 404, and stays up (it answered 500)."""
    proj.run("echo one > a.txt", check=True)
    with UI(proj) as ui:
        h = {"X-Envgit-Token": ui.token, "Origin": ui.base, "Content-Type": "application/json"}
        deep = "[" * 100_000 + "]" * 100_000
        for path in ("/steps/1/rewind", "/asks/1"):
            status, _, body = ui.request("POST", path, '{"a": ' + deep + "}", h)
            assert status == 400, (path, status, body)
        huge = str(1 << 64)
        for method, path in (("GET", f"/steps/{huge}"), ("GET", f"/steps/{huge}/rewind"),
                             ("POST", f"/steps/{huge}/rewind"), ("POST", f"/asks/{huge}")):
            status, _, body = ui.request(method, path, "{}" if method == "POST" else None,
                                         h if method == "POST" else None)
            assert status in (400, 404), (method, path, status, body)
        assert ui.get("/steps/1")[0] == 200                     # still up
