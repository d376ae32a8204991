"""Writing a file whole or not at all, never through a name someone else could have chosen.

The one way envgit writes a file where a step, or an agent's own tools, can also write (the
project, the session's /tmp, an agent's state directory): a temporary with a random name is
created beside the target with O_CREAT|O_EXCL|O_NOFOLLOW (so a symlink, hard link or FIFO
planted at a predictable name such as `FILE.tmp` or `FILE.<pid>` is never opened, let alone
written through), written, fsynced, then renamed over the target. The rename replaces a
symlink at the target itself rather than following it.

Standard library only, and only `os`: it is imported on the hot path (sandbox/environ.py)
and copied beside the Claude hook script, which runs without envgit on its path."""

import os

_TRIES = 16


def write_atomic(path: str, data, mode: int = 0o666, *, chmod: int | None = None,
                 sync: bool = True) -> None:
    """Write `data` (bytes, or str as UTF-8 with surrogateescape) to `path`: complete or
    absent. `mode` is the creation mode (the umask applies, as with open()); `chmod`, when
    given, is set exactly. `sync`: fsync the file and its directory (durable across a crash).
    Raises OSError; the temporary is removed on any failure."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    fd, tmp = _create_beside(path, mode)
    try:
        try:
            if chmod is not None:
                os.fchmod(fd, chmod)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        try:
            dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


def _create_beside(path: str, mode: int) -> tuple[int, str]:
    """(fd, name) of a new empty file in `path`'s directory, its name random and hidden."""
    d, base = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TRIES):
        tmp = os.path.join(d, f".{base[:64]}.envgit-{os.urandom(8).hex()}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")
