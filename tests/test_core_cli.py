"""init, policy commands, doctor, and the hot path's imports."""

import json
import os
import subprocess
import sys

from conftest import ENVGIT


def test_init_writes_policy_state_and_gitignore(tmp_path):
    r = subprocess.run([ENVGIT, "init"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0
    assert (tmp_path / "envgit.yaml").read_text().startswith("# envgit policy")
    assert (tmp_path / ".envgit").is_dir()
    assert ".envgit/" in (tmp_path / ".gitignore").read_text().splitlines()
    (tmp_path / "envgit.yaml").write_text("version: 1\n")
    r = subprocess.run([ENVGIT, "init"], cwd=tmp_path, capture_output=True, text=True)
    assert (tmp_path / "envgit.yaml").read_text() == "version: 1\n" and "keeping it" in r.stderr
    assert (tmp_path / ".gitignore").read_text().count(".envgit/") == 1


def test_policy_check_and_show(proj):
    r = proj.envgit("policy", "check")
    assert r.returncode == 0 and "ok" in r.stdout
    r = proj.envgit("policy", "show")
    assert "~/.ssh" in r.stdout and "# default" in r.stdout
    proj.write_policy("version: 1\nfilesystem:\n  deny_reed: []\n")
    r = proj.envgit("policy", "check")
    assert r.returncode == 2 and "envgit.yaml:3:3" in r.stderr and "deny_read" in r.stderr
    schema = json.loads(proj.envgit("policy", "schema", check=True).stdout)
    assert schema["title"] == "envgit.yaml"


def test_bad_policy_refuses_the_step_and_records_nothing(proj):
    proj.write_policy("version: 1\nfilesystem:\n  deny_reed: []\n")
    r = proj.run("echo should-not-run")
    assert r.returncode == 125 and "envgit.yaml:3:3" in r.stderr     # envgit's own failure
    assert "should-not-run" not in r.stdout
    assert json.loads(proj.envgit("log", "--json", check=True).stdout) == []


def test_doctor(proj):
    r = proj.envgit("doctor")
    assert r.returncode == 0, r.stdout
    assert "bubblewrap" in r.stdout and "namespaces" in r.stdout
    checks = json.loads(proj.envgit("doctor", "--json").stdout)
    assert all(c["ok"] for c in checks if c["required"])
    # with bwrap missing (envgit takes it from system directories, never PATH: here an
    # ENVGIT_BWRAP naming nothing), doctor names it and the fix
    r = proj.envgit("doctor", env={"ENVGIT_BWRAP": "/nonexistent/bwrap"})
    assert r.returncode == 1 and "MISS  bubblewrap" in r.stdout and "apt-get install -y bubblewrap" in r.stdout


ALLOWED = {"envgit", "envgit.cli", "envgit.run", "envgit.paths", "envgit.daemon",
           "envgit.daemon.client", "envgit.sandbox", "envgit.sandbox.seccomp", "envgit.sandbox.launch",
           "envgit.sandbox.resolver"}


def test_hot_path_imports_only_the_standard_library():
    r = subprocess.run([sys.executable, "-X", "importtime", "-c",
                        "import envgit.cli, envgit.run"], capture_output=True, text=True)
    mods = {ln.split("|")[-1].strip() for ln in r.stderr.splitlines()[1:] if ln.startswith("import time:")}
    ours = {m for m in mods if m.split(".")[0] == "envgit"}
    assert ours <= ALLOWED, ours - ALLOWED
    foreign = ({m.split(".")[0] for m in mods - ours} - set(sys.stdlib_module_names)
               - {"_distutils_hack", "__editable___envgit_0_1_0_finder", "sitecustomize"})
    assert not foreign, foreign
    assert "sqlite3" not in mods and "yaml" not in mods


def test_init_refuses_the_home_directory(tmp_path):
    r = subprocess.run([ENVGIT, "init"], cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "home directory" in r.stderr
    assert not (tmp_path / "envgit.yaml").exists() and not (tmp_path / ".envgit").exists()
