"""The command blocks of the README and of the reference it points to (docs/POLICY.md,
docs/GUIDE.md), run: so none of them can rot.

- ```sh setup (README): `dev/run demo` is run (the set-up is idempotent, so this re-checks it
  and runs the demo); `dev/run test` is this very suite, which CI runs through .ci/run.
- ```sh: each line runs in order in a fresh project (in a home holding a canary key), the
  README's first; a line whose comment says "refused" must fail, every other line must succeed.
- ```yaml (docs/POLICY.md): the example policy must load; so must ```yaml credentials
  (docs/POLICY.md) and ```yaml vm (docs/GUIDE.md).
- ```sh live (docs/GUIDE.md): parsed by envgit's own argument parser.
- The README's "What a step cannot do" names tests that exist, and the README stays short
  enough to be read to the end.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CANARY, Env, make_home

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# The README's tutorial, then the reference it points to, in the order their sh blocks run.
DOCS = [README, *((ROOT / "docs" / name).read_text() for name in ("POLICY.md", "GUIDE.md"))]
BLOCKS = [b for text in DOCS for b in re.findall(r"```(\w+)(?: (\w+))?\n(.*?)```", text, re.S)]
README_LINES = 200


def blocks(lang, tag=None):
    return [body for lang_, t, body in BLOCKS if lang_ == lang and (t or None) == tag]


def test_the_readme_is_short_and_points_to_the_reference():
    assert len(README.splitlines()) <= README_LINES, "the README is the tutorial; reference goes in docs/"
    for name in ("docs/POLICY.md", "docs/GUIDE.md", "CONTRIBUTING.md", "LICENSE"):
        assert f"`{name}`" in README, name
        assert (ROOT / name).is_file(), name


def commands(body):
    for line in body.splitlines():
        cmd, _, comment = line.partition("  #")
        if cmd.strip():
            yield cmd.strip(), comment


def test_setup_block_names_the_two_commands():
    (setup,) = blocks("sh", "setup")
    cmds = [c for c, _ in commands(setup)]
    assert cmds == ["dev/run demo", "dev/run test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "dev/run test" in ci                        # CI runs the README's test command
    r = subprocess.run(["bash", "dev/run", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_COLOR": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ok  rewind:" in r.stdout


def test_usage_blocks_run(tmp_path):
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    env = Env(home, root, {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    ran = 0
    try:
        for body in blocks("sh"):
            for cmd, comment in commands(body):
                r = subprocess.run(["bash", "-c", cmd], cwd=root, env=env.env, capture_output=True,
                                   text=True, timeout=120)
                ran += 1
                assert CANARY not in r.stdout + r.stderr, cmd
                if "refused" in comment:
                    assert r.returncode != 0, cmd
                else:
                    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    finally:
        env.stop()
    assert ran >= 9


def test_policy_example_loads(tmp_path):
    (example,) = blocks("yaml")
    (tmp_path / "envgit.yaml").write_text(example)
    (tmp_path / ".envgit").mkdir()
    r = subprocess.run([str(Path(sys.executable).parent / "envgit"), "policy", "check"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("tag,shown", [
    ("credentials", ("credential github", "credential aws")),
    ("signing", ("signing: key '~/.ssh/id_ed25519', allow  # ", "envgit.yaml:3")),
])
def test_policy_md_examples_load(tmp_path, tag, shown):
    (example,) = blocks("yaml", tag)
    (tmp_path / "envgit.yaml").write_text("version: 1\n" + example)
    (tmp_path / ".envgit").mkdir()
    r = subprocess.run([str(Path(sys.executable).parent / "envgit"), "policy", "show"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert all(text in r.stdout for text in shown), r.stdout


def test_every_promise_names_a_test_that_exists():
    """Each row of "What a step cannot do" names tests that exist in tests/adversarial/."""
    section = README.split("### What a step cannot do", 1)[1].split("\n## ", 1)[0]
    refs = re.findall(r"`(test_\w+\.py)::(test_\w+)`", section)
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "::" in ln]
    assert len(rows) >= 15 and all("::" in r for r in rows)
    for path, name in refs:
        text = (ROOT / "tests" / "adversarial" / path).read_text()
        assert re.search(rf"^def {name}\(", text, re.M), f"{path}::{name} named in README is not a test"


def test_live_blocks_name_real_commands_and_flags():
    """```sh live: commands that wait for something (a page, a pending question) are not run;
    each is parsed by envgit's own argument parser instead, so a renamed flag fails here."""
    from envgit.cli import _parser
    parser = _parser(json_errors=False)
    checked = 0
    for body in blocks("sh", "live"):
        for cmd, _ in commands(body):
            words = cmd.split()
            assert words[0] == "envgit", cmd
            parser.parse_args(words[1:])           # SystemExit(2) on an unknown command or flag
            checked += 1
    assert checked >= 3


def test_vm_example_loads(tmp_path):
    (example,) = blocks("yaml", "vm")
    (tmp_path / "envgit.yaml").write_text(example)
    (tmp_path / ".envgit").mkdir()
    r = subprocess.run([str(Path(sys.executable).parent / "envgit"), "policy", "check"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
