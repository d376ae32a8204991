"""A project whose state lives outside it (paths.external_state: a host whose steps run with
Landlock) keeps `.envgit` in it as a symlink to there, for `envgit` commands to find the
project by. A step can remove or replace the link (it can write the project) though not reach
what it names; whatever stands there at a step's end that is not the link is moved aside, under
a name the person sees, and the link made again, before anything else reads the project.
"""

import os

from ..paths import STATE_DIR


def repair(project, step) -> str | None:
    """Put the link back if a step changed it; a line saying what was done, or None."""
    if project.state == os.path.join(project.root, STATE_DIR):
        return None                                  # the state is inside: nothing to keep
    link = os.path.join(project.root, STATE_DIR)
    try:
        if os.readlink(link) == project.state:
            return None
    except OSError:
        pass                                         # gone, or not a link
    moved = None
    if os.path.lexists(link):
        moved = os.path.join(project.root, f"{STATE_DIR}-left-by-step-{step}")
        n = 1
        while os.path.lexists(moved):
            n += 1
            moved = os.path.join(project.root, f"{STATE_DIR}-left-by-step-{step}-{n}")
        os.rename(link, moved)
    os.symlink(project.state, link)
    return (f"changed {link}, the link to this project's state ({project.state}); "
            "it is a link again" + (f", and what the step left there is at {moved}" if moved else ""))
