"""The `attacker` fixture, for every test under tests/adversarial/: a test names it, nothing to
import. What it yields and how it is made: harness.py (the Attacker class, attacker_in). It is
parametrized by tests/conftest.py's pytest_generate_tests (indirect): "root", and "user" too
where the test says `@pytest.mark.both_uids(why)`."""

import sys
from pathlib import Path

import pytest

_SUITE_CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


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
