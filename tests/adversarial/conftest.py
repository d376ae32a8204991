"""The fixtures every test under tests/adversarial/ may name, with nothing to import:

- `attacker`: an attacker's project (harness.py: the Attacker class, attacker_in). It is
  parametrized by tests/conftest.py's pytest_generate_tests (indirect): "root", and "user" too
  where the test says `@pytest.mark.both_uids(why)`.
- `ll`: an attacker's project on a host without user namespaces (Landlock steps), root and user.
- `gate_servers`: gatekit's git server and recording stub, up for one test.
- `shared_image`: the VM tier's guest image, built once per machine.
- `s3`: a real S3-compatible server for one test (tests/kit/s3.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.s3 import s3_server  # noqa: F401  (the fixture `s3`)

_SUITE_CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"

# One guest image for every test user: built once per machine, readable by all (it holds
# Debian's public packages and envgit's agent, nothing of anyone's).
SHARED_CACHE = "/var/tmp/envgit-test-vm-cache"


def pytest_configure(config):
    """Neither tests/ nor tests/adversarial/ is a package, so pytest imports both conftest.py
    files as the module `conftest`, this one last, in the place of tests/conftest.py in
    sys.modules; every module of the suite (harness.py too) means tests/conftest.py by
    `from conftest import ...`. Put it back. pytest calls this as soon as it has registered
    this file, before it imports any test module under it."""
    for plugin in config.pluginmanager.get_plugins():
        path = getattr(plugin, "__file__", None)
        if path and Path(path).resolve() == _SUITE_CONFTEST:
            sys.modules["conftest"] = plugin
            return
    raise pytest.UsageError(f"{_SUITE_CONFTEST} is not loaded: tests/adversarial needs it")


@pytest.fixture
def attacker(request, tmp_path):
    """An attacker's project, as root or as an unprivileged user (request.param)."""
    from harness import attacker_in  # not at the top: harness imports tests/conftest.py's names
    with attacker_in(request.param, tmp_path) as a:
        yield a


@pytest.fixture(params=["root", "user"])
def ll(request, tmp_path):
    """An attacker's project on a host that refuses user namespaces (kit/nouserns.py), where
    its steps run with Landlock; as root and as an unprivileged user (a test narrows it with
    `@pytest.mark.parametrize("ll", ["root"], indirect=True)`), its daemon already up."""
    from harness import attacker_in
    with attacker_in(request.param, tmp_path, no_userns=True) as a:
        a.run("true", check=True)
        yield a


@pytest.fixture
def gate_servers():
    """(git, stub): gatekit's local HTTPS git server and the stub that records every request."""
    from gatekit import servers
    with servers() as (git, stub):
        yield git, stub


@pytest.fixture(scope="module")
def shared_image():
    """The VM tier's guest image in SHARED_CACHE (built there once per machine), readable by
    every test user; a test points its project's ENVGIT_VM_CACHE at it."""
    old = os.environ.get("ENVGIT_VM_CACHE")
    os.environ["ENVGIT_VM_CACHE"] = SHARED_CACHE
    try:
        from envgit.vm import image
        image.ensure()
    finally:
        if old is None:
            os.environ.pop("ENVGIT_VM_CACHE")
        else:
            os.environ["ENVGIT_VM_CACHE"] = old
    subprocess.run(["chmod", "-R", "a+rX", SHARED_CACHE], check=True)
    return SHARED_CACHE
