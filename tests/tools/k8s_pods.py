"""Kubernetes without a cluster, for tests/tools/test_k8s.py: a strict
offline schema check of emitted objects (Debian's python3-kubernetes models),
and pods run as local processes.

A pod here is its container's exact command and environment, as the kubelet
would start it, plus what Kubernetes adds: HOSTNAME (the pod's name) and
KUBERNETES_SERVICE_HOST, or TF_CONFIG as the TFJob operator builds it. What
differs from a cluster, and only that: the pods' DNS names resolve to
127.0.0.1 through a private /etc/hosts (each pod runs in a mount namespace
of its own, `unshare --mount`, with a file bind-mounted there), the
ConfigMap's mount path and the run directory are folders of the test, and
(TFJob only) each replica's port is a free one, since all pods share one
address here where a cluster gives each its own.
"""

import json
import os
import re
import signal
import subprocess
import time

import kubernetes.client as kc
from kubernetes.client.api_client import ApiClient

# apiVersion/kind -> the client's model of it
CORE_MODELS = {("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Secret"): "V1Secret",
               ("v1", "Service"): "V1Service", ("apps/v1", "StatefulSet"): "V1StatefulSet"}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}
TFJOB_REPLICA_TYPES = {"Chief", "Master", "PS", "Worker", "Evaluator"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
RUN_POLICY_KEYS = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                   "backoffLimit", "schedulingPolicy"}


class SchemaError(AssertionError):
    pass


def check_fields(data, type_name, path):
    """Every field of `data` exists in the model `type_name` (recursively),
    with the model's type: what the API server's schema check would refuse
    as an unknown or mistyped field."""
    if type_name in PRIMITIVES:
        ok = isinstance(data, PRIMITIVES[type_name]) and not (
            type_name != "bool" and isinstance(data, bool))
        if not ok:
            raise SchemaError(f"{path}: expected {type_name}, got {data!r}")
        return
    if type_name == "object":  # IntOrString and the like
        return
    if m := re.fullmatch(r"list\[(.*)\]", type_name):
        if not isinstance(data, list):
            raise SchemaError(f"{path}: expected a list, got {data!r}")
        for i, item in enumerate(data):
            check_fields(item, m.group(1), f"{path}[{i}]")
        return
    if m := re.fullmatch(r"dict\(([^,]*), (.*)\)", type_name):
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected a map, got {data!r}")
        for key, value in data.items():
            check_fields(value, m.group(2), f"{path}.{key}")
        return
    model = getattr(kc.models, type_name)
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: expected a {type_name} map, got {data!r}")
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, value in data.items():
        if key not in fields:
            raise SchemaError(f"{path}: {type_name} has no field '{key}'")
        check_fields(value, model.openapi_types[fields[key]], f"{path}.{key}")


def validate(obj):
    """Raises SchemaError unless `obj` is a valid core object (fields, types,
    required fields through the client's own deserialization), or a TFJob
    whose replica pod templates are valid pod templates."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key == ("kubeflow.org/v1", "TFJob"):
        spec = obj["spec"]
        if set(spec) - {"runPolicy", "tfReplicaSpecs", "successPolicy", "enableDynamicWorker"}:
            raise SchemaError(f"TFJob.spec: unknown fields {sorted(spec)}")
        if set(spec.get("runPolicy", {})) - RUN_POLICY_KEYS:
            raise SchemaError(f"TFJob.spec.runPolicy: unknown fields {sorted(spec['runPolicy'])}")
        for kind, replica in spec["tfReplicaSpecs"].items():
            path = f"TFJob.spec.tfReplicaSpecs.{kind}"
            if kind not in TFJOB_REPLICA_TYPES:
                raise SchemaError(f"{path}: not a TFJob replica type")
            if set(replica) - {"replicas", "restartPolicy", "template"}:
                raise SchemaError(f"{path}: unknown fields {sorted(replica)}")
            if replica["restartPolicy"] not in RESTART_POLICIES:
                raise SchemaError(f"{path}.restartPolicy: {replica['restartPolicy']}")
            check_fields(replica["template"], "V1PodTemplateSpec", f"{path}.template")
            deserialize(replica["template"], "V1PodTemplateSpec", path)
        return
    if key not in CORE_MODELS:
        raise SchemaError(f"unexpected object {key}")
    check_fields(obj, CORE_MODELS[key], obj["kind"])
    deserialize(obj, CORE_MODELS[key], obj["kind"])


def deserialize(data, type_name, path):
    # The models' setters refuse a missing required field (client-side
    # validation is on by default).
    try:
        ApiClient()._ApiClient__deserialize(data, type_name)
    except ValueError as e:
        raise SchemaError(f"{path}: {e}") from None


class Pod:
    """One pod's container run locally in a mount namespace of its own; see
    the module's docstring. `command`: the container's command and args;
    `env`: what the pod's environment holds."""

    def __init__(self, name, command, env, hosts_file, log_path):
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "wb")
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root"}
        # The pod's processes are a session of their own, so the test ends
        # exactly them by the pod's PID (its process group).
        self.popen = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
             'mount --bind "$0" /etc/hosts || exit 97; exec "$@"', hosts_file] + command,
            env=dict(base, **env), stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def signal(self, sig):
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout=10):
        """SIGTERM to the pod (as the kubelet sends it), SIGKILL to whatever
        of its group is left after `timeout`; returns the pod's exit code."""
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever of the pod is left, an orphan of a shell that has
        # already exited too: its process group is the pod's.
        self.signal(signal.SIGKILL)
        code = self.popen.wait()
        self.log.close()
        return code


def hosts_file(path, names):
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for name in names:
            f.write(f"127.0.0.1 {name}\n")
    return path


def wait_until(predicate, timeout, what, pods=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in pods:
            code = p.popen.poll()
            if code is not None and code != 0:
                raise AssertionError(f"pod {p.name} exited with {code} while waiting for "
                                     f"{what}:\n{p.output()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def tf_config(tfjob, role, index, namespace, ports):
    """TF_CONFIG as the TFJob operator gives replica `index` of `role`:
    every replica's `<job>-<type>-<i>.<namespace>.svc:<port>`, the port
    replaced by ports[type][i] (one address for all pods here)."""
    name = tfjob["metadata"]["name"]
    cluster = {}
    for kind, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        t = kind.lower()
        cluster[t] = [f"{name}-{t}-{i}.{namespace}.svc:{ports[t][i]}"
                      for i in range(spec["replicas"])]
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index},
                       "environment": "cloud"})
