"""Make the pinned schema copies in this folder from the upstream files (run by hand when a
version moves; tests/test_k8s.py only reads the results). What is dropped changes no rule:
`description` texts, and the Kubernetes definitions that neither a PodTemplateSpec nor a
PersistentVolumeClaim (the kinds k8s/ uses) can reach.

  git -C kubernetes-client/python show v33.1.0:kubernetes/swagger.json.unprocessed > swagger.json
  git -C kubeflow/trainer show v1.9.4:manifests/base/crds/kubeflow.org_pytorchjobs.yaml > pj.yaml
  git -C kubeflow/trainer show v2.3.0:manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml > tj.yaml
  git -C kubeflow/trainer show v2.3.0:manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml > tr.yaml
  python tests/data/k8s/pin.py swagger.json pj.yaml tj.yaml tr.yaml
"""
import json
import pathlib
import sys

import yaml

HERE = pathlib.Path(__file__).resolve().parent
K8S_SOURCE = {
    "url": "https://github.com/kubernetes/kubernetes/blob/release-1.33/api/openapi-spec/swagger.json",
    "copy": "https://github.com/kubernetes-client/python/blob/v33.1.0/kubernetes/swagger.json.unprocessed",
    "version": "Kubernetes 1.33 (kubernetes-client/python v33.1.0, "
               "commit 8f5578ee6845d33b3fb54867e2ea88349df6d07e)",
}
CRD_SOURCES = {  # CRD file -> (tag, commit) in github.com/kubeflow/trainer
    "kubeflow.org_pytorchjobs.yaml": ("v1.9.4", "4445c12aa62e4345b0c2c6ac9b215a70eca46ed7"),
    "trainer.kubeflow.org_trainjobs.yaml": ("v2.3.0", "658725bdae5c7e3a0854d93ac6ff492e109a22ab"),
    "trainer.kubeflow.org_trainingruntimes.yaml": ("v2.3.0", "658725bdae5c7e3a0854d93ac6ff492e109a22ab"),
}


def strip_descriptions(node):
    if isinstance(node, dict):
        # A property may itself be called "description" (properties: {description: {...}}).
        return {k: strip_descriptions(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def reachable(definitions, root):
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = json.dumps(definitions[name])
        for ref in text.split('"$ref": "#/definitions/')[1:]:
            todo.append(ref.split('"', 1)[0])
    return seen


def pin_kubernetes(swagger_path):
    defs = json.loads(pathlib.Path(swagger_path).read_text())["definitions"]
    keep = sorted(reachable(defs, "io.k8s.api.core.v1.PodTemplateSpec")
                  | reachable(defs, "io.k8s.api.core.v1.PersistentVolumeClaim"))
    out = {"$comment": "Kubernetes OpenAPI definitions reachable from io.k8s.api.core.v1."
                       "PodTemplateSpec and PersistentVolumeClaim, descriptions removed"
                       " (tests/data/k8s/pin.py)",
           "source": K8S_SOURCE,
           "definitions": {name: strip_descriptions(defs[name]) for name in keep}}
    target = HERE / "kubernetes-1.33-subset.json"
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(target.name, len(keep), "definitions")


def pin_crd(crd_path):
    name = pathlib.Path(crd_path).name
    for known in CRD_SOURCES:
        if name.endswith(known.split("_", 1)[1]):
            name = known
    tag, commit = CRD_SOURCES[name]
    crd = yaml.safe_load(pathlib.Path(crd_path).read_text())
    versions = {v["name"]: strip_descriptions(v["schema"]["openAPIV3Schema"])
                for v in crd["spec"]["versions"]}
    out = {"$comment": f"openAPIV3Schema of {crd['metadata']['name']}, descriptions removed"
                       " (tests/data/k8s/pin.py)",
           "source": {"url": f"https://github.com/kubeflow/trainer/blob/{tag}/manifests/base/crds/{name}",
                      "version": f"kubeflow/trainer {tag}, commit {commit}"},
           "group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"],
           "versions": versions}
    target = HERE / f"{pathlib.Path(name).stem}-{tag}.json"
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(target.name, sorted(versions))


if __name__ == "__main__":
    pin_kubernetes(sys.argv[1])
    for path in sys.argv[2:]:
        pin_crd(path)
