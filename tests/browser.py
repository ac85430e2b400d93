"""A headless Chromium driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``), no extra
package: the tests that check the API page in a real browser use it.

Chromium reads the protocol's commands on its file descriptor 3 and writes answers and events on 4, each message
JSON ended by a NUL byte. :class:`Browser` starts it with the flags below (no sandbox, GPU, background networking,
component updates, sync or first-run pages; a user-data directory of its own), attaches to its page and records
every event; :meth:`Browser.requested_urls` lists every URL the page asked for, whether it was sent, refused by
the page's Content-Security-Policy or failed. Every wait is bounded; :meth:`Browser.close` kills the process.
"""
from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium-headless-shell", "chromium", "chromium-browser")
INSTALL_HINT = "no Chromium: apt-get install chromium-headless-shell (or chromium) to run the browser test"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
         "--disable-extensions", "--remote-debugging-pipe")

_MOVE_AND_EXEC = ("import os, sys; reads, writes = int(sys.argv[1]), int(sys.argv[2]); os.dup2(reads, 3); "
                  "os.dup2(writes, 4); os.close(reads); os.close(writes); os.execv(sys.argv[3], sys.argv[3:])")


def find_chromium() -> str | None:
    """The path of an installed Chromium (the headless shell first), or None."""
    return next((found for name in BINARIES if (found := shutil.which(name))), None)


def _above_4(fd: int) -> int:
    """``fd`` moved to a descriptor number above 4 (closing the original)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class BrowserError(RuntimeError):
    """The browser answered a command with an error, exited, or did not answer in time."""


class Browser:
    """A headless Chromium with one page attached (``session``); ``extra_flags`` are added to :data:`FLAGS`."""

    def __init__(self, binary: str, extra_flags: tuple[str, ...] = (), timeout_s: float = 30):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child's ends above 4, so that moving them to 3 and 4 overwrites neither
        to_browser_r, from_browser_w = (_above_4(to_browser_r), _above_4(from_browser_w))
        # a small launcher moves the pipe ends to the descriptors 3 and 4 the protocol names, then becomes Chromium
        command = [sys.executable, "-c", _MOVE_AND_EXEC, str(to_browser_r), str(from_browser_w), binary, *FLAGS,
                   f"--user-data-dir={self.profile}", *extra_flags, "about:blank"]
        self.process = subprocess.Popen(command, pass_fds=(to_browser_r, from_browser_w), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        try:
            targets = self.call("Target.getTargets")["targetInfos"]
            page = next(target for target in targets if target["type"] == "page")
            self.session = self.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})[
                "sessionId"]
            for domain in ("Page", "Network", "Runtime", "Log", "DOM"):
                self.call(f"{domain}.enable", session=self.session)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as stream:
            while chunk := stream.read(65536):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for message in messages:
                    self._messages.put(json.loads(message))
        self._messages.put(None)  # the browser closed its end

    def _take(self, deadline: float) -> dict[str, Any]:
        try:
            message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise BrowserError(f"the browser sent nothing for {self.timeout_s} s") from None
        if message is None:
            raise BrowserError(f"the browser exited (status {self.process.poll()})")
        return message

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result, recording the events that arrive meanwhile."""
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            command["sessionId"] = session
        os.write(self._to_browser, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._take(deadline)
            if message.get("id") != self._next_id:
                self.events.append(message)
                continue
            if "error" in message:
                raise BrowserError(f"{method}: {message['error']}")
            return message.get("result", {})

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """:meth:`call` in the attached page's session."""
        return self.call(method, params, session=self.session)

    def wait_event(self, method: str, since: int = 0) -> dict[str, Any]:
        """The first event named ``method`` recorded at index ``since`` or later, waiting for it if need be."""
        deadline = time.monotonic() + self.timeout_s
        seen = since
        while True:
            found = next((event for event in self.events[seen:] if event.get("method") == method), None)
            if found is not None:
                return found
            seen = len(self.events)
            self.events.append(self._take(deadline))

    def navigate(self, url: str) -> None:
        """Open ``url`` in the page and wait until its load event."""
        mark = len(self.events)
        result = self.page("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired", since=mark)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float) -> Any:
        """Poll a JavaScript expression until it is truthy; its value, or ``BrowserError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise BrowserError(f"{expression!r} still false after {timeout_s} s")

    def set_files(self, selector: str, paths: list[Path]) -> None:
        """Choose files in the file input ``selector``, as a person picking them does."""
        root = self.page("DOM.getDocument")["root"]["nodeId"]
        node = self.page("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        self.page("DOM.setFileInputFiles", {"nodeId": node, "files": [str(path.resolve()) for path in paths]})

    def type_text(self, selector: str, text: str) -> None:
        """Focus the element ``selector`` and type ``text`` into it (keyboard input events, not a script)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.page("Input.insertText", {"text": text})

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for so far: requests sent (``Network.requestWillBeSent``) and requests the
        browser refused before sending them, e.g. by the Content-Security-Policy (their log entries' URLs)."""
        urls = [event["params"]["request"]["url"] for event in self.events
                if event.get("method") == "Network.requestWillBeSent"]
        urls += [event["params"]["entry"]["url"] for event in self.events
                 if event.get("method") == "Log.entryAdded" and event["params"]["entry"].get("url")]
        return urls

    def csp_violations(self) -> list[str]:
        """The browser's log lines about the Content-Security-Policy refusing something."""
        return [entry["params"]["entry"]["text"] for entry in self.events
                if entry.get("method") == "Log.entryAdded" and "Content Security Policy" in
                entry["params"]["entry"].get("text", "")]

    def close(self) -> None:
        """Close the browser (asked to, so that its helper processes end with it; killed after 10 s) and remove its
        profile."""
        if self.process.poll() is None:
            try:
                os.write(self._to_browser, json.dumps({"id": -1, "method": "Browser.close"}).encode() + b"\0")
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=10)
        os.close(self._to_browser)
        self._reader.join(timeout=10)  # the browser's helpers have closed their ends of its pipe: all have ended
        shutil.rmtree(self.profile, ignore_errors=True)
