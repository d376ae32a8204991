"""More escape routes (defaults.ESCAPE_ROUTES): what git leaves between commands (a rebase's
todo list), a virtualenv's programs, and package managers', cargo's and CI's files. Each is
planted from inside a step; the oracle is a marker file the plant touches when the person later
runs the real tool on the host, where one is here (git, a venv's pip). A protected route is
read-only once it exists; a marked one stays writable, and the step that leaves it changed is
marked `escape-route-written`, with the path, and told at its end. What package managers write
in a virtualenv as a matter of course (its pyvenv.cfg and programs) is listed quietly instead:
mark `tool-files-written`, the path on the step and in one plain line (tests/test_routes_levels.py).
Beside each, the legitimate use still works: a rebase inside a step, pip install into a venv."""

import json
import zipfile

import pytest

from harness import every_case, put_back, taken_back

NOTICE = "ESCAPE ROUTE"
ID = "-c user.name=a -c user.email=a@example.com"


def last_step(a):
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    return steps[-1]


def marked(a, r, *prefixes):
    """The step `r` ran as is marked, in the journal and on its terminal, for a route under
    each of `prefixes`."""
    s = last_step(a)
    assert "escape-route-written" in s["marks"], (s, r.stderr)
    for p in prefixes:
        assert any(e == p or e.startswith(p + "/") for e in s["escape_routes"]), (p, s["escape_routes"])
        assert p in r.stderr and NOTICE in r.stderr, r.stderr


def listed_quietly(a, r, *paths):
    """The step `r` ran lists `paths` as tool files: the mark, the paths in the journal and in
    its one plain line, and no loud notice."""
    s = last_step(a)
    assert "tool-files-written" in s["marks"] and "escape-route-written" not in s["marks"], (s, r.stderr)
    for p in paths:
        assert p in s["escape_routes"], (p, s["escape_routes"])
        assert p in r.stderr and NOTICE not in r.stderr, r.stderr


def not_marked(a):
    s = last_step(a)
    assert "escape-route-written" not in s["marks"], s.get("escape_routes")


def person(a, script):
    """The person, outside any sandbox, sets something up."""
    r = a.host(script)
    assert r.returncode == 0, r.stderr


def two_commits(a):
    person(a, f"echo 1 > f && git add f && git {ID} commit -q -m one && "
              f"echo 2 > f && git {ID} commit -q -am two")


# --- git's state between commands ---------------------------------------------------------------

def test_a_planted_rebase_is_marked_and_really_runs(attacker):
    """A step leaves an interactive rebase stopped at `break` with `exec` next in its todo; the
    person's `git status` says a rebase is in progress and `git rebase --continue` runs it."""
    a = attacker
    m = a.home / "pwned-rebase"
    two_commits(a)
    ed = a.root / "ed.sh"
    ed.write_text(f"#!/bin/sh\nprintf 'break\\nexec touch {m}\\npick %s\\n' "
                  f"\"$(git rev-parse --short HEAD)\" > \"$1\"\n")
    ed.chmod(0o755)
    a.own(ed)
    r = a.run(f"GIT_SEQUENCE_EDITOR=$PWD/ed.sh git {ID} rebase -i HEAD~1")
    assert r.returncode == 0, r.stderr
    assert not m.exists()                    # it did not run inside
    marked(a, r, ".git/rebase-merge")
    st = a.host("git status")
    assert "rebase" in st.stdout, st.stdout
    a.host(f"git {ID} rebase --continue")
    assert m.exists()                        # the oracle is live: that is why it is said


GIT_STATE = {
    "rebase-apply": ({".git/rebase-apply/next": "1\\n", ".git/rebase-apply/last": "1\\n",
                      ".git/rebase-apply/0001": "From x\\n"}, ".git/rebase-apply"),
    "sequencer": ({".git/sequencer/todo": "pick 0000000 x\\n"}, ".git/sequencer"),
    "alternates": ({".git/objects/info/alternates": "/tmp/elsewhere/objects\\n"}, ".git/objects/info/alternates"),
    "grafts": ({".git/info/grafts": "0" * 40 + "\\n"}, ".git/info/grafts"),
    "shallow": ({".git/shallow": "0" * 40 + "\\n"}, ".git/shallow"),
    "replace": ({".git/refs/replace/" + "1" * 40: "0" * 40 + "\\n"}, ".git/refs/replace"),
    "exclude": ({".git/info/exclude": "evil.sh\\n"}, ".git/info/exclude"),
}


def test_git_state_left_behind_is_marked(attacker):
    """Each kind its own step in one project, which the person puts back as it was after it."""
    a = attacker

    def check(kind):
        files, route = GIT_STATE[kind]
        with put_back(a, *files):
            r = a.run(" && ".join(f"mkdir -p $(dirname {p}) && printf '{c}' > {p}" for p, c in files.items()))
            assert r.returncode == 0, r.stderr
            marked(a, r, route)

    every_case(GIT_STATE, check)


def test_a_rebase_inside_a_step_still_works_and_is_not_marked(attacker):
    """The legitimate use: a whole interactive rebase in one step leaves no state behind, and
    one stopped by a conflict (the person's, or a step's) is finished by a later step unmarked."""
    a = attacker
    two_commits(a)
    r = a.run(f"GIT_SEQUENCE_EDITOR=true git {ID} rebase -i HEAD~1 && git log --oneline | wc -l")
    assert r.returncode == 0 and r.stdout.strip().endswith("2"), r.stderr
    not_marked(a)
    r = a.run(f"GIT_SEQUENCE_EDITOR='sed -i 1ibreak' git {ID} rebase -i HEAD~1")
    assert r.returncode == 0, r.stderr
    marked(a, r, ".git/rebase-merge")        # a stopped rebase is state left behind: told
    r = a.run(f"git {ID} rebase --continue && git status --short")
    assert r.returncode == 0, r.stderr
    assert not (a.root / ".git" / "rebase-merge").exists()
    not_marked(a)                            # finishing it leaves nothing behind


def test_rebase_state_of_a_linked_worktree_is_marked(attacker):
    a = attacker
    two_commits(a)
    person(a, "git worktree add -q wt HEAD~1")
    r = a.run("mkdir -p .git/worktrees/wt/rebase-merge && echo 'exec touch x' > "
              ".git/worktrees/wt/rebase-merge/git-rebase-todo")
    assert r.returncode == 0, r.stderr
    marked(a, r, ".git/worktrees/wt/rebase-merge")


# --- a virtualenv's programs --------------------------------------------------------------------

def make_venv(a, path=".venv"):
    person(a, f"/usr/bin/python3 -m venv {path}")


def _pip_rewritten_is_listed_and_really_runs(a):
    m = a.home / "pwned-venv-pip"
    r = a.run(f"sed -i '1a import os; os.system(\"touch {m}\")' .venv/bin/pip")
    assert r.returncode == 0, r.stderr
    assert not m.exists()
    listed_quietly(a, r, ".venv/bin/pip")     # as `pip install -U pip` rewrites it
    a.host(".venv/bin/pip --version")
    assert m.exists()                        # the oracle is live


# pip.conf routes the person's index credentials: loud. The venv's programs and its
# pyvenv.cfg are what `python -m venv` and pip write: listed quietly.
VENV_ROUTES = {
    "python-replaced": ("rm .venv/bin/python && printf '#!/bin/sh\\ntouch {m}\\n' > .venv/bin/python",
                        ".venv/bin/python", False),
    "pip.conf": ("printf '[global]\\nindex-url = http://127.0.0.1:9/simple\\n' > .venv/pip.conf",
                 ".venv/pip.conf", True),
    "pyvenv.cfg": ("sed -i 's|^home = .*|home = /tmp/evil|' .venv/pyvenv.cfg", ".venv/pyvenv.cfg", False),
}


def _a_venv_route_is_marked(a, kind):
    plant, route, loud = VENV_ROUTES[kind]
    r = a.run(plant.format(m=a.home / "pwned"))
    assert r.returncode == 0, r.stderr
    (marked if loud else listed_quietly)(a, r, route)


def _wheel(path):
    """A minimal wheel with a console script (no build backend, no network)."""
    dist = "hello-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.py", "def main():\n    print('hello')\n")
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/entry_points.txt", "[console_scripts]\nhello = hello:main\n")
        z.writestr(f"{dist}/RECORD", "")


def _pip_install_into_a_venv_works_and_is_listed(a):
    with put_back(a, "hello-1.0-py3-none-any.whl", "bin"):
        _wheel(a.root / "hello-1.0-py3-none-any.whl")
        a.own(a.root / "hello-1.0-py3-none-any.whl")
        r = a.run(".venv/bin/pip install -q --no-index --no-deps --no-cache-dir "
                  "--disable-pip-version-check ./hello-1.0-py3-none-any.whl && .venv/bin/hello")
        assert r.returncode == 0 and "hello" in r.stdout, r.stderr
        listed_quietly(a, r, ".venv/bin/hello")
        # an ordinary file in the project beside the venv is not a route
        r = a.run("mkdir -p bin && echo x > bin/tool && echo y > .venv/notes.txt")
        assert r.returncode == 0, r.stderr
        not_marked(a)
        assert "tool-files-written" not in last_step(a)["marks"]


def test_a_venvs_programs_and_files_written_by_a_step_are_listed_or_marked(attacker):
    """A venv the person made (`python -m venv`: its pip takes seconds to install, once): each
    case its own steps on it, and the person copies the venv as made back after each. Its pip
    rewritten is listed and runs; its python, pip.conf and pyvenv.cfg are routes; pip install
    into it still works, listed quietly."""
    a = attacker
    make_venv(a)
    person(a, "cp -a .venv ../venv-as-made")
    cases = {"pip-rewritten": _pip_rewritten_is_listed_and_really_runs,
             **{k: lambda a, k=k: _a_venv_route_is_marked(a, k) for k in VENV_ROUTES},
             "pip-install": _pip_install_into_a_venv_works_and_is_listed}

    def check(case):
        try:
            cases[case](a)
        finally:
            person(a, "rm -rf .venv && cp -a ../venv-as-made .venv")

    every_case(cases, check)


def test_a_venv_made_and_planted_in_one_step_is_listed(attacker):
    """No pyvenv.cfg before the step: the venv is recognised as it is after."""
    a = attacker
    r = a.run("/usr/bin/python3 -m venv --without-pip tools/env && "
              "printf '#!/bin/sh\\necho hijacked\\n' > tools/env/bin/black && chmod +x tools/env/bin/black")
    assert r.returncode == 0, r.stderr
    s = last_step(a)
    assert "tools/env/bin/black" in s["escape_routes"] and "tool-files-written" in s["marks"], s
    assert "escape-route-written" not in s["marks"] and NOTICE not in r.stderr, r.stderr


def test_node_modules_bin_is_never_loud(attacker):
    """The line drawn (defaults.py): node_modules/.bin is rewritten by every install and runs
    only when the person runs the project's scripts (listed quietly when a step leaves it
    changed: tests/test_routes_levels.py); a package's own .gitattributes or bunfig.toml is read
    by no tool there."""
    a = attacker
    r = a.run("mkdir -p node_modules/.bin node_modules/jest/.cargo && echo x > node_modules/.bin/jest && "
              "echo x > node_modules/jest/.gitattributes && echo x > node_modules/jest/bunfig.toml && "
              "echo x > node_modules/jest/.cargo/config.toml && echo x > node_modules/jest/.pnpmfile.cjs && "
              "rm -rf node_modules && mkdir -p node_modules/jest && echo x > node_modules/jest/.gitattributes")
    assert r.returncode == 0, r.stderr
    not_marked(a)


# --- package managers, cargo, CI, .gitattributes ----------------------------------------------------

PROTECTED = [".pnpmfile.cjs", ".pnpmfile.mjs", "bunfig.toml", "packages/app/bunfig.toml",
             ".cargo/config.toml", ".cargo/config", "crates/core/.cargo/config.toml",
             ".yarn/plugins/plugin-evil.cjs", ".yarn/releases/yarn-4.0.0.cjs", "team.code-workspace",
             ".pre-commit-config.yaml", "lefthook.yml", "mise.toml", ".vscode/settings.json"]
MARKED = [".github/workflows/ci.yml", ".github/actions/setup/action.yml", ".gitlab-ci.yml",
          ".circleci/config.yml", ".gitattributes", "src/.gitattributes", "pnpm-workspace.yaml",
          "rust-toolchain.toml", "rust-toolchain", ".tool-versions"]
PLANT = "touch /tmp/pwned-by-more-routes"


@pytest.mark.both_uids("an existing route is protected by a read-only bind in the step's view: as a non-root user "
                       "bwrap builds it in a user namespace, where DAC lets the person write their own file: the bind "
                       "must hold there too")
def test_an_existing_one_is_read_only(attacker):
    """Each route made by the person, attacked by a step, then removed: one after another in
    one project."""
    a = attacker

    def check(rel):
        p = a.root / rel
        with put_back(a, rel, f"{rel}.new"):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("original\n")
            a.own(a.root)
            r = a.run(f"echo '{PLANT}' >> {rel}; echo '{PLANT}' > {rel}.new && mv {rel}.new {rel}")
            assert r.returncode != 0
            assert p.read_text() == "original\n"
            assert a.run("echo ok > notes.txt && rm notes.txt").returncode == 0

    every_case(PROTECTED, check)


def test_a_new_one_is_taken_back_or_marked_and_told(attacker):
    """Each route made by a step, one after another in one project; what a marked one leaves
    the person removes before the next."""
    a = attacker

    def check(rel):
        with put_back(a, rel):
            r = a.run(f"mkdir -p $(dirname {rel}) && echo '{PLANT}' > {rel}")
            assert r.returncode == 0, r.stderr
            if rel in PROTECTED:                    # nothing to bind before it exists: taken back
                taken_back(a, r, rel)
                assert not (a.root / rel).exists()
                return
            marked(a, r, rel)
            r = a.run(f"echo '# more' >> {rel}")    # writable: tools edit them, every change is told
            assert r.returncode == 0, r.stderr
            marked(a, r, rel)

    every_case(PROTECTED + MARKED, check)


def test_gitattributes_driver_really_runs(attacker):
    """The person's own config (global or, here, the repository's) defines a diff driver (a
    stand-in for any textconv or filter they use); the step's .gitattributes points the
    project's files at it: their `git diff` runs it."""
    a = attacker
    m = a.home / "pwned-attributes"
    two_commits(a)
    person(a, f"git config diff.conv.textconv 'touch {m}; cat'")   # theirs, not the step's
    r = a.run("echo '* diff=conv' > .gitattributes && echo 3 > f")
    assert r.returncode == 0, r.stderr
    marked(a, r, ".gitattributes")
    a.host("git diff")
    assert m.exists()


def test_a_packed_replace_ref_is_marked_and_really_shown(attacker):
    """`git replace` then `git pack-refs`: no loose ref is left, packed-refs holds it, and the
    person's `git log` shows the step's commit in place of their own."""
    a = attacker
    two_commits(a)
    r = a.run(f"git {ID} commit -q --allow-empty -m planted-history && new=$(git rev-parse HEAD) && "
              f"git reset -q --hard HEAD~1 && git replace HEAD $new && git pack-refs --all && "
              f"test ! -e .git/refs/replace/$(git rev-parse HEAD)")
    assert r.returncode == 0, r.stderr
    marked(a, r, ".git/packed-refs")
    assert "planted-history" in a.host("git log --oneline -1").stdout   # the oracle is live


def test_packing_refs_without_replace_refs_is_not_marked(attacker):
    a = attacker
    two_commits(a)
    r = a.run("git branch topic && git pack-refs --all && git branch -D topic && git gc -q")
    assert r.returncode == 0, r.stderr
    not_marked(a)
