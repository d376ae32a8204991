"""The `s3` fixture: a real S3-compatible server for one test (tests/s3server.py's S3Server,
`rclone serve s3` on 127.0.0.1), its bucket under the test's tmp_path, stopped after the test.
Function-scoped: the tests damage, delete and count the bucket's objects.

tests/adversarial/conftest.py offers it to every test there; a module elsewhere imports the
fixture's function, which pytest finds under the fixture's name:

    from kit.s3 import s3_server  # noqa: F401  (the fixture `s3`)
"""

import pytest

from s3server import S3Server


@pytest.fixture(name="s3")
def s3_server(tmp_path):
    server = S3Server(tmp_path / "s3")
    yield server
    server.stop()
