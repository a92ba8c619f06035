"""Kubernetes: the manifests in k8s/ (a Kubeflow PyTorchJob and a Kubeflow Trainer TrainJob with
its TrainingRuntime) are what the API server and the operators accept (pinned schemas in
tests/data/k8s/), keep the image's entrypoint, run non-root with a real /dev/shm, and their exact
container spec, with the variables each operator injects, trains as two containers."""
import copy
import json
import re
import uuid

import build_info  # scripts/build_info.py: the image tag the manifests must name
import jsonschema
import pytest
import yaml
from conftest import ROOT, version_row
from test_train_amp import ENTRYPOINT_LOG, SUMMARY, SYNTH

import docker

K8S = ROOT / "k8s"
SCHEMAS = ROOT / "tests" / "data" / "k8s"
JOBS = ["pytorchjob.yaml", "trainjob.yaml"]
MANIFESTS = [*JOBS, "workspace-pvc.yaml"]
# The pinned CRD schema for each (group, kind); tests/data/k8s/pin.py made them.
CRDS = {
    ("kubeflow.org", "PyTorchJob"): "kubeflow.org_pytorchjobs-v1.9.4.json",
    ("trainer.kubeflow.org", "TrainJob"): "trainer.kubeflow.org_trainjobs-v2.3.0.json",
    ("trainer.kubeflow.org", "TrainingRuntime"): "trainer.kubeflow.org_trainingruntimes-v2.3.0.json",
}
K8S_DEFS = "kubernetes-1.33-subset.json"


def load(name):
    return list(yaml.safe_load_all((K8S / name).read_text()))


def docs():
    """Every document of every manifest: (id, document)."""
    return [(f"{name}:{d['kind']}", d) for name in MANIFESTS for d in load(name)]


def strict(schema):
    """Reject unknown fields, as the API server's strict field validation (kubectl's default)
    does: OpenAPI schemas list the known properties but do not say "nothing else"."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_validator(group, kind, version):
    pinned = json.loads((SCHEMAS / CRDS[(group, kind)]).read_text())
    assert pinned["group"] == group and pinned["kind"] == kind, pinned["source"]
    return jsonschema.Draft7Validator(strict(pinned["versions"][version]))


def k8s_validator(definition):
    """A validator for one Kubernetes definition (io.k8s.api.core.v1.*) from the pinned spec."""
    defs = strict(json.loads((SCHEMAS / K8S_DEFS).read_text())["definitions"])
    # Both are strings in the OpenAPI document, but the API server's JSON decoding takes
    # numbers too (e.g. `nvidia.com/gpu: 8`, a port by number): accept what it accepts.
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["string", "integer"]}
    return jsonschema.Draft7Validator({"$ref": f"#/definitions/{definition}", "definitions": defs})


def pod_templates(doc):
    """The Kubernetes PodTemplateSpecs a document holds: (path, template)."""
    if doc["kind"] == "PyTorchJob":
        return [(f"spec.pytorchReplicaSpecs.{r}.template", s["template"])
                for r, s in doc["spec"]["pytorchReplicaSpecs"].items() if "template" in s]
    if doc["kind"] == "TrainingRuntime":
        return [(f"spec.template.spec.replicatedJobs[{i}].template.spec.template",
                 j["template"]["spec"]["template"])
                for i, j in enumerate(doc["spec"]["template"]["spec"]["replicatedJobs"])]
    return []


def errors(validator, instance):
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}"
            for e in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))]


def schema_errors(doc):
    """Everything the pinned schemas reject in one document, as readable lines."""
    if doc["apiVersion"] == "v1":  # a core kind: Kubernetes' own definition
        return errors(k8s_validator(f"io.k8s.api.core.v1.{doc['kind']}"), doc)
    group, version = doc["apiVersion"].split("/")
    found = errors(crd_validator(group, doc["kind"], version), doc)
    found += [f"metadata: {e}" for e in errors(k8s_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), doc["metadata"])]
    for path, template in pod_templates(doc):
        found += [f"{path}: {e}" for e in errors(k8s_validator("io.k8s.api.core.v1.PodTemplateSpec"), template)]
    if doc["kind"] == "TrainJob":
        trainer = doc["spec"]["trainer"]
        found += [f"spec.trainer.resourcesPerNode: {e}" for e in errors(
            k8s_validator("io.k8s.api.core.v1.ResourceRequirements"), trainer.get("resourcesPerNode", {}))]
        for i, env in enumerate(trainer.get("env", [])):
            found += [f"spec.trainer.env[{i}]: {e}" for e in errors(k8s_validator("io.k8s.api.core.v1.EnvVar"), env)]
    return found


@pytest.mark.parametrize("doc", [d for _, d in docs()], ids=[i for i, _ in docs()])
def test_manifest_validates_against_the_kubernetes_and_operator_schemas(doc):
    """Each k8s/ document should pass its operator's CRD schema and Kubernetes' PodTemplateSpec."""
    found = schema_errors(doc)
    assert not found, "the pinned schemas reject it:\n" + "\n".join(found)


# Mistakes a manifest can make -> the schema that must catch it. If the validation ever lets
# these through (e.g. strict() stops working), the test above proves nothing.
def _set(doc, path, value):
    node = doc
    *parents, last = path
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value


PJ_POD = ["spec", "pytorchReplicaSpecs", "Master", "template", "spec"]
TJ_POD = ["spec", "template", "spec", "replicatedJobs", 0, "template", "spec", "template", "spec"]
BROKEN = {
    "misspelt-container-field": ("pytorchjob.yaml", 0, [*PJ_POD, "containers", 0, "comand"], ["x"]),
    "pvc-access-mode-as-string": ("workspace-pvc.yaml", 0, ["spec", "accessModes"], "ReadWriteMany"),
    "uid-as-string": ("pytorchjob.yaml", 0, [*PJ_POD, "securityContext", "runAsUser"], "1000"),
    "replicas-as-string": ("pytorchjob.yaml", 0, ["spec", "pytorchReplicaSpecs", "Worker", "replicas"], "1"),
    "nproc-as-integer": ("pytorchjob.yaml", 0, ["spec", "nprocPerNode"], 8),
    "emptydir-medium-misplaced": ("trainjob.yaml", 0, [*TJ_POD, "volumes", 0, "medium"], "Memory"),
    "container-without-name": ("trainjob.yaml", 0, [*TJ_POD, "containers", 0, "name"], KeyError),
    "trainer-nodes-as-string": ("trainjob.yaml", 1, ["spec", "trainer", "numNodes"], "2"),
    "trainer-unknown-field": ("trainjob.yaml", 1, ["spec", "trainer", "nprocPerNode"], 8),
}


@pytest.mark.parametrize("case", BROKEN.values(), ids=BROKEN.keys())
def test_schema_validation_rejects_a_broken_manifest(case):
    """A wrong field, type or missing name in a k8s/ document should fail the schema check."""
    name, index, path, value = case
    doc = copy.deepcopy(load(name)[index])
    _set(doc, path, value)
    assert schema_errors(doc), f"{name}: setting {'.'.join(map(str, path))} = {value!r} passed"


# ---------------------------------------------------------------------------------------
# The pods each operator makes of a manifest (also what the contract test below starts).

OPERATOR_ENV = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PET_NNODES",
                "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"]


def pytorchjob_pods(doc, nodes=None, nproc=None):
    """The pods the Training Operator v1.9 makes of a PyTorchJob resized to `nodes` x `nproc`:
    (address, container, pod spec, env), env as pkg/controller.v1/pytorch/envvar.go builds it."""
    doc = copy.deepcopy(doc)
    specs = doc["spec"]["pytorchReplicaSpecs"]
    if nodes:
        specs["Worker"]["replicas"] = nodes - 1
    nodes = sum(s["replicas"] for s in specs.values())
    doc["spec"]["nprocPerNode"] = str(nproc or doc["spec"]["nprocPerNode"])
    nproc = int(doc["spec"]["nprocPerNode"])
    name = doc["metadata"]["name"]
    master = f"{name}-master-0"
    port = next(p["containerPort"] for p in specs["Master"]["template"]["spec"]["containers"][0]["ports"]
                if p["name"] == "pytorchjob-port")
    pods = []
    for rtype in ("Master", "Worker"):
        for index in range(specs[rtype]["replicas"]):
            spec = copy.deepcopy(specs[rtype]["template"]["spec"])
            container = next(c for c in spec["containers"] if c["name"] == "pytorch")
            rank = index + (1 if rtype == "Worker" else 0)
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            env.update(PYTHONUNBUFFERED="1", MASTER_PORT=str(port), PET_MASTER_PORT=str(port),
                       MASTER_ADDR=master, PET_MASTER_ADDR=master, WORLD_SIZE=str(nodes * nproc),
                       RANK=str(rank), PET_NODE_RANK=str(rank),
                       PET_NPROC_PER_NODE=doc["spec"]["nprocPerNode"], PET_NNODES=str(nodes))
            pods.append((f"{name}-{rtype.lower()}-{index}", container, spec, env))
    return pods


def trainjob_pods(runtime, job, nodes=None, nproc=None):
    """The pods Trainer v2.3 makes of a TrainJob resized to `nodes` x `nproc`, on its
    TrainingRuntime: trainer.image/command/args replace the `node` container's (jobset plugin),
    trainer.env is merged in, then the torch plugin's PET_* (plugins/torch/torch.go)."""
    name = job["metadata"]["name"]
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"], "runtimeRef names another runtime"
    rjob = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                if j["template"]["metadata"]["labels"].get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer")
    trainer = job["spec"]["trainer"]
    nodes, nproc = nodes or trainer["numNodes"], nproc or trainer["numProcPerNode"]
    pods = []
    for index in range(nodes):
        spec = copy.deepcopy(rjob["template"]["spec"]["template"]["spec"])
        container = next(c for c in spec["containers"] if c["name"] == "node")
        for key in ("image", "command", "args"):
            if key in trainer:
                container[key] = trainer[key]
        if "resourcesPerNode" in trainer:
            container["resources"] = trainer["resourcesPerNode"]
        env = {e["name"]: e["value"] for e in container.get("env", []) + trainer.get("env", [])}
        env.update(PET_NNODES=str(nodes), PET_NPROC_PER_NODE=str(nproc), PET_NODE_RANK=str(index),
                   PET_MASTER_ADDR=f"{name}-node-0-0.{name}", PET_MASTER_PORT="29500")
        pods.append((f"{name}-node-0-{index}.{name}", container, spec, env))
    return pods


def operator_pods(manifest, nodes=2, nproc=1):
    if manifest == "pytorchjob.yaml":
        return pytorchjob_pods(load(manifest)[0], nodes, nproc)
    runtime, job = load(manifest)
    return trainjob_pods(runtime, job, nodes, nproc)


# ---------------------------------------------------------------------------------------
# What the manifests must say, beyond what the schemas can check.

def manifest_pods():
    """(id, pod spec, container) of every pod the operators would make of k8s/, at full size."""
    return [(f"{manifest}:{address}", spec, container)
            for manifest in JOBS for address, container, spec, _ in operator_pods(manifest, None, None)]


def quantity(text):
    """A Kubernetes quantity (16Gi, 512Mi, 8) in bytes/units."""
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", str(text))
    assert m, f"unexpected quantity {text!r}"
    power = {"K": 1, "M": 2, "G": 3, "T": 4}.get((m.group(2) or " ")[0], 0)
    return int(m.group(1)) * (1024 if (m.group(2) or "").endswith("i") else 1000) ** power


@pytest.mark.parametrize("pod_id, spec, container", manifest_pods(), ids=[p[0] for p in manifest_pods()])
def test_pod_keeps_the_entrypoint_runs_non_root_and_has_a_real_shm(pod_id, spec, container):
    """Each pod should use args (not command), a numeric non-root user and an in-memory /dev/shm."""
    assert "command" not in container, f"{pod_id}: command replaces the image's ENTRYPOINT; use args"
    assert container["args"][:2] == ["torchrun", "/usr/local/bin/train_amp.py"], container["args"]
    sc = spec.get("securityContext", {})
    assert sc.get("runAsNonRoot") is True, f"{pod_id}: runAsNonRoot should be true: {sc}"
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        assert isinstance(sc.get(key), int) and sc[key] > 0, f"{pod_id}: {key} should be a non-zero number: {sc}"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir", {})
    assert shm.get("medium") == "Memory" and quantity(shm.get("sizeLimit", 0)) >= 2**30, (
        f"{pod_id}: /dev/shm should be an emptyDir with medium Memory and a sizeLimit >= 1Gi: {shm}")
    assert "/workspace" in mounts, f"{pod_id}: no workspace volume for data and checkpoints"
    if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts, f"{pod_id}: a read-only root needs a writable /tmp"
    assert container["image"].endswith(":" + build_info.tag(version_row())), (
        f"{pod_id}: the image tag should follow versions.json ({build_info.tag(version_row())})")


def test_jobs_mount_the_shared_workspace_claim_defined_in_k8s():
    """Every pod's workspace should be the ReadWriteMany claim that k8s/workspace-pvc.yaml makes."""
    pvc = load("workspace-pvc.yaml")[0]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], f"the nodes share it: {pvc['spec']}"
    for pod_id, spec, container in manifest_pods():
        volumes = {v["name"]: v for v in spec["volumes"]}
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/workspace")
        claim = volumes[mount["name"]].get("persistentVolumeClaim", {}).get("claimName")
        assert claim == pvc["metadata"]["name"], f"{pod_id}: /workspace is {volumes[mount['name']]}"


def test_gpu_limits_match_the_processes_per_node():
    """nvidia.com/gpu should equal the processes torchrun starts per pod, in both manifests."""
    pj = load("pytorchjob.yaml")[0]
    for rtype, rs in pj["spec"]["pytorchReplicaSpecs"].items():
        gpus = rs["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert str(gpus) == pj["spec"]["nprocPerNode"], f"PyTorchJob {rtype}: {gpus} GPUs vs nprocPerNode"
    trainer = load("trainjob.yaml")[1]["spec"]["trainer"]
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == trainer["numProcPerNode"], trainer


def test_pytorchjob_master_and_worker_run_the_same_pod():
    """Master and Worker templates should be identical (one edited alone breaks the job)."""
    specs = load("pytorchjob.yaml")[0]["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["template"] == specs["Worker"]["template"], "Master and Worker differ"
    assert specs["Master"]["replicas"] == 1, "a PyTorchJob has exactly one Master"


def test_manifests_leave_the_operator_variables_to_the_operator():
    """No manifest should set the variables its operator injects (Trainer rejects such jobs)."""
    injected = set(OPERATOR_ENV) | {"PYTHONUNBUFFERED"}
    for doc_id, doc in docs():
        for env_list in _env_lists(doc):
            clash = injected & {e["name"] for e in env_list}
            assert not clash, f"{doc_id} sets {sorted(clash)}"


def _env_lists(doc):
    for _, template in pod_templates(doc):
        for c in template["spec"]["containers"]:
            yield c.get("env", [])
    if doc["kind"] == "TrainJob":
        yield doc["spec"]["trainer"].get("env", [])


@pytest.mark.parametrize("name", JOBS)
def test_manifest_names_the_infiniband_and_roce_settings(name):
    """Each manifest should carry NCCL's IB/RoCE variables and IPC_LOCK, commented, for the user."""
    text = (K8S / name).read_text()
    for needle in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME", "IPC_LOCK"):
        assert re.search(rf"^\s*#.*{needle}", text, re.MULTILINE), f"{name}: no commented {needle}"


# ---------------------------------------------------------------------------------------
# The contract: each manifest's container, as its operator wires it, trains as two containers.
# What Docker cannot stand for: GPUs (CPU/gloo here, one process per pod, not G) and the
# services' DNS (network aliases with the same names instead).

# Small, CPU: the manifest's args stay and are parsed; these come after them and win.
SMALL = [*SYNTH, "--epochs", "1", "--log-every", "1", "--dist-timeout", "240"]


def docker_run_kwargs(container, spec, env, workspace, image_ref):
    """docker run options for a pod's container: what Kubernetes would give it."""
    sc = spec.get("securityContext", {})
    csc = container.get("securityContext", {})
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    kwargs = {"image": image_ref, "environment": env, "read_only": bool(csc.get("readOnlyRootFilesystem")),
              "user": f"{sc['runAsUser']}:{sc['runAsGroup']}", "group_add": [str(sc["fsGroup"])],
              "cap_drop": csc.get("capabilities", {}).get("drop"), "tmpfs": {}, "volumes": {},
              "security_opt": ["no-new-privileges"] if csc.get("allowPrivilegeEscalation") is False else None}
    if "command" in container:
        kwargs["entrypoint"] = container["command"]
    for mount in container.get("volumeMounts", []):
        vol, path = volumes[mount["name"]], mount["mountPath"]
        if "persistentVolumeClaim" in vol:
            kwargs["volumes"][workspace] = {"bind": path, "mode": "rw"}
        elif vol.get("emptyDir", {}).get("medium") == "Memory" and path == "/dev/shm":
            kwargs["shm_size"] = quantity(vol["emptyDir"]["sizeLimit"])
        elif "emptyDir" in vol:  # emptyDir: empty, writable by anyone, exec allowed
            size = vol["emptyDir"].get("sizeLimit")
            kwargs["tmpfs"][path] = "exec,mode=1777" + (f",size={quantity(size)}" if size else "")
        else:
            pytest.fail(f"no Docker stand-in for volume {vol}")
    return kwargs


@pytest.fixture
def workspace_volume(docker_client, image_ref):
    """A Docker volume standing for the ReadWriteMany PVC, owned as the kubelet leaves a volume
    for fsGroup (group fsGroup, group-writable, setgid directories). Always removed."""
    made = []

    def make(fs_group):
        vol = docker_client.volumes.create(f"k8s-workspace-{uuid.uuid4().hex[:8]}")
        made.append(vol)
        docker_client.containers.run(
            image_ref, ["sh", "-c", f"chgrp -R {fs_group} /w && chmod -R g+rwX /w && chmod g+s /w"],
            entrypoint="", user="0", volumes={vol.name: {"bind": "/w"}}, remove=True)
        return vol.name

    yield make
    for vol in made:
        try:
            vol.remove(force=True)
        except docker.errors.NotFound:
            pass


@pytest.mark.parametrize("manifest", JOBS)
def test_manifest_container_spec_trains_as_two_pods(manifest, workspace_volume, docker_network,
                                                    start_container, docker_client, image_ref):
    """The manifest's container (args, user, shm, read-only root, operator env) should train one 2-node job."""
    pods = operator_pods(manifest)
    workspace = workspace_volume(pods[0][2]["securityContext"]["fsGroup"])
    started = []
    for address, container, spec, env in pods:
        kwargs = docker_run_kwargs(container, spec, env, workspace, image_ref)
        # The pod's DNS name (the operator's service, JobSet's headless service) as an alias.
        endpoint = docker.types.EndpointConfig(docker_client.api._version, aliases=[address])
        started.append(start_container(
            [*container["args"], *SMALL], name=f"k8s-{uuid.uuid4().hex[:8]}",
            hostname=address.split(".")[0], network=docker_network.name,
            networking_config={docker_network.name: endpoint}, **kwargs))
    codes = [c.wait(timeout=480)["StatusCode"] for c in started]
    logs = [c.logs().decode(errors="replace") for c in started]
    for (address, *_), code, log in zip(pods, codes, logs):
        assert code == 0, f"{address} exited {code}:\n{log[-6000:]}"
        bad = [ln for ln in log.splitlines() if ENTRYPOINT_LOG.match(ln) and not ln.startswith("INFO")]
        assert not bad, f"{address}: the entrypoint warned:\n" + "\n".join(bad)
        assert "Executing: torchrun" in log, f"{address}: the image's entrypoint did not run:\n{log[:3000]}"
    # torchrun gave train_amp.py the job: 2 ranks, 256 images / 2 / 32 = 4 steps each.
    assert "launch: torchrun" in logs[0] and "rank 0, world size 2," in logs[0], logs[0][-6000:]
    assert "world_size=2" in logs[0] and "steps/epoch=4 " in logs[0], logs[0][-6000:]
    assert SUMMARY.search(logs[0]) and "nan" not in logs[0], f"no finite epoch:\n{logs[0][-6000:]}"
    # The checkpoint is on the shared workspace, written by rank 0 as the pod's user.
    ckpt_dir = next(a.split("=", 1)[1] for a in pods[0][1]["args"] if a.startswith("--checkpoint-dir="))
    sc = pods[0][2]["securityContext"]
    out = start_container(["stat", "-c", "%u:%g %s", f"{ckpt_dir}/last.pt"], entrypoint="", detach=True,
                          volumes={workspace: {"bind": "/workspace"}})
    out.wait(timeout=60)
    stat = out.logs().decode().strip()
    assert re.fullmatch(rf"{sc['runAsUser']}:{sc['fsGroup']} \d+", stat), f"last.pt: {stat}"
