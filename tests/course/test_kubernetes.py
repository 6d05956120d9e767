"""The Kubernetes manifests: valid against the vendored Kubeflow Trainer CRD schemas,
consistent with the course image, and their torchrun command runs on one machine.
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "env" / "kubernetes"
COURSE_IN_IMAGE = "/home/jovyan/course"   # the Dockerfile's COURSE_DIR
PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
       "PET_MASTER_PORT")
NAME_RULE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")   # the CRD's CEL rule, by hand


def _strict(schema):
    """Forbid unknown fields where the schema lists fields (kubectl's strict check)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _strict(value) for key, value in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        schema["additionalProperties"] = False
    return schema


def _schema(doc: dict) -> dict:
    version = doc["apiVersion"].split("/")[1]
    vendored = json.loads((KUBE / "schemas" / f"{doc['kind'].lower()}-{version}.json")
                          .read_text())
    assert doc["apiVersion"] == f"{vendored['group']}/{vendored['version']}"
    return vendored


def _errors(doc: dict) -> list[str]:
    """Return the schema errors of one manifest, plus the metadata.name rules."""
    validator = jsonschema.Draft202012Validator(
        _strict(_schema(doc)["openAPIV3Schema"]))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(doc)]
    name = doc["metadata"]["name"]
    if not NAME_RULE.match(name) or len(name) > 63:
        errors.append(f"metadata.name {name!r} is not an RFC 1035 label")
    return errors


def _manifests() -> dict:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(KUBE.glob("*.yaml"))}


def _trainjob() -> dict:
    return _manifests()["trainjob.yaml"]


@pytest.mark.parametrize("name", sorted(_manifests()))
def test_manifest_validates_against_the_vendored_crd_schema(name):
    """Does every manifest in env/kubernetes/ satisfy its CRD's schema, strictly?"""
    assert _errors(_manifests()[name]) == []


@pytest.mark.parametrize("path, value, message", [
    (("spec", "trainer", "numProcsPerNode"), 4, "numProcsPerNode' was unexpected"),
    (("spec", "trainer", "numNodes"), "2", "is not of type 'integer'"),
    (("spec", "runtimeRef", "name"), "", "should be non-empty"),
    (("metadata", "name"), "Course_DDP", "RFC 1035"),
])
def test_validation_catches_typos_and_wrong_types(path, value, message):
    """Would a misspelled field, a string count or a bad name be caught offline?"""
    doc = _trainjob()
    *parents, last = path
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    assert any(message in error for error in _errors(doc)), _errors(doc)


def test_vendored_schemas_are_descriptions_removed_and_say_where_from():
    """Do the vendored schemas name their source and hold no descriptions?"""
    for path in (KUBE / "schemas").glob("*.json"):
        vendored = json.loads(path.read_text())
        assert vendored["source"].startswith("https://github.com/kubeflow/trainer/")
        assert re.fullmatch(r"[0-9a-f]{64}", vendored["source_sha256"])
        assert '"description"' not in json.dumps(vendored["openAPIV3Schema"])
        assert path.name == f"{vendored['kind'].lower()}-{vendored['version']}.json"


def test_trainjob_asks_for_gpus_shm_and_the_course_image():
    """One rank per GPU, a RAM-backed /dev/shm in the node container, course image?"""
    trainer = _trainjob()["spec"]["trainer"]
    assert trainer["numProcPerNode"] == trainer["resourcesPerNode"]["limits"][
        "nvidia.com/gpu"]
    z2jh = yaml.safe_load((ROOT / "env/jupyterhub/z2jh-values.yaml").read_text())
    image = z2jh["singleuser"]["image"]
    assert trainer["image"] == f"{image['name']}:{image['tag']}"
    pod = (_trainjob()["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]
           ["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])
    shm = [v["name"] for v in pod["volumes"] if v.get("emptyDir", {}).get("medium")
           == "Memory"]
    node = [c for c in pod["containers"] if c["name"] == "node"]
    mounts = {m["mountPath"]: m["name"] for c in node for m in c["volumeMounts"]}
    assert mounts.get("/dev/shm") in shm


def test_trainjob_runs_a_course_file_with_restarts_and_no_reserved_env():
    """Does the job run a file the image holds, under c10d with --max-restarts?"""
    trainer = _trainjob()["spec"]["trainer"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COURSE_DIR=/home/${NB_USER}/course" in dockerfile
    assert "COPY --chown=${NB_UID}:${NB_GID} env/ ${COURSE_DIR}/env/" in dockerfile
    scripts = [a for a in trainer["args"] if a.startswith(COURSE_IN_IMAGE)]
    assert scripts and all((ROOT / s[len(COURSE_IN_IMAGE) + 1:]).is_file()
                           for s in scripts)
    assert trainer["command"] == ["torchrun"]
    for flag in ("--rdzv-backend=c10d", "--max-restarts=3",
                 "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"):
        assert flag in trainer["args"]
    names = {e["name"] for e in trainer["env"]}
    assert not names & set(PET), "the Trainer's webhook rejects reserved PET_* names"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in names


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_trainjob_command_runs_with_the_operators_environment():
    """With PET_* set as the operator sets them (1 pod, 2 ranks), does it train?"""
    trainer = _trainjob()["spec"]["trainer"]
    pod_env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0",
               "PET_MASTER_ADDR": "localhost", "PET_MASTER_PORT": str(_free_port())}
    pod_env.update({e["name"]: e["value"] for e in trainer["env"]})
    args = [a.replace(COURSE_IN_IMAGE, str(ROOT)) for a in trainer["args"]]
    for name, value in pod_env.items():   # Kubernetes expands $(VAR) in args
        args = [a.replace(f"$({name})", value) for a in args]
    assert args[-2:] == ["--steps", "200"]
    args[-1] = "3"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = subprocess.run([torchrun, *args, "--limit", "512", "--global-batch", "64"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, **pod_env, "LABKIT_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    from labkit import hardware   # the script leaves the choice to "auto": NCCL on a
    chosen = hardware.choose(2, verbose=False).backend   # node with 2+ GPUs, else gloo
    assert f"2 ranks ({chosen})" in done.stdout
    assert "parameters identical on every rank: True" in done.stdout


# torch's flight-recorder settings renamed in 2.x (legacy name -> current one), as
# torch 2.14 reads them: FlightRecorder.hpp reads {"TORCH_FR_BUFFER_SIZE",
# "TORCH_NCCL_TRACE_BUFFER_SIZE"}, the dump writer {"TORCH_FR_DUMP_TEMP_FILE",
# "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} (the first name of each list is the current one).
FLIGHT_RECORDER_RENAMES = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
                           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE",
                           "TORCH_NCCL_TRACE_CPP_STACK": "TORCH_FR_CPP_STACK"}


def test_trainjob_uses_the_flight_recorders_current_names():
    """Buffer, dump switch and dump file under torch 2.14's names, no legacy one?
    Where torch's headers are installed, the buffer's pair is read from them."""
    import torch

    env = {e["name"]: e["value"] for e in _trainjob()["spec"]["trainer"]["env"]}
    assert not set(env) & set(FLIGHT_RECORDER_RENAMES), "legacy names"
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
            "TORCH_FR_DUMP_TEMP_FILE"} <= set(env)
    header = (Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d"
              / "FlightRecorder.hpp")
    if header.exists():
        pairs = re.findall(r'\{"(TORCH_FR_\w+)", "(TORCH_NCCL_\w+)"\}',
                           header.read_text())
        assert ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE") in pairs
        for current, legacy in pairs:
            assert FLIGHT_RECORDER_RENAMES.get(legacy) == current
