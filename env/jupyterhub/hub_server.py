"""Start a JupyterHub on loopback for a rehearsal, with one system user per learner
(for rehearse.py, as root): the hub's config, its users, its start and stop.

The hub runs LocalProcessSpawner (each server as its learner) and loads
tljh_course.py unchanged; a service token with admin:users, admin:servers and
access:servers is what rehearse.py's client uses.
"""

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from hub_client import Hub

__all__ = ["PREFIX", "make_users", "remove_user", "running_hub", "wait_until"]

HERE = Path(__file__).resolve().parent
# The rehearsal's system users: lkr01, lkr02, ...; LABKIT_HUB_USERS gives another
# prefix, so that two rehearsals on one machine (two test runs) never share a user.
PREFIX = os.environ.get("LABKIT_HUB_USERS", "lkr")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- users and hub

def make_users(count: int) -> list:
    """Create ``count`` system users with private homes; return their pwd entries."""
    accounts = []
    for index in range(1, count + 1):
        name = f"{PREFIX}{index:02d}"
        remove_user(name)   # left by an interrupted rehearsal
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell",
                        "/bin/bash", "--key", "HOME_MODE=0700", name], check=True)
        accounts.append(pwd.getpwnam(name))
    return accounts


def remove_user(name: str) -> None:
    """Remove a rehearsal user, their processes (userdel refuses while one runs) and
    their private temp folder (left only by a rehearsal that was cut short)."""
    for _attempt in range(30):
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        if subprocess.run(["pgrep", "-u", name], capture_output=True).returncode:
            break
        time.sleep(1.0)
    subprocess.run(["userdel", "--remove", name], capture_output=True)
    shutil.rmtree(f"/tmp/course-{name}", ignore_errors=True)


_CONFIG = '''
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = "http://127.0.0.1:{public}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{state}/cookie_secret"
c.JupyterHub.pid_file = "{state}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{state}/proxy.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.disable_user_config = True
c.Spawner.start_timeout = 600
c.Spawner.http_timeout = 600
c.Spawner.environment = {environment!r}
c.JupyterHub.services = [{{"name": "rehearsal", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "rehearsal", "services": ["rehearsal"],
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users"]}}]
load_subconfig({course_config!r})   # the course's hub settings, unchanged
'''


@contextmanager
def running_hub(install, environment: dict):
    """Start JupyterHub (and its proxy) on loopback; yield a Hub; stop it after.

    ``install`` is hub_install.install()'s: where the venv, proxy, course and data are.
    """
    state = install.build / "state"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(mode=0o700, parents=True)
    token, public = secrets.token_hex(32), _free_port()
    (state / "jupyterhub_config.py").write_text(_CONFIG.format(
        public=public, hub=_free_port(), api=_free_port(), proxy=str(install.proxy),
        state=state, singleuser=str(install.bin / "jupyterhub-singleuser"),
        environment=environment, token=token,
        course_config=str(HERE / "tljh_course.py")))
    env = {"PATH": f"{install.bin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "HOME": str(state), "COURSE_HOME": str(install.course),
           "COURSE_DATA": str(install.data)}   # no PYTHONPATH: learners get none
    log = open(state / "hub.log", "w")
    hub = subprocess.Popen([str(install.bin / "jupyterhub"), "-f",
                            str(state / "jupyterhub_config.py")], cwd=state, env=env,
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = Hub(f"http://127.0.0.1:{public}", token)
        client.wait_up()
        yield client
    finally:
        hub.terminate()   # cleanup_servers: the hub stops every server first
        try:
            hub.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, 9)
            hub.wait()
        log.close()


def wait_until(check, names: list, limit: float) -> float:
    """Wait until ``check(name)`` holds for every name; return the seconds taken."""
    start, left = time.monotonic(), set(names)
    while left:
        if time.monotonic() - start > limit:
            raise TimeoutError(f"not ready after {limit:g} s: {sorted(left)}")
        left = {name for name in left if not check(name)}
        time.sleep(1.0)
    return time.monotonic() - start


