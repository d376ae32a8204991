"""Red team, round 14: a step moves the person's keyboard focus from "Deny" to "Allow once".

When the asks panel is redrawn while a button in it has the focus, ui.js focuses the FIRST
button of the new panel: the first question's "Allow once". A step decides when the panel is
redrawn (it sends another asked-about request whenever it likes). A person answering with the
keyboard (the page is meant to be keyboard navigable) tabs to "Deny" on question 1; the step
sends request 2; the focus is now on "Allow once" of question 1, and the Enter meant for
"Deny" allows the request.

Oracle: the server's record (the POST the person meant to deny arrived)."""

import shutil
import threading
import time

import pytest

from gatekit import hostport, netproject, servers
from harness import attacker  # noqa: F401  (the fixture)
from uikit import UI, browser, have_browser, wait_for

pytestmark = [pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed"),
              pytest.mark.skipif(not have_browser(), reason="Chromium and chromedriver are not installed")]

ASK_API = ("irreversible:\n  - net: {host: \"*.example.test\", method: \"*\", path: \"/api/**\"}\n"
           "    action: ask\n    name: api-write\n")


@pytest.fixture
def world():
    with servers() as (git, stub):
        yield git, stub


def test_a_new_question_does_not_move_the_focus_to_allow(attacker, world):
    from selenium.webdriver.common.keys import Keys
    git, stub = world
    netproject(attacker, git, stub, ASK_API)
    api = hostport(stub, "stub.example.test")
    result = {}

    def step():
        result["r"] = attacker.run(
            f"curl -s -o /dev/null -X POST --data-binary one https://{api}/api/one & sleep 8; "
            f"curl -s -o /dev/null -X POST --data-binary two https://{api}/api/two & wait", timeout=120)
    with UI(attacker) as ui, browser() as b:
        b.get(ui.url)
        t = threading.Thread(target=step)
        t.start()
        try:
            deny = wait_for(lambda: b.find_element("css selector", 'button[data-answer="deny"]'),
                            timeout=40, what="question 1's Deny button")
            b.execute_script("arguments[0].focus()", deny)         # the person tabbed to Deny
            assert b.switch_to.active_element.get_attribute("data-answer") == "deny"
            wait_for(lambda: len(b.find_elements("css selector", "article.ask")) >= 2, timeout=40,
                     what="the step's second question")
            time.sleep(0.5)
            focused = b.switch_to.active_element.get_attribute("data-answer")
            b.switch_to.active_element.send_keys(Keys.ENTER)       # ... and presses Enter
            wait_for(lambda: "Question" in b.find_element("id", "flash").text, timeout=20, what="the answer")
            said = b.find_element("id", "flash").text
            for a in b.find_elements("css selector", 'button[data-answer="deny"]'):   # the rest: no
                try:
                    a.click()
                except Exception:
                    pass
        finally:
            t.join(150)
    posts = [q["path"] for q in stub.requests if q["method"] == "POST"]
    assert "/api/one" not in posts, (
        f"the person pressed Enter on Deny; a new question moved the focus to {focused!r} and the "
        f"page said {said!r}: the server received {posts}")
