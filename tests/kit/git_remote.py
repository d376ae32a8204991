"""The `remote` fixture: a local HTTPS git server for one test (tests/gitserver.py), its
repositories under the test's tmp_path. A module imports the fixture's function, which pytest
finds under the fixture's name:

    from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
"""

import pytest

from gitserver import GitServer


@pytest.fixture(name="remote")
def git_remote(tmp_path):
    with GitServer(root=tmp_path / "srv") as srv:
        yield srv
