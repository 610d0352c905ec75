"""`tools/launch cluster.yaml --emit k8s|tfjob`: the Kubernetes objects that
run a job (docs/clusters.md, "Kubernetes" and "Kubeflow TFJob").

Both forms hold the resolved cluster file in a ConfigMap that every pod
mounts, and run `pstrain --cluster <that file>` with no --role: pstrain
learns its role and index from what the pod sees (shared/scheduler_env.h).

k8s: per role a headless Service and a StatefulSet of that name, so pod N
of `<job>-ps` is `<job>-ps-N` and is reached at `<job>-ps-N.<job>-ps`
(pstrain reads its ordinal from HOSTNAME). Server N listens on
`ps.port_base + N`, as under Slurm, so one rule places servers whether they
share a node or not; the readiness probe therefore asks the pod's own port,
which a fixed tcpSocket probe of a shared pod template cannot name. Each pod
keeps its run directory (checkpoints, logs, the saved model) on a volume
claim of its own, which a restarted pod gets back: a server restarted by
Kubernetes continues from its newest checkpoint (`--restore latest`, which
starts fresh where there is none). A StatefulSet restarts whatever exits,
success included, so a process that finished keeps its pod up (idle) until
the StatefulSets are deleted: a finished server is not restarted into a
finished job, and the run directory stays readable.

tfjob: one Kubeflow TFJob with PS and Worker replicas. Its operator gives
each pod TF_CONFIG (every replica's `host:port` and the pod's own type and
index) and restarts failed containers in place (restartPolicy OnFailure),
so the run directory lives in an emptyDir that survives such a restart; the
job ends when worker 0 completes, and its running pods are then removed.

With security.curve the keys are made here: a Secret per role holding that
role's secret keys and the public list, so a worker's pod never holds a
server's key; the tool key stays with the operator (<run_dir>/keys/tool).
"""

import yaml

from .cluster_config import scheduled_device

IMAGE_BINARY = "/usr/bin/pstrain"      # where the package (and Containerfile) puts it
CONFIG_DIR = "/etc/pstrain"            # the ConfigMap: cluster.yaml
RUN_DIR = "/var/lib/pstrain/run"       # run_dir inside every pod
KEYS_DIR = "/etc/pstrain-keys"         # the role's Secret, as $PSTRAIN_KEYS
TFJOB_PORT = 2222                      # the TFJob operator's default port
CONTAINER = "pstrain"                  # the container's name (k8s)
TFJOB_CONTAINER = "tensorflow"         # the operator fills TF_CONFIG only in this one

# The pod's command under a StatefulSet: pstrain as a child whose exit the
# pod reports, SIGTERM passed on (the servers checkpoint on it), and after a
# clean exit an idle pod rather than an exit Kubernetes would restart.
STAY_UP = """\
"$@" & pid=$!
stopping=0
trap 'stopping=1; kill -TERM "$pid" 2>/dev/null' TERM INT
while :; do
  wait "$pid"; code=$?
  kill -0 "$pid" 2>/dev/null || break
done
# Stopped by Kubernetes, or failed (to be restarted): the pod ends with pstrain.
[ "$code" -eq 0 ] && [ "$stopping" -eq 0 ] || exit "$code"
echo "pstrain: finished; this pod stays up until its StatefulSet is deleted" >&2
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
"""

# Readiness of server N: its port, ps.port_base + N, accepts a connection.
PS_READY = 'exec 3<>"/dev/tcp/127.0.0.1/$(({base} + ${{HOSTNAME##*-}}))"'


def count_overrides(cfg):
    """The --set overrides that put a checked config's servers and workers in
    the count form, hosts left to the pods (a listed host means nothing
    inside a cluster): `ps={count, port_base}` from the file's first port,
    `workers={count, device}`."""
    ps, workers = cfg["ps"], cfg["workers"]
    device = scheduled_device(workers, "Kubernetes")
    if isinstance(ps, dict):
        ps_count, port_base = int(ps["count"]), int(ps["port_base"])
    else:
        ps_count, port_base = len(ps), int(ps[0]["port"])
    return [f'ps={{"count": {ps_count}, "port_base": {port_base}}}',
            f'workers={{"count": {len(workers)}, "device": "{device}"}}']


class Emitter:
    """The objects for one resolved config `cfg` (count form, run_dir set to
    RUN_DIR) whose text is `text`. `opts`: image, namespace, binary (the
    pstrain inside the image), ps_cpu, ps_memory, worker_cpu, worker_memory,
    volume_size, storage_class (or None), max_restarts, run_id; `keys`:
    {file name: bytes} from `pstrain --keygen`, or None without CURVE."""

    def __init__(self, cfg, text, opts, keys=None):
        self.cfg, self.text, self.opts, self.keys = cfg, text, opts, keys
        self.job = cfg["job"]
        self.ps_count = int(cfg["ps"]["count"])
        self.port_base = int(cfg["ps"]["port_base"])
        self.worker_count = len(cfg["workers"])
        self.gpus = cfg["workers"][0]["device"] == "cuda"

    def metadata(self, name, role=None):
        labels = {"app.kubernetes.io/name": "pstrain", "app.kubernetes.io/instance": self.job}
        if role:
            labels["app.kubernetes.io/component"] = role
        meta = {"name": name, "labels": labels}
        if self.opts["namespace"]:
            meta["namespace"] = self.opts["namespace"]
        return meta

    def config_map(self):
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": self.metadata(f"{self.job}-config"),
                "data": {"cluster.yaml": self.text}}

    def secrets(self):
        """A Secret per role: that role's secret keys and the public list."""
        if self.keys is None:
            return []
        out = []
        for role in ("ps", "worker"):
            files = {n: v for n, v in self.keys.items() if n.startswith(role + "-")}
            files["public_keys"] = self.keys["public_keys"]
            out.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": self.metadata(f"{self.job}-{role}-keys", role),
                        "stringData": {n: v.decode() for n, v in sorted(files.items())}})
        return out

    def pstrain_args(self, role):
        args = [self.opts["binary"], "--cluster", f"{CONFIG_DIR}/cluster.yaml",
                "--run-id", self.opts["run_id"]]
        return args + (["--restore", "latest"] if role == "ps" else [])

    def resources(self, role):
        requests = {"cpu": self.opts[f"{role}_cpu"], "memory": self.opts[f"{role}_memory"]}
        out = {"requests": requests}
        if role == "worker" and self.gpus:
            out["limits"] = {"nvidia.com/gpu": "1"}
        return out

    def container(self, role, name):
        c = {"name": name, "image": self.opts["image"],
             "resources": self.resources(role),
             "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                              {"name": "run", "mountPath": RUN_DIR}]}
        if self.keys is not None:
            c["env"] = [{"name": "PSTRAIN_KEYS", "value": KEYS_DIR}]
            c["volumeMounts"].append({"name": "keys", "mountPath": KEYS_DIR, "readOnly": True})
        return c

    def volumes(self, role, run_volume):
        vols = [{"name": "config", "configMap": {"name": f"{self.job}-config"}}]
        if run_volume is not None:
            vols.append(run_volume)
        if self.keys is not None:
            # Owner-only: pstrain refuses a key file that others can read.
            vols.append({"name": "keys", "secret": {"secretName": f"{self.job}-{role}-keys",
                                                    "defaultMode": 0o400}})
        return vols

    # -- k8s: headless Services and StatefulSets ---------------------------

    def service(self, role):
        name = f"{self.job}-{role}"
        return {"apiVersion": "v1", "kind": "Service", "metadata": self.metadata(name, role),
                "spec": {"clusterIP": "None",
                         # Names resolve before a pod is ready: a worker
                         # connects while its servers still start.
                         "publishNotReadyAddresses": True,
                         "selector": self.metadata(name, role)["labels"]}}

    def stateful_set(self, role):
        name = f"{self.job}-{role}"
        meta = self.metadata(name, role)
        c = self.container(role, CONTAINER)
        c["command"] = ["/bin/sh", "-c", STAY_UP, "pstrain-pod"] + self.pstrain_args(role)
        if role == "ps":
            c["readinessProbe"] = {
                "exec": {"command": ["/bin/bash", "-c", PS_READY.format(base=self.port_base)]},
                "periodSeconds": 2, "timeoutSeconds": 2}
        claim = {"metadata": {"name": "run"},
                 "spec": {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": self.opts["volume_size"]}}}}
        if self.opts["storage_class"]:
            claim["spec"]["storageClassName"] = self.opts["storage_class"]
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                "spec": {"serviceName": name,
                         "replicas": self.ps_count if role == "ps" else self.worker_count,
                         # Every pod at once: a worker waits for its servers
                         # itself, with deadlines.
                         "podManagementPolicy": "Parallel",
                         "selector": {"matchLabels": meta["labels"]},
                         "template": {"metadata": {"labels": meta["labels"]},
                                      "spec": {"containers": [c],
                                               "volumes": self.volumes(role, None)}},
                         "volumeClaimTemplates": [claim]}}

    def k8s(self):
        """ConfigMap, Secrets, then per role its Service and StatefulSet."""
        objs = [self.config_map()] + self.secrets()
        for role in ("ps", "worker"):
            objs += [self.service(role), self.stateful_set(role)]
        return objs

    # -- tfjob: one Kubeflow TFJob ------------------------------------------

    def replica(self, role):
        c = self.container(role, TFJOB_CONTAINER)
        c["command"] = self.pstrain_args(role)
        c["ports"] = [{"name": "tfjob-port", "containerPort": TFJOB_PORT}]
        if role == "ps":
            c["readinessProbe"] = {"tcpSocket": {"port": TFJOB_PORT}, "periodSeconds": 2}
        meta = self.metadata(f"{self.job}-{role}", role)
        return {"replicas": self.ps_count if role == "ps" else self.worker_count,
                "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": meta["labels"]},
                             "spec": {"containers": [c],
                                      "volumes": self.volumes(role, {"name": "run",
                                                                     "emptyDir": {}})}}}

    def tfjob(self):
        """ConfigMap, Secrets, then the TFJob."""
        job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
               "metadata": self.metadata(self.job),
               "spec": {"runPolicy": {"cleanPodPolicy": "Running",
                                      "backoffLimit": self.opts["max_restarts"]},
                        "tfReplicaSpecs": {"PS": self.replica("ps"),
                                           "Worker": self.replica("worker")}}}
        return [self.config_map()] + self.secrets() + [job]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the cluster file, the pod's script) as literal
    blocks, so the manifests read like the files they carry; no anchors and
    aliases for repeated labels, which some tools do not follow."""

    def ignore_aliases(self, data):
        return True


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objs):
    """The objects as one multi-document YAML file for `kubectl apply -f`."""
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
