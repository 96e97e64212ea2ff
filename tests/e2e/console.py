#!/usr/bin/env python3
"""Drives the web console (served at <base-url>/console/) through an owner's work in
Chromium: sign in, create an environment, import an archive, build, edit with a conflicting
save, build again, compare versions 1 and 2, activate version 1, run a command in a
session's terminal, end the session, delete the environment.

It fails on any console error or uncaught page error, and on any request to another origin.
A screenshot of each page goes into --screenshots. It needs a running server (it starts
none) and the Python `playwright` package with a Chromium (by default /usr/bin/chromium;
Playwright's own browsers are not needed).

    python3 tests/e2e/console.py --base-url http://127.0.0.1:8080 --token tok-acme --screenshots /tmp/shots

With --token '' (the default) it signs in without a token, for a server with tokens off.
"""

import argparse
import io
import json
import re
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright, expect

PYPROJECT = """[project]
name = "console-check"
version = "0.1.0"
requires-python = ">=3.8"
dependencies = ["six==1.16.0"]
"""

MAIN_PY = """import six

print("six", six.__version__)
"""


def project_archive() -> bytes:
    """A tar.gz with one wrapping directory, as most archives have."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in [("pyproject.toml", PYPROJECT), ("main.py", MAIN_PY)]:
            data = text.encode()
            info = tarfile.TarInfo(f"console-check/{name}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Failures:
    def __init__(self, origin: str):
        self.origin = origin
        self.errors: list[str] = []
        # Network log lines the browser prints for answers the test asks for on purpose.
        self.expected_statuses: list[tuple[int, str]] = []

    def expect_status(self, status: int, url_part: str):
        self.expected_statuses.append((status, url_part))

    def on_console(self, message):
        if message.type != "error":
            return
        text = message.text
        where = (message.location or {}).get("url", "")
        found = re.match(r"Failed to load resource: the server responded with a status of (\d+)", text)
        if found:
            status = int(found.group(1))
            for expected, part in self.expected_statuses:
                if status == expected and part in where:
                    return
        self.errors.append(f"console error: {text} ({where})")

    def on_page_error(self, error):
        self.errors.append(f"page error: {error}")

    def on_request(self, request):
        url = request.url
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme in ("data", "blob", "about"):
            return
        parts = urllib.parse.urlsplit(url)
        http_scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        origin = f"{http_scheme}://{parts.netloc}"
        if origin != self.origin:
            self.errors.append(f"request to another origin: {url}")

    def check(self, step: str):
        if self.errors:
            raise AssertionError(f"after {step}:\n  " + "\n  ".join(self.errors))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--token", default="", help="an API token; empty: sign in without one")
    parser.add_argument("--screenshots", required=True, help="directory for the screenshots")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium to drive")
    parser.add_argument("--build-timeout", type=float, default=600, help="seconds a build may take")
    parser.add_argument("--headed", action="store_true", help="show the browser")
    parser.add_argument(
        "--require-file-diff",
        action="store_true",
        help="fail when the server cannot list a version's files (the diff then shows packages only)",
    )
    args = parser.parse_args()

    base = args.base_url.rstrip("/")
    parts = urllib.parse.urlsplit(base)
    origin = f"{parts.scheme}://{parts.netloc}"
    console = f"{base}/console/"
    shots = Path(args.screenshots)
    shots.mkdir(parents=True, exist_ok=True)
    archive_path = shots / "console-check.tar.gz"
    archive_path.write_bytes(project_archive())
    failures = Failures(origin)
    name = f"Console check {int(time.time())}"
    counter = [0]

    def api(method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """A call made outside the browser, as another client would (no Origin header)."""
        request = urllib.request.Request(f"{base}{path}", data=body, method=method, headers=headers or {})
        if args.token:
            request.add_header("Authorization", f"Bearer {args.token}")
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            return json.loads(text) if text else None

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=args.chromium, headless=not args.headed, args=["--no-sandbox"]
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.on("console", failures.on_console)
        page.on("pageerror", failures.on_page_error)
        page.on("request", failures.on_request)

        def shot(label: str, full_page: bool = True):
            counter[0] += 1
            page.wait_for_timeout(150)
            page.screenshot(path=str(shots / f"{counter[0]:02d}-{label}.png"), full_page=full_page)
            failures.check(label)
            print(f"ok  {counter[0]:02d} {label}", flush=True)

        def tab(label: str):
            page.get_by_role("navigation", name="Environment").get_by_role("link", name=label, exact=True).click()

        def fits_width():
            """At phone width nothing may make the page scroll sideways."""
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            if overflow > 0:
                failures.errors.append(f"{page.url}: {overflow} px wider than the window")

        def heading(text: str):
            expect(page.locator("h1")).to_contain_text(text)

        # 1. Sign in.
        page.goto(console)
        heading("Sign in")
        shot("signin")
        if args.token:
            page.get_by_label("API token").fill(args.token)
        else:
            page.get_by_label("This server has tokens off").check()
        page.get_by_role("button", name="Sign in").click()
        heading("Environments")
        shot("environments")

        # 2. Create an environment.
        page.get_by_label("Name", exact=True).fill(name)
        page.get_by_label("Entry command (optional)").fill("python3 main.py")
        page.get_by_role("button", name="Create environment").click()
        heading(name)
        env_id = page.url.rsplit("/", 1)[-1]
        assert env_id.startswith("henv_"), page.url
        shot("environment-new")

        # 3. Import the archive by dropping it on the drop zone.
        tab("Files")
        heading(f"Files of {name}")
        data = list(archive_path.read_bytes())
        page.evaluate(
            """(bytes) => {
                const file = new File([new Uint8Array(bytes)], 'console-check.tar.gz', { type: 'application/gzip' });
                const transfer = new DataTransfer();
                transfer.items.add(file);
                const zone = document.getElementById('dropzone');
                zone.dispatchEvent(new DragEvent('dragenter', { dataTransfer: transfer, bubbles: true, cancelable: true }));
                zone.dispatchEvent(new DragEvent('dragover', { dataTransfer: transfer, bubbles: true, cancelable: true }));
                zone.dispatchEvent(new DragEvent('drop', { dataTransfer: transfer, bubbles: true, cancelable: true }));
            }""",
            data,
        )
        expect(page.get_by_text("Imported 2 files")).to_be_visible()
        shot("import-done")
        page.get_by_role("button", name="Show the files").click()
        expect(page.get_by_role("link", name="main.py")).to_be_visible()
        expect(page.get_by_role("link", name="pyproject.toml")).to_be_visible()
        shot("files")

        def build(expected_version: int):
            tab("Overview")
            heading(name)
            page.get_by_role("button", name="Start a build").click()
            heading(f"Build of version {expected_version}")
            expect(page.locator(".build-progress")).to_contain_text("Building", timeout=10_000)
            shot(f"build-{expected_version}-running", full_page=False)
            expect(page.locator("#build-done")).to_be_visible(timeout=args.build_timeout * 1000)
            expect(page.locator("#build-status")).to_have_text("ready")
            expect(page.locator("#build-log")).not_to_be_empty()
            packages = page.locator("section").filter(has=page.get_by_role("heading", name="Packages installed"))
            expect(packages).to_contain_text("six")
            shot(f"build-{expected_version}-ready")

        # 4. Build version 1, following its log.
        build(1)

        # 5. Edit main.py; a save over another writer's change is refused, then one succeeds.
        tab("Files")
        page.get_by_role("link", name="main.py").click()
        heading("main.py")
        editor = page.get_by_label("Contents")
        expect(editor).to_have_value(MAIN_PY)
        api(
            "PUT",
            f"/v1/environments/{env_id}/files/main.py",
            MAIN_PY.replace("six", "six ").encode(),
            {"Content-Type": "application/octet-stream"},
        )
        failures.expect_status(412, "/files/main.py")
        editor.fill(MAIN_PY + 'print("edited in the console")\n')
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator(".conflict")).to_contain_text("Not saved")
        expect(page.locator(".conflict")).to_contain_text("precondition_failed")
        shot("edit-conflict")
        page.get_by_role("button", name=re.compile("Reload the file")).click()
        editor = page.get_by_label("Contents")
        expect(editor).to_have_value(MAIN_PY.replace("six", "six "))
        edited = MAIN_PY + 'print(6 * 7)\n'
        editor.fill(edited)
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.get_by_text("Saved (")).to_be_visible()
        shot("edit-saved")
        # And the project's dependency, upgraded, in the same editor.
        tab("Files")
        page.get_by_role("link", name="pyproject.toml").click()
        heading("pyproject.toml")
        editor = page.get_by_label("Contents")
        expect(editor).to_have_value(PYPROJECT)
        editor.fill(PYPROJECT.replace("six==1.16.0", "six==1.17.0"))
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.get_by_text("Saved (")).to_be_visible()

        # 6. Build version 2.
        build(2)

        # 7. Compare versions 1 and 2.
        tab("Builds & versions")
        heading(f"Versions of {name}")
        page.get_by_label("From").select_option("1")
        page.get_by_label("To").select_option("2")
        page.get_by_role("button", name="Compare").click()
        heading("Version 1 → version 2")
        files = page.locator("#diff-files")
        expect(files.locator("table, #diff-files-unavailable")).to_be_visible(timeout=30_000)
        if files.locator("#diff-files-unavailable").count():
            message = "the server lists no version's files: the diff shows packages only"
            if args.require_file_diff:
                raise AssertionError(message)
            print(f"note: {message}", flush=True)
        else:
            for changed in ["main.py", "pyproject.toml"]:
                row = files.locator("tr").filter(has_text=changed)
                expect(row).to_contain_text("changed")
        upgraded = page.locator("#diff-packages tr").filter(has_text="six")
        expect(upgraded).to_contain_text("upgraded")
        expect(upgraded).to_contain_text("1.16.0")
        expect(upgraded).to_contain_text("1.17.0")
        shot("diff-1-2")

        # 8. Activate version 1 (roll back).
        tab("Builds & versions")
        page.get_by_role("button", name="Activate v1…").click()
        page.get_by_role("button", name="Yes, make v1 active").click()
        row = page.locator("tbody tr").filter(has=page.get_by_role("link", name="v1", exact=True))
        expect(row).to_contain_text("active")
        shot("versions-v1-active")

        # 9. A session on it, and a terminal.
        tab("Overview")
        heading(name)
        expect(page.locator("dl.facts")).to_contain_text("v1")
        page.get_by_role("button", name="New session").click()
        heading("Session sess_")
        session_id = page.url.rsplit("/", 1)[-1]
        expect(page.locator("dl.facts")).to_contain_text("version 1")
        page.get_by_role("button", name="Open terminal").click()
        status = page.locator("#terminal-status")
        expect(status).to_contain_text("Connected", timeout=30_000)
        page.locator("#terminal").click()
        page.keyboard.type('python3 -c "print(6*7)"')
        page.keyboard.press("Enter")
        page.wait_for_function(
            "() => /^42\\s*$/m.test(document.querySelector('#terminal .xterm-rows').innerText)", timeout=30_000
        )
        size_before = status.inner_text()
        page.locator("#terminal-status").scroll_into_view_if_needed()
        shot("terminal-42", full_page=False)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_function(
            "(before) => { const t = document.querySelector('#terminal-status').innerText;"
            " return t.includes('Connected') && t !== before; }",
            arg=size_before,
            timeout=10_000,
        )
        # The server's terminal has the new size: `stty size` prints "rows cols".
        cols, rows = re.search(r"(\d+)×(\d+)$", status.inner_text().strip()).groups()
        page.locator("#terminal").click()
        page.keyboard.type("stty size")
        page.keyboard.press("Enter")
        page.wait_for_function(
            "(size) => new RegExp('^' + size + '\\s*$', 'm').test(document.querySelector('#terminal .xterm-rows').innerText)",
            arg=f"{rows} {cols}",
            timeout=10_000,
        )
        page.locator("#terminal-status").scroll_into_view_if_needed()
        fits_width()
        shot("terminal-phone-width", full_page=False)
        page.set_viewport_size({"width": 1280, "height": 900})
        # Ctrl-C reaches the command on the terminal: a long sleep is interrupted, and the
        # shell's next command runs.
        page.locator("#terminal").click()
        page.keyboard.type("sleep 300")
        page.keyboard.press("Enter")
        time.sleep(0.5)
        page.keyboard.press("Control+C")
        page.keyboard.type("echo after-$((40+2))")
        page.keyboard.press("Enter")
        page.wait_for_function(
            "() => /^after-42\\s*$/m.test(document.querySelector('#terminal .xterm-rows').innerText)",
            timeout=30_000,
        )
        page.keyboard.type("exit 3")
        page.keyboard.press("Enter")
        expect(page.locator("#terminal-exit")).to_contain_text("exited with status 3", timeout=30_000)
        shot("terminal-exited", full_page=False)

        # 10. End the session.
        page.get_by_role("button", name="End session…").click()
        page.get_by_role("button", name="End it now").click()
        expect(page.locator("#session-status")).to_have_text("ended")
        shot("session-ended")
        assert api("GET", f"/v1/sessions/{session_id}")["status"] == "ended"

        # The other pages: sessions, harnesses, usage, and two at phone width.
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Sessions").click()
        heading("Sessions")
        shot("sessions")
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Harnesses").click()
        heading("Harnesses")
        shot("harnesses")
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
        heading("Usage and quotas")
        shot("usage")
        page.set_viewport_size({"width": 390, "height": 844})
        for label, route, title in [
            ("environments-phone", "#/environments", "Environments"),
            ("environment-phone", f"#/environments/{env_id}", name),
            ("session-phone", f"#/sessions/{session_id}", "Session sess_"),
            ("usage-phone", "#/usage", "Usage and quotas"),
        ]:
            page.goto(f"{console}{route}")
            heading(title)
            page.wait_for_load_state("networkidle")
            fits_width()
            shot(label)
        page.goto(f"{console}#/environments/{env_id}/versions")
        heading(f"Versions of {name}")
        fits_width()
        shot("versions-phone")
        page.goto(f"{console}#/environments/{env_id}/files/main.py")
        heading("main.py")
        expect(page.get_by_label("Contents")).to_have_value(edited)
        fits_width()
        shot("file-phone")
        page.set_viewport_size({"width": 1280, "height": 900})

        # 11. Delete the environment, through its confirmation step.
        page.goto(f"{console}#/environments/{env_id}")
        heading(name)
        page.get_by_role("button", name="Delete environment…").click()
        page.get_by_label(f"Type “{name}” to confirm").fill(name)
        page.get_by_role("button", name="Delete permanently").click()
        heading("Environments")
        expect(page.get_by_role("link", name=name)).to_have_count(0)
        shot("deleted")

        failures.check("the end")
        browser.close()
    print("console test passed", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (AssertionError, urllib.error.URLError) as error:
        print(f"FAILED: {error}", file=sys.stderr)
        sys.exit(1)
