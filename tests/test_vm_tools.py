"""The VM tier's guest as a place to work: its tools (bash, coreutils, git, curl, make, python3
with pip and venv, from the read-only tool image laid over /usr, vm/toolimage.py; pytest, node
and npm added by `vm.packages` as a person would) in real steps, git through the same gate as
the default tier, a Python project installed with pip and tested with pytest, a Node project
installed with `npm ci` and tested with `npm test` (both from local registries standing in for
pypi.org and registry.npmjs.org, behind the gate), and a server started with nohup in one step
still serving in the next and after a rewind.

Real QEMU (TCG here), one project and one booted guest for the module, the tests in file
order; a local HTTPS git server (tests/gitserver.py) behind the gate. The tool image is built
once per machine into the shared cache (ENVGIT_VM_CACHE, as tests/test_vm.py).
"""

import json
import shutil

import pytest

from conftest import Env, make_home
from gitserver import GitServer, HTTPSServer
from kit.registries import NPM_NAMES, PYPI_NAMES, both_app, npm_lock
from kit.vmproject import VM_CACHE

needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (dev/run test installs it)")

MAKEFILE = "all: out.txt\n\nout.txt: in.txt\n\ttr a-z A-Z < in.txt > out.txt\n"


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    with GitServer(root=tmp_path_factory.mktemp("srv")) as srv:
        yield srv


PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "pyapp"
version = "0.1.0"
dependencies = ["envgit-tiny"]

[tool.setuptools]
py-modules = ["pyapp"]
"""
PYAPP = "import envgit_tiny\n\n\ndef answer():\n    return envgit_tiny.VALUE\n"
PYTEST = "from pyapp import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
PACKAGE_JSON = {"name": "jsapp", "version": "0.0.0", "private": True,
                "dependencies": {"envgit-tiny": "^1.0.0"}, "scripts": {"test": "node test.js"}}
JSTEST = ('const v = require("envgit-tiny");\n'
          'if (v !== 42) { console.error("got " + v); process.exit(1); }\n'
          'console.log("jsapp: 1 test passed");\n')


@pytest.fixture(scope="module")
def registries(tmp_path_factory, remote):
    """pypi.org, files.pythonhosted.org and registry.npmjs.org on 127.0.0.1, under the git
    server's CA (the daemon trusts one test CA)."""
    with HTTPSServer(both_app(), PYPI_NAMES + NPM_NAMES, root=tmp_path_factory.mktemp("reg"),
                     ca=remote.ca) as srv:
        yield srv


@pytest.fixture(scope="module")
def vm(tmp_path_factory, remote, registries):
    base = tmp_path_factory.mktemp("vmtools")
    home = make_home(base)
    root = home / "proj"
    root.mkdir()
    resolve = ",".join([remote.resolve, *(f"{n}=127.0.0.1:{registries.port}" for n in registries.names)])
    e = Env(home, root, {"ENVGIT_VM_CACHE": VM_CACHE, "ENVGIT_DAEMON_IDLE": "600",
                         "ENVGIT_RESOLVE": resolve, "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    e.envgit("init", check=True)
    host = remote.url.split("/")[2]
    e.write_policy(f'version: 1\nnetwork:\n  allow: ["{host}", preset:pypi, preset:npm]\n'
                   "irreversible:\n  - preset: default\nshell: []\nbackend: vm\n"
                   "vm: { memory: 384MiB, cpus: 1, packages: [jq, python3-pytest, nodejs, npm] }\n")
    (root / "Makefile").write_text(MAKEFILE)
    (root / "in.txt").write_text("built by make\n")
    (root / "pyapp").mkdir()
    for name, text in (("pyproject.toml", PYPROJECT), ("pyapp.py", PYAPP), ("test_pyapp.py", PYTEST)):
        (root / "pyapp" / name).write_text(text)
    (root / "jsapp").mkdir()
    (root / "jsapp" / "package.json").write_text(json.dumps(PACKAGE_JSON, indent=2) + "\n")
    (root / "jsapp" / "package-lock.json").write_text(json.dumps(npm_lock("jsapp"), indent=2) + "\n")
    (root / "jsapp" / "test.js").write_text(JSTEST)
    yield e
    e.stop()


def _steps(e):
    return json.loads(e.envgit("log", "--json", check=True).stdout)


def test_vm_packages_is_a_list_of_debian_names_checked_with_file_and_line(tmp_path):
    from envgit.policy import load_policy
    from envgit.policy.schema import PolicyError
    (tmp_path / "envgit.yaml").write_text("version: 1\nbackend: vm\nvm:\n  packages: [jq, nodejs]\n")
    pol = load_policy(tmp_path / "envgit.yaml")
    assert pol.vm_packages == ["jq", "nodejs"]
    assert pol.where["vm.packages[1]"].endswith("envgit.yaml:4")
    (tmp_path / "envgit.yaml").write_text("version: 1\nbackend: vm\nvm:\n  packages: [jq, \"Node JS\"]\n")
    with pytest.raises(PolicyError, match=r"envgit.yaml:4:\d+: vm.packages\[1\]: 'Node JS' is not a Debian pack"):
        load_policy(tmp_path / "envgit.yaml")


@needs_qemu
def test_the_guest_has_bash_coreutils_make_git_curl_and_pip(vm):
    r = vm.run('echo "sh is bash $BASH_VERSION"; bash -c \'a=(x y); echo "array ${a[1]}"\'; '
               "nohup --version | head -1; git --version; curl --version | head -1; "
               "make && cat out.txt; python3 -m pip --version; echo '{\"a\": [1, 2]}' | jq -c .a; "
               "ps -o pid= -p $$ >/dev/null && echo ps-ok",
               timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "sh is bash 5." in out                  # `sh -c` runs bash
    assert "array y" in out
    assert "GNU coreutils" in out                  # nohup is coreutils', not missing
    assert "git version 2." in out and "curl 7." in out
    assert "BUILT BY MAKE" in out and (vm.root / "out.txt").read_text() == "BUILT BY MAKE\n"
    assert "pip " in out and "ps-ok" in out
    assert "[1,2]" in out                          # vm.packages: jq, added to the tool image


@needs_qemu
def test_git_clone_through_the_gate_and_a_hidden_push_is_refused(vm, remote):
    before = remote.refs()
    r = vm.run(f"git clone -q {remote.url} /tmp/app && cd /tmp/app && git log --oneline | wc -l && "
               "echo change >> README && git -c user.email=a@example.test -c user.name=a commit -qam change && "
               "g=git; $g push origin HEAD:main; echo push-exit=$?", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "push-exit=0" not in r.stdout, r.stdout + r.stderr
    assert "[remote rejected]" in r.stderr and "preset:default/git-push" in r.stderr, r.stderr
    assert remote.refs() == before                           # the remote's ref never moved
    assert not any(m == "POST" and "receive-pack" in p and s == 200 for m, p, s in remote.log)
    assert any(m == "GET" and "upload-pack" in p for m, p, s in remote.log)    # the clone was real
    reqs = _steps(vm)[-1]["requests"]
    assert any(q["method"] == "POST" and "receive-pack" in q["path"] and q["decision"] == "deny" for q in reqs)
    # curl through the same gate, with the gate's CA (CURL_CA_BUNDLE as in the default tier)
    r = vm.run(f"curl -sS -o /dev/null -w '%{{http_code}}' {remote.url}/info/refs?service=git-upload-pack",
               timeout=300)
    assert r.stdout == "200", r.stdout + r.stderr


@needs_qemu
def test_a_python_project_installs_with_pip_and_its_tests_pass_with_pytest(vm, registries):
    # the index has envgit-tiny alone: the build backend is Debian's setuptools in the guest
    # (--no-build-isolation), as a person with a private index does
    # the system's pip run by the venv's Python installs into the venv: no copy of pip made
    # (ensurepip takes a minute under TCG)
    r = vm.run("cd pyapp && python3 -m venv --system-site-packages --without-pip .venv && "
               ".venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation -e . && "
               ".venv/bin/python -m pytest -q -p no:cacheprovider", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout, r.stdout + r.stderr
    assert any(p.endswith(".whl") for m, p, s in registries.log), registries.log
    reqs = _steps(vm)[-1]["requests"]
    assert {q["host"] for q in reqs if q["decision"] == "allow"} >= set(PYPI_NAMES), reqs
    # the editable install points at the project's own file, written back to the host
    assert list((vm.root / "pyapp" / ".venv").glob("lib/python3*/site-packages/__editable__*pyapp*"))


@needs_qemu
def test_a_node_project_installs_with_npm_ci_and_its_tests_pass_with_npm_test(vm, registries):
    r = vm.run("cd jsapp && npm ci --no-audit --no-fund --no-update-notifier && npm test",
               timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "jsapp: 1 test passed" in r.stdout, r.stdout + r.stderr
    assert any(p.endswith("envgit-tiny-1.0.0.tgz") for m, p, s in registries.log), registries.log
    reqs = _steps(vm)[-1]["requests"]
    assert any(q["host"] == "registry.npmjs.org" and q["decision"] == "allow" for q in reqs), reqs
    assert (vm.root / "jsapp" / "node_modules" / "envgit-tiny" / "index.js").read_text() == \
        "module.exports = 42;\n"


def _serving(vm):
    return vm.run("curl -s --noproxy '*' -m 20 http://127.0.0.1:8001/in.txt", timeout=300)


@needs_qemu
def test_a_nohup_server_serves_in_the_next_step_and_after_a_rewind(vm):
    r = vm.run("nohup python3 -m http.server 8001 --bind 127.0.0.1 >/tmp/server.log 2>&1 & "
               "for i in $(seq 1 150); do curl -s --noproxy '*' -o /dev/null http://127.0.0.1:8001/ && exit 0; "
               "sleep 0.2; done; cat /tmp/server.log; exit 1", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    started = _steps(vm)[-1]["id"]
    r = _serving(vm)
    assert r.returncode == 0 and r.stdout == "built by make\n", r.stdout + r.stderr
    r = vm.run("pkill -f 'http[.]server'; sleep 1; curl -s --noproxy '*' -m 5 http://127.0.0.1:8001/ || echo gone")
    assert "gone" in r.stdout, r.stdout + r.stderr
    r = vm.envgit("rewind", str(started), "--yes", timeout=300)
    assert r.returncode == 0 and "memory and processes are back" in r.stdout, r.stdout + r.stderr
    r = _serving(vm)
    assert r.returncode == 0 and r.stdout == "built by make\n", r.stdout + r.stderr


@needs_qemu
def test_a_changed_vm_packages_boots_the_guest_with_the_new_tools(vm):
    policy = (vm.root / "envgit.yaml").read_text()
    vm.write_policy(policy.replace(", packages: [jq, python3-pytest, nodejs, npm]", ""))
    r = vm.run("command -v jq || echo no-jq; git --version", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vm.packages changed: the VM boots afresh" in r.stderr, r.stderr
    assert "no-jq" in r.stdout and "git version 2." in r.stdout
