"""The seccomp program, run through a small classic-BPF interpreter for each architecture it
knows (the adversarial tests run it for real on this machine's only): which calls it refuses,
with which errno, and that every jump lands inside the program."""

import errno
import struct

import pytest

from envgit.sandbox.seccomp import program

AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
O_CREAT, O_TMPFILE, O_WRONLY = 0o100, 0o20200000, 0o1

# (name -> syscall number, which argument is the mode, which the flags) per architecture
CALLS = {
    "x86_64": {"chmod": (90, 1, None), "fchmod": (91, 1, None), "fchmodat": (268, 2, None),
               "fchmodat2": (452, 2, None), "creat": (85, 1, None), "mkdir": (83, 1, None),
               "mkdirat": (258, 2, None), "mknod": (133, 1, None), "mknodat": (259, 2, None),
               "open": (2, 2, 1), "openat": (257, 3, 2)},
    "aarch64": {"fchmod": (52, 1, None), "fchmodat": (53, 2, None), "fchmodat2": (452, 2, None),
                "mkdirat": (34, 2, None), "mknodat": (33, 2, None), "openat": (56, 3, 2)},
}
OTHER = {"x86_64": {"getpid": 39, "ioctl": 16, "keyctl": 250, "openat2": 437, "io_uring_setup": 425},
         "aarch64": {"getpid": 172, "ioctl": 29, "keyctl": 219, "openat2": 437, "io_uring_setup": 425}}


def run(prog, arch, nr, args=(0,) * 6):
    """Evaluate `prog` on one seccomp_data; returns the action."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, *[a & (2**64 - 1) for a in args])
    ops = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    a, pc = 0, 0
    while True:
        assert 0 <= pc < len(ops), "a jump out of the program"
        code, jt, jf, k = ops[pc]
        if code == 0x20:
            a = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = a == k if code == 0x15 else a >= k if code == 0x35 else bool(a & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unknown op {code:#x}")


def _args(call, mode, flags=0):
    args = [0] * 6
    _, m, f = call
    args[m] = mode
    if f is not None:
        args[f] = flags
    return args


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_setuid_and_setgid_modes_are_refused(machine):
    prog, arch = program(machine), AUDIT[machine]
    for name, call in CALLS[machine].items():
        creates = O_CREAT | O_WRONLY if call[2] is not None else 0
        for mode in (0o4755, 0o2755, 0o6777, 0o104755):
            assert run(prog, arch, call[0], _args(call, mode, creates)) == ERRNO | errno.EPERM, (name, oct(mode))
        for mode in (0o755, 0o644, 0o1777, 0o100644):
            assert run(prog, arch, call[0], _args(call, mode, creates)) == ALLOW, (name, oct(mode))
        if call[2] is not None:
            # O_TMPFILE creates too; a mode without O_CREAT is ignored by the kernel
            assert run(prog, arch, call[0], _args(call, 0o4755, O_TMPFILE | O_WRONLY)) == ERRNO | errno.EPERM
            assert run(prog, arch, call[0], _args(call, 0o4755, O_WRONLY)) == ALLOW


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_other_calls(machine):
    prog, arch, nr = program(machine), AUDIT[machine], OTHER[machine]
    assert run(prog, arch, nr["getpid"]) == ALLOW
    assert run(prog, arch, nr["openat2"]) == ERRNO | errno.ENOSYS
    assert run(prog, arch, nr["io_uring_setup"]) == ERRNO | errno.ENOSYS
    assert run(prog, arch, nr["keyctl"]) == ERRNO | errno.EPERM
    assert run(prog, arch, nr["ioctl"], (1, 0x5412, 0, 0, 0, 0)) == ERRNO | errno.EPERM   # TIOCSTI
    assert run(prog, arch, nr["ioctl"], (1, 0x5401, 0, 0, 0, 0)) == ALLOW                 # TCGETS
    assert run(prog, 0x40000003, nr["getpid"]) == ERRNO | errno.EPERM                     # i386
    if machine == "x86_64":
        assert run(prog, arch, 0x40000000 + 39) == ERRNO | errno.EPERM                  # x32


def test_unknown_machine_has_no_filter():
    assert program("riscv64") is None
