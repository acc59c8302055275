"""deploy/kubernetes/: every object valid, and the pod the Deployment describes running.

- Rendered by ``kubectl kustomize`` (the base, the production overlay, the mesh wiring and the
  production overlay with the Envoy Gateway component).
- Core objects: ``kubernetes-validate --strict`` against Kubernetes 1.31 and the newest version
  it ships (unknown fields refused).
- Custom resources (ServiceMonitor, PrometheusRule, EnvoyFilter, BackendTrafficPolicy,
  EnvoyPatchPolicy): the ``openAPIV3Schema`` of their projects' own CRDs, kept in
  deploy/kubernetes/schemas/ (README.md there says where each came from), with unknown fields
  refused as ``kubectl apply --validate=strict`` refuses them. A kind with no schema fails.
- The PrometheusRule carries deploy/prometheus/alerts.yaml's groups, rule for rule.
- The ConfigMaps' files load (rules, Envoy configuration), and the Deployment's container runs as
  the kubelet would run it (tests/podman.py): its environment, the ConfigMaps and the Secret
  mounted as folders the kubelet writes, read-only root, its user: ready, probes answering.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from cp_server import free_port, unique_namespace
from kubernetes_validate.utils import latest_version
from podman import REPO, Container, configmap_dir, project_image
from rls_client import OK, Rls, descriptor
from support import eventually, installed_binary
from tls_served import client_ssl, grpc_channel

from control_plane.envoy import load_envoy_config
from control_plane.rules import load_rules
from control_plane.settings import load_settings

pytestmark = pytest.mark.timeout(300)

KUBE = REPO / "deploy/kubernetes"
SCHEMAS = KUBE / "schemas"
VERSIONS = ("1.31.0", latest_version())
#: what each rendering is; the last, the production overlay with Envoy Gateway's component
TARGETS = ("base", "overlays/production", "mesh/istio", "mesh/envoy-gateway", "production+envoy-gateway")
#: (group, kind) -> the CRD file its schema comes from
CRDS = {
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
    ("networking.istio.io", "EnvoyFilter"): "networking.istio.io_envoyfilters.yaml",
    ("networking.istio.io", "DestinationRule"): "networking.istio.io_destinationrules.yaml",
    ("cert-manager.io", "Certificate"): "cert-manager.io_certificates.yaml",
    ("gateway.envoyproxy.io", "BackendTrafficPolicy"): "gateway.envoyproxy.io_backendtrafficpolicies.yaml",
    ("gateway.envoyproxy.io", "EnvoyPatchPolicy"): "gateway.envoyproxy.io_envoypatchpolicies.yaml",
    ("gateway.envoyproxy.io", "EnvoyProxy"): "gateway.envoyproxy.io_envoyproxies.yaml",
}


@cache
def rendered(target: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """``kubectl kustomize`` of a target: (the YAML, its objects)."""
    kubectl = installed_binary("kubectl", "kubectl (the machine image's apt source; .ci/run installs it)")
    if target == "production+envoy-gateway":
        root = Path(os.environ.get("TMPDIR", "/tmp")) / f"shadowlimit-kustomize-{os.getpid()}"
        root.mkdir(exist_ok=True)
        (root / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [{os.path.relpath(KUBE / 'overlays/production', root)}]\n"
            f"components: [{os.path.relpath(KUBE / 'mesh/envoy-gateway/shadowlimit', root)}]\n"
        )
    else:
        root = KUBE / target
    proc = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def _group(obj: dict[str, Any]) -> str:
    api = obj["apiVersion"]
    return api.split("/")[0] if "/" in api else ""


def _is_custom(obj: dict[str, Any]) -> bool:
    return "." in _group(obj) and not _group(obj).endswith(".k8s.io")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_core_objects_pass_kubernetes_validate_strict(target, version, tmp_path):
    text, objects = rendered(target)
    core = [o for o in objects if not _is_custom(o)]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(core))
    tool = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run(
        [str(tool), "--strict", "-k", version, str(path)], capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ERROR" not in out and "WARN" not in out, out
    for obj in core:
        assert f"passed for resource {obj['kind'].lower()}/{obj['metadata']['name']}" in out, (obj["kind"], out)


def test_kubernetes_validate_strict_refuses_an_unknown_field(tmp_path):
    """The check above can fail: a misspelt field of the Deployment is refused."""
    deployment = next(o for o in rendered("base")[1] if o["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    tool = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run([str(tool), "--strict", "-k", VERSIONS[0], str(path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "readinesProbe" in proc.stdout + proc.stderr


@cache
def crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    """The CRD's schema for ``version``, unknown fields refused where the CRD does not keep them."""
    file = CRDS.get((group, kind))
    assert file, f"no CRD schema for {group}/{kind} in deploy/kubernetes/schemas/ (add the project's CRD)"
    crd = yaml.safe_load((SCHEMAS / file).read_text())
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["group"] == group
    assert crd["spec"]["names"]["kind"] == kind
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served", True)}
    assert version in served, f"{group}/{kind}: the CRD serves {sorted(served)}, not {version}"
    schema = copy.deepcopy(served[version]["schema"]["openAPIV3Schema"])
    # the API server accepts these at the top of every object, whether the CRD lists them or not
    for name, kind in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
        schema.setdefault("properties", {}).setdefault(name, {"type": kind})
    return _strict(schema)


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _crd_errors(obj: dict[str, Any]) -> list[str]:
    schema = crd_schema(_group(obj), obj["kind"], obj["apiVersion"].split("/")[1])
    validator = jsonschema.Draft4Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("target", TARGETS)
def test_custom_resources_match_their_projects_crds(target):
    custom = [o for o in rendered(target)[1] if _is_custom(o)]
    for obj in custom:
        errors = _crd_errors(obj)
        assert not errors, (obj["kind"], obj["metadata"]["name"], errors)


def test_every_crd_kind_is_shipped_and_checked():
    kinds = {(_group(o), o["kind"]) for t in TARGETS for o in rendered(t)[1] if _is_custom(o)}
    assert kinds == set(CRDS)


@pytest.mark.parametrize(
    "kind", ["ServiceMonitor", "EnvoyFilter", "BackendTrafficPolicy", "Certificate", "DestinationRule"]
)
def test_a_crd_schema_refuses_an_unknown_field(kind):
    """The check above can fail: an unknown field, and a wrong type, are refused."""
    obj = next(o for t in TARGETS for o in rendered(t)[1] if o["kind"] == kind)
    typo = copy.deepcopy(obj)
    typo["spec"]["selectr"] = {}
    assert any("selectr" in e for e in _crd_errors(typo))
    wrong = copy.deepcopy(obj)
    wrong["spec"] = "not a mapping"
    assert _crd_errors(wrong)


def test_the_prometheus_rule_is_the_shipped_alert_rules():
    rule = next(o for o in rendered("base")[1] if o["kind"] == "PrometheusRule")
    shipped = yaml.safe_load((REPO / "deploy/prometheus/alerts.yaml").read_text())
    assert rule["spec"]["groups"] == shipped["groups"]


def _deployment(target: str = "base") -> dict[str, Any]:
    return next(o for o in rendered(target)[1] if o["kind"] == "Deployment")


def test_the_deployment_s_shape():
    base, production = _deployment("base"), _deployment("overlays/production")
    spec = base["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert base["spec"]["replicas"] == 3
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert (
        spec["securityContext"]["runAsNonRoot"]
        and spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    )
    keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    # hot reload: the ConfigMaps are mounted as folders (a subPath mount is never updated)
    assert not [m for m in container["volumeMounts"] if "subPath" in m]
    hard = production["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert ("kubernetes.io/hostname", "DoNotSchedule") in {(c["topologyKey"], c["whenUnsatisfiable"]) for c in hard}


def test_only_the_gateways_reach_the_grpc_port_and_only_prometheus_and_clients_the_http_one():
    policy = next(o for o in rendered("base")[1] if o["kind"] == "NetworkPolicy")
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}
    assert set(by_port) == {"grpc", "http"}
    grpc_from = {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in by_port["grpc"]}
    assert grpc_from == {"istio-system", "envoy-gateway-system"}
    assert all(p.get("podSelector", {}).get("matchLabels") for p in by_port["grpc"] + by_port["http"])


@pytest.mark.parametrize("target", ["base", "production+envoy-gateway"])
def test_the_config_maps_load(target, tmp_path, monkeypatch):
    objects = rendered(target)[1]
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    settings = load_settings(redis_url="redis://127.0.0.1:6379/0", enable_distributed_rate_limiting=True)
    rules = tmp_path / "rules.yaml"
    rules.write_text(maps["shadowlimit-rules"]["rules.yaml"])
    assert load_rules(str(rules), settings).routes
    envoy = configmap_dir(tmp_path / "envoy", maps["shadowlimit-envoy"])
    domains = {r.name.split("/")[0] for r in load_envoy_config(str(envoy), settings).routes}
    expected = {"edge"} | ({"default%2Feg%2Fhttp"} if target != "base" else set())
    assert domains == expected, domains


def _container_environment(deployment: dict[str, Any], secret: dict[str, Any], pod: str) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (Secret keys, the pod's name)."""
    env = {}
    for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in source:
            env[var["name"]] = secret["stringData"][source["secretKeyRef"]["key"]]
        else:
            assert source["fieldRef"]["fieldPath"] == "metadata.name", source
            env[var["name"]] = pod
    return env


def _answers(api: httpx.Client, path: str) -> bool:
    try:
        return api.get(path).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_pod_runs_as_the_kubelet_would_run_it(redis_server, test_pki, tmp_path):
    """The base's Deployment in Podman: its env (the Redis URL swapped for the test Redis), the
    ConfigMaps and the Secrets as the kubelet mounts them (cert-manager's shadowlimit-tls: the test
    PKI's server certificate, key and CA), its user, a read-only root and /tmp; its probes over
    HTTPS, the gRPC port over mutual TLS (the test PKI's client certificate in place of the
    gateways' name)."""
    image, _ = project_image()
    objects = rendered("base")[1]
    deployment = _deployment()
    secret = next(o for o in objects if o["kind"] == "Secret")
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    env = _container_environment(deployment, secret, pod="shadowlimit-7d9f-abcde")
    env["RATE_LIMIT_REDIS_URL"] = redis_server.url
    port, grpc = free_port(), free_port()
    env |= {"SHADOWLIMIT_HOST": "127.0.0.1", "SHADOWLIMIT_PORT": str(port), "SHADOWLIMIT_GRPC_PORT": str(grpc),
            "SHADOWLIMIT_NAMESPACE": unique_namespace("pod")}  # fmt: skip  # the host's network: loopback
    assert env["SHADOWLIMIT_GRPC_TLS_CLIENT_NAMES"] == "DNS:gateway.shadowlimit.internal"
    env["SHADOWLIMIT_GRPC_TLS_CLIENT_NAMES"] = "DNS:envoy.internal"  # the test PKI's client certificate
    spec = deployment["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    options = ["--network", "host", "--read-only", "--user", f"{spec['securityContext']['runAsUser']}:"
               f"{spec['securityContext']['runAsGroup']}", "--cap-drop", "ALL", "--tmpfs", mounts["tmp"]]  # fmt: skip
    for volume in spec["volumes"]:
        if "configMap" in volume:
            files = maps[volume["configMap"]["name"]]
        elif volume.get("secret", {}).get("secretName") == "shadowlimit-tls":  # cert-manager's
            pem = {"tls.crt": test_pki.server_cert, "tls.key": test_pki.server_key, "ca.crt": test_pki.ca_cert}
            files = {i["path"]: Path(pem[i["key"]]).read_text() for i in volume["secret"]["items"]}
        elif "secret" in volume:
            files = {i["path"]: secret["stringData"][i["key"]] for i in volume["secret"]["items"]}
        else:
            continue
        folder = configmap_dir(tmp_path / volume["name"], files)
        options += ["-v", f"{folder}:{mounts[volume['name']]}:ro"]
    with Container(image, deployment["spec"]["template"]["spec"]["containers"][0]["args"], env=env,
                   options=options):  # fmt: skip
        probes = spec["containers"][0]
        assert {probes[p]["httpGet"]["scheme"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {
            "HTTPS"
        }
        api = httpx.Client(base_url=f"https://localhost:{port}", verify=client_ssl(test_pki.ca_cert), timeout=5)
        eventually(lambda: _answers(api, probes["startupProbe"]["httpGet"]["path"]), 60, what="the HTTPS port")
        ready = api.get(probes["readinessProbe"]["httpGet"]["path"])
        assert ready.status_code == 200 and ready.json()["rules"]["error"] is None, ready.text
        assert ready.json()["instance_id"] == "shadowlimit-7d9f-abcde"
        assert api.get(probes["livenessProbe"]["httpGet"]["path"]).status_code == 200
        routes = api.get("/v1/routes")
        assert routes.status_code == 401  # the tokens file is there: reads need a viewer token
        api.close()
        rls = Rls(grpc, grpc_channel(grpc, test_pki.ca_cert, (test_pki.envoy_client_cert, test_pki.envoy_client_key)))
        try:  # the Envoy configuration folder: its `edge` domain, /login in shadow (OK, and counted)
            assert rls.codes(descriptor(("path", "/login")), domain="edge") == (OK, [OK])
        finally:
            rls.close()
