"""The VM tier's guest: a Debian kernel and an initramfs root built from Debian packages on
first use, cached per machine under $XDG_CACHE_HOME/envgit/vm/<content hash>/ (~/.cache/...).

Nothing comes from outside the package registries: `apt-get download` fetches the packages
(any user can), `dpkg-deb -x` unpacks them, and the root is written as a cpio archive here.
The root is small on purpose (guests run under TCG on hosts without working KVM): busybox,
Python 3.11 with its standard library (byte-compiled on the host when a python3.11 is there:
compiling under TCG costs seconds per module), the virtio modules, the guest agent.

An image's directory is named by its recipe (the agent's source, the init script, the package
names and build steps: recipe_digest) and the package versions it was built from, so a new
agent builds a new image beside the old one.
"""

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

IMAGE_FORMAT = 5
KERNEL_META = "linux-image-cloud-amd64"
PACKAGES = ("busybox-static", "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
            "libc6", "zlib1g", "libexpat1", "libffi8", "libssl3")
# loaded in this order by /init (the cloud kernel builds them as modules)
MODULES = ("virtio_ring", "virtio", "virtio_mmio", "virtio_console", "virtio_balloon", "virtio_blk",
           "overlay")
# what the guest never needs: left out of the archive (size is boot time and RAM under TCG)
PRUNE = ("usr/share", "usr/lib/python3.11/test", "usr/lib/python3.11/ensurepip",
         "usr/lib/python3.11/idlelib", "usr/lib/python3.11/tkinter", "usr/lib/python3.11/lib2to3",
         "usr/lib/python3.11/pydoc_data", "usr/lib/python3.11/turtledemo",
         "usr/lib/python3.11/config-3.11-x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/gconv",
         "usr/lib/python3.11/distutils", "usr/lib/python3.11/unittest", "sbin/ldconfig",
         "usr/bin/pydoc3.11", "etc/ld.so.conf.d", "usr/lib/python3.11/__phello__")
AGENT_PORT = "envgit.agent"

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /tmp /run /root
mount -t devpts -o ptmxmode=0666,newinstance devpts /dev/pts
ln -sf /dev/pts/ptmx /dev/ptmx
mount -t tmpfs tmp /tmp
mount -t tmpfs shm /dev/shm
for m in %(modules)s; do insmod /lib/modules/$m.ko 2>/dev/null; done
# the tools (toolimage.py): a read-only drive laid over /usr, its files before the initramfs's
if grep -q envgit.tools /proc/cmdline; then
  for i in $(seq 1 100); do [ -b /dev/vda ] && break; sleep 0.02; done
  mkdir -p /tools
  if mount -t ext4 -o ro /dev/vda /tools && mount -t overlay tools -o lowerdir=/tools/usr:/usr /usr; then
    echo "envgit-vm: tools on /usr"
  else
    echo "envgit-vm: the tool drive did not mount"
  fi
fi
ip link set lo up
hostname envgit-vm
root=$(sed -n 's/.*envgit.root=\([0-9a-f]*\).*/\1/p' /proc/cmdline)
for i in $(seq 1 200); do
  for p in /sys/class/virtio-ports/*; do
    if [ "$(cat $p/name 2>/dev/null)" = "%(port)s" ]; then
      port=/dev/$(basename $p)
    fi
  done
  [ -n "$port" ] && [ -e "$port" ] && break
  sleep 0.05
done
echo "envgit-vm: agent on $port"
cd /
exec /usr/bin/python3.11 -S -B /envgit/agent.py "$root" "$port"
"""


class ImageError(Exception):
    pass


def cache_root() -> str:
    if os.environ.get("ENVGIT_VM_CACHE"):       # one image for many homes (the tests)
        return os.environ["ENVGIT_VM_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "envgit", "vm")


def _apt(*args) -> str:
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImageError(f"{args[0]} failed: {e} (the VM tier builds its guest from Debian packages: "
                         "apt-get and dpkg-deb are needed)") from None
    if r.returncode:
        raise ImageError(f"{' '.join(args[:2])} failed: {r.stderr.strip()[-300:]}")
    return r.stdout


def _candidate(pkg) -> str:
    out = _apt("apt-cache", "policy", pkg)
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            v = line.split(":", 1)[1].strip()
            if v and v != "(none)":
                return v
    raise ImageError(f"no installable version of {pkg} (apt-get update?)")


def _kernel_package() -> str:
    out = _apt("apt-cache", "depends", KERNEL_META)
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split(":", 1)[1].strip()
    raise ImageError(f"{KERNEL_META} names no kernel package")


def wanted() -> dict:
    """The packages and versions the image is built from (asked of apt's lists only)."""
    pkgs = (_kernel_package(),) + PACKAGES
    return {p: _candidate(p) for p in pkgs}


def recipe_digest() -> str:
    """What the image is built by here: the build steps, the package names, the agent."""
    h = hashlib.sha256()
    h.update(f"format {IMAGE_FORMAT}\n{KERNEL_META} {PACKAGES} {MODULES} {PRUNE}\n".encode())
    here = os.path.dirname(__file__)
    for name in ("agent.py", "wire.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    h.update(INIT.encode())
    return h.hexdigest()[:16]


def _versions_digest(versions: dict) -> str:
    return hashlib.sha256("".join(f"{p}={v}\n" for p, v in sorted(versions.items())).encode()).hexdigest()[:8]


class Image:
    def __init__(self, path):
        self.path = path
        self.kernel = os.path.join(path, "vmlinux")
        self.initrd = os.path.join(path, "initrd.cpio")

    def ok(self):
        return os.path.isfile(os.path.join(self.path, "ready"))


def ensure(progress=None) -> Image:
    """The cached image for this machine, built first when missing (a few seconds to a minute:
    `progress(text)` is told each stage). An existing image is found without asking apt when
    it was built by the same recipe (no apt call per daemon start; ENVGIT_VM_REBUILD=1 asks
    apt for newer packages)."""
    root = cache_root()
    say = progress or (lambda text: None)
    recipe = recipe_digest()
    try:
        cached = sorted((e for e in os.listdir(root)
                         if e.startswith(recipe + "-") and Image(os.path.join(root, e)).ok()),
                        key=lambda e: os.stat(os.path.join(root, e, "ready")).st_mtime)
    except FileNotFoundError:
        cached = []
    if cached and not os.environ.get("ENVGIT_VM_REBUILD"):
        img = Image(os.path.join(root, cached[-1]))
        try:
            os.utime(os.path.join(img.path, "ready"))     # in use: kept by _drop_old
        except OSError:
            pass
        return img
    say("resolving the guest's Debian packages")
    versions = wanted()
    img = Image(os.path.join(root, f"{recipe}-{_versions_digest(versions)}"))
    if img.ok():
        return img
    os.makedirs(root, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=root)
    try:
        _build(work, versions, say)
        try:
            os.rename(work, img.path)
        except OSError:                 # another process built it meanwhile
            if not img.ok():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _drop_old(root, keep=os.path.basename(img.path))
    return img


def _drop_old(root, keep, older_than_s=86400):
    """Images of other recipes or versions not built or used for a day: each is ~90 MB, and a
    new envgit or Debian update builds a new one beside them. (A running guest keeps its kernel
    and root in its RAM: removing the files under it is harmless.)"""
    now = time.time()
    for e in os.listdir(root):
        p = os.path.join(root, e)
        if e == keep or not os.path.isdir(p):
            continue
        try:
            age = now - os.stat(os.path.join(p, "ready") if Image(p).ok() else p).st_mtime
        except OSError:
            continue
        if age > older_than_s:
            shutil.rmtree(p, ignore_errors=True)


def _build(work, versions, say):
    debs = os.path.join(work, "debs")
    tree = os.path.join(work, "root")
    os.makedirs(debs)
    os.makedirs(tree)
    t0 = time.monotonic()
    say(f"downloading {len(versions)} Debian packages (kernel, busybox, python3.11)")
    _apt("sh", "-c", 'cd "$1" && shift && exec apt-get download -q "$@"', "sh", debs,
         *(f"{p}={v}" for p, v in versions.items()))
    kernel_pkg = next(p for p in versions if p.startswith("linux-image-"))
    kdir = os.path.join(work, "kernel")
    for name in sorted(os.listdir(debs)):
        deb = os.path.join(debs, name)
        say(f"unpacking {name.split('_')[0]}")
        _apt("dpkg-deb", "-x", deb, kdir if name.startswith(kernel_pkg + "_") else tree)
    release = kernel_pkg[len("linux-image-"):]
    say("extracting the kernel")
    _extract_vmlinux(os.path.join(kdir, "boot", f"vmlinuz-{release}"), os.path.join(work, "vmlinux"))
    mods = os.path.join(tree, "lib", "modules")
    os.makedirs(mods, exist_ok=True)
    found = {}
    for dirpath, _, files in os.walk(os.path.join(kdir, "lib", "modules")):
        for f in files:
            if f.endswith(".ko") and f[:-3] in MODULES:
                found[f[:-3]] = os.path.join(dirpath, f)
    missing = [m for m in MODULES if m not in found]
    if missing:
        raise ImageError(f"the kernel package {kernel_pkg} has no module {', '.join(missing)}")
    for m, p in found.items():
        shutil.copy(p, os.path.join(mods, m + ".ko"))
    for rel in PRUNE:
        p = os.path.join(tree, rel)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)
    here = os.path.dirname(__file__)
    os.makedirs(os.path.join(tree, "envgit"))
    for name in ("agent.py", "wire.py"):
        shutil.copy(os.path.join(here, name), os.path.join(tree, "envgit", name))
    for d in ("proc", "sys", "dev", "tmp", "run", "root", "etc", "bin", "sbin"):
        os.makedirs(os.path.join(tree, d), exist_ok=True)
    if not os.path.exists(os.path.join(tree, "bin", "busybox")):
        raise ImageError("busybox-static unpacked no /bin/busybox")
    for name, target in (("python3", "python3.11"), ("python", "python3.11")):
        link = os.path.join(tree, "usr", "bin", name)
        if not os.path.lexists(link):
            os.symlink(target, link)
    with open(os.path.join(tree, "init"), "w") as f:
        f.write(INIT % {"modules": " ".join(MODULES), "port": AGENT_PORT})
    os.chmod(os.path.join(tree, "init"), 0o755)
    with open(os.path.join(tree, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    with open(os.path.join(tree, "etc", "group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    with open(os.path.join(tree, "etc", "hosts"), "w") as f:
        f.write("127.0.0.1 localhost envgit-vm\n::1 localhost\n")
    _precompile(tree, say)
    merge_usr(tree)
    say("writing the initramfs")
    write_cpio(tree, os.path.join(work, "initrd.cpio"))
    shutil.rmtree(tree)
    shutil.rmtree(kdir)
    shutil.rmtree(debs)
    with open(os.path.join(work, "ready"), "w") as f:
        f.write("".join(f"{p}={v}\n" for p, v in sorted(versions.items())))
        f.write(f"built in {time.monotonic() - t0:.1f} s\n")


def merge_usr(tree):
    """/bin, /sbin, /lib and /lib64 as links into /usr, as on an installed Debian 12 (its
    packages still ship files under /bin and /lib): the tool image, laid over /usr, then
    holds every program and library of its packages, and its bash or coreutils come before
    busybox's applets, which /init links into the same /usr/bin."""
    for d in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        src = os.path.join(tree, d)
        if os.path.isdir(src) and not os.path.islink(src):
            _move_into(src, os.path.join(tree, "usr", d))
            shutil.rmtree(src)
            os.symlink(f"usr/{d}", src)


def _move_into(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if not os.path.lexists(d):
            os.rename(s, d)
        elif os.path.isdir(s) and not os.path.islink(s) and os.path.isdir(d) and not os.path.islink(d):
            _move_into(s, d)
        # else: the same name under /usr too; /usr's is kept


def read_cpio_names(path) -> set:
    """The names in a newc cpio archive (write_cpio's)."""
    names = set()
    with open(path, "rb") as f:
        while True:
            hdr = f.read(110)
            if len(hdr) < 110 or hdr[:6] != b"070701":
                break
            size, namesize = int(hdr[54:62], 16), int(hdr[94:102], 16)
            name = f.read(namesize)[:-1].decode(errors="surrogateescape")
            f.seek((4 - (110 + namesize) % 4) % 4, 1)
            if name == "TRAILER!!!":
                break
            names.add(name)
            f.seek(size + (4 - size % 4) % 4, 1)
    return names


def _precompile(tree, say):
    """Byte-compile the guest's standard library with the host's own Python 3.11 when there is
    one (the same bytecode: the magic number is the version's); else the guest compiles on use."""
    host = shutil.which("python3.11", path="/usr/bin:/bin:/usr/local/bin")
    if not host:
        return
    say("byte-compiling the guest's Python")
    lib = os.path.join(tree, "usr", "lib", "python3.11")
    r = subprocess.run([host, "-m", "compileall", "-q", "-b", "-j0", lib, os.path.join(tree, "envgit")],
                       capture_output=True, timeout=600)
    if r.returncode:
        return
    # Sourceless: a .pyc beside each module (`-b`) and no .py, which halves the stdlib's share
    # of the root (RAM the guest holds, so what every memory snapshot copies); the agent's
    # own source stays, as /init runs it by name.
    for dirpath, dirs, files in os.walk(lib):
        for f in files:
            if f.endswith(".py") and f + "c" in files:
                os.unlink(os.path.join(dirpath, f))
        if "__pycache__" in dirs:
            shutil.rmtree(os.path.join(dirpath, "__pycache__"))
            dirs.remove("__pycache__")


def _extract_vmlinux(bzimage, out):
    """The uncompressed ELF kernel out of a bzImage (for QEMU's PVH boot on `microvm`), as the
    kernel tree's scripts/extract-vmlinux does: find the payload's compression magic and
    decompress from there. Debian's kernels are LZ4 (decompressed with the `lz4` tool when
    present), XZ or gzip (the standard library)."""
    with open(bzimage, "rb") as f:
        data = f.read()
    import gzip
    import lzma
    for magic, how in ((b"\x02\x21\x4c\x18", "lz4"), (b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b\x08", "gzip")):
        start = 0
        while True:
            i = data.find(magic, start)
            if i < 0:
                break
            start = i + 1
            try:
                if how == "xz":
                    raw = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[i:])
                elif how == "gzip":
                    raw = gzip.GzipFile(fileobj=__import__("io").BytesIO(data[i:])).read()
                else:
                    lz4 = shutil.which("lz4", path="/usr/bin:/bin")
                    if not lz4:
                        raise ImageError("the kernel is LZ4-compressed and no lz4 tool is installed "
                                         "(apt-get install lz4)")
                    r = subprocess.run([lz4, "-dc"], input=data[i:], capture_output=True, timeout=120)
                    raw = r.stdout
            except ImageError:
                raise
            except Exception:
                continue
            if raw[:4] == b"\x7fELF":
                with open(out, "wb") as f:
                    f.write(raw)
                return
    raise ImageError(f"no kernel found inside {bzimage}")


def write_cpio(tree, out):
    """`tree` as a newc cpio archive (the initramfs format), every entry owned by root."""
    ino = [1]

    def entry(f, name, st_mode, data=b"", nlink=1):
        ino[0] += 1
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            ino[0], st_mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0))
        f.write(hdr.encode() + name.encode() + b"\0")
        f.write(b"\0" * ((4 - (110 + len(name) + 1) % 4) % 4))
        f.write(data)
        f.write(b"\0" * ((4 - len(data) % 4) % 4))

    with open(out, "wb") as f:
        for dirpath, dirs, files in os.walk(tree):
            dirs.sort()
            rel = os.path.relpath(dirpath, tree)
            if rel != ".":
                st = os.lstat(dirpath)
                entry(f, rel, stat.S_IFDIR | (st.st_mode & 0o7777), nlink=2)
            for name in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(dirpath, d))):
                p = os.path.join(dirpath, name)
                r = os.path.normpath(os.path.join(rel, name))
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    entry(f, r, st.st_mode, os.readlink(p).encode())
                elif stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as g:
                        entry(f, r, st.st_mode, g.read())
        entry(f, "TRAILER!!!", 0)


if __name__ == "__main__":
    img = ensure(lambda t: print("envgit vm:", t, file=sys.stderr))
    print(img.path)
