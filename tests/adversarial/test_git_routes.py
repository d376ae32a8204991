"""Class 4: git runs code from places a step can write. Each attack plants, from inside a step,
something that would make a plain `git status` or `git commit` run outside the sandbox, then the
person runs real git on the host. The oracle is a marker file the planted code would touch.

Every variant ends one of two ways, and the test says which it expects: the plant cannot be
made (the file is read-only inside; the marker never appears), or the file could not exist
before the step (nothing to bind read-only), so the step that made it is marked
`escape-route-written`, with the path, and its end says so on the terminal.
"""

import json
from pathlib import Path

import pytest

from harness import every_case, put_back, taken_back

NOTICE = "WROTE AN ESCAPE ROUTE"
ID = "-c user.name=a -c user.email=a@example.com"


def last_step(a):
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    return steps[-1]


def marked(a, r, *paths):
    """The step `r` ran as says, on its terminal and in the journal, that it wrote `paths`."""
    s = last_step(a)
    assert "escape-route-written" in s["marks"], (s, r.stderr)
    for p in paths:
        assert p in s["escape_routes"], (p, s["escape_routes"])
        assert p in r.stderr and NOTICE in r.stderr, r.stderr


def host_git(a, script, marker):
    """Run real git outside the sandbox, as the person would later; True if the plant ran."""
    a.host(script)
    return marker.exists()


def fsmonitor_config(marker):
    return f"[core]\n\trepositoryformatversion = 0\n\tfsmonitor = \"touch {marker}; false\"\n"


READ_ONLY_GIT = ("git's files are protected by read-only binds in the step's view: as a non-root user bwrap builds "
                 "that view in a user namespace, where DAC lets the person write their own repository: the binds "
                 "must hold there too")


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_commondir_redirect_is_taken_back(attacker):
    """`.git/commondir` (absent in a plain repository, so nothing to bind) sends git to another
    directory's config: the step that writes it has it taken back at its end; its version is
    in its snapshot, and a rewind to it does not bring it back."""
    a = attacker
    m = a.home / "pwned-commondir"
    r = a.run(f"cp -r .git evil && git --git-dir=evil config core.fsmonitor 'touch {m}; false' && "
              "echo ../evil > .git/commondir")
    assert r.returncode == 0, r.stderr
    s = taken_back(a, r, ".git/commondir")
    assert not (a.root / ".git" / "commondir").exists()
    assert not host_git(a, "git status", m)
    assert ".git/commondir" in a.envgit("diff", str(s["id"])).stdout    # kept for review
    a.envgit("rewind", "-y", str(s["id"]))
    assert not (a.root / ".git" / "commondir").exists()
    person(a, "echo ../evil > .git/commondir")      # the oracle is live: the plant would run
    assert host_git(a, "git status", m)


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_nested_gitlink_with_fsmonitor(attacker):
    """A nested repository added as a gitlink: the outer `git status` looks into it and runs its
    core.fsmonitor. Made in one step, it is marked; its config cannot be changed by a later one."""
    a = attacker
    m = a.home / "pwned-gitlink"
    r = a.run(f"git init -q sub && git -C sub {ID} commit -q --allow-empty -m x && git add sub")
    assert r.returncode == 0, r.stderr
    marked(a, r, "sub/.git/config")
    r = a.run(f"git -C sub config core.fsmonitor 'touch {m}; false'; "
              f"echo 'touch {m}' > sub/.git/hooks/post-checkout; chmod +x sub/.git/hooks/post-checkout")
    assert r.returncode != 0
    assert not host_git(a, "git status; git -C sub checkout -q HEAD", m)
    assert "fsmonitor" not in (a.root / "sub" / ".git" / "config").read_text()
    # the nested repository still works inside (objects, refs, index are writable)
    r = a.run(f"echo hi > sub/f && git -C sub add f && git -C sub {ID} commit -q -m f && git -C sub log --oneline")
    assert r.returncode == 0 and " f" in r.stdout, r.stderr


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_nested_repository_made_with_fsmonitor_in_one_step_is_taken_back(attacker):
    """A repository made inside a step keeps what `git init` writes; a config that names a
    program is taken back, the rest of the repository stays."""
    a = attacker
    m = a.home / "pwned-nested"
    r = a.run(f"git init -q sub && git -C sub config core.fsmonitor 'touch {m}; false' && "
              f"git -C sub {ID} commit -q --allow-empty -m x && git add sub")
    assert r.returncode == 0, r.stderr
    taken_back(a, r, "sub/.git/config")
    assert not host_git(a, "git status; git -C sub status", m)
    assert (a.root / "sub" / ".git" / "HEAD").exists()      # only the config was taken back
    r = a.run("git init -q plain && git clone -q plain cloned && git -C cloned remote -v")
    assert r.returncode == 0 and "origin" in r.stdout, r.stderr
    s = last_step(a)
    assert s["taken_back"] == [] and (a.root / "cloned" / ".git" / "config").exists(), s


def person(a, script):
    """The person, outside any sandbox, sets something up."""
    r = a.host(script)
    assert r.returncode == 0, r.stderr


def _submodule(a):
    """The person adds a real submodule (its gitdir in .git/modules/lib)."""
    person(a, f"git init -q -b main ../upstream && git -C ../upstream {ID} commit -q --allow-empty -m u && "
              "git -c protocol.file.allow=always submodule add -q ../upstream lib")
    assert (a.root / ".git" / "modules" / "lib" / "config").exists()


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_submodule_config_and_hooks_are_read_only(attacker):
    a = attacker
    _submodule(a)
    m = a.home / "pwned-modules"
    cfg = a.root / ".git" / "modules" / "lib" / "config"
    before = cfg.read_text()
    r = a.run(f"git config --file .git/modules/lib/config core.fsmonitor 'touch {m}; false'")
    assert r.returncode != 0
    r = a.run(f"printf '#!/bin/sh\\ntouch {m}\\n' > .git/modules/lib/hooks/post-checkout && "
              "chmod +x .git/modules/lib/hooks/post-checkout")
    assert r.returncode != 0
    assert cfg.read_text() == before
    assert not host_git(a, "git status; git submodule update --checkout --force lib; git -C lib checkout -q HEAD", m)
    # the submodule still works inside: its config is shown (sanitised), its objects writable
    r = a.run(f"git status --short && echo x > lib/new && git -C lib add new && git -C lib {ID} commit -q -m n "
              "&& git -C lib log --oneline | wc -l")
    assert r.returncode == 0 and r.stdout.strip().endswith("2"), r.stdout + r.stderr
    # a submodule gitdir made from nothing has its config taken back
    r = a.run(f"mkdir -p .git/modules/evil && printf '{fsmonitor_config(m)}' > .git/modules/evil/config")
    assert r.returncode == 0, r.stderr
    taken_back(a, r, ".git/modules/evil/config")
    assert not (a.root / ".git" / "modules" / "evil" / "config").exists()


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_dot_git_file_redirect(attacker):
    """A `.git` file sends git to any directory: one a step makes that names no worktree or
    submodule of the project is taken back; one `git worktree add` makes stays."""
    a = attacker
    m = a.home / "pwned-gitfile"
    r = a.run(f"git init -q src && mv src/.git egd && git --git-dir=egd config core.fsmonitor 'touch {m}; false' "
              "&& mkdir -p wt && echo 'gitdir: ../egd' > wt/.git")
    assert r.returncode == 0, r.stderr
    taken_back(a, r, "wt/.git")
    assert not (a.root / "wt" / ".git").exists()
    assert not host_git(a, "cd wt && git status", m)
    r = a.run(f"git {ID} commit -q --allow-empty -m base && git worktree add -q inner && git -C inner status")
    assert r.returncode == 0, r.stderr
    assert last_step(a)["taken_back"] == [] and (a.root / "inner" / ".git").is_file()


def _hooks_path_config(a, path, where):
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(f"[core]\n\thooksPath = {path}\n")
    a.own(where.parent)
    a.stop()                       # a daemon started later reads the person's environment


def _person_home(a):
    """The HOME the person's commands run with (runuser gives the test user its own)."""
    home = Path(a.host("echo $HOME").stdout.strip())
    if not home.exists():
        home.mkdir(parents=True)
        a.own(home)
    return home


def _hooks_path_from(a, source):
    home = _person_home(a)
    m = a.home / f"pwned-hookspath-{source}"
    made = []
    if source == "xdg-default":
        made.append(home / ".config" / "git" / "config")
        _hooks_path_config(a, ".githooks", made[-1])
        hooks = a.root / ".githooks"
    elif source == "xdg-beside-gitconfig":
        # git reads both; `git config --global` names only ~/.gitconfig when it exists (2.39)
        made.append(home / ".config" / "git" / "config")
        _hooks_path_config(a, ".githooks", made[-1])
        made.append(home / ".gitconfig")
        made[-1].write_text("[user]\n\tname = person\n")
        a.own(made[-1])
        hooks = a.root / ".githooks"
    elif source == "xdg-env":
        xdg = a.home / "xdg"
        a.env["XDG_CONFIG_HOME"] = str(xdg)
        made.append(xdg / "git" / "config")
        _hooks_path_config(a, ".githooks", made[-1])
        hooks = a.root / ".githooks"
    else:
        hooks = a.root / "tools" / "hooks"
        made.append(home / ".gitconfig")
        _hooks_path_config(a, str(hooks), made[-1])
    try:
        with put_back(a, ".githooks", "tools"):
            r = a.run(f"mkdir -p {hooks} && printf '#!/bin/sh\\ntouch {m}\\n' > {hooks}/pre-commit && "
                      f"chmod +x {hooks}/pre-commit")
            assert r.returncode != 0
            assert not host_git(a, f"echo {source} > f && git add f && git {ID} commit -q -m x", m)
            assert (a.root / "f").read_text() == f"{source}\n"      # the commit really ran
            said = hooks.relative_to(a.root) if source != "gitconfig-absolute" else hooks
            assert a.host("git config --get core.hooksPath").stdout.strip() == str(said)
    finally:
        for f in made:
            f.unlink()
        a.env.pop("XDG_CONFIG_HOME", None)      # the next case's daemon is started afresh


@pytest.mark.both_uids(READ_ONLY_GIT +
                       "; and core.hooksPath comes from the person's HOME (runuser's passwd home for a non-root "
                       "person)")
def test_hooks_path_from_any_config_source(attacker):
    """Each source of core.hooksPath in turn, in one project: the person's config written and
    the daemon started afresh, a step's plant, the person's commit; the config removed after."""
    every_case(["xdg-default", "xdg-env", "gitconfig-absolute", "xdg-beside-gitconfig"],
               lambda source: _hooks_path_from(attacker, source))


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_husky_delegate_scripts_are_read_only(attacker):
    """husky v9: core.hooksPath is .husky/_, whose scripts run ../<hook>: both are read-only."""
    a = attacker
    m = a.home / "pwned-husky"
    ok = a.home / "husky-ran"
    husky = a.root / ".husky"
    (husky / "_").mkdir(parents=True)
    (husky / "_" / "h").write_text('#!/usr/bin/env sh\nn=$(basename "$0")\n'
                                   's=$(dirname "$(dirname "$0")")/$n\n[ ! -f "$s" ] && exit 0\n'
                                   'sh -e "$s" "$@"\n')
    (husky / "_" / "pre-commit").write_text('#!/usr/bin/env sh\n. "$(dirname "$0")/h"\n')
    (husky / "pre-commit").write_text(f"touch {ok}\n")
    for f in (husky / "_" / "h", husky / "_" / "pre-commit"):
        f.chmod(0o755)
    a.own(a.home)
    person(a, "git config core.hooksPath .husky/_")
    r = a.run(f"echo 'touch {m}' > .husky/pre-commit")
    assert r.returncode != 0
    r = a.run(f"echo 'touch {m}' > .husky/_/h")
    assert r.returncode != 0
    assert not host_git(a, f"echo x > f && git add f && git {ID} commit -q -m x", m)
    assert ok.exists()                       # the person's own hook ran: the oracle is live


@pytest.mark.both_uids("the other side of the read-only binds: git in a non-root user's step (a user namespace) "
                       "checks the repository's owner through the uid map and must still work")
def test_git_still_works_inside(attacker):
    a = attacker
    r = a.run(f"echo hi > a.txt && git add a.txt && git {ID} commit -q -m a && git status --short && "
              "git log --oneline | wc -l")
    assert r.returncode == 0 and r.stdout.strip().endswith("1"), r.stderr
    assert "escape-route-written" not in last_step(a)["marks"], last_step(a).get("escape_routes")


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_a_repository_in_another_writable_place(attacker):
    """allow_write of a second repository: its hooks and config are protected there too."""
    a = attacker
    other = a.home / "other"
    m = a.home / "pwned-other"
    person(a, f"git init -q {other}")
    a.write_policy(f'version: 1\nfilesystem:\n  allow_write: [".", "{other}"]\n')
    r = a.run(f"printf '#!/bin/sh\\ntouch {m}\\n' > {other}/.git/hooks/pre-commit; "
              f"chmod +x {other}/.git/hooks/pre-commit; git -C {other} config core.fsmonitor 'touch {m}'")
    assert r.returncode != 0
    r = a.run(f"echo hi > {other}/file && git -C {other} add file")   # the rest of it is writable
    assert r.returncode == 0, r.stderr
    assert not host_git(a, f"cd {other} && git {ID} commit -q -m x && git status", m)


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_a_missing_include_file_is_a_route(attacker):
    """The repository's config includes a file that does not exist yet: git skips it until it
    exists, so one a step creates is taken back; once the person made it, it is read-only."""
    a = attacker
    m = a.home / "pwned-include"
    person(a, "git config include.path ../team.gitconfig")
    r = a.run(f"printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > team.gitconfig")
    assert r.returncode == 0, r.stderr
    taken_back(a, r, "team.gitconfig")
    assert not host_git(a, "git status", m)
    person(a, "echo '[user]' > team.gitconfig")
    r = a.run("echo '[core]' > team.gitconfig")
    assert r.returncode != 0


def test_a_route_behind_many_changes_or_an_exclude_is_still_marked(attacker):
    """The snapshot lists at most 200 paths and leaves excluded ones out: a route hidden
    behind 300 other files, or in an excluded directory, is found all the same."""
    a = attacker
    a.write_policy('version: 1\nsnapshot:\n  exclude: ["vendor/**"]\n')
    r = a.run("mkdir -p many && for i in $(seq 300); do echo $i > many/a$i; done && git init -q zz")
    assert r.returncode == 0, r.stderr
    marked(a, r, "zz/.git/config")
    r = a.run("mkdir -p vendor && git init -q vendor/dep")
    assert r.returncode == 0, r.stderr
    marked(a, r, "vendor/dep/.git/config")


# --- every source of git's configuration, and every program it names -------------------------

def _person_config(a, where, text):
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(text)
    a.own(where.parent)
    a.stop()                       # a daemon started later reads the person's configuration


FSMONITOR = '[core]\\n\\tfsmonitor = "touch {m}; false"\\n'


def _included_by_the_persons_config(a, source):
    home = _person_home(a)
    m = a.home / f"pwned-{source}"
    inc = a.root / "team.gitconfig"
    made = [home / ".gitconfig"]
    made[0].write_text("[user]\n\tname = person\n")
    a.own(made[0])
    if source.startswith("xdg-include"):
        made.append(home / ".config" / "git" / "config")
        _person_config(a, made[-1], f"[include]\n\tpath = {inc}\n")
    elif source == "global-includeif-absent":
        made[0].write_text(f"[user]\n\tname = person\n[includeIf \"gitdir:{a.root}/\"]\n\tpath = {inc}\n")
        a.stop()
    else:
        a.env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="include.path", GIT_CONFIG_VALUE_0=str(inc))
        a.stop()
    plant = FSMONITOR.format(m=m)
    try:
        with put_back(a, "team.gitconfig"):
            if not source.endswith("absent") and source != "command-scope-include":
                inc.write_text("[user]\n\temail = person@example.com\n")
                a.own(inc)
                r = a.run(f"printf '{plant}' >> team.gitconfig")
                assert r.returncode != 0
                assert "fsmonitor" not in inc.read_text()
            else:
                r = a.run(f"printf '{plant}' > team.gitconfig")
                assert r.returncode == 0, r.stderr
                taken_back(a, r, "team.gitconfig")
            assert not host_git(a, "git status", m)
            person(a, f"printf '{plant}' > team.gitconfig")        # the oracle is live
            assert host_git(a, "git status", m)
    finally:
        for f in made:
            f.unlink(missing_ok=True)
        for k in ("GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0"):
            a.env.pop(k, None)                      # the next case's daemon is started afresh


@pytest.mark.both_uids(READ_ONLY_GIT + "; and the person's configuration comes from their HOME")
def test_a_project_file_the_persons_config_includes(attacker):
    """The person's own config (XDG beside ~/.gitconfig, ~/.gitconfig's includeIf, the command
    scope of GIT_CONFIG_COUNT) includes a project file: one that exists is read-only, one a
    step creates is taken back; the person's `git status` never runs what a step put there.
    Each source in turn in one project, its config and the included file removed after it."""
    every_case(["xdg-include", "xdg-include-absent", "global-includeif-absent", "command-scope-include"],
               lambda source: _included_by_the_persons_config(attacker, source))


# key: (value, trigger)
REPO_PROGRAMS = {
    "filter.tidy.clean": ("./tools/clean.sh", "echo x > f.txt && git add f.txt"),
    "alias.st2": ("!./tools/st.sh", "git st2"),
    "core.fsmonitor": ("./tools/fsmon.sh", "git status"),
}


def _a_program_the_repository_config_names(a, key):
    value, trigger = REPO_PROGRAMS[key]
    m = a.home / f"pwned-program-{key}"
    ok = a.home / f"program-ran-{key}"
    prog = a.root / value.lstrip("!")
    with put_back(a, ".gitattributes", "tools", "f.txt"):
        person(a, f"git config {key} '{value}' && printf '* filter=tidy\\n' > .gitattributes")
        try:
            prog.parent.mkdir(parents=True, exist_ok=True)
            prog.write_text(f"#!/bin/sh\ntouch {ok}\ncat\n")
            prog.chmod(0o755)
            a.own(prog.parent)
            r = a.run(f"printf '#!/bin/sh\\ntouch {m}\\ncat\\n' > {prog.relative_to(a.root)}")
            assert r.returncode != 0
            a.host(trigger)
            assert ok.exists() and not m.exists()                     # the person's own ran, nothing else
            prog.unlink()                                             # absent: one a step makes is taken back
            r = a.run(f"printf '#!/bin/sh\\ntouch {m}\\ncat\\n' > {prog.relative_to(a.root)} && "
                      f"chmod +x {prog.relative_to(a.root)}")
            assert r.returncode == 0, r.stderr
            taken_back(a, r, str(prog.relative_to(a.root)))
            a.host(trigger)
            assert not m.exists()
        finally:                                  # the person's config and index as they were
            person(a, f"git rm -q --cached --ignore-unmatch f.txt && git config --unset {key}")


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_a_program_the_repository_config_names_in_the_project(attacker):
    """The person's repository config runs a program that lives in the project (a filter, an
    alias, an fsmonitor hook): that program is protected like a hook, present or not. Each in
    turn in one project, the person's setting and files removed after it."""
    every_case(REPO_PROGRAMS, lambda key: _a_program_the_repository_config_names(attacker, key))


@pytest.mark.both_uids(READ_ONLY_GIT)
@pytest.mark.parametrize("where", ["src", "."])
def test_a_directory_shaped_like_a_repository(attacker, where):
    """git takes any directory with HEAD beside refs/objects for a repository when no `.git` is
    in the way (or the `.git`'s HEAD does not parse), and obeys the `config` there: the HEAD a
    step makes is taken back, so the person's git under it is the project's again; a bare
    repository `git clone --bare` makes runs nothing and stays."""
    a = attacker
    m = a.home / "pwned-bare"
    person(a, f"mkdir -p src/lib && echo 'print(1)' > src/lib/a.py && git add -A && git {ID} commit -qm init")
    worktree = ".." if where == "src" else "."
    plant = (f"git clone -q --bare . /tmp/b && cp -r /tmp/b/objects /tmp/b/refs /tmp/b/packed-refs {where}/ && "
             f"cp .git/HEAD {where}/HEAD && printf '[core]\\n\\trepositoryformatversion = 0\\n"
             f"\\tbare = false\\n\\tworktree = {worktree}\\n\\tfsmonitor = \"touch {m}; false\"\\n' > {where}/config")
    if where == ".":
        plant += " && cp .git/index index && echo garbage > .git/HEAD"
    r = a.run(plant)
    assert r.returncode == 0, r.stderr
    taken_back(a, r, "HEAD" if where == "." else f"{where}/HEAD")
    at = "cd src/lib" if where == "src" else "true"
    assert not host_git(a, f"{at} && git status", m)
    person(a, f"cp {where}/packed-refs /dev/null && printf 'ref: refs/heads/master\\n' > {where}/HEAD")
    assert host_git(a, f"{at} && git status", m)               # the oracle is live
    if where == ".":
        return
    r = a.run("git clone -q --bare . fixtures/repo.git && git -C fixtures/repo.git log --oneline")
    assert r.returncode == 0, r.stderr
    assert last_step(a)["taken_back"] == [] and (a.root / "fixtures" / "repo.git" / "HEAD").exists()


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_a_worktree_gitdir_without_a_commondir_is_a_repository_of_its_own(attacker):
    """`.git/worktrees/x` with a HEAD, refs, objects and a config but no commondir is its own
    repository: a `.git` file naming it (and a gitlink in the index, so the person's `git
    status` at the root looks inside) would run its config. The config and the `.git` file are
    taken back; a real `git worktree add` stays."""
    a = attacker
    m = a.home / "pwned-worktree-gitdir"
    person(a, f"git {ID} commit -q --allow-empty -m init")
    r = a.run("mkdir -p .git/worktrees/x/refs/heads .git/worktrees/x/objects vendor && "
              "echo 'ref: refs/heads/main' > .git/worktrees/x/HEAD && "
              f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"touch {m}; false\"\\n' "
              "> .git/worktrees/x/config && echo 'gitdir: ../.git/worktrees/x' > vendor/.git && "
              "git update-index --add --cacheinfo 160000,4b825dc642cb6eb9a060e54bf8d69288fbee4904,vendor")
    assert r.returncode == 0, r.stderr
    taken_back(a, r, ".git/worktrees/x/config", "vendor/.git")
    assert not host_git(a, "git status; cd vendor && git status", m)
    person(a, "echo 'gitdir: ../.git/worktrees/x' > vendor/.git && "
              f"printf '[core]\\n\\tfsmonitor = \"touch {m}; false\"\\n' > .git/worktrees/x/config")
    assert host_git(a, "git status", m)                         # the oracle is live


@pytest.mark.both_uids(READ_ONLY_GIT)
def test_a_git_file_through_a_symlinked_gitdir(attacker):
    """`sub/.git` names `.git/modules/x`, a symlink to a directory shaped like a repository
    (its HEAD a symlink into refs/, as git accepts) with a config that runs a program: judged
    by where it leads, and taken back."""
    a = attacker
    m = a.home / "pwned-symlinked-gitdir"
    r = a.run("mkdir -p evil/refs/heads evil/objects sub .git/modules && ln -s refs/heads/main evil/HEAD && "
              f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"touch {m}; false\"\\n' "
              "> evil/config && ln -s ../../evil .git/modules/x && echo 'gitdir: ../.git/modules/x' > sub/.git")
    assert r.returncode == 0, r.stderr
    taken_back(a, r, "sub/.git")
    assert not host_git(a, "cd sub && git status", m)
