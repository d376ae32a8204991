"""`envgit completion bash|zsh|fish`: the script each shell loads, loaded by the real shell, and
asked what follows a typed word. bash and fish are asked as their completion systems ask
(bash: COMP_WORDS/COMP_CWORD and the function `complete -F` names; fish: `complete -C`); zsh
runs the bash function through its own bashcompinit under the sh emulation its compgen uses,
and filters by the typed prefix in its completion system, so for zsh the words offered are
checked to include the right ones and none of another command's."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ENVGIT = str(Path(sys.executable).parent / "envgit")


def _script(shell, tmp_path):
    r = subprocess.run([ENVGIT, "completion", shell], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    path = tmp_path / f"envgit.{shell}"
    path.write_text(r.stdout)
    return path


BASH_ASK = 't(){ COMP_WORDS=("$@"); COMP_CWORD=$(($#-1)); _envgit; echo "${COMPREPLY[*]}"; }; '


def _bash(script, *words):
    line = " ".join(f"'{w}'" for w in words)
    r = subprocess.run(["bash", "--norc", "-c", f"source {script}; {BASH_ASK} t {line}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completes_commands_subcommands_and_options(tmp_path):
    script = _script("bash", tmp_path)
    assert _bash(script, "envgit", "re") == ["remote", "restore", "rewind"]
    assert {"check", "show", "schema"} <= set(_bash(script, "envgit", "policy", ""))
    assert "--yes" in _bash(script, "envgit", "rewind", "--")
    assert _bash(script, "envgit", "policy", "check", "--j") == ["--json"]
    # after run, the command's own: a command name, then nothing of envgit's (files)
    assert "echo" in _bash(script, "envgit", "run", "ech")
    assert _bash(script, "envgit", "run", "echo", "--") == []
    assert _bash(script, "envgit", "claude", "--") == []


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (dev/run installs it)")
def test_zsh_loads_the_script_and_offers_the_right_words(tmp_path):
    script = _script("zsh", tmp_path)
    ask = ('t(){ emulate -L sh; setopt ksharrays; COMP_WORDS=("$@"); COMP_CWORD=$(($#-1)); _envgit; '
           'print -r -- "${COMPREPLY[*]}"; }; ')
    r = subprocess.run(["zsh", "-f", "-c", f"source {script}; {ask} t envgit policy ''; t envgit rewind --"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    policy, rewind = r.stdout.splitlines()
    assert {"check", "show", "schema"} <= set(policy.split()) and "rewind" not in policy.split()
    assert "--yes" in rewind.split() and "check" not in rewind.split()


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (dev/run installs it)")
def test_fish_completes_commands_subcommands_and_options(tmp_path):
    script = _script("fish", tmp_path)

    def ask(line):
        r = subprocess.run(["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return [w.split("\t")[0] for w in r.stdout.splitlines()]

    assert ask("envgit re") == ["remote", "restore", "rewind"]
    assert {"check", "show", "schema"} <= set(ask("envgit policy "))
    assert "--yes" in ask("envgit rewind --")
    assert "rewind" not in ask("envgit policy ")


def test_an_unknown_shell_is_a_usage_error():
    r = subprocess.run([ENVGIT, "completion", "tcsh"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_each_command_is_built_by_the_module_commands_names_for_it():
    """A command parses with only its own module's parsers (cli.py, commands.COMMAND_MODULE):
    the map names, for every command the whole tree has, the module that registers it."""
    import argparse
    import importlib

    from envgit import cli, commands
    made = {}
    for name in commands.MODULES:
        p = argparse.ArgumentParser()
        sub = p.add_subparsers()
        importlib.import_module(f"envgit.commands.{name}").add_parsers(sub, argparse)
        made.update({c: name for c in sub.choices})
    expect = {c: (None if c == "completion" else m) for c, m in made.items()}
    assert commands.COMMAND_MODULE == expect
    whole = cli._parser(False)._subparsers._group_actions[0].choices
    assert set(whole) - set(made) == {"run", "mcp", *cli.AGENTS}      # dispatched before argparse
    for command, module in commands.COMMAND_MODULE.items():
        if module is not None:
            assert command in cli._parser(False, command)._subparsers._group_actions[0].choices


def test_a_command_and_its_help_work_from_its_own_parsers(tmp_path):
    r = subprocess.run([ENVGIT, "show", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "envgit show last~1 --json" in r.stdout, r.stderr
    r = subprocess.run([ENVGIT, "show", "1", "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr, r.stderr
    r = subprocess.run([ENVGIT, "--json-typo"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: envgit" in r.stderr, r.stderr
