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
from conftest import ROOT, SLOWDOWN, version_row
from train_amp_helpers import ENTRYPOINT_LOG, SUMMARY, SYNTH

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
    """Each manifest should carry NCCL's IB/RoCE variables, commented, for the user, and say in a
    comment why IPC_LOCK is not added and that the memlock rlimit (the runtime's) is what counts."""
    text = (K8S / name).read_text()
    for needle in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME", "IPC_LOCK", "LimitMEMLOCK=infinity"):
        assert re.search(rf"^\s*#.*{needle}", text, re.MULTILINE), f"{name}: no commented {needle}"


# ---------------------------------------------------------------------------------------
# What the API server, its admission and the operators' webhooks refuse, or the scheduler does
# wrong, that a schema cannot say: names, counts, references, restart policies, resources.

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Service names are DNS-1035 labels (a letter first): each job's name becomes one (the
# operator's <job>-master-0, JobSet's headless <job>).
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
IANA_SVC_NAME = re.compile(r"(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*")  # a container port's name
# Restart policies each kind accepts: a PyTorchJob replica (training-operator's RestartPolicy), a
# Job's pod (batch/v1 validation: Always is refused). Every Job-run pod here sets one: JobSet
# would otherwise default it to OnFailure.
RESTART_POLICIES = {"PyTorchJob": {"Always", "OnFailure", "Never", "ExitCode"}, "Job": {"Never", "OnFailure"}}


def pods_of(docs):
    """The pods the operators make of one manifest's documents, at the manifest's size."""
    kinds = {d["kind"]: d for d in docs}
    if "PyTorchJob" in kinds:
        return pytorchjob_pods(kinds["PyTorchJob"])
    if "TrainJob" in kinds:
        return trainjob_pods(kinds["TrainingRuntime"], kinds["TrainJob"])
    return []


def api_rule_violations(docs):
    """Every rule below broken by one manifest's documents, as readable lines."""
    bad = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if not DNS1123_SUBDOMAIN.fullmatch(name):
            bad.append(f"{kind} name {name!r} is not a DNS-1123 subdomain")
        if kind in ("PyTorchJob", "TrainJob") and not DNS1035_LABEL.fullmatch(name):
            bad.append(f"{kind} name {name!r} is not a DNS-1035 label (it names a Service)")
        if kind == "PyTorchJob":
            if not (str(doc["spec"].get("nprocPerNode", "1")).isdigit() and int(doc["spec"].get("nprocPerNode", "1")) >= 1):
                bad.append(f"nprocPerNode {doc['spec'].get('nprocPerNode')!r} is not a count >= 1")
            for rtype, rs in doc["spec"]["pytorchReplicaSpecs"].items():
                if rs.get("replicas", 1) < 1:
                    bad.append(f"{rtype} replicas {rs['replicas']} < 1")
                if rs.get("restartPolicy") not in RESTART_POLICIES["PyTorchJob"]:
                    bad.append(f"{rtype} restartPolicy {rs.get('restartPolicy')!r} not in {sorted(RESTART_POLICIES['PyTorchJob'])}")
        if kind == "TrainJob":
            for key in ("numNodes", "numProcPerNode"):
                if doc["spec"]["trainer"].get(key, 1) < 1:
                    bad.append(f"trainer.{key} {doc['spec']['trainer'][key]} < 1")
        if kind == "TrainingRuntime":
            if doc["spec"]["mlPolicy"].get("numNodes", 1) < 1:
                bad.append(f"mlPolicy.numNodes {doc['spec']['mlPolicy']['numNodes']} < 1")
            for rjob in doc["spec"]["template"]["spec"]["replicatedJobs"]:
                if not DNS1123_LABEL.fullmatch(rjob["name"]):
                    bad.append(f"replicatedJob name {rjob['name']!r} is not a DNS-1123 label")
                policy = rjob["template"]["spec"]["template"]["spec"].get("restartPolicy")
                if policy not in RESTART_POLICIES["Job"]:
                    bad.append(f"replicatedJob {rjob['name']} pod restartPolicy {policy!r} not in {sorted(RESTART_POLICIES['Job'])}")
        for path, template in pod_templates(doc):
            bad += [f"{path}: {v}" for v in pod_rule_violations(template["spec"])]
    try:
        pods = pods_of(docs)
    except StopIteration:  # the operator finds no container (pytorch, node) or port it needs
        return [*bad, "the operator finds no container or port by the name it looks for"]
    for address, container, spec, _ in pods:
        bad += [f"{address}: {v}" for v in resource_violations(container, spec)]
    return bad


def pod_rule_violations(spec):
    bad = []
    volumes = [v["name"] for v in spec.get("volumes", [])]
    for v in volumes:
        if not DNS1123_LABEL.fullmatch(v):
            bad.append(f"volume name {v!r} is not a DNS-1123 label")
    for c in spec["containers"]:
        if not DNS1123_LABEL.fullmatch(c["name"]):
            bad.append(f"container name {c['name']!r} is not a DNS-1123 label")
        for port in c.get("ports", []):
            if "name" in port and not IANA_SVC_NAME.fullmatch(port["name"]):
                bad.append(f"port name {port['name']!r} is not an IANA service name (<= 15 characters)")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                bad.append(f"container {c['name']} mounts {m['name']!r}, which is no volume of the pod ({volumes})")
    return bad


def resource_violations(container, spec):
    """A training container needs CPU and memory requests (without them the pod is BestEffort:
    evicted first, nothing reserved), and its memory must hold the in-memory /dev/shm, whose
    pages are charged to the container, with room to spare for the processes."""
    res = container.get("resources", {})
    requests, limits = res.get("requests", {}), res.get("limits", {})
    bad = [f"no {r} request (the pod would be BestEffort)" for r in ("cpu", "memory") if r not in requests]
    shm = sum(quantity(v["emptyDir"].get("sizeLimit", 0)) for v in spec.get("volumes", [])
              if v.get("emptyDir", {}).get("medium") == "Memory")
    if "memory" in requests and quantity(requests["memory"]) <= shm:
        bad.append(f"memory request {requests['memory']} does not exceed the {shm / 2**30:g}Gi of memory emptyDirs")
    if "memory" in limits and "memory" in requests and quantity(limits["memory"]) < quantity(requests["memory"]):
        bad.append(f"memory limit {limits['memory']} is below the request {requests['memory']}")
    return bad


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_manifest_follows_the_rules_the_schema_cannot_check(manifest):
    """Each k8s/ manifest should have DNS-1123 names (DNS-1035 for jobs), counts >= 1, mounts of
    declared volumes only, restart policies its kind accepts, set explicitly, and CPU and memory
    requests on every training container, the memory one above its in-memory /dev/shm."""
    bad = api_rule_violations(load(manifest))
    assert not bad, f"{manifest}:\n" + "\n".join(bad)


PJ_C = [*PJ_POD, "containers", 0]
TJ_C = [*TJ_POD, "containers", 0]
RULE_BROKEN = {
    "job-name-upper-case": ("pytorchjob.yaml", 0, ["metadata", "name"], "Team-DL-train", "DNS-1123 subdomain"),
    "job-name-digit-first": ("trainjob.yaml", 1, ["metadata", "name"], "2-train", "DNS-1035"),
    "container-name-underscore": ("pytorchjob.yaml", 0, [*PJ_C, "name"], "py_torch", "container name"),
    "volume-name-dot": ("trainjob.yaml", 0, [*TJ_POD, "volumes", 1, "name"], "tmp.dir", "volume name"),
    "port-name-too-long": ("pytorchjob.yaml", 0, [*PJ_C, "ports", 0, "name"], "pytorchjob-port1", "IANA"),
    "replicated-job-name-upper": ("trainjob.yaml", 0, [*TJ_POD[:5], "name"], "Node", "replicatedJob name"),
    "worker-replicas-zero": ("pytorchjob.yaml", 0, ["spec", "pytorchReplicaSpecs", "Worker", "replicas"], 0, "replicas 0 < 1"),
    "nproc-zero": ("pytorchjob.yaml", 0, ["spec", "nprocPerNode"], "0", "nprocPerNode"),
    "trainjob-nodes-zero": ("trainjob.yaml", 1, ["spec", "trainer", "numNodes"], 0, "numNodes 0 < 1"),
    "runtime-nodes-zero": ("trainjob.yaml", 0, ["spec", "mlPolicy", "numNodes"], 0, "mlPolicy.numNodes"),
    "mount-of-no-volume": ("pytorchjob.yaml", 0, [*PJ_C, "volumeMounts", 0, "name"], "shm", "no volume of the pod"),
    "pytorchjob-restart-unknown": ("pytorchjob.yaml", 0, ["spec", "pytorchReplicaSpecs", "Master", "restartPolicy"],
                                   "Sometimes", "restartPolicy 'Sometimes'"),
    "job-pod-restart-always": ("trainjob.yaml", 0, [*TJ_POD, "restartPolicy"], "Always", "restartPolicy 'Always'"),
    "job-pod-restart-unset": ("trainjob.yaml", 0, [*TJ_POD, "restartPolicy"], KeyError, "restartPolicy None"),
    "no-cpu-request": ("pytorchjob.yaml", 0, [*PJ_C, "resources", "requests", "cpu"], KeyError, "no cpu request"),
    "no-requests-at-all": ("trainjob.yaml", 0, [*TJ_C, "resources"], KeyError, None),
    # resourcesPerNode replaces the runtime container's resources whole (Trainer's jobset
    # builder.go, WithResources): limits alone there leave the pods without requests.
    "trainjob-limits-only": ("trainjob.yaml", 1, ["spec", "trainer", "resourcesPerNode", "requests"], KeyError,
                             "no memory request"),
    "memory-request-below-shm": ("pytorchjob.yaml", 0, [*PJ_C, "resources", "requests", "memory"], "8Gi",
                                 "does not exceed the 16Gi"),
    "memory-limit-below-request": ("pytorchjob.yaml", 0, [*PJ_C, "resources", "limits", "memory"], "32Gi",
                                   "below the request"),
}


@pytest.mark.parametrize("case", RULE_BROKEN.values(), ids=RULE_BROKEN.keys())
def test_each_rule_fails_a_manifest_that_breaks_it(case):
    """A copy of a k8s/ manifest broken in one place should fail the rules above, naming the
    broken rule (None: the manifest stays valid, e.g. a runtime without defaults)."""
    name, index, path, value, says = case
    docs = copy.deepcopy(load(name))
    _set(docs[index], path, value)
    bad = api_rule_violations(docs)
    if says is None:
        assert not bad, f"{name}: {path} = {value!r} should stay valid: {bad}"
    else:
        assert any(says in line for line in bad), f"{name}: {'.'.join(map(str, path))} = {value!r} passed: {bad}"


def test_a_failed_pod_fails_the_job_instead_of_restarting_alone():
    """No pod should restart on its own (a restarted torchrun cannot rejoin a static rendezvous):
    the PyTorchJob's replicas say Never; the TrainingRuntime's pods Never with backoffLimit 0
    and no JobSet restarts (JobSet would default to OnFailure and 6 retries)."""
    pj = load("pytorchjob.yaml")[0]
    assert {r: s.get("restartPolicy") for r, s in pj["spec"]["pytorchReplicaSpecs"].items()} == \
        {"Master": "Never", "Worker": "Never"}, pj["spec"]["pytorchReplicaSpecs"].keys()
    runtime = load("trainjob.yaml")[0]["spec"]["template"]["spec"]
    assert runtime.get("failurePolicy", {}).get("maxRestarts") == 0, f"JobSet failurePolicy: {runtime.get('failurePolicy')}"
    for rjob in runtime["replicatedJobs"]:
        job = rjob["template"]["spec"]
        assert job.get("backoffLimit") == 0 and job["template"]["spec"].get("restartPolicy") == "Never", \
            f"replicatedJob {rjob['name']}: backoffLimit {job.get('backoffLimit')}, restartPolicy " \
            f"{job['template']['spec'].get('restartPolicy')}"


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
    codes = [c.wait(timeout=480 * SLOWDOWN)["StatusCode"] for c in started]
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
    out.wait(timeout=60 * SLOWDOWN)
    stat = out.logs().decode().strip()
    assert re.fullmatch(rf"{sc['runAsUser']}:{sc['fsGroup']} \d+", stat), f"last.pt: {stat}"
