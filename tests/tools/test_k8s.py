#!/usr/bin/python3
"""tools/launch --emit k8s and --emit tfjob: the objects' content and schema
(offline, with Debian's Kubernetes client models: kubectl validates only
against a live API server), and the default job trained by the emitted
pods' exact commands and environments run as local processes
(k8s_pods.py says what differs from a cluster)."""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

import yaml

import k8s_pods
import support
from pstrain_tools import emit_k8s

TARGET_ACCURACY = 0.85
TRAIN_DEADLINE_S = 300


def free_port_pair():
    """A port p with p and p + 1 both free (server N listens on port_base + N)."""
    for _ in range(100):
        p = support.free_port()
        if p < 65535 and port_free(p + 1):
            return p
    raise AssertionError("no two consecutive free ports")


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Emitted:
    """`tools/launch <doc> --emit <form>` into a temporary folder: the result,
    the objects by kind and name, the run directory here."""

    def __init__(self, testcase, doc, form, *extra):
        tmp = tempfile.TemporaryDirectory(prefix=f"pstrain-{form}-")
        testcase.addCleanup(tmp.cleanup)
        w = support.Workspace(doc)
        testcase.addCleanup(w.cleanup)
        self.dir = tmp.name
        self.run_dir = os.path.join(tmp.name, "emitted")
        self.file = os.path.join(tmp.name, f"{form}.yaml")
        self.result = subprocess.run(
            [sys.executable, os.path.join(support.TOOLS, "launch"), w.cluster, "--emit", form,
             "--run-dir", self.run_dir, "-o", self.file, *extra],
            capture_output=True, text=True, env=support.tool_env(), cwd=support.ROOT, timeout=60)
        self.objects = {}
        if self.result.returncode == 0:
            with open(self.file) as f:
                self.docs = list(yaml.safe_load_all(f))
            self.objects = {(o["kind"], o["metadata"]["name"]): o for o in self.docs}

    def get(self, kind, name):
        return self.objects[(kind, name)]

    def cluster_text(self):
        return self.get("ConfigMap", "fashion-mlp-config")["data"]["cluster.yaml"]


def container_of(pod_template):
    (c,) = pod_template["spec"]["containers"]
    return c


def env_of(container):
    return {e["name"]: e["value"] for e in container.get("env", [])}


class LocalCluster:
    """The emitted pods as local processes (k8s_pods.Pod): the ConfigMap's
    file and the run directory mapped to the test's folders."""

    def __init__(self, testcase, emitted, names):
        self.t, self.e = testcase, emitted
        self.config_dir = os.path.join(emitted.dir, "config")
        self.run_dir = os.path.join(emitted.dir, "run")
        os.makedirs(self.config_dir)
        with open(os.path.join(self.config_dir, "cluster.yaml"), "w") as f:
            f.write(emitted.cluster_text().replace(emit_k8s.RUN_DIR, self.run_dir))
        self.hosts = k8s_pods.hosts_file(os.path.join(emitted.dir, "hosts"), names)
        self.pods = []
        testcase.addCleanup(self.stop_all)

    def command(self, container):
        return [a.replace(emit_k8s.CONFIG_DIR, self.config_dir)
                for a in container["command"] + container.get("args", [])]

    def start(self, name, container, env):
        pod = k8s_pods.Pod(name, self.command(container), dict(env_of(container), **env),
                           self.hosts, os.path.join(self.e.dir, f"{name}.out"))
        self.pods.append(pod)
        return pod

    def stop_all(self):
        """Every pod stopped (k8s_pods.Pod.stop), its leftovers too; {name: exit code}."""
        return {p.name: p.stop() for p in self.pods}

    def final_accuracy(self, pod):
        found = re.findall(r"final test accuracy (\d+\.\d+)", pod.output())
        self.t.assertTrue(found, f"{pod.name} printed no final accuracy:\n{pod.output()[-3000:]}")
        return float(found[-1])


class K8sManifestTest(unittest.TestCase):
    def setUp(self):
        support.require_binary(self)

    def test_objects_of_the_default_job(self):
        e = Emitted(self, support.default_job([7100, 7101]), "k8s", "--max-restarts", "2")
        self.assertEqual(e.result.returncode, 0, e.result.stderr)
        self.assertIn("kubectl apply -f", e.result.stderr)
        self.assertEqual(sorted(e.objects), [
            ("ConfigMap", "fashion-mlp-config"),
            ("Service", "fashion-mlp-ps"), ("Service", "fashion-mlp-worker"),
            ("StatefulSet", "fashion-mlp-ps"), ("StatefulSet", "fashion-mlp-worker")])
        for obj in e.docs:
            k8s_pods.validate(obj)
        # The ConfigMap holds pstrain's own resolution: hosts left to the
        # pods, run_dir inside the pod; the run directory here keeps a copy.
        resolved = yaml.load(e.cluster_text(), Loader=yaml.BaseLoader)
        self.assertEqual(resolved["ps"], {"count": "2", "port_base": "7100", "bind": "0.0.0.0"})
        self.assertEqual([w.get("host") for w in resolved["workers"]], [None, None])
        self.assertEqual(resolved["run_dir"], emit_k8s.RUN_DIR)
        self.assertIn(e.cluster_text(), support.read_text(os.path.join(e.run_dir, "cluster.yaml")))
        run_ids = set()
        for role, replicas in (("ps", 2), ("worker", 2)):
            name = f"fashion-mlp-{role}"
            svc, sts = e.get("Service", name), e.get("StatefulSet", name)
            self.assertEqual(svc["spec"]["clusterIP"], "None")
            self.assertTrue(svc["spec"]["publishNotReadyAddresses"])
            self.assertEqual(sts["spec"]["serviceName"], name)
            self.assertEqual(sts["spec"]["replicas"], replicas)
            self.assertEqual(svc["spec"]["selector"], sts["spec"]["selector"]["matchLabels"])
            self.assertEqual(sts["spec"]["template"]["metadata"]["labels"],
                             sts["spec"]["selector"]["matchLabels"])
            c = container_of(sts["spec"]["template"])
            self.assertEqual(c["resources"]["requests"],
                             {"cpu": "1", "memory": "1Gi"} if role == "ps"
                             else {"cpu": "2", "memory": "2Gi"})
            self.assertNotIn("limits", c["resources"])
            args = c["command"]
            self.assertNotIn("--role", args)
            self.assertEqual(args[args.index("--cluster") + 1], "/etc/pstrain/cluster.yaml")
            run_ids.add(args[args.index("--run-id") + 1])
            self.assertEqual("--restore" in args, role == "ps")
            (claim,) = sts["spec"]["volumeClaimTemplates"]
            self.assertEqual(claim["spec"]["resources"]["requests"]["storage"], "1Gi")
            self.assertIn({"name": "run", "mountPath": emit_k8s.RUN_DIR}, c["volumeMounts"])
        self.assertEqual(len(run_ids), 1, "every pod of the job shares one run id")
        probe = container_of(e.get("StatefulSet", "fashion-mlp-ps")["spec"]["template"])
        self.assertIn("readinessProbe", probe)

    def test_gpu_workers_and_flags(self):
        doc = support.default_job([7100, 7101])
        doc["workers"] = {"count": 3, "host": "127.0.0.1", "device": "cuda"}
        e = Emitted(self, doc, "k8s", "--image", "registry.example/pstrain:1.0",
                    "--namespace", "ml", "--worker-cpu", "4", "--worker-memory", "8Gi",
                    "--volume-size", "5Gi", "--storage-class", "fast")
        self.assertEqual(e.result.returncode, 0, e.result.stderr)
        for obj in e.docs:
            k8s_pods.validate(obj)
            self.assertEqual(obj["metadata"]["namespace"], "ml")
        workers = e.get("StatefulSet", "fashion-mlp-worker")
        self.assertEqual(workers["spec"]["replicas"], 3)
        c = container_of(workers["spec"]["template"])
        self.assertEqual(c["image"], "registry.example/pstrain:1.0")
        self.assertEqual(c["resources"], {"requests": {"cpu": "4", "memory": "8Gi"},
                                          "limits": {"nvidia.com/gpu": "1"}})
        (claim,) = workers["spec"]["volumeClaimTemplates"]
        self.assertEqual(claim["spec"]["storageClassName"], "fast")
        self.assertEqual(claim["spec"]["resources"]["requests"]["storage"], "5Gi")
        ps = container_of(e.get("StatefulSet", "fashion-mlp-ps")["spec"]["template"])
        self.assertNotIn("limits", ps["resources"])
        resolved = yaml.load(e.cluster_text(), Loader=yaml.BaseLoader)
        self.assertEqual({w["device"] for w in resolved["workers"]}, {"cuda"})

    def test_curve_keys_as_a_secret_per_role(self):
        doc = support.default_job([7100, 7101])
        doc["security"] = {"curve": True}
        e = Emitted(self, doc, "k8s")
        self.assertEqual(e.result.returncode, 0, e.result.stderr)
        for obj in e.docs:
            k8s_pods.validate(obj)
        ps_keys = e.get("Secret", "fashion-mlp-ps-keys")["stringData"]
        worker_keys = e.get("Secret", "fashion-mlp-worker-keys")["stringData"]
        self.assertEqual(sorted(ps_keys), ["ps-0.key", "ps-1.key", "public_keys"])
        self.assertEqual(sorted(worker_keys), ["public_keys", "worker-0.key", "worker-1.key"])
        self.assertEqual(ps_keys["public_keys"], worker_keys["public_keys"])
        # The tool's key stays here, owner-only, and is in no Secret.
        tool = os.path.join(e.run_dir, "keys", "tool", "tool.key")
        self.assertEqual(os.stat(tool).st_mode & 0o777, 0o600)
        self.assertNotIn(support.read_text(tool).strip(),
                         "".join(ps_keys.values()) + "".join(worker_keys.values()))
        for role in ("ps", "worker"):
            spec = e.get("StatefulSet", f"fashion-mlp-{role}")["spec"]["template"]["spec"]
            c = container_of({"spec": spec})
            self.assertEqual(env_of(c)["PSTRAIN_KEYS"], emit_k8s.KEYS_DIR)
            keys = next(v for v in spec["volumes"] if v["name"] == "keys")
            self.assertEqual(keys["secret"], {"secretName": f"fashion-mlp-{role}-keys",
                                              "defaultMode": 0o400})

    def test_tfjob(self):
        e = Emitted(self, support.default_job([7100, 7101]), "tfjob", "--max-restarts", "4")
        self.assertEqual(e.result.returncode, 0, e.result.stderr)
        for obj in e.docs:
            k8s_pods.validate(obj)
        job = e.get("TFJob", "fashion-mlp")
        self.assertEqual(job["spec"]["runPolicy"], {"cleanPodPolicy": "Running",
                                                    "backoffLimit": 4})
        replicas = job["spec"]["tfReplicaSpecs"]
        self.assertEqual(sorted(replicas), ["PS", "Worker"])
        for kind in ("PS", "Worker"):
            self.assertEqual(replicas[kind]["replicas"], 2)
            self.assertEqual(replicas[kind]["restartPolicy"], "OnFailure")
            c = container_of(replicas[kind]["template"])
            # The operator writes TF_CONFIG into this container only.
            self.assertEqual(c["name"], "tensorflow")
            self.assertEqual(c["ports"], [{"name": "tfjob-port", "containerPort": 2222}])
            self.assertEqual("--restore" in c["command"], kind == "PS")
        ps = container_of(replicas["PS"]["template"])
        self.assertEqual(ps["readinessProbe"]["tcpSocket"], {"port": 2222})

    def test_refusals_name_the_problem(self):
        doc = support.default_job([7100, 7101])
        doc["workers"] = "auto"
        e = Emitted(self, doc, "k8s")
        self.assertEqual(e.result.returncode, 2)
        self.assertIn("workers: auto counts this host's GPUs", e.result.stderr)
        doc = support.default_job([7100, 7101])
        doc["workers"] = [{"host": "127.0.0.1", "device": "cpu"},
                          {"host": "127.0.0.1", "device": "cuda"}]
        e = Emitted(self, doc, "tfjob")
        self.assertEqual(e.result.returncode, 2)
        self.assertIn("give them one device", e.result.stderr)

    def test_schema_check_refuses_what_a_server_would(self):
        # The offline check itself can fail: an unknown field, a wrong type,
        # a missing required field.
        e = Emitted(self, support.default_job([7100, 7101]), "k8s")
        sts = e.get("StatefulSet", "fashion-mlp-ps")
        for break_it, message in (
                (lambda o: o["spec"].update(replica=2), "has no field 'replica'"),
                (lambda o: o["spec"].update(replicas="2"), "expected int"),
                (lambda o: container_of(o["spec"]["template"]).pop("name"), "`name`")):
            broken = yaml.safe_load(yaml.safe_dump(sts))
            break_it(broken)
            with self.assertRaisesRegex(k8s_pods.SchemaError, re.escape(message)):
                k8s_pods.validate(broken)


class K8sPodsTrainTest(unittest.TestCase):
    """The emitted pods, run locally, train the default job."""

    def setUp(self):
        support.require_binary(self)
        if os.geteuid() != 0:
            self.fail("mapping the pods' DNS names to loopback needs a private /etc/hosts "
                      "(unshare --mount, as root); run as root, as CI does")

    def statefulset_pods(self):
        port_base = free_port_pair()
        e = Emitted(self, support.default_job([port_base, port_base + 1]), "k8s",
                    "--image-binary", support.PSTRAIN)
        self.assertEqual(e.result.returncode, 0, e.result.stderr)
        names = [f"fashion-mlp-{r}-{i}.fashion-mlp-{r}" for r in ("ps", "worker")
                 for i in range(2)]
        return e, LocalCluster(self, e, names), port_base

    def start_statefulset_pod(self, cluster, e, role, ordinal):
        sts = e.get("StatefulSet", f"fashion-mlp-{role}")
        name = f"fashion-mlp-{role}-{ordinal}"
        return cluster.start(name, container_of(sts["spec"]["template"]),
                             {"HOSTNAME": name, "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                              "KUBERNETES_SERVICE_PORT": "443"})

    def probe(self, e, ordinal):
        """The servers' readiness probe, as the kubelet runs it in pod `ordinal`."""
        c = container_of(e.get("StatefulSet", "fashion-mlp-ps")["spec"]["template"])
        return subprocess.run(c["readinessProbe"]["exec"]["command"],
                              env={"HOSTNAME": f"fashion-mlp-ps-{ordinal}", "PATH": "/usr/bin:/bin"},
                              capture_output=True, timeout=10).returncode

    def test_statefulset_pods_train_the_default_job(self):
        e, cluster, _ = self.statefulset_pods()
        self.assertNotEqual(self.probe(e, 0), 0, "ready before the server started")
        pods = [self.start_statefulset_pod(cluster, e, role, i)
                for role in ("ps", "worker") for i in range(2)]
        for i in range(2):
            k8s_pods.wait_until(lambda i=i: self.probe(e, i) == 0, 60,
                                f"server {i}'s readiness probe", pods)
        # Each process finishes, then its pod stays up rather than exit.
        k8s_pods.wait_until(lambda: all("pstrain: finished" in p.output() for p in pods),
                            TRAIN_DEADLINE_S, "every pod to finish", pods)
        self.assertTrue(all(p.popen.poll() is None for p in pods), "a finished pod exited")
        accuracy = cluster.final_accuracy(pods[2])
        print(f"k8s pods: final test accuracy {accuracy:.4f}", file=sys.stderr)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY)
        for p in pods[:2]:
            self.assertIn("from kubernetes", p.output())
        # A finished pod ends cleanly when Kubernetes stops it.
        self.assertEqual(cluster.stop_all(), {p.name: 0 for p in pods})

    def test_readiness_and_sigterm_of_one_server(self):
        e, cluster, _ = self.statefulset_pods()
        pod = self.start_statefulset_pod(cluster, e, "ps", 0)
        k8s_pods.wait_until(lambda: self.probe(e, 0) == 0, 60, "server 0 ready", [pod])
        # Each pod's probe asks its own server's port.
        self.assertNotEqual(self.probe(e, 1), 0, "server 1 reads ready while only server 0 runs")
        # Kubernetes stops a pod with SIGTERM to its first process; the
        # server must get it, to write its last checkpoint.
        server = [p for p in support.descendants(pod.popen.pid) if support.is_pstrain(p)]
        self.assertEqual(len(server), 1, pod.output())
        os.kill(pod.popen.pid, signal.SIGTERM)
        code = pod.popen.wait(30)
        self.assertFalse(support.alive(server[0]), "the server outlived its pod")
        self.assertIn("stopping on signal 15", pod.output())
        self.assertEqual(code, 0, pod.output())  # pstrain's own exit after a SIGTERM
        checkpoints = os.path.join(cluster.run_dir, "checkpoints")
        written = [f for _, _, fs in os.walk(checkpoints) for f in fs if f == "ps0.bin"]
        self.assertTrue(written, f"no checkpoint in {checkpoints}:\n{pod.output()}")

    def test_tfjob_pods_train_the_default_job(self):
        e = Emitted(self, support.default_job([7100, 7101]), "tfjob",
                    "--image-binary", support.PSTRAIN)
        self.assertEqual(e.result.returncode, 0, e.result.stderr)
        job = e.get("TFJob", "fashion-mlp")
        ports = {"ps": [support.free_port() for _ in range(2)],
                 "worker": [support.free_port() for _ in range(2)]}
        names = [f"fashion-mlp-{t}-{i}.ml.svc" for t in ("ps", "worker") for i in range(2)]
        cluster = LocalCluster(self, e, names)
        pods = []
        for kind, role in (("PS", "ps"), ("Worker", "worker")):
            c = container_of(job["spec"]["tfReplicaSpecs"][kind]["template"])
            for i in range(2):
                tf = k8s_pods.tf_config(job, role, i, "ml", ports)
                pods.append(cluster.start(f"fashion-mlp-{role}-{i}", c, {
                    "TF_CONFIG": tf, "HOSTNAME": f"fashion-mlp-{role}-{i}",
                    "KUBERNETES_SERVICE_HOST": "10.96.0.1"}))
        # The operator's job ends when every process has exited 0.
        k8s_pods.wait_until(lambda: all(p.popen.poll() == 0 for p in pods), TRAIN_DEADLINE_S,
                            "every replica to exit 0", pods)
        accuracy = cluster.final_accuracy(pods[2])
        print(f"tfjob pods: final test accuracy {accuracy:.4f}", file=sys.stderr)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY)
        for p in pods:
            self.assertIn("from TF_CONFIG", p.output(), p.name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
