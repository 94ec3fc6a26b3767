"""deploy/: the Dockerfile and Kubernetes manifests, checked structurally (kubeconform is neither on PyPI nor in
Debian): every object has its kind's required fields, selectors match their pods, references resolve, probes and
metrics name what the service serves."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
REQUIRED = {  # kind -> (apiVersion, required spec paths)
    "Deployment": ("apps/v1", ("spec.selector.matchLabels", "spec.template.metadata.labels",
                               "spec.template.spec.containers")),
    "Service": ("v1", ("spec.selector", "spec.ports")),
    "Secret": ("v1", ()),
    "ScaledObject": ("keda.sh/v1alpha1", ("spec.scaleTargetRef.name", "spec.triggers", "spec.minReplicaCount",
                                          "spec.maxReplicaCount")),
    "Kustomization": ("kustomize.config.k8s.io/v1beta1", ()),
}
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label, as Kubernetes requires


def _get(obj, path: str):
    for part in path.split("."):
        obj = obj[part]
    return obj


@pytest.fixture(scope="module")
def objects() -> list:
    out = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        out += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def _by_kind(objects, kind) -> dict:
    return {d["metadata"]["name"]: d for _, d in objects if d["kind"] == kind}


def test_every_object_has_its_kinds_fields(objects):
    assert {d["kind"] for _, d in objects} == set(REQUIRED)
    for name, d in objects:
        api, paths = REQUIRED[d["kind"]]
        assert d["apiVersion"] == api, name
        if d["kind"] != "Kustomization":
            assert NAME.match(d["metadata"]["name"]), name
        for p in paths:
            assert _get(d, p), f"{name}: {d['kind']} lacks {p}"


def test_kustomization_lists_every_manifest(objects):
    (kust,) = [d for _, d in objects if d["kind"] == "Kustomization"]
    files = {f.name for f in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_deployments_select_their_pods_and_use_the_secret(objects):
    secrets = _by_kind(objects, "Secret")
    deployments = _by_kind(objects, "Deployment")
    assert set(deployments) == {"flowsim-api", "flowsim-worker"}
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert c["image"] and c["args"][0] == ("serve" if name == "flowsim-api" else "worker")
        (env,) = [e for e in c["env"] if e["name"] == "FLOWSIM_SERVICE_DB"]
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref["key"] in secrets[ref["name"]]["stringData"]
        assert secrets[ref["name"]]["stringData"][ref["key"]].startswith("postgresql://")
    api = deployments["flowsim-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["args"][api["args"].index("--workers") + 1] == "0:0"
    probes = {api["readinessProbe"]["httpGet"]["path"], api["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/healthz"}


def test_probes_and_service_point_at_what_the_app_serves(objects, tmp_path):
    pytest.importorskip("fastapi")
    from flowsim.service.app import create_app
    from flowsim.service.db import open_db

    routes = {r.path for r in create_app(open_db(f"sqlite:///{tmp_path / 's.sqlite'}")).routes}
    assert {"/readyz", "/healthz", "/metrics"} <= routes
    (svc,) = _by_kind(objects, "Service").values()
    api = _by_kind(objects, "Deployment")["flowsim-api"]
    assert svc["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"] for p in api["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports


def test_worker_autoscaling_on_queue_depth_with_a_night_floor(objects):
    (so,) = _by_kind(objects, "ScaledObject").values()
    assert so["spec"]["scaleTargetRef"]["name"] in _by_kind(objects, "Deployment")
    triggers = {t["type"]: t["metadata"] for t in so["spec"]["triggers"]}
    metrics = pytest.importorskip("flowsim.service.metrics")

    assert "flowsim_queue_depth" in triggers["prometheus"]["query"] and "flowsim_queue_depth" in metrics.__doc__
    cron = triggers["cron"]
    full, floor = int(cron["desiredReplicas"]), so["spec"]["minReplicaCount"]
    assert cron["start"].endswith("1-5") and cron["end"].endswith("1-5")  # workdays only
    assert 0.25 <= floor / full <= 0.35  # about 30 % at night and on weekends
    assert so["spec"]["maxReplicaCount"] >= full


def test_dockerfile_installs_the_service_and_runs_flowsim():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.1[1-9]", text, re.M)
    assert 'pip install --no-cache-dir ".[service]"' in text
    assert 'ENTRYPOINT ["flowsim"]' in text and "EXPOSE 8000" in text
    assert re.search(r"^USER \d+", text, re.M)  # not root
