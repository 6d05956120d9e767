"""JupyterHub on one machine (The Littlest JupyterHub, or plain JupyterHub with local
users): the course's settings, one GPU set per learner, and each learner's limits.

TLJH: copy to /opt/tljh/config/jupyterhub_config.d/ and `sudo tljh-config reload`.
Plain JupyterHub: `load_subconfig("/opt/course/env/jupyterhub/tljh_course.py")` in
jupyterhub_config.py. env/jupyterhub/README.md is the guide. Read when the hub starts,
from its environment (TLJH's hub is the systemd unit `jupyterhub`: set them in a
drop-in, `systemctl edit jupyterhub`):

- COURSE_GPUS: GPU indices for learners, e.g. "0,1". Unset: every GPU the NVIDIA
  driver shows (/proc/driver/nvidia/gpus, else `nvidia-smi -L`); "" : CPU only. A GPU
  the machine does not have stops the hub at start, with the reason.
- COURSE_GPUS_PER_USER (1), COURSE_MAX_RANKS (8), COURSE_MAX_THREADS (8),
  COURSE_HELPER_IDLE_S (unset: labkit's 900 s),
  COURSE_HOME (/opt/course: the read-only install whose labs/ each learner gets a
  copy of, at ~/course/labs, on first start), COURSE_DATA (/srv/course/mnist).

CUDA_VISIBLE_DEVICES is a convention, not a fence (a learner can unset it in a
terminal); for hard isolation use Kubernetes (z2jh-values.yaml) or MIG partitions.
"""

import glob
import os
import pwd
import shutil
import subprocess
import zlib

# Fixed seats win over the hash, e.g. {"instructor": [0, 1]}.
ASSIGNED = {}


def gpus_found() -> int:
    """Count the GPUs of this machine without touching CUDA (the hub has no torch).

    TLJH's hub runs with PrivateDevices=yes: /dev/nvidia* are hidden from it, so
    the driver's /proc entries are read first; `nvidia-smi -L` is the fallback.
    """
    found = glob.glob("/proc/driver/nvidia/gpus/*")
    if found:
        return len(found)
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def course_gpus(environ=os.environ, found=None) -> list:
    """The GPU indices learners may be given: COURSE_GPUS, checked, or all found."""
    found = gpus_found() if found is None else found
    if "COURSE_GPUS" not in environ:
        return list(range(found))
    text = environ["COURSE_GPUS"]
    try:
        asked = [int(i) for i in text.split(",") if i.strip()]
    except ValueError:
        raise ValueError(f"COURSE_GPUS={text!r}: give GPU indices such as '0,1', or "
                         "'' for CPU only.") from None
    missing = [i for i in asked if not 0 <= i < found]
    if missing:
        raise ValueError(f"COURSE_GPUS={text!r} names GPU(s) {missing}, but this "
                         f"machine has {found} GPU(s) (indices 0 to {found - 1}; "
                         "`nvidia-smi -L` lists them). Unset COURSE_GPUS to use all "
                         "of them, or set it to '' for CPU only.")
    return asked


def gpus_for(username: str, gpus, per_user: int = 1, assigned=ASSIGNED) -> list:
    """Return the GPU indices for ``username``, the same after every hub restart."""
    if username in assigned:
        return list(assigned[username])
    if not gpus:
        return []
    start = zlib.crc32(username.encode()) % len(gpus)   # hash() is salted per process
    return [gpus[(start + k) % len(gpus)] for k in range(min(per_user, len(gpus)))]


def give_course_copy(home: str, uid: int, gid: int, course_home: str) -> None:
    """Copy the course's labs/ to ``home``/course/labs once, owned by the learner
    (solutions/ and tests/ are not in the install). An existing copy is kept."""
    target = os.path.join(home, "course")
    source = os.path.join(course_home, "labs")
    if os.path.exists(target) or not os.path.isdir(source):
        return
    shutil.copytree(source, os.path.join(target, "labs"))
    for folder, _subfolders, files in os.walk(target):
        os.chown(folder, uid, gid)
        for name in files:
            os.chown(os.path.join(folder, name), uid, gid)


def private_tmp(username: str, uid: int, gid: int, root: str = "/tmp") -> str:
    """Make the learner's own temp folder (0700), empty; ``post_stop`` removes it."""
    folder = os.path.join(root, f"course-{username}")
    shutil.rmtree(folder, ignore_errors=True)   # left by a hub that crashed
    os.mkdir(folder, 0o700)
    os.chown(folder, uid, gid)
    return folder


def unix_name(spawner) -> str:
    """The learner's system account: TLJH's SystemdSpawner maps hub users through
    ``username_template`` ("jupyter-{USERNAME}"); the local spawners use the name."""
    template = getattr(spawner, "username_template", None)
    if template:
        return template.format(USERNAME=spawner.user.name, USERID=spawner.user.id)
    return spawner.user.name


def make_hooks(gpus, environ=os.environ):
    """Return (pre_spawn_hook, post_stop_hook) for this machine's course settings."""
    per_user = int(environ.get("COURSE_GPUS_PER_USER", "1"))
    course_home = environ.get("COURSE_HOME", "/opt/course")

    def pre_spawn(spawner) -> None:
        ids = gpus_for(spawner.user.name, gpus, per_user)
        # An empty CUDA_VISIBLE_DEVICES hides every GPU: CPU ranks, gloo.
        spawner.environment["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
        spawner.log.info("%s gets GPU(s) %s", spawner.user.name, ids or "none")
        try:
            account = pwd.getpwnam(unix_name(spawner))
        except KeyError:   # TLJH creates the account later, from /etc/skel
            return
        give_course_copy(account.pw_dir, account.pw_uid, account.pw_gid, course_home)
        if not hasattr(spawner, "isolate_tmp"):   # SystemdSpawner: PrivateTmp instead
            spawner.environment["TMPDIR"] = private_tmp(
                account.pw_name, account.pw_uid, account.pw_gid)

    def post_stop(spawner) -> None:
        if not hasattr(spawner, "isolate_tmp"):
            shutil.rmtree(os.path.join("/tmp", f"course-{unix_name(spawner)}"),
                          ignore_errors=True)

    return pre_spawn, post_stop


def learner_environment(environ=os.environ) -> dict:
    """What every learner's server gets: the data, the launcher's caps, and how long
    an idle launcher helper stays (when the room sets it: labkit's default is 900 s)."""
    found = {"LABKIT_DATA": environ.get("COURSE_DATA", "/srv/course/mnist"),
             "LABKIT_MAX_RANKS": environ.get("COURSE_MAX_RANKS", "8"),
             "LABKIT_MAX_THREADS": environ.get("COURSE_MAX_THREADS", "8")}
    if environ.get("COURSE_HELPER_IDLE_S"):
        found["LABKIT_HELPER_IDLE_S"] = environ["COURSE_HELPER_IDLE_S"]
    return found


if "get_config" in globals():   # run by JupyterHub's config loader, not on import
    c = get_config()  # noqa: F821 (provided by the loader)
    c.Spawner.pre_spawn_hook, c.Spawner.post_stop_hook = make_hooks(course_gpus())
    c.Spawner.default_url = "/lab/tree/course/labs"
    c.Spawner.environment.update(learner_environment())
    c.SystemdSpawner.isolate_tmp = True   # TLJH: each server's own /tmp, gone at stop
