"""The Littlest JupyterHub: course settings and one GPU set per user.

Copy to /opt/tljh/config/jupyterhub_config.d/ and run `sudo tljh-config reload`.
TLJH runs every user's server as a systemd unit on one machine, with no containers:
CUDA_VISIBLE_DEVICES is how each learner is pointed at their own GPU(s). It is a
convention, not a fence (a learner can unset it in a terminal); for hard isolation use
Kubernetes (z2jh-values.yaml) or MIG partitions.
"""

import os
import zlib

# GPU indices this machine offers to learners, e.g. "0,1,2,3"; empty means CPU only.
GPUS = [int(i) for i in os.environ.get("COURSE_GPUS", "0,1,2,3").split(",")
        if i.strip()]
GPUS_PER_USER = int(os.environ.get("COURSE_GPUS_PER_USER", "1"))
# Fixed seats win over the hash, e.g. {"instructor": [0, 1]}.
ASSIGNED = {}
# Filled once by `sudo labkit data prepare --root /srv/course/mnist`, then chmod a-w.
LABKIT_DATA = "/srv/course/mnist"


def gpus_for(username: str, gpus=GPUS, per_user=GPUS_PER_USER,
             assigned=ASSIGNED) -> list:
    """Return the GPU indices for ``username``, the same after every hub restart."""
    if username in assigned:
        return list(assigned[username])
    if not gpus:
        return []
    start = zlib.crc32(username.encode()) % len(gpus)   # hash() is salted per process
    return [gpus[(start + k) % len(gpus)] for k in range(min(per_user, len(gpus)))]


def set_visible_gpus(spawner) -> None:
    """Give the server its GPUs (none: an empty CUDA_VISIBLE_DEVICES hides them all)."""
    ids = gpus_for(spawner.user.name)
    spawner.environment["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
    spawner.log.info("%s gets GPU(s) %s", spawner.user.name, ids or "none")


if "get_config" in globals():   # run by JupyterHub's config loader, not on import
    c = get_config()  # noqa: F821 (provided by the loader)
    c.Spawner.pre_spawn_hook = set_visible_gpus
    c.Spawner.default_url = "/lab/tree/course/labs"
    c.Spawner.environment.update({"LABKIT_DATA": LABKIT_DATA})
