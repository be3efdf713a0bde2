"""Checks deploy/ offline; run by scripts/check-deploy, which sets up its tools.

1. Every YAML file parses. Every Kubernetes object of a built-in kind
   validates against the Kubernetes KUBERNETES_VERSION schemas
   (kubernetes-validate, strict: unknown fields are errors); a kind it has
   no schema for is an error, not a warning.
2. The KEDA and Prometheus-operator objects validate against cloudcoil's
   models of their CRDs (pydantic, generated from the CRDs' OpenAPI
   schemas), and a field the model drops (unknown to the CRD) or a value
   it converts (a string where the CRD wants a number) is an error too.
3. What ties the files together: Services, PodMonitors, the
   PodDisruptionBudget and the ServiceMonitor select what exists and name
   ports that exist; probes, resources and a locked-down securityContext on
   every container; secrets only through secretKeyRef; the worker's grace
   period above its leave timeout and its probes on /health/live and
   /health/ready; the dashboard read-only with its login from a Secret;
   the `peerq` commands, flags and environment variables the manifests use
   exist in src/ (a command not written yet is reported, not failed); the
   ScaledObjects' target, trigger and query; the alert rules' fields; the
   PrometheusRule's groups equal alerts.yaml's; every metric name an
   expression or a query uses is one the exporter or src/metrics.rs
   defines.
4. The Dockerfiles: hadolint, and our own rules: every FROM pinned (an
   exact version tag, no `latest`, or a digest), multi-stage, the final
   stage's USER numeric and not root, ENTRYPOINT in exec form (SIGTERM
   reaches the process), no secret in ENV or ARG, a .dockerignore beside
   each that keeps target/ out.
5. With promtool (env PROMTOOL): `promtool check rules` on alerts.yaml and
   on the PrometheusRule's groups, `promtool test rules` on
   alerts.test.yaml.

Exits 1 naming every failure, 0 when all pass.
"""

import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv_utils
from pydantic import ValidationError as PydanticError

KUBERNETES_VERSION = "1.30.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
RULES_FILE = "deploy/prometheus/alerts.yaml"
RULES_TEST_FILE = "deploy/prometheus/alerts.test.yaml"
# The exporter's gauges (`peerq exporter`), each labelled `service`, as
# the contract gives them: the exporter must define every one of them.
EXPORTER_METRICS = {
    "peerq_service_backlog_entries",
    "peerq_service_oldest_waiting_seconds",
    "peerq_service_delayed_tasks",
    "peerq_service_dead_letters",
    "peerq_service_instances",
    "peerq_service_paused",
}
# The rules the README names, and the exporter's gauge one rule must watch.
REQUIRED_ALERTS = {"PeerqBacklogGrowing", "PeerqNoReadyInstance"}
CRD_GROUPS = {"keda.sh", "monitoring.coreos.com"}
SEVERITIES = {"critical", "warning", "info"}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
DURATION = re.compile(r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|BASIC_AUTH|REDIS_URL|POSTGRES_URL|CREDENTIAL", re.I)

failures = []
notes = []


def fail(where, message):
    failures.append(f"{where}: {message}")


def rel(path):
    return os.path.relpath(path, ROOT)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- loading


def load_documents():
    """Every object of every YAML file under deploy/ but the rules files:
    a list of (file, index, object)."""
    objects = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)):
        name = rel(path)
        if name in (RULES_FILE, RULES_TEST_FILE):
            continue
        try:
            documents = list(yaml.safe_load_all(read(path)))
        except yaml.YAMLError as e:
            fail(name, f"does not parse: {e}")
            continue
        for i, doc in enumerate(documents):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                fail(f"{name}#{i}", "is not a mapping")
                continue
            for field in ("apiVersion", "kind"):
                if not isinstance(doc.get(field), str):
                    fail(f"{name}#{i}", f"has no {field}")
            if not (doc.get("metadata") or {}).get("name"):
                fail(f"{name}#{i}", "has no metadata.name")
            if isinstance(doc.get("apiVersion"), str) and isinstance(doc.get("kind"), str):
                objects.append((name, i, doc))
    return objects


def label(name, i, doc):
    return f"{name}: {doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"


# ------------------------------------------------------ built-in schemas


def validate_builtin(name, i, doc):
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kv_utils.SchemaNotFoundError:
        fail(label(name, i, doc), f"no Kubernetes {KUBERNETES_VERSION} schema for {doc['apiVersion']} {doc['kind']} (a typo, or a CRD this check does not know)")
    except kv_utils.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "(root)"
        fail(label(name, i, doc), f"Kubernetes {KUBERNETES_VERSION} schema: {path}: {e.message}")


# ------------------------------------------------------------ CRD models


def crd_models():
    from cloudcoil.models.keda import v1alpha1 as keda
    from cloudcoil.models.prometheus_operator import v1 as monitoring

    return {
        ("keda.sh/v1alpha1", "ScaledObject"): keda.ScaledObject,
        ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring.PrometheusRule,
        ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PodMonitor"): monitoring.PodMonitor,
    }


def differences(given, kept, path):
    """Where `kept` (the model's dump) lost or changed what `given` had."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            yield f"{path or '(root)'}: became {kept!r}"
            return
        for key, value in given.items():
            where = f"{path}.{key}" if path else key
            if key not in kept:
                yield f"{where}: unknown field"
            else:
                yield from differences(value, kept[key], where)
    elif isinstance(given, list):
        if not isinstance(kept, list) or len(kept) != len(given):
            yield f"{path}: became {kept!r}"
            return
        for n, (a, b) in enumerate(zip(given, kept)):
            yield from differences(a, b, f"{path}[{n}]")
    elif given != kept or type(given) is not type(kept):
        yield f"{path}: {given!r} is not of the CRD's type (read as {kept!r})"


def validate_crd(name, i, doc, models):
    model = models.get((doc["apiVersion"], doc["kind"]))
    if model is None:
        fail(label(name, i, doc), f"no CRD model for {doc['apiVersion']} {doc['kind']}")
        return
    try:
        parsed = model.model_validate(doc)
    except PydanticError as e:
        for error in e.errors():
            where = ".".join(str(p) for p in error["loc"])
            fail(label(name, i, doc), f"CRD schema: {where}: {error['msg']}")
        return
    kept = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    for difference in differences(doc, kept, ""):
        fail(label(name, i, doc), f"CRD schema: {difference}")


# ------------------------------------------------------------ the source


def metric_names():
    """The metric names the exporter (src/admin/exporter/, which must
    define the contract's EXPORTER_METRICS) and src/metrics.rs define."""
    exporter = os.path.join(ROOT, "src", "admin", "exporter")
    source = "".join(
        read(os.path.join(exporter, f)) for f in sorted(os.listdir(exporter)) if f.endswith(".rs")
    )
    names = set(re.findall(r'"(peerq_service_\w+)"', source))
    for missing in sorted(EXPORTER_METRICS - names):
        fail("src/admin/exporter/", f"the exporter does not define {missing}, a contract's metric")
    source = read(os.path.join(ROOT, "src", "metrics.rs"))
    names |= set(re.findall(r'pub const \w+: &str = "(peerq_\w+)";', source))
    return names


def unknown_metrics(expr, known):
    """peerq_* names in a PromQL expression that no one defines."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    unknown = set()
    for name in re.findall(r"\bpeerq_[a-zA-Z0-9_]*", without_strings):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in known and base not in known:
            unknown.add(name)
    return sorted(unknown)


def cli_source():
    files = sorted(glob.glob(os.path.join(ROOT, "src", "bin", "peerq", "**", "*.rs"), recursive=True))
    return "\n".join(read(f) for f in files)


def all_source():
    files = glob.glob(os.path.join(ROOT, "src", "**", "*.rs"), recursive=True)
    return "\n".join(read(f) for f in files)


def long_flags(text):
    """The long flags clap derives from the `#[arg(...)]` fields in `text`:
    `long = "x"` gives --x, a bare `long` the field's name in kebab case."""
    flags = set()
    for m in re.finditer(r"#\[arg\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)\]", text):
        attribute = m.group(1)
        if not re.search(r"\blong\b", attribute):
            continue
        named = re.search(r'\blong\s*=\s*"([^"]+)"', attribute)
        field = re.match(r"(?:\s*(?:#\[[^\]]*\]|///[^\n]*))*\s*(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:", text[m.end():])
        if named:
            flags.add(named.group(1))
        elif field:
            flags.add(field.group(1).replace("_", "-"))
    return flags


def block(text, start):
    """The text of the braces that open at or after `start`."""
    open_at = text.index("{", start)
    depth = 0
    for n in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[n], 0)
        if depth == 0:
            return text[open_at : n + 1]
    return text[open_at:]


def check_cli_args(where, args, cli):
    """The `peerq` command and flags a container's args use exist in
    src/bin/peerq (clap derive: a variant per command, its fields the
    flags, and the global flags of `Cli`)."""
    if not args:
        fail(where, "runs the peerq image without a command")
        return
    command = args[0]
    variant = "".join(part.capitalize() for part in command.split("-"))
    found = re.search(rf"^\s*{variant}\s*([{{(])", cli, re.M)
    if not found:
        notes.append(f"{where}: src/bin/peerq has no `{command}` command yet: its flags are not checked")
        return
    cli_struct = re.search(r"struct Cli\b", cli)
    globals_ = long_flags(block(cli, cli_struct.start())) if cli_struct else set()
    own = long_flags(block(cli, found.start())) if found.group(1) == "{" else long_flags(cli)
    for flag in (a for a in args[1:] if a.startswith("--")):
        flag = flag.split("=", 1)[0][2:]
        if flag not in own | globals_:
            fail(where, f"`peerq {command}` has no flag --{flag} in src/bin/peerq (it has {', '.join('--' + f for f in sorted(own)) or 'none'})")


# -------------------------------------------------------- the manifests


def pod_spec(doc):
    return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}


def pod_labels(doc):
    return (((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def selects(selector, labels):
    match = (selector or {}).get("matchLabels", selector or {})
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def env_of(container):
    return {e["name"]: e for e in container.get("env") or [] if "name" in e}


def env_value(container, name, default=None):
    entry = env_of(container).get(name)
    return entry.get("value", default) if entry else default


def from_secret(where, container, name, required=True):
    entry = env_of(container).get(name)
    if entry is None:
        if required:
            fail(where, f"sets no {name}")
        return False
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
    if "value" in entry or not ref:
        fail(where, f"{name} must come from a Secret (valueFrom.secretKeyRef), not a literal value")
        return False
    if ref.get("optional"):
        fail(where, f"{name}'s Secret must not be optional")
    return True


def port_number(container, port):
    """A probe's or a Service's port (a name or a number) as a container
    port number, or None."""
    for p in container.get("ports") or []:
        if port in (p.get("name"), p.get("containerPort")):
            return p.get("containerPort")
    return None


def listen_port(where, address):
    match = re.fullmatch(r"(?:\[[^\]]*\]|[^:]*):(\d+)", str(address or ""))
    if not match:
        fail(where, f"listen address {address!r} has no port")
        return None
    return int(match.group(1))


def check_container_basics(where, pod, container):
    image = container.get("image", "")
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    if "@sha256:" not in image and (not tag or tag == "latest"):
        fail(where, f"image {image!r} has no version tag (or is :latest)")
    for probe in ("livenessProbe", "readinessProbe"):
        if probe not in container:
            fail(where, f"has no {probe}")
    resources = container.get("resources") or {}
    for bound in ("requests", "limits"):
        for kind, quantity in (resources.get(bound) or {}).items():
            if not QUANTITY.match(str(quantity)):
                fail(where, f"resources.{bound}.{kind} {quantity!r} is not a Kubernetes quantity")
    for kind in ("cpu", "memory"):
        if kind not in (resources.get("requests") or {}):
            fail(where, f"requests no {kind}")
    if "memory" not in (resources.get("limits") or {}):
        fail(where, "has no memory limit")
    pod_security = pod.get("securityContext") or {}
    security = container.get("securityContext") or {}
    if not (security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))):
        fail(where, "is not runAsNonRoot")
    user = security.get("runAsUser", pod_security.get("runAsUser"))
    if user == 0:
        fail(where, "runs as user 0")
    if security.get("readOnlyRootFilesystem") is not True:
        fail(where, "has no readOnlyRootFilesystem: true")
    if security.get("allowPrivilegeEscalation") is not False:
        fail(where, "has no allowPrivilegeEscalation: false")
    if "ALL" not in ((security.get("capabilities") or {}).get("drop") or []):
        fail(where, "does not drop ALL capabilities")
    for entry in container.get("env") or []:
        value = str(entry.get("value", ""))
        if SECRET_NAME.search(entry.get("name", "")) and "value" in entry:
            fail(where, f"{entry['name']} is a literal value: take it from a Secret")
        if re.search(r"://[^/@\s]*:[^/@\s]*@", value):
            fail(where, f"{entry['name']} holds credentials in a URL: take it from a Secret")
    for port in container.get("ports") or []:
        if not port.get("name"):
            fail(where, f"container port {port.get('containerPort')} has no name")


def check_worker(where, doc, container):
    spec = pod_spec(doc)
    leave = env_value(container, "PEERQ_LEAVE_TIMEOUT_SECS", "25")
    try:
        leave = float(leave)
    except ValueError:
        fail(where, f"PEERQ_LEAVE_TIMEOUT_SECS {leave!r} is not a number")
        return
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < leave + 10:
        fail(where, f"terminationGracePeriodSeconds {grace} is below the leave timeout ({leave:g} s) + 10 s: the kubelet would kill the leave")
    from_secret(where, container, "PEERQ_REDIS_URL")
    port = listen_port(where, env_value(container, "PEERQ_HTTP_ADDR", "0.0.0.0:9000"))
    for probe, path in (("livenessProbe", "/health/live"), ("readinessProbe", "/health/ready")):
        get = (container.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path:
            fail(where, f"{probe} is not an httpGet of {path}")
        elif port_number(container, get.get("port")) != port:
            fail(where, f"{probe}'s port {get.get('port')!r} is not PEERQ_HTTP_ADDR's port {port}")
    if env_value(container, "PEERQ_SERVICE") is None:
        fail(where, "sets no PEERQ_SERVICE")


def check_dashboard(where, container, args):
    if "--read-only" not in args:
        fail(where, "the dashboard is not --read-only (the default these files promise)")
    auth = [n for n in ("PEERQ_DASHBOARD_BASIC_AUTH", "PEERQ_DASHBOARD_TOKEN") if n in env_of(container)]
    if len(auth) != 1:
        fail(where, f"needs exactly one of PEERQ_DASHBOARD_BASIC_AUTH and PEERQ_DASHBOARD_TOKEN (has {auth or 'none'})")
    for name in auth:
        from_secret(where, container, name)
    from_secret(where, container, "PEERQ_REDIS_URL")


def flag_value(args, flag):
    for n, a in enumerate(args):
        if a == flag and n + 1 < len(args):
            return args[n + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def check_manifests(objects, known_metrics):
    by_kind = {}
    for name, i, doc in objects:
        by_kind.setdefault(doc["kind"], []).append((name, i, doc))
    deployments = by_kind.get("Deployment", [])
    services = by_kind.get("Service", [])
    cli = cli_source()
    source = all_source()
    worker_example = os.path.join(ROOT, "examples", "worker.rs")
    worker_source = read(worker_example) if os.path.exists(worker_example) else None
    workers = {}

    for name, i, doc in deployments:
        spec = pod_spec(doc)
        if not selects((doc.get("spec") or {}).get("selector"), pod_labels(doc)):
            fail(label(name, i, doc), "spec.selector does not match the pod template's labels")
        if spec.get("automountServiceAccountToken") is not False:
            fail(label(name, i, doc), "mounts a service account token it does not need")
        for container in spec.get("containers") or []:
            where = f"{label(name, i, doc)} container {container.get('name')}"
            check_container_basics(where, spec, container)
            image = container.get("image", "")
            repository = image.split("@")[0].rsplit(":", 1)[0].rsplit("/", 1)[-1]
            args = [str(a) for a in container.get("args") or []]
            if repository == "peerq":
                check_cli_args(where, args, cli)
                for env in env_of(container):
                    if f'"{env}"' not in source:
                        fail(where, f"sets {env}, which nothing in src/ reads")
                command = args[0] if args else ""
                listen = flag_value(args, "--listen")
                if command in ("dashboard", "exporter"):
                    port = listen_port(where, listen) if listen else None
                    if listen is None:
                        fail(where, f"`peerq {command}` without --listen listens on loopback only")
                    elif port_number(container, port) is None:
                        fail(where, f"--listen port {port} is not a container port")
                    if listen and listen.startswith("127."):
                        fail(where, f"--listen {listen} is loopback: unreachable from the Service")
                if command == "dashboard":
                    check_dashboard(where, container, args)
                elif command == "exporter":
                    from_secret(where, container, "PEERQ_REDIS_URL")
                    if not flag_value(args, "--service"):
                        fail(where, "the exporter is given no --service")
            elif repository == "peerq-worker":
                check_worker(where, doc, container)
                workers[doc["metadata"]["name"]] = env_value(container, "PEERQ_SERVICE")
                if worker_source is None:
                    notes.append(f"{where}: examples/worker.rs does not exist yet: its environment variables are not checked")
                else:
                    for env in env_of(container):
                        if f'"{env}"' not in worker_source:
                            fail(where, f"sets {env}, which examples/worker.rs does not read")
            else:
                fail(where, f"image {image!r} is neither peerq nor peerq-worker")
    if not workers:
        fail("deploy/kubernetes", "no worker Deployment (image peerq-worker)")

    def deployment_selected(selector):
        return [d for d in deployments if selects(selector, pod_labels(d[2]))]

    for name, i, doc in services:
        spec = doc.get("spec") or {}
        targets = deployment_selected(spec.get("selector"))
        if not targets:
            fail(label(name, i, doc), "selects no Deployment's pods")
            continue
        containers = [c for t in targets for c in pod_spec(t[2]).get("containers") or []]
        for port in spec.get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            if not any(port_number(c, target) for c in containers):
                fail(label(name, i, doc), f"targetPort {target!r} is no container port of the pods it selects")
    for name, i, doc in by_kind.get("PodDisruptionBudget", []):
        targets = deployment_selected((doc.get("spec") or {}).get("selector"))
        if not targets:
            fail(label(name, i, doc), "selects no Deployment's pods")
    pdb_targets = {
        t[2]["metadata"]["name"]
        for _, _, pdb in by_kind.get("PodDisruptionBudget", [])
        for t in deployment_selected((pdb.get("spec") or {}).get("selector"))
    }
    for worker in workers:
        if worker not in pdb_targets:
            fail(f"Deployment/{worker}", "has no PodDisruptionBudget")
    for name, i, doc in by_kind.get("ServiceMonitor", []):
        spec = doc.get("spec") or {}
        matched = [s for s in services if selects(spec.get("selector"), (s[2].get("metadata") or {}).get("labels") or {})]
        if not matched:
            fail(label(name, i, doc), "selects no Service")
        names = {p.get("name") for s in matched for p in (s[2].get("spec") or {}).get("ports") or []}
        for endpoint in spec.get("endpoints") or []:
            if endpoint.get("port") not in names:
                fail(label(name, i, doc), f"endpoint port {endpoint.get('port')!r} is no port name of the Services it selects")
    for name, i, doc in by_kind.get("PodMonitor", []):
        spec = doc.get("spec") or {}
        targets = deployment_selected(spec.get("selector"))
        if not targets:
            fail(label(name, i, doc), "selects no Deployment's pods")
        containers = [c for t in targets for c in pod_spec(t[2]).get("containers") or []]
        for endpoint in spec.get("podMetricsEndpoints") or []:
            if not any(port_number(c, endpoint.get("port")) for c in containers):
                fail(label(name, i, doc), f"port {endpoint.get('port')!r} is no container port of the pods it selects")

    minimums = set()
    for name, i, doc in by_kind.get("ScaledObject", []):
        where = label(name, i, doc)
        spec = doc.get("spec") or {}
        target = spec.get("scaleTargetRef") or {}
        if target.get("kind", "Deployment") != "Deployment" or target.get("name") not in workers:
            fail(where, f"scaleTargetRef {target.get('name')!r} is not a worker Deployment of deploy/kubernetes ({', '.join(sorted(workers))})")
        low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        minimums.add(min(low, 1))
        if low > high:
            fail(where, f"minReplicaCount {low} is above maxReplicaCount {high}")
        triggers = spec.get("triggers") or []
        if not triggers:
            fail(where, "has no trigger")
        for n, trigger in enumerate(triggers):
            at = f"{where} triggers[{n}]"
            if trigger.get("type") != "prometheus":
                fail(at, f"type {trigger.get('type')!r} is not prometheus")
                continue
            meta = trigger.get("metadata") or {}
            for field in ("serverAddress", "query", "threshold"):
                if not meta.get(field):
                    fail(at, f"metadata.{field} is missing")
            if meta.get("serverAddress") and not re.match(r"^https?://[^/\s]+", meta["serverAddress"]):
                fail(at, f"serverAddress {meta['serverAddress']!r} is not an http(s) URL")
            try:
                if float(meta.get("threshold", "x")) <= 0:
                    fail(at, "threshold must be above 0")
            except ValueError:
                fail(at, f"threshold {meta.get('threshold')!r} is not a number")
            query = meta.get("query", "")
            for metric in unknown_metrics(query, known_metrics):
                fail(at, f"query uses {metric}, which neither the exporter nor src/metrics.rs defines")
            if "peerq_service_backlog_entries" not in query:
                fail(at, "query does not read peerq_service_backlog_entries")
            service = workers.get(target.get("name"))
            if service and f'service="{service}"' not in query:
                fail(at, f"query is not about service=\"{service}\" (the target's PEERQ_SERVICE)")
    if by_kind.get("ScaledObject") and minimums != {0, 1}:
        fail("deploy/keda", "wants one ScaledObject with minReplicaCount 0 (scale to zero) and one with at least 1 (periodic jobs)")
    elif not by_kind.get("ScaledObject"):
        fail("deploy/keda", "has no ScaledObject")
    return by_kind


# ------------------------------------------------------------ the rules


def check_rules(by_kind, known_metrics):
    try:
        rules = yaml.safe_load(read(os.path.join(ROOT, RULES_FILE)))
    except (OSError, yaml.YAMLError) as e:
        fail(RULES_FILE, f"does not load: {e}")
        return None
    groups = (rules or {}).get("groups")
    if not isinstance(groups, list) or not groups:
        fail(RULES_FILE, "has no groups")
        return None
    names = []
    watched = set()
    for group in groups:
        if not group.get("name"):
            fail(RULES_FILE, "a group has no name")
        for rule in group.get("rules") or []:
            alert = rule.get("alert")
            where = f"{RULES_FILE}: {alert or rule.get('record') or '?'}"
            if not alert:
                fail(where, "is not an alerting rule (no alert:)")
                continue
            names.append(alert)
            expr = rule.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                fail(where, "has no expr")
                continue
            if not DURATION.match(str(rule.get("for", ""))):
                fail(where, f"for {rule.get('for')!r} is not a duration")
            if (rule.get("labels") or {}).get("severity") not in SEVERITIES:
                fail(where, f"labels.severity must be one of {sorted(SEVERITIES)}")
            if not (rule.get("annotations") or {}).get("summary"):
                fail(where, "has no annotations.summary")
            for metric in unknown_metrics(expr, known_metrics):
                fail(where, f"expr uses {metric}, which neither the exporter nor src/metrics.rs defines")
            watched |= set(re.findall(r"\bpeerq_\w+", expr))
    for alert in sorted(set(names)):
        if names.count(alert) > 1:
            fail(RULES_FILE, f"alert {alert} is defined {names.count(alert)} times")
    for alert in sorted(REQUIRED_ALERTS - set(names)):
        fail(RULES_FILE, f"has no {alert} (the README names it)")
    if "peerq_service_oldest_waiting_seconds" not in watched:
        fail(RULES_FILE, "no rule watches peerq_service_oldest_waiting_seconds")
    prometheus_rules = by_kind.get("PrometheusRule") or []
    if len(prometheus_rules) != 1:
        fail("deploy/prometheus", f"wants one PrometheusRule, has {len(prometheus_rules)}")
    for name, i, doc in prometheus_rules:
        if (doc.get("spec") or {}).get("groups") != groups:
            fail(label(name, i, doc), f"spec.groups differ from {RULES_FILE}'s groups")
    return groups


def promtool(groups, prometheus_rules):
    tool = os.environ.get("PROMTOOL")
    if not tool:
        notes.append("promtool: not at hand (no apt-get or no Debian package): rule syntax and unit tests skipped")
        return None
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.splitlines()
    runs = [([tool, "check", "rules", RULES_FILE], RULES_FILE), ([tool, "test", "rules", RULES_TEST_FILE], RULES_TEST_FILE)]
    with tempfile.TemporaryDirectory() as tmp:
        for name, i, doc in prometheus_rules:
            path = os.path.join(tmp, f"{doc['metadata']['name']}.rules.yaml")
            with open(path, "w") as f:
                yaml.safe_dump({"groups": (doc.get("spec") or {}).get("groups")}, f)
            runs.append(([tool, "check", "rules", path], label(name, i, doc)))
        for command, where in runs:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                output = (done.stdout + done.stderr).strip().replace("\n", "\n    ")
                fail(where, f"`promtool {' '.join(command[1:3])}` failed:\n    {output}")
    return version[0] if version else tool


# ----------------------------------------------------------- Dockerfiles


def dockerfile_instructions(text):
    """(instruction, arguments) pairs, continuation lines joined, comments
    and the parser directives left out."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    pairs = []
    for line in lines:
        word, _, rest = line.partition(" ")
        pairs.append((word.upper(), rest.strip()))
    return pairs


def expand(value, args):
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def check_dockerfile(path):
    name = rel(path)
    instructions = dockerfile_instructions(read(path))
    global_args, stages = {}, []
    pins = []
    for word, rest in instructions:
        if word == "ARG" and not stages:
            key, _, default = rest.partition("=")
            global_args[key.strip()] = default.strip().strip('"')
        if word == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            image = expand(parts[0], global_args) if parts else ""
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"image": image, "alias": alias, "instructions": []})
            if image.lower() in {s["alias"].lower() for s in stages[:-1] if s["alias"]}:
                continue
            if "$" in image:
                fail(name, f"FROM {image}: an ARG without a default")
                continue
            reference, _, digest = image.partition("@")
            tag = reference.rsplit("/", 1)[-1].partition(":")[2]
            if digest:
                if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                    fail(name, f"FROM {image}: {digest!r} is not a sha256 digest")
                pins.append(f"{image} (digest)")
            elif not tag or tag == "latest":
                fail(name, f"FROM {image}: not pinned (give an exact version tag or a digest)")
            elif not re.search(r"\d+\.\d+", tag):
                fail(name, f"FROM {image}: the tag {tag!r} is no exact version (such as 1.95.0 or 12.13)")
            else:
                pins.append(f"{image} (exact tag)")
        elif stages:
            stages[-1]["instructions"].append((word, rest))
        if word in ("ENV", "ARG"):
            key = re.split(r"[=\s]", rest, 1)[0]
            if SECRET_NAME.search(key) and ("=" in rest or len(rest.split()) > 1):
                fail(name, f"{word} {key}: a secret in the image")
    if len(stages) < 2:
        fail(name, "is not multi-stage (a builder and a runtime stage)")
    if not stages:
        return pins
    final = stages[-1]["instructions"]
    users = [rest for word, rest in final if word == "USER"]
    if not users:
        fail(name, "the final stage sets no USER (it would run as root)")
    else:
        user = users[-1].split(":")[0]
        if not user.isdigit():
            fail(name, f"USER {users[-1]}: give a numeric uid (Kubernetes' runAsNonRoot checks it)")
        elif int(user) == 0:
            fail(name, "the final stage's USER is root")
    entrypoints = [rest for word, rest in final if word in ("ENTRYPOINT", "CMD")]
    if not entrypoints or not all(e.startswith("[") for e in entrypoints):
        fail(name, "the final stage's ENTRYPOINT/CMD must be in exec form: SIGTERM must reach the process")
    builder = re.match(r"(?:.*/)?rust:(\d+)\.(\d+)(?:\.(\d+))?", stages[0]["image"])
    wanted = re.search(r'^rust-version\s*=\s*"(\d+)\.(\d+)', read(os.path.join(ROOT, "Cargo.toml")), re.M)
    if not builder:
        fail(name, f"the first stage ({stages[0]['image']}) is not a rust:<version> builder")
    elif wanted and tuple(map(int, builder.groups()[:2])) < tuple(map(int, wanted.groups())):
        fail(name, f"the builder's Rust {builder.group(1)}.{builder.group(2)} is older than Cargo.toml's rust-version")
    else:
        try:
            rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.split()
            version = rustc[1] if len(rustc) > 1 else None
        except OSError:
            version = None
        image_version = ".".join(g for g in builder.groups() if g)
        if version and version != image_version:
            notes.append(f"{name}: builds with Rust {image_version}, this machine's toolchain is {version}")
    ignore = path + ".dockerignore"
    if not os.path.exists(ignore):
        fail(name, f"has no {rel(ignore)}: the build context would take target/ (gigabytes)")
    elif not re.search(r"^/?target/?$", read(ignore), re.M):
        fail(rel(ignore), "does not exclude target")
    return pins


def hadolint(paths):
    tool = os.environ.get("HADOLINT")
    done = subprocess.run([tool, "--version"], capture_output=True, text=True)
    version = done.stdout.strip()
    done = subprocess.run([tool, "--no-color", *paths], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        for line in (done.stdout + done.stderr).strip().splitlines():
            fail("hadolint", line)
    return version


# ------------------------------------------------------------------ main


def main():
    started = time.monotonic()
    objects = load_documents()
    models = crd_models()
    builtin = crd = 0
    for name, i, doc in objects:
        group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
        if group in CRD_GROUPS:
            validate_crd(name, i, doc, models)
            crd += 1
        else:
            validate_builtin(name, i, doc)
            builtin += 1
    known = metric_names()
    by_kind = check_manifests(objects, known)
    groups = check_rules(by_kind, known)
    promtool_version = promtool(groups, by_kind.get("PrometheusRule") or []) if groups else None
    dockerfiles = [rel(p) for p in sorted(glob.glob(os.path.join(DEPLOY, "docker", "*.Dockerfile")))]
    pins = []
    for path in dockerfiles:
        pins += check_dockerfile(os.path.join(ROOT, path))
    hadolint_version = hadolint(dockerfiles) if dockerfiles else None
    if not dockerfiles:
        fail("deploy/docker", "has no Dockerfile")

    print(f"check-deploy: {builtin} objects against Kubernetes {KUBERNETES_VERSION} (kubernetes-validate {kubernetes_validate.__version__}, strict)")
    print(f"check-deploy: {crd} KEDA and Prometheus-operator objects against cloudcoil's CRD models")
    print(f"check-deploy: {len(dockerfiles)} Dockerfiles with {hadolint_version} and our rules; base images {', '.join(sorted(set(pins)))}")
    if promtool_version:
        print(f"check-deploy: alert rules and their unit tests with {promtool_version}")
    for note in notes:
        print(f"check-deploy: note: {note}")
    if failures:
        print(f"check-deploy: {len(failures)} failed:", file=sys.stderr)
        for failure in failures:
            print(f"  FAIL {failure}", file=sys.stderr)
        return 1
    print(f"check-deploy: all passed ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
