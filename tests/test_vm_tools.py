"""The VM tier's guest as a place to work: its tools (bash, coreutils, git, curl, make, python3
with pip, from the read-only tool image laid over /usr, vm/toolimage.py) in real steps, git
through the same gate as the default tier, and a server started with nohup in one step still
serving in the next and after a rewind.

Real QEMU (TCG here), one project and one booted guest for the module, the tests in file
order; a local HTTPS git server (tests/gitserver.py) behind the gate. The tool image is built
once per machine into the shared cache (ENVGIT_VM_CACHE, as tests/test_vm.py).
"""

import json
import shutil

import pytest

from conftest import Env, make_home
from gitserver import GitServer
from kit.vmproject import VM_CACHE

needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (dev/run test installs it)")

MAKEFILE = "all: out.txt\n\nout.txt: in.txt\n\ttr a-z A-Z < in.txt > out.txt\n"


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    with GitServer(root=tmp_path_factory.mktemp("srv")) as srv:
        yield srv


@pytest.fixture(scope="module")
def vm(tmp_path_factory, remote):
    base = tmp_path_factory.mktemp("vmtools")
    home = make_home(base)
    root = home / "proj"
    root.mkdir()
    e = Env(home, root, {"ENVGIT_VM_CACHE": VM_CACHE, "ENVGIT_DAEMON_IDLE": "600",
                         "ENVGIT_RESOLVE": remote.resolve, "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    e.envgit("init", check=True)
    host = remote.url.split("/")[2]
    e.write_policy(f'version: 1\nnetwork:\n  allow: ["{host}"]\nirreversible:\n  - preset: default\n'
                   "shell: []\nbackend: vm\nvm: { memory: 384MiB, cpus: 1, packages: [jq] }\n")
    (root / "Makefile").write_text(MAKEFILE)
    (root / "in.txt").write_text("built by make\n")
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
    vm.write_policy(policy.replace(", packages: [jq]", ""))
    r = vm.run("command -v jq || echo no-jq; git --version", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vm.packages changed: the VM boots afresh" in r.stderr, r.stderr
    assert "no-jq" in r.stdout and "git version 2." in r.stdout
