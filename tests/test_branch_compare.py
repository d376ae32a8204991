"""`envgit compare`: branches side by side, read from each one's own journal and store, and
`--run CMD` run in every branch at once, each run a step of its own branch."""

import json

import pytest

from envgit.branch import registry
from envgit.paths import Project
from uikit import UI, browser, have_browser, wait_for

needs_browser = pytest.mark.skipif(not have_browser(), reason="Chromium and chromedriver are not installed "
                                   "(dev/run test installs them)")


def compare(proj, *args, check=True):
    r = proj.envgit("compare", *args, "--json", check=check)
    return json.loads(r.stdout)


def fork_dirs(proj, n):
    proj.envgit("fork", str(n), check=True)
    return {str(r["id"]): r["dir"] for r in registry.forks(Project(str(proj.root)))}


def test_forks_and_main_side_by_side_with_a_run_in_each(proj):
    (proj.root / "a.txt").write_text("base\n")
    proj.run("true", check=True)
    dirs = fork_dirs(proj, 2)
    assert sorted(dirs) == ["1", "2"]
    proj.run("echo one > a.txt; echo new > b.txt", cwd=dirs["1"])
    proj.run("echo one > a.txt; exit 4", cwd=dirs["2"])
    proj.run("echo two > a.txt", check=True)
    try:
        got = compare(proj, "main", "1", "2", "--run", "test -f b.txt && echo has-b || echo no-b")
    finally:
        for d in dirs.values():
            proj.envgit("daemon", "stop", cwd=d)
    sides = {s["name"]: s for s in got["sides"]}
    assert [sides[n]["kind"] for n in ("main", "1", "2")] == ["main", "fork", "fork"]
    assert sides["2"]["failed"] == 1 and sides["1"]["failed"] == 0
    runs = {r["name"]: r for r in got["run"]}
    assert (runs["main"]["exit_code"], runs["1"]["exit_code"], runs["2"]["exit_code"]) == (0, 0, 0)
    assert (runs["main"]["last_line"], runs["1"]["last_line"], runs["2"]["last_line"]) == ("no-b", "has-b", "no-b")
    files = {f["path"]: f["sides"] for f in got["files"]}
    a = [c["status"] + ":" + c["content"] for c in files["a.txt"]]
    assert a[0] == "M:a" and a[1] == a[2] == "M:b"          # the two branches wrote the same bytes
    assert [c["status"] for c in files["b.txt"]] == ["", "A", ""]
    # each run is a step of its own branch's journal
    for name, d in dirs.items():
        steps = json.loads(proj.envgit("log", "--json", cwd=d, check=True).stdout)
        assert steps[-1]["argv"][-1].startswith("test -f b.txt"), (name, steps[-1])
    text = proj.envgit("compare", "1", "2", check=True).stdout
    lines = {line.split()[-1] if not line.endswith("(same)") else line.split()[-2]: line
             for line in text.splitlines() if line.startswith("  ") and "txt" in line}
    assert lines["a.txt"].endswith("(same)") and not lines["b.txt"].endswith("(same)")   # 1 and 2 agree on a.txt


def test_a_name_that_is_no_branch_is_one_clear_error(proj):
    proj.run("true", check=True)
    r = proj.envgit("compare", "main", "7")
    assert r.returncode == 2 and "'7' is not a branch" in r.stderr and "Traceback" not in r.stderr
    r = proj.envgit("compare", "main")
    assert r.returncode == 2 and "at least two" in r.stderr


def test_the_steps_a_rewind_stepped_over_beside_the_tree_it_went_back_to(proj):
    (proj.root / "a.txt").write_text("base\n")
    proj.run("true", check=True)                                  # step 1: the fork point
    proj.run("echo later > a.txt; echo extra > c.txt", check=True)
    proj.envgit("rewind", "1", "--yes", check=True)
    proj.run("echo other > a.txt", check=True)
    rid = json.loads(proj.envgit("branches", "--json", check=True).stdout)
    rid = [b["id"] for b in (rid["branches"] if isinstance(rid, dict) else rid) if str(b["id"]).startswith("r")][0]
    got = compare(proj, rid, "main")
    sides = {s["name"]: s for s in got["sides"]}
    assert sides[rid]["kind"] == "rewound" and sides[rid]["steps"] == 1
    files = {f["path"]: [c["status"] + c["content"] for c in f["sides"]] for f in got["files"]}
    assert files["c.txt"] == ["Aa", ""] and files["a.txt"][0] != files["a.txt"][1]


@needs_browser
def test_the_page_compares_the_branches_chosen_on_it(proj):
    (proj.root / "a.txt").write_text("base\n")
    proj.run("true", check=True)
    dirs = fork_dirs(proj, 2)
    try:
        proj.run("echo one > a.txt", cwd=dirs["1"], check=True)
        proj.run("echo two > a.txt; echo x > '<b>.txt'", cwd=dirs["2"], check=True)
        with UI(proj) as ui, browser() as b:
            b.get(ui.link("/compare"))
            wait_for(lambda: "Branches side by side" in b.find_element("tag name", "h1").text, what="the page")
            for box in b.find_elements("css selector", "input[name=ids]"):
                if box.get_attribute("value") in ("1", "2"):
                    box.click()
            b.find_element("css selector", ".compare-pick button").click()
            wait_for(lambda: b.find_elements("css selector", "table.files"), what="the comparison")
            heads = [th.text for th in b.find_elements("css selector", "table.compare thead th")][:3]
            assert heads == ["", "1", "2"], heads
            rows = {r.find_element("tag name", "code").text: [td.text for td in r.find_elements("tag name", "td")][1:]
                    for r in b.find_elements("css selector", "table.files tbody tr")}
            assert rows["a.txt"] == ["M:a", "M:b"] and rows["<b>.txt"] == ["–", "A:a"], rows
            assert not b.find_elements("css selector", "table.files b")       # a name is text, never markup
    finally:
        for d in dirs.values():
            proj.envgit("daemon", "stop", cwd=d)


def test_the_compare_page_answers_a_bad_choice_with_its_reason_never_a_500(proj):
    proj.run("true", check=True)
    with UI(proj) as ui:
        for query in ("ids=main&ids=../../etc", "ids=main&ids=r" + "9" * 40, "ids=main", "ids=" + "x" * 5000):
            status, _, body = ui.get("/compare?" + query)
            assert status == 200 and "Branches side by side" in body, (query, status)
        assert "is not a branch" in ui.get("/compare?ids=main&ids=7")[2]


def test_a_fork_no_step_has_run_in_yet_is_its_fork_point(proj):
    (proj.root / "a.txt").write_text("base\n")
    proj.run("true", check=True)
    fork_dirs(proj, 1)
    proj.run("echo two > a.txt", check=True)
    got = compare(proj, "main", "1")
    sides = {s["name"]: s for s in got["sides"]}
    assert sides["1"]["steps"] == 0 and sides["1"]["tree"] == sides["1"]["from_tree"]
    assert {f["path"]: [c["status"] for c in f["sides"]] for f in got["files"]} == {"a.txt": ["M", ""]}
