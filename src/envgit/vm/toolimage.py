"""The guest's toolchain: a read-only ext4 image of Debian packages (bash, coreutils, git,
curl, make, python3 with pip ... and `vm.packages`), given to the guest as a virtio-blk drive
and laid over its /usr by /init (image.py's INIT).

A block device, not a 9p export: QEMU migrates a guest with a drive (memory snapshots and
`-incoming` keep working; the restored QEMU gets the same file) and refuses one with a
mounted 9p export. Built on first use like the initramfs: `apt-get -s` with an empty dpkg
status resolves the packages' whole dependency closure (as apt would install it on an empty
system), `apt-get download` fetches them, `dpkg-deb -x` unpacks them, `mke2fs -d` writes the
tree into an image (e2fsprogs; no root, no loop mount). Maintainer scripts are not run: what
they would make (alternatives, /etc/ssl/certs) the guest does without or gets otherwise.

The image is kept in its initramfs's cache directory (image.py), as
tools-<packages digest>-<versions digest>.img: what the initramfs already has is left out of
it (one copy of libc and of Python's standard library, the initramfs's byte-compiled one).
"""

import hashlib
import os
import shutil
import subprocess
import time

from .image import ImageError, _apt, merge_usr, read_cpio_names

TOOLS_FORMAT = 1
# what an agent types first; their libraries come with them (resolve)
DEFAULT_PACKAGES = ("bash", "coreutils", "git", "curl", "ca-certificates", "make", "procps",
                    "findutils", "grep", "sed", "tar", "gzip", "python3", "python3-pip", "python3-venv")
# pulled in by a dependency but only of use to a package manager converting a system
SKIP = ("usrmerge",)
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
         "usr/share/bug", "usr/share/doc-base", "usr/share/bash-completion", "usr/share/zsh",
         "usr/lib/python3.11/test")


def packages_for(extra) -> tuple:
    """The default set plus the policy's `vm.packages`, in order, once each."""
    return tuple(dict.fromkeys((*DEFAULT_PACKAGES, *(extra or ()))))


def resolve(packages) -> dict:
    """Each package of the closure and its version: apt's own resolver run on an empty system
    (`-s`: nothing installed, nothing downloaded), so virtual packages, alternatives and
    Pre-Depends are chosen as apt chooses them."""
    try:
        out = _apt("apt-get", "-s", "-q", "-o", "Dir::State::status=/dev/null",
                   "-o", "APT::Install-Recommends=false", "-o", "APT::Install-Suggests=false",
                   "install", *packages)
    except ImageError as e:
        raise ImageError(f"the guest's tools ({' '.join(packages)}) cannot be resolved: {e} "
                         "(a name in vm.packages that apt does not know? `apt-cache search` "
                         "finds one; or run apt-get update)") from None
    got = {}
    for line in out.splitlines():
        if line.startswith("Inst "):
            parts = line.split()
            if len(parts) >= 3 and parts[2].startswith("("):
                got[parts[1]] = parts[2][1:]
    if not got:
        raise ImageError(f"apt resolved nothing for {' '.join(packages)}")
    return {p: v for p, v in got.items() if p not in SKIP and not p.startswith("linux-image-")}


def _digest(text) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def recipe(packages) -> str:
    return _digest(f"tools {TOOLS_FORMAT} {SKIP} {PRUNE}\n" + "\n".join(packages))


def ensure(image, extra=(), progress=None) -> str:
    """The path of the tool image for `image` (image.Image) with `extra` packages, built first
    when missing. Found without asking apt when one of the same packages exists
    (ENVGIT_VM_REBUILD=1 asks apt for newer versions)."""
    say = progress or (lambda text: None)
    packages = packages_for(extra)
    prefix = f"tools-{recipe(packages)}-"
    done = sorted((e for e in os.listdir(image.path) if e.startswith(prefix) and e.endswith(".img")),
                  key=lambda e: os.stat(os.path.join(image.path, e)).st_mtime)
    if done and not os.environ.get("ENVGIT_VM_REBUILD"):
        path = os.path.join(image.path, done[-1])
        _touch(path)
        return path
    say(f"resolving the guest's tools ({len(packages)} Debian packages and their libraries)")
    versions = resolve(packages)
    pinned = "".join(f"{p}={v}\n" for p, v in sorted(versions.items()))
    path = os.path.join(image.path, prefix + _digest(pinned) + ".img")
    if os.path.isfile(path):
        _touch(path)
        return path
    work = os.path.join(image.path, f".tools-build-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        t0 = time.monotonic()
        _build(work, image, versions, say)
        os.replace(os.path.join(work, "tools.img"), path)
        say(f"the guest's tools are built ({time.monotonic() - t0:.0f} s, "
            f"{_allocated(path) / 1e6:.0f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _drop_old(image.path, keep=os.path.basename(path))
    return path


def _touch(path):
    try:
        os.utime(path)                  # in use: kept by _drop_old
    except OSError:
        pass


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def _drop_old(directory, keep, older_than_s=86400):
    """Tool images of other package sets not built or used for a day (a memory snapshot taken
    with one needs it: its step's rewind says so when it is gone, and the next boot is fresh)."""
    now = time.time()
    for e in os.listdir(directory):
        p = os.path.join(directory, e)
        if e.startswith("tools-") and e.endswith(".img") and e != keep:
            try:
                if now - os.stat(p).st_mtime > older_than_s:
                    os.unlink(p)
            except OSError:
                pass


def _build(work, image, versions, say):
    debs = os.path.join(work, "debs")
    tree = os.path.join(work, "root")
    os.makedirs(debs)
    os.makedirs(tree)
    say(f"downloading {len(versions)} Debian packages for the guest's tools")
    _apt("sh", "-c", 'cd "$1" && shift && exec apt-get download -q "$@"', "sh", debs,
         *(f"{p}={v}" for p, v in versions.items()))
    say(f"unpacking {len(versions)} packages")
    for name in sorted(os.listdir(debs)):
        _apt("dpkg-deb", "-x", os.path.join(debs, name), tree)
    shutil.rmtree(debs)
    merge_usr(tree)
    for rel in PRUNE:
        shutil.rmtree(os.path.join(tree, rel), ignore_errors=True)
    # bash is the shell `sh` finds (on PATH before busybox's); Debian's /bin/sh, dash, is not here
    sh = os.path.join(tree, "usr", "bin", "sh")
    if not os.path.lexists(sh) and os.path.exists(os.path.join(tree, "usr", "bin", "bash")):
        os.symlink("bash", sh)
    _leave_out_the_initramfs(tree, image.initrd)
    _precompile(tree, say)
    say("writing the tool image")
    mkfs(tree, os.path.join(work, "tools.img"))


def _leave_out_the_initramfs(tree, initrd):
    """Each file the initramfs has (the guest sees it already: /init lays this image *over*
    the initramfs's /usr, so a duplicate would shadow the initramfs's sourceless bytecode
    with source compiled on every start) is removed from the tree, and a module whose .pyc
    the initramfs has."""
    have = read_cpio_names(initrd)
    for dirpath, dirs, files in os.walk(tree):
        rel = os.path.relpath(dirpath, tree)
        for f in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            r = os.path.normpath(os.path.join(rel, f))
            if r in have or (r.endswith(".py") and r + "c" in have):
                os.unlink(os.path.join(dirpath, f))


def _precompile(tree, say):
    """Byte-compile the image's Python with the host's python3.11 when there is one (/usr is
    read-only in the guest, so bytecode not shipped would be compiled again, under TCG, on
    every start of pip). Hash-checked, unchecked: the image never changes under it."""
    host = shutil.which("python3.11", path="/usr/bin:/bin:/usr/local/bin")
    if not host:
        return
    say("byte-compiling the tools' Python")
    dirs = [d for d in (os.path.join(tree, "usr", "lib", "python3"), os.path.join(tree, "usr", "lib", "python3.11"))
            if os.path.isdir(d)]
    if dirs:
        subprocess.run([host, "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash",
                        *dirs], capture_output=True, timeout=900)


def mkfs(tree, out):
    """`tree` as an ext4 image without a journal (read-only in the guest), sized to fit,
    written by mke2fs -d as an ordinary user."""
    mke2fs = shutil.which("mke2fs", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not mke2fs:
        raise ImageError("mke2fs is not installed (apt-get install e2fsprogs): the VM tier writes "
                         "the guest's tools into an ext4 image with it")
    size, inodes = 0, 0
    for dirpath, dirs, files in os.walk(tree):
        inodes += len(dirs) + len(files)
        for f in files:
            try:
                size += (os.lstat(os.path.join(dirpath, f)).st_size + 4095) // 4096 * 4096
            except OSError:
                pass
    blocks = (size * 12 // 10 + inodes * 512 + (32 << 20)) // 4096
    r = subprocess.run([mke2fs, "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-b", "4096", "-m", "0",
                        "-N", str(inodes + 4096), "-L", "envgit-tools", "-E", "root_owner=0:0",
                        "-d", tree, "-r", "1", out, str(blocks)],
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise ImageError(f"mke2fs failed: {r.stderr.strip()[-300:]}")
