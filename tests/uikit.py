"""What the `envgit ui` tests share: the real `envgit ui` started in a project (a subprocess,
its URL read from its --json line, stopped by pid at the end) and a headless Chromium driven
through Debian's chromedriver (Selenium), both bounded and cleaned up.

    with UI(env) as ui:             # env: a conftest.Env
        ui.url, ui.base, ui.token, ui.port
        ui.get("/steps/3")          # an HTTP GET with the token (urllib; no browser)
    with browser() as b:            # selenium.webdriver.Chrome
        b.get(ui.url)
"""

import contextlib
import http.client
import json
import os
import select
import shutil
import signal
import subprocess
import time
import urllib.parse

from conftest import ENVGIT

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def have_browser() -> bool:
    return os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)


class UI:
    def __init__(self, env, *args, cwd=None, open_browser=False, extra_env=None):
        self.env, self.args, self.cwd = env, args, cwd
        self.open_browser, self.extra_env = open_browser, extra_env or {}
        self.proc = None

    def __enter__(self):
        argv = [ENVGIT, "ui", *([] if self.open_browser else ["--no-open"]), "--json", *self.args]
        if getattr(self.env, "user", None):               # harness.Attacker: as its user
            argv = self.env._argv(argv)
        self.proc = subprocess.Popen(argv, cwd=self.cwd or self.env.root, env={**self.env.env, **self.extra_env},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        text, deadline = b"", time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                text += chunk
                try:
                    self.info = json.loads(text)
                    break
                except ValueError:
                    continue
            elif self.proc.poll() is not None:
                break
        else:
            self.__exit__()
            raise AssertionError("envgit ui did not print its URL in 30 s")
        if not hasattr(self, "info"):
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
            self.__exit__()
            raise AssertionError(f"envgit ui did not start: {text!r} {err}")
        self.url, self.port = self.info["url"], self.info["port"]
        self.base = self.url.split("/?", 1)[0]
        self.token = urllib.parse.parse_qs(urllib.parse.urlsplit(self.url).query)["token"][0]
        return self

    def __exit__(self, *exc):
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGINT)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def link(self, where, /, **params) -> str:
        return f"{self.base}{where}?" + urllib.parse.urlencode({**params, "token": self.token})

    def request(self, method, path, body=None, headers=None, token=True, timeout=30):
        """(status, headers dict, body text) of one request on a fresh connection; `path` is
        sent as given (no normalisation), with ?token= added when `token`."""
        if token:
            path += ("&" if "?" in path else "?") + "token=" + self.token
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        try:
            c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in h.items():
                if v is not None:
                    c.putheader(k, v)
            data = body.encode() if isinstance(body, str) else body
            if data is not None:
                c.putheader("Content-Length", str(len(data)))
            c.endheaders(data)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode(errors="replace")
        finally:
            c.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, obj, headers=None, **kw):
        h = {"X-Envgit-Token": self.token, "Origin": self.base, "Content-Type": "application/json",
             **(headers or {})}
        return self.request("POST", path, json.dumps(obj), h, **kw)


@contextlib.contextmanager
def browser(width=1280, height=900, javascript=True):
    """Headless Debian Chromium through its chromedriver; quit (and its processes gone) after.
    javascript=False: a browser with scripts turned off (the static views must read without)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              f"--window-size={width},{height}", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-sync", "--disable-default-apps"):
        o.add_argument(a)
    if not javascript:
        o.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)
    d.set_page_load_timeout(30)
    try:
        yield d
    finally:
        d.quit()


def wait_for(fn, timeout=20, every=0.1, what="condition"):
    """fn()'s first truthy value within `timeout` seconds; AssertionError naming `what` if none."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:          # an element not there yet, a page mid-reload
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


def which_all(*names) -> bool:
    return all(shutil.which(n) for n in names)
