"""How loudly a step's escape routes are said (defaults.ESCAPE_ROUTES' `quiet` kind,
sandbox/routes.py `tools_own`, policy/marks.py): what package managers write on every install (a
virtualenv's pyvenv.cfg, programs and .pth files, node_modules/.bin) and a `.env` copied from its
example are listed on the step quietly, mark `tool-files-written` and one plain line; a route the
person's own tools obey unasked (git hooks and config, .envrc, editors' and agents' settings) stays
loud, `WROTE AN ESCAPE ROUTE` or taken back. Real steps (`envgit run`, bwrap, the real python
venv, pip and npm, offline), and the classification in process where a real step cannot set it up
cheaply."""

import json
import os
import shutil
import subprocess
import zipfile
from types import SimpleNamespace

import pytest

from envgit.policy.marks import Found, after_step

LOUD = "ESCAPE ROUTE"
QUIET = "tool-files-written"


def last(env) -> dict:
    """The last step that is not a take-back (`envgit show --json`)."""
    steps = json.loads(env.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    s = [x for x in steps if x["argv"][:2] != ["envgit", "take-back"]][-1]
    return json.loads(env.envgit("show", str(s["id"]), "--json", check=True).stdout)


def quiet(env, r, *paths) -> dict:
    """The step `r` ran listed `paths` quietly: the mark, the paths on the step, one plain
    line on its terminal, never the loud notice."""
    s = last(env)
    assert QUIET in s["marks"] and "escape-route-written" not in s["marks"], (s["marks"], r.stderr)
    for p in paths:
        assert p in s["escape_routes"], (p, s["escape_routes"])
    assert LOUD not in r.stderr, r.stderr
    assert sum(QUIET + ":" in line for line in r.stderr.splitlines()) == 1, r.stderr
    return s


def _wheel(path):
    """A minimal wheel with a console script (no build backend, no network)."""
    dist = "hello-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.py", "def main():\n    print('hello')\n")
        z.writestr("hello_start.pth", "import os\n")
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/entry_points.txt", "[console_scripts]\nhello = hello:main\n")
        z.writestr(f"{dist}/RECORD", "")


def test_a_venv_and_a_pip_install_into_it_are_listed_quietly(proj):
    r = proj.run("/usr/bin/python3 -m venv .venv", timeout=300)
    assert r.returncode == 0, r.stderr
    quiet(proj, r, ".venv/pyvenv.cfg", ".venv/bin/python", ".venv/bin/activate")
    _wheel(proj.root / "hello-1.0-py3-none-any.whl")
    r = proj.run(".venv/bin/pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check "
                 "./hello-1.0-py3-none-any.whl && .venv/bin/hello", timeout=300)
    assert r.returncode == 0 and "hello" in r.stdout, r.stderr
    pth = [p for p in last(proj)["escape_routes"] if p.endswith("/site-packages/hello_start.pth")]
    quiet(proj, r, ".venv/bin/hello", *pth)
    assert pth, last(proj)["escape_routes"]


def test_a_venv_made_beside_a_planted_hook_is_quiet_and_the_hook_loud_and_taken_back(proj):
    """One step, both kinds: the hook of a repository made in the step is taken back and said
    loudly; the venv beside it is listed in the quiet line only."""
    r = proj.run("/usr/bin/python3 -m venv --without-pip tools/env && git init -q sub && "
                 "printf '#!/bin/sh\\necho planted\\n' > sub/.git/hooks/pre-commit && "
                 "chmod +x sub/.git/hooks/pre-commit", timeout=300)
    assert r.returncode == 0, r.stderr
    s = last(proj)
    assert {"escape-route-written", QUIET} <= set(s["marks"]), s["marks"]
    assert "sub/.git/hooks/pre-commit" in s["taken_back"], s
    assert not (proj.root / "sub/.git/hooks/pre-commit").exists()
    assert "took back" in r.stderr and "sub/.git/hooks/pre-commit" in r.stderr
    line = [x for x in r.stderr.splitlines() if QUIET + ":" in x]
    assert len(line) == 1 and "tools/env/" in line[0] and "pre-commit" not in line[0], r.stderr
    took = [x for x in r.stderr.splitlines() if "took back" in x]
    assert took and "tools/env" not in took[0], r.stderr


def test_a_copied_env_example_is_quiet_and_any_other_env_loud(proj):
    (proj.root / ".env.example").write_text("DB_PASSWORD=changeme\n")
    r = proj.run("printf 'DB_PASSWORD=x\\n' > .env")
    assert r.returncode == 0, r.stderr
    assert "escape-route-written" in last(proj)["marks"] and LOUD in r.stderr, r.stderr
    (proj.root / ".env").unlink()
    r = proj.run("cp .env.example .env")
    assert r.returncode == 0, r.stderr
    quiet(proj, r, ".env")


def _npm_package(where):
    """A package with a `bin`, packed into a local tarball by the real npm (no registry)."""
    pkg = where / "hello-bin"
    pkg.mkdir()
    (pkg / "package.json").write_text(json.dumps({"name": "hello-bin", "version": "1.0.0",
                                                  "bin": {"hello-bin": "cli.js"}}))
    (pkg / "cli.js").write_text("#!/usr/bin/env node\nconsole.log('hello from npm')\n")
    r = subprocess.run(["npm", "pack", "--silent", str(pkg)], cwd=where, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "npm_config_cache": str(where / "npm-cache")})
    assert r.returncode == 0, r.stderr
    return where / r.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_npm_install_of_a_package_with_a_bin_is_listed_quietly(proj, tmp_path):
    tarball = _npm_package(tmp_path)
    shutil.copy(tarball, proj.root / tarball.name)
    r = proj.run(f"npm install --offline --no-audit --no-fund --cache /tmp/npm-cache ./{tarball.name} && "
                 "node_modules/.bin/hello-bin", timeout=300)
    assert r.returncode == 0 and "hello from npm" in r.stdout, r.stderr
    quiet(proj, r, "node_modules/.bin/hello-bin")


# --- the classification, in process --------------------------------------------------------

def _policy(root):
    from envgit.policy.load import load_policy
    (root / "envgit.yaml").write_text("version: 1\n")
    return load_policy(root / "envgit.yaml")


def test_a_venvs_bin_named_as_the_hooks_path_is_loud(tmp_path):
    """By what obeys the file, not its name: a bin/ git runs as hooks is never quiet."""
    from envgit.sandbox.routes import tools_own
    root = tmp_path / "p"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "node_modules" / ".bin").mkdir(parents=True)
    pol = _policy(root)
    written = [".venv/bin/pre-commit", "node_modules/.bin/x", ".venv/pyvenv.cfg", ".envrc",
               "lib/site-packages/x.pth", ".venv/pip.conf"]
    scan = SimpleNamespace(routes=SimpleNamespace(protect=[]))
    assert tools_own(pol, str(root), str(tmp_path), scan, written) == [
        ".venv/bin/pre-commit", "node_modules/.bin/x", ".venv/pyvenv.cfg"]
    scan.routes.protect = [str(root / ".venv" / "bin")]          # core.hooksPath = .venv/bin
    assert tools_own(pol, str(root), str(tmp_path), scan, written) == ["node_modules/.bin/x", ".venv/pyvenv.cfg"]


def test_quiet_routes_earn_their_own_mark_and_one_line():
    found = Found(step=4, summary={}, escapes=[".venv/bin/a", ".venv/bin/b", ".envrc", ".venv/bin/HEAD"],
                  tool_files=[".venv/bin/a", ".venv/bin/b", ".venv/bin/HEAD"], taken_back=[".venv/bin/HEAD"])
    marks, notices = after_step(found)
    assert marks == ["escape-route-written", QUIET]
    assert notices[0].startswith("took back") and ".venv/bin/HEAD" in notices[0]
    assert notices[1].startswith("WROTE AN ESCAPE ROUTE") and ".envrc" in notices[1] and ".venv/bin/a" not in notices[1]
    assert notices[2].startswith(QUIET + ": .venv/bin/a, .venv/bin/b (") and "envgit diff 4" in notices[2]
    marks, notices = after_step(Found(step=5, summary={}, escapes=["node_modules/.bin/x"],
                                      tool_files=["node_modules/.bin/x"]))
    assert marks == [QUIET] and len(notices) == 1 and LOUD not in notices[0]
