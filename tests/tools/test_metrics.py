#!/usr/bin/python3
"""Prometheus metrics, checked by a real Prometheus: one short run of the
default job (2 ps + 2 workers, Fashion-MNIST, a fifth of an epoch) with
metrics on, launched by tools/launch while a `prometheus` that this test
starts on a free port (its own temporary storage, ended by PID) scrapes
every process through the run directory's discovery file. The test then
asks Prometheus' HTTP API what it stored and compares it with what the run
wrote itself, and runs the Grafana dashboard's queries; promtool checks each
endpoint's text. tools/launch --prometheus runs its own Prometheus and stops
it with the run. A metrics port already
taken stops the process with an error naming it.

Every process keeps serving after its work until a scrape has read its
final values (metrics.linger_s), so Prometheus holds them however late its
scrapes come on a loaded machine; pstrain_finished says which values are
final, and each check reads the last value Prometheus stored
(last_over_time), since a process that has exited is no longer scraped."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import support
from pstrain_tools import cluster_config, prometheus_server

# A process waits at most this long for a scrape of its final values:
# Prometheus applies new targets only every 5 s, and this machine is shared.
LINGER_S = 60
SCRAPE_INTERVAL_S = 0.2
STORED = "[1h]"  # every sample of the run


def promtool():
    return shutil.which("promtool") or "/usr/bin/promtool"


def free_port_block(count):
    """A base port with `count` consecutive ports free a moment ago, below
    the kernel's ephemeral range so that outgoing connections do not take
    them meanwhile."""
    for base in range(20000, 32000 - count, 97):
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports")


def fetch(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


class Poller(threading.Thread):
    """Fetches each process's /metrics while the run goes on, keeping the
    first text in which the process has done work (promtool checks those).
    It stops fetching a process then, so that its later fetches cannot be
    the scrape a lingering process waits for instead of Prometheus'."""

    WORK = ("pstrain_worker_steps_total", "pstrain_ps_updates_total")

    def __init__(self, launch_json):
        super().__init__(daemon=True)
        self.launch_json = launch_json
        self.texts = {}
        self.stopping = threading.Event()

    def worked(self, text):
        for line in text.splitlines():
            if line.startswith(self.WORK) and float(line.rsplit(" ", 1)[1]) > 0:
                return True
        return False

    def run(self):
        urls = {}
        while not self.stopping.is_set():
            if not urls and os.path.exists(self.launch_json):
                try:
                    record = support.read_json(self.launch_json)
                    urls = {p["name"]: p["metrics_url"] for p in record["processes"]}
                except (ValueError, KeyError):
                    pass
            for name, url in urls.items():
                if name in self.texts:
                    continue
                try:
                    text = fetch(url)
                except OSError:
                    continue
                if self.worked(text):
                    self.texts[name] = text
            time.sleep(0.05)


class MetricsRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(support.PSTRAIN, os.X_OK):
            raise AssertionError(f"no pstrain binary at {support.PSTRAIN}; set $PSTRAIN")
        cls.tmp = tempfile.TemporaryDirectory(prefix="pstrain-metrics-")
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.run_dir = os.path.join(cls.tmp.name, "run")
        os.makedirs(cls.run_dir)
        cls.port_base = free_port_block(4)
        # Started before the launcher, watching the discovery file it writes.
        cls.prometheus = prometheus_server.PrometheusServer(
            os.path.join(cls.tmp.name, "prometheus"), support.free_port(),
            prometheus_server.config_text(
                [os.path.join(cls.run_dir, prometheus_server.TARGETS_FILE)], SCRAPE_INTERVAL_S))
        cls.addClassCleanup(cls.prometheus.stop)
        try:
            cls.prometheus.start()
        except prometheus_server.PrometheusError as e:
            raise AssertionError(f"Prometheus did not start, so nothing can be checked: {e}")

        ps = [{"host": "127.0.0.1", "port": support.free_port()} for _ in range(2)]
        cluster = os.path.join(support.ROOT, "cluster.yaml")
        overrides = [f"ps={json.dumps(ps)}", "train.epochs=0.2", "metrics.enabled=true",
                     f"metrics.port_base={cls.port_base}", f"metrics.linger_s={LINGER_S}"]
        # The discovery file the launcher will write, written first and
        # taken by Prometheus (it applies new targets only every 5 s), so
        # that it scrapes the processes from their start, as tools/launch
        # --prometheus does; the launcher replaces it with the same.
        _, doc = cluster_config.check(support.PSTRAIN, cluster, overrides)
        urls = cluster_config.metrics_urls(doc)
        prometheus_server.write_targets(
            os.path.join(cls.run_dir, prometheus_server.TARGETS_FILE), urls)
        if not cls.prometheus.wait_for_targets(len(urls)):
            raise AssertionError("Prometheus did not take the targets within 30 s; its log "
                                 f"ends:\n{cls.prometheus.log_tail()}")

        poller = Poller(os.path.join(cls.run_dir, "launch.json"))
        poller.start()
        cls.launch = support.run_tool("launch", [
            cluster, "--run-dir", cls.run_dir, "--max-restarts", "0"]
            + [a for o in overrides for a in ("--set", o)], timeout=240)
        poller.stopping.set()
        poller.join()
        cls.texts = poller.texts
        if cls.launch.returncode != 0:
            raise AssertionError(f"the run failed ({cls.launch.returncode}):\n"
                                 f"{cls.launch.stdout[-3000:]}\n{cls.launch.stderr[-3000:]}")
        cls.record = support.read_json(os.path.join(cls.run_dir, "launch.json"))
        with open(os.path.join(cls.run_dir, "worker0.metrics.jsonl")) as f:
            cls.final = [json.loads(l) for l in f if '"event":"final"' in l][-1]

    def values(self, promql):
        """{(role, index): value} of a query's series."""
        out = {}
        for series in self.prometheus.query(promql):
            labels = series["metric"]
            out[(labels.get("role"), labels.get("index"))] = float(series["value"][1])
        return out

    def scalar(self, promql):
        result = self.prometheus.query(promql)
        self.assertEqual(len(result), 1, f"{promql}: {result}")
        return float(result[0]["value"][1])

    def test_every_process_scraped_with_its_final_values(self):
        finished = self.values(f"last_over_time(pstrain_finished{STORED})")
        expected = {("ps", "0"), ("ps", "1"), ("worker", "0"), ("worker", "1")}
        self.assertEqual(finished, {k: 1.0 for k in expected},
                         "every process's final values (pstrain_finished 1) in Prometheus")
        # The instances scraped are the URLs launch.json names.
        instances = {s["metric"]["instance"]: s["metric"]["pstrain_process"]
                     for s in self.prometheus.query(f"last_over_time(pstrain_finished{STORED})")}
        self.assertEqual(
            instances,
            {p["metrics_url"].split("/")[2]: p["name"] for p in self.record["processes"]})
        for s in self.prometheus.query(f"last_over_time(pstrain_finished{STORED})"):
            self.assertEqual(s["metric"]["job"], "fashion-mlp")

    def test_samples_agree_with_the_run(self):
        total = self.scalar(f"sum(last_over_time(pstrain_worker_samples_total{STORED}))")
        self.assertGreater(total, 0)
        self.assertEqual(total, self.final["global_samples"],
                         "the workers' samples summed = the final global count")
        self.assertEqual(
            self.scalar(f'last_over_time(pstrain_ps_global_samples{{index="0"}}{STORED})'), total,
            "ps 0's count = the workers' samples")

    def test_updates_applied_agree_with_the_workers_steps(self):
        steps = self.scalar(f"sum(last_over_time(pstrain_worker_steps_total{STORED}))")
        chunks = self.scalar(f"sum(last_over_time(pstrain_ps_chunks{STORED}))")
        updates = self.scalar(f"sum(last_over_time(pstrain_ps_updates_total{STORED}))")
        self.assertGreater(steps, 0)
        # Every async step pushes each chunk once; a resend is never applied twice.
        self.assertEqual(updates, steps * chunks)
        self.assertEqual(
            self.scalar(f"sum(last_over_time(pstrain_ps_update_staleness_count{STORED}))"),
            updates, "one staleness per applied push")
        self.assertGreaterEqual(
            self.scalar(f'sum(last_over_time(pstrain_ps_requests_total{{op="push_pull"}}'
                        f'{STORED}))'), updates)

    def test_accuracy_agrees_with_the_final_evaluation(self):
        accuracy = self.values(f"last_over_time(pstrain_worker_test_accuracy{STORED})")
        self.assertEqual(list(accuracy), [("worker", "0")])
        self.assertAlmostEqual(accuracy[("worker", "0")], self.final["test_accuracy"], places=6)

    def test_every_dashboard_query_finds_the_run(self):
        with open(os.path.join(support.ROOT, "docs", "grafana-dashboard.json")) as f:
            dashboard = json.load(f)
        # While worker 0 was still scraped (the servers outlive it), so that
        # no series is stale yet; rates over the whole short run.
        # The time of worker 0's last sample itself: timestamp() of a range
        # function's result is the query's own time, after the exited
        # worker's series went stale.
        (samples,) = self.prometheus.query(f'pstrain_finished{{role="worker",index="0"}}{STORED}')
        at = float(samples["values"][-1][0])
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = (target["expr"].replace("$job", "fashion-mlp")
                        .replace("$__rate_interval", "1m"))
                result = self.prometheus.query(expr, at)
                if "allreduce" not in expr:  # sync mode's
                    self.assertTrue(result, f"{panel['title']}: {expr} finds nothing")

    def test_promtool_accepts_every_endpoint(self):
        self.assertEqual(sorted(self.texts), ["ps0", "ps1", "worker0", "worker1"],
                         "a text from each process while it worked")
        for name, text in self.texts.items():
            r = subprocess.run([promtool(), "check", "metrics"], input=text,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""), name)


class LaunchPrometheusTest(unittest.TestCase):
    def test_launch_runs_prometheus_for_the_run_and_stops_it(self):
        support.require_binary(self)
        w = support.Workspace(support.cluster(
            metrics={"port_base": free_port_block(4)}, train={"eval_every": 0}))
        self.addCleanup(w.cleanup)
        run_dir = os.path.join(w.path, "run")
        r = support.run_tool("launch", [w.cluster, "--run-dir", run_dir, "--max-restarts", "0",
                                        "--prometheus", "--scrape-interval", "0.2"], timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        record = support.read_json(os.path.join(run_dir, "launch.json"))
        prometheus = record["prometheus"]
        self.assertIn(f"launch: Prometheus at {prometheus['url']} ", r.stdout)
        self.assertFalse(support.alive(prometheus["pid"]), "Prometheus stopped with the run")
        self.assertTrue(os.path.isdir(os.path.join(run_dir, "prometheus", "wal")),
                        "its data stays in the run directory")
        # --prometheus turned metrics on, and it scraped every process's
        # final values before the process exited.
        for p in record["processes"]:
            self.assertTrue(p["metrics_url"].startswith("http://127.0.0.1:"))
            log = support.read_text(os.path.join(run_dir, p["name"] + ".log"))
            self.assertIn("metrics: a scrape read the final values", log, p["name"])


class MetricsPortTakenTest(unittest.TestCase):
    def test_a_taken_port_stops_the_process_naming_it(self):
        support.require_binary(self)
        with socket.socket() as taken:
            # Even a socket that would share the port (SO_REUSEPORT) holds it.
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            w = support.Workspace(support.cluster(
                metrics={"enabled": True, "port_base": port}))
            self.addCleanup(w.cleanup)
            r = subprocess.run([support.PSTRAIN, "--role", "ps", "--index", "0", "--cluster",
                                w.cluster, "--set", f"run_dir={w.path}/run"],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"cannot serve metrics on 127.0.0.1:{port}: Address already in use",
                      r.stderr)


if __name__ == "__main__":
    unittest.main()
