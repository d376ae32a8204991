"""`envgit export`: one self-contained JSON record per step (shape = docs/JSON.md), and a
static HTML report in which nothing a step chose can run. Real steps (`envgit run`, bwrap),
the gate and a remembered grant from test_grants.py's fixture."""

import html.parser
import json
import shutil
import subprocess

import pytest

from test_cli_conventions import documented_keys
from test_grants import CURL, Person, grants_world  # noqa: F401  (the fixture `world`)

EVIL = "<script>document.title='pwned'</script>"
EVIL_FILE = "<img src=x onerror=alert(1)>.txt"


def _records(env, *argv):
    r = env.envgit("export", *argv, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()], r.stdout


def test_jsonl_records_are_self_contained_documented_and_round_trip(world):
    w, env = world, world.env
    post = f"{CURL} -X POST --data-binary x"
    with Person(env, lambda q: ["approve", "--remember"]):
        assert env.run(f"{post} {w.url()}; echo one > one.txt").stdout.split() == ["200"]
    with Person(env, lambda q: ["deny"]):
        assert env.run(f"{post} {w.url()}; {post} {w.url(path='/api/two')}").stdout.split() == ["200", "403"]
    recs, text = _records(env)
    shown = json.loads(env.envgit("log", "--json", check=True).stdout)
    assert [r["step"] for r in recs] == [s["id"] for s in shown] == [1, 2]
    doc = documented_keys()
    for r in recs:
        assert set(r) == doc["export"], set(r) ^ doc["export"]
        for a in r["approvals"]:
            assert set(a) == doc["export.approvals"], set(a) ^ doc["export.approvals"]
        assert r["argv"] == shown[r["step"] - 1]["argv"] and r["requests"] == shown[r["step"] - 1]["requests"]
    # round trip: parsing and writing again gives the same lines; ASCII only
    assert text.isascii() and "\n".join(json.dumps(r, separators=(",", ":")) for r in recs) + "\n" == text
    first, second = recs
    assert {"path": "one.txt", "status": "added"} in first["files_changed"] and first["snapshot"]
    assert first["approvals"][0]["channel"] == "cli" and first["approvals"][0]["grant"] is None
    used = [a for a in second["approvals"] if a["granted_by"]]
    assert len(used) == 1 and used[0]["channel"] == "grant"
    g = used[0]["grant"]                                  # embedded whole, not only named
    assert g["id"] == "g1" and g["scope"]["path"] == "/api/one" and g["uses"] == 1
    assert set(g) == doc["grant"] and set(g["scope"]) == doc["grant.scope"]
    assert [a["answer"] for a in second["approvals"] if not a["granted_by"]] == ["deny"]
    listed = json.loads(env.envgit("grants", "--json", check=True).stdout)
    assert listed == [g]
    s = json.loads(env.envgit("stats", "--json", check=True).stdout)
    assert set(s) == doc["stats"]
    # --since after every step: nothing; --session of another: refused as log refuses it
    assert _records(env, "--since", "2999-01-01")[0] == []
    r = env.envgit("export", "--session", "nosuch")
    assert r.returncode == 2 and "no such session" in r.stderr


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.handlers, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.handlers += [k for k, _ in attrs if k.startswith("on")] + \
            [v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#")]

    def handle_data(self, data):
        self.text.append(data)


def test_html_report_is_static_and_a_step_named_script_stays_text(world, tmp_path):
    env = world.env
    r = env.run(f"echo \"{EVIL}\" > '{EVIL_FILE}'; echo '\x1b]0;title\x07' > esc.txt; true \"{EVIL}\"")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "report.html"
    assert env.envgit("export", "--html", str(out), check=True).returncode == 0
    page = out.read_text()
    p = _Tags()
    p.feed(page)
    assert "script" not in p.tags and "img" not in p.tags, p.tags          # the oracle: no element
    assert p.handlers == [], p.handlers                                     # nothing to run or fetch
    text = "".join(p.text)
    assert "<script>document.title=" in text and EVIL_FILE in text       # shown, as text
    assert "\x1b" not in page and "\x07" not in page
    assert "default-src 'none'" in page                                     # and forbidden anyway
    # the page opened by a real browser: no script ran (the title is the report's own)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (dev/run test installs it)")
    dump = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           out.as_uri()], capture_output=True, text=True, timeout=60)
    assert "<title>envgit report" in dump.stdout and "pwned" not in dump.stdout.split("</title>")[0]
    # a path that cannot be written: one line, nothing half-written
    r = env.envgit("export", "--html", str(tmp_path / "no" / "such" / "r.html"))
    assert r.returncode == 2 and r.stderr.startswith("envgit: cannot write") and "Traceback" not in r.stderr
