"""The page of an install step (`envgit ui`, ui/stepview.py, view/generated.py): a generated
directory (a virtualenv, node_modules, build output, what .gitignore ignores) is one line with
its count and size, its files loaded when it is opened; the requests come before the diffs; the
page of a 1,000-file step stays small. The real `envgit ui`, a real step, Debian's Chromium."""

import re

import pytest

from uikit import UI, browser, have_browser, wait_for

needs_browser = pytest.mark.skipif(not have_browser(), reason="Chromium and chromedriver are not installed "
                                   "(dev/run test installs them)")
SITE = ".venv/lib/python3.13/site-packages"
PAGE_MAX = 200_000


def _install_step(proj):
    """One step that writes 1,000 files under a virtualenv's site-packages (50 packages of 20
    modules), an `out/` the project's .gitignore ignores, and two files of the project."""
    with open(proj.root / ".gitignore", "a") as f:
        f.write("/out/\n")
    proj.run(f"mkdir -p {SITE} && cd {SITE} && for p in $(seq 50); do mkdir pkg$p && "
             "for m in $(seq 20); do printf 'value = %d\\n' $m > pkg$p/mod$m.py; done; done && cd - >/dev/null && "
             "mkdir -p out && echo built > out/app.js && "
             "printf 'import pkg1\\nprint(pkg1)\\n' > app.py && echo 'pkg1==1.0' > requirements.txt",
             check=True, timeout=300)


@needs_browser
def test_an_install_steps_page_folds_the_venv_and_opens_it_on_asking(proj):
    _install_step(proj)
    with UI(proj) as ui, browser() as b:
        status, _, body = ui.get("/steps/1", timeout=120)
        assert status == 200 and len(body.encode()) < PAGE_MAX, len(body.encode())
        b.get(ui.link("/steps/1"))
        wait_for(lambda: "Step 1" in b.find_element("tag name", "h1").text, what="the step page")
        assert len(b.page_source.encode()) < PAGE_MAX
        folded = {d.find_element("css selector", "summary code").text: d
                  for d in b.find_elements("css selector", "details.folded")}
        assert set(folded) == {".venv", "out"}, list(folded)
        line = folded[".venv"].find_element("tag name", "summary").text
        assert re.search(r"\b1000 files, \d", line), line
        assert "1 file," in folded["out"].find_element("tag name", "summary").text
        diffs = " ".join(p.text for p in b.find_elements("css selector", "details.file pre.diff"))
        assert "+import pkg1" in diffs and "+pkg1==1.0" in diffs
        assert len(b.find_elements("css selector", "details.file")) == 2      # app.py, requirements.txt
        # the requests (and asks) come before the diffs
        assert b.execute_script(
            "return document.querySelector('section.requests').compareDocumentPosition("
            "document.querySelector('section.files')) & Node.DOCUMENT_POSITION_FOLLOWING") != 0
        href = folded[".venv"].find_element("css selector", ".part-body a").get_attribute("href")
        # opened, the folded line loads its files from the page
        folded[".venv"].find_element("tag name", "summary").click()
        wanted = f"{SITE}/pkg1/mod3.py"
        wait_for(lambda: wanted in folded[".venv"].text, what="the venv's files in the opened line")
        assert "+value = 3" in folded[".venv"].text
        # without JavaScript, the line's link is the same list on a page of its own
        assert "under=.venv" in href
        status, _, under = ui.get("/steps/1?under=.venv", timeout=120)
        assert status == 200 and wanted in under and "<code>app.py</code>" not in under
