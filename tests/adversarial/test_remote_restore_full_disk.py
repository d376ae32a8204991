"""Red team 16, faults: a full disk during `restore --from` (a tmpfs too small for the tree).
What must hold: one `envgit: …` line and exit 1, no traceback; nothing half-written left
claiming to be the tree (the target it created removed, or said incomplete)."""

import os
import subprocess

import pytest

from test_remote import add_remote, fill, machine

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_restore_from_onto_a_full_disk_is_one_line_and_leaves_no_partial_tree(tmp_path, s3, small_disk):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)                                  # holds a 3 MiB file
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    m2 = machine(tmp_path, "m2", s3, init=False)
    (tmp_path / "k").write_bytes((m1.home / ".config/envgit/remotes/ci.key").read_bytes())
    add_remote(m2, s3, key_file=tmp_path / "k")
    target = small_disk / "out"
    r = m2.envgit("restore", "--from", "ci", "last", "--target", str(target), "--project", "proj",
                  "--machine", "m1")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and r.stderr.startswith("envgit: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    left = sorted(str(p.relative_to(small_disk)) for p in small_disk.rglob("*"))
    assert not target.exists(), f"a partial tree is left in the target it created: {left}; said: {r.stderr.strip()}"
