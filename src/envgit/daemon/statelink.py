"""A project whose state lives outside it (paths.external_state: a host whose steps run with
Landlock) keeps `.envgit` in it as a symlink to there, for the person to find it by. A step can
remove or replace the link (it can write the project) though not reach what it names, and can
change the modes of what the link leads to (Landlock has no right for chmod). So before and after
every step: whatever stands at `.envgit` that is not the link is moved aside, under a name the
person sees, the link made again, and the state directory, its journal and its socket get back
the modes that keep them the person's alone.
"""

import os
import stat

from ..paths import STATE_DIR

PRIVATE = {"": 0o700, "journal.sqlite": 0o600, "daemon.sock": 0o600}


def repair(project, step) -> str | None:
    """Put the link and the modes back if a step changed them; a line saying what was done,
    or None. `step`: the step that ended, or None before one begins."""
    if not project.state_is_outside:
        return None                                  # the state is inside: nothing to keep
    said = _modes(project.state)
    link = os.path.join(project.root, STATE_DIR)
    try:
        if os.readlink(link) == project.state:
            return said
    except OSError:
        pass                                         # gone, or not a link
    moved = None
    try:
        if os.path.lexists(link):
            tag = f"step-{step}" if step is not None else "a-step"
            moved = os.path.join(project.root, f"{STATE_DIR}-left-by-{tag}")
            n = 1
            while os.path.lexists(moved):
                n += 1
                moved = os.path.join(project.root, f"{STATE_DIR}-left-by-{tag}-{n}")
            os.rename(link, moved)
        os.symlink(project.state, link)
    except OSError as e:     # the project made unwritable to the daemon: the state is found by path
        return (f"could not make {link} a link to this project's state again ({e.strerror}); "
                f"envgit still finds it at {project.state}")
    return (f"changed {link}, the link to this project's state ({project.state}); it is a link "
            "again" + (f", and what the step left there is at {moved}" if moved else ""))


def _modes(state) -> str | None:
    changed = []
    for name, mode in PRIVATE.items():
        path = os.path.join(state, name) if name else state
        try:
            st = os.lstat(path)
            if stat.S_IMODE(st.st_mode) != mode and not stat.S_ISLNK(st.st_mode):
                os.chmod(path, mode)
                changed.append(path)
        except OSError:
            pass
    return f"gave {', '.join(changed)} back their private modes (a step had changed them)" if changed else None
