"""Talk to a JupyterHub as its learners' browsers would: REST for the hub and each
server, the kernel websocket for running cells (used by rehearse.py).

Only the standard library, requests and websocket-client (both JupyterLab's own
dependencies). Every call carries one service token with the scopes rehearse.py
grants it (admin:users, admin:servers, access:servers).
"""

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

import requests
import websocket

__all__ = ["Hub", "Cell", "KernelSession", "KERNEL_DIED", "kernel_died"]


KERNEL_DIED = ("the kernel died, and the server restarted it with nothing in it: killed "
               "for memory? (dmesg says 'Out of memory: Killed process')")


def kernel_died(message: dict) -> bool:
    """Is this the server's word that the kernel died? jupyter_server sends a status of
    "restarting" (it starts a new kernel) or "dead" to every client of the kernel,
    outside any request, so a cell waiting for its reply would wait for ever."""
    return (message.get("msg_type") == "status"
            and message.get("content", {}).get("execution_state") in ("restarting", "dead"))


class Hub:
    """The hub's REST API at ``url`` (http://127.0.0.1:PORT), with ``token``."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url.rstrip("/"), token
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {token}"

    def api(self, method: str, path: str, **kwargs):
        """Call ``/hub/api/<path>``; return the decoded JSON (None when empty)."""
        reply = self.http.request(method, f"{self.url}/hub/api/{path}", timeout=60,
                                  **kwargs)
        if reply.status_code >= 400:
            raise RuntimeError(f"{method} /hub/api/{path}: {reply.status_code} "
                               f"{reply.text[:500]}")
        return reply.json() if reply.content else None

    def wait_up(self, limit: float = 120.0) -> None:
        """Wait until the hub answers."""
        deadline = time.monotonic() + limit
        while True:
            try:
                self.api("GET", "")
                return
            except (requests.ConnectionError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def start_server(self, name: str) -> None:
        self.api("POST", f"users/{name}/server")

    def server_ready(self, name: str) -> bool:
        server = (self.api("GET", f"users/{name}").get("servers") or {}).get("")
        return bool(server and server.get("ready"))

    def stop_server(self, name: str) -> None:
        self.api("DELETE", f"users/{name}/server")

    def server_stopped(self, name: str) -> bool:
        return not (self.api("GET", f"users/{name}").get("servers") or {})

    def user_api(self, method: str, name: str, path: str, tries: int = 5, **kwargs):
        """Call the learner's own server: ``/user/<name>/api/<path>``. A crowded
        server may answer late or with the hub's "starting" page: tried again."""
        for attempt in range(tries):
            try:
                reply = self.http.request(method, f"{self.url}/user/{name}/api/{path}",
                                          timeout=180, **kwargs)
            except requests.RequestException:
                if attempt == tries - 1:
                    raise
                time.sleep(3.0)
                continue
            if reply.status_code < 400 and (not reply.content or reply.headers.get(
                    "Content-Type", "").startswith("application/json")):
                return reply.json() if reply.content else None
            if attempt == tries - 1 or reply.status_code in (400, 401, 403, 404):
                raise RuntimeError(f"{method} /user/{name}/api/{path}: "
                                   f"{reply.status_code} {reply.text[:300]}")
            time.sleep(3.0)
        return None


@dataclass
class Cell:
    """What one executed cell gave: its index, seconds, error (if any), output."""

    index: int
    seconds: float
    error: str | None
    text: str = ""


@dataclass
class KernelSession:
    """A notebook session in a learner's server and the websocket to its kernel."""

    hub: Hub
    name: str
    path: str                          # the notebook, relative to the learner's home
    session: dict = field(default_factory=dict)
    socket: object = None
    reconnects: int = 0   # websockets that dropped (a crowded server) and were reopened

    def open(self) -> None:
        """Start a kernel for ``path`` (its folder is the kernel's working folder)."""
        self.session = self.hub.user_api("POST", self.name, "sessions", json={
            "path": self.path, "type": "notebook", "name": self.path.split("/")[-1],
            "kernel": {"name": "python3"}})
        self.connect()

    def connect(self) -> None:
        """Open the kernel's websocket. Reconnecting with the same ``session_id``
        makes the server replay what the kernel sent meanwhile, as for JupyterLab."""
        kernel = self.session["kernel"]["id"]
        url = self.hub.url.replace("http", "ws", 1)
        self.socket = websocket.create_connection(
            f"{url}/user/{self.name}/api/kernels/{kernel}/channels"
            f"?session_id={self.session['id']}",
            header=[f"Authorization: token {self.hub.token}"], timeout=60)

    def _receive(self, deadline: float):
        """The next message, or None once ``deadline`` passed; a dropped websocket is
        reopened (counted in ``reconnects``) as a browser would."""
        while time.monotonic() < deadline:
            self.socket.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                text = self.socket.recv()
                if text:
                    return json.loads(text)
            except websocket.WebSocketTimeoutException:
                return None
            except (websocket.WebSocketException, OSError, ValueError):
                pass
            self.reconnects += 1
            time.sleep(2.0)
            try:
                self.connect()
            except (websocket.WebSocketException, OSError):
                continue
        return None

    def notebook(self) -> dict:
        """The learner's notebook, read through their server's contents API."""
        return self.hub.user_api("GET", self.name, f"contents/{self.path}")["content"]

    def run(self, index: int, code: str, timeout: float) -> Cell:
        """Execute ``code``; wait for its reply and for the kernel to be idle again."""
        msg_id, start = uuid.uuid4().hex, time.monotonic()
        self.socket.send(json.dumps(_execute_request(msg_id, code)))
        error, text, replied, idle = None, [], False, False
        while not (replied and idle):
            message = self._receive(start + timeout)
            if message is None:
                return Cell(index, time.monotonic() - start, "timed out", "".join(text))
            if kernel_died(message):   # nothing will answer this request now
                return Cell(index, time.monotonic() - start, KERNEL_DIED, "".join(text))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"[:2000]
            elif kind == "execute_reply":
                replied = True
                if content.get("status") == "error" and error is None:
                    error = f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        return Cell(index, time.monotonic() - start, error, "".join(text))

    def close(self) -> None:
        """Close the websocket and shut the kernel down through the server."""
        if self.socket is not None:
            self.socket.close()
        if self.session:
            self.hub.user_api("DELETE", self.name, f"sessions/{self.session['id']}")


def _execute_request(msg_id: str, code: str) -> dict:
    now = datetime.now(timezone.utc).isoformat()
    return {"header": {"msg_id": msg_id, "msg_type": "execute_request",
                       "username": "rehearsal", "session": msg_id, "date": now,
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True}}
