"""A Prometheus server for one run: its configuration, and the process.

Debian's `prometheus` (2.42) scrapes every ps and worker of a run that has
`metrics.enabled`. The targets come by file-based discovery from the run
directory: tools/launch writes `prometheus_targets.json` there (one entry per
process, `targets_document`) before it starts them. The processes label
their own series with job, role and index, which the configuration keeps
(`honor_labels`) over Prometheus' own `job` label.

    server = PrometheusServer(storage_dir, port, config_text([targets_file]))
    server.start()       # raises PrometheusError saying why it did not come up
    ... server.query("sum(pstrain_worker_samples_total)") ...
    server.stop()        # SIGTERM by PID, SIGKILL after a grace period

$PROMETHEUS names the binary (default /usr/bin/prometheus).
"""

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

TARGETS_FILE = "prometheus_targets.json"
STOP_GRACE_SECONDS = 10


class PrometheusError(Exception):
    """The server could not be started or answered with an error."""


def binary():
    return os.environ.get("PROMETHEUS") or "/usr/bin/prometheus"


def targets_document(processes):
    """The file_sd document for `processes`, [(name, metrics_url)]: one
    group per process, so each target is labelled with its process name."""
    groups = []
    for name, url in processes:
        parts = urllib.parse.urlsplit(url)
        groups.append({"targets": [parts.netloc], "labels": {"pstrain_process": name}})
    return groups


def write_targets(path, processes):
    """Writes the discovery file atomically: Prometheus watches it and must
    never read half of it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(targets_document(processes), f, indent=1)
    os.replace(tmp, path)


def config_text(target_files, scrape_interval=1.0):
    """prometheus.yml scraping the processes listed in `target_files`
    (file_sd), every `scrape_interval` seconds. JSON is YAML, and needs no
    yaml module to write."""
    # Prometheus' durations are whole numbers of a unit: 0.25 s is "250ms".
    interval = f"{max(1, round(scrape_interval * 1000))}ms"
    return json.dumps({
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": interval},
        "scrape_configs": [{
            "job_name": "pstrain",
            # The series' own job, role and index labels win over the
            # scrape's.
            "honor_labels": True,
            "file_sd_configs": [{"files": list(target_files), "refresh_interval": "1s"}],
        }],
    }, indent=1) + "\n"


class PrometheusServer:
    """One `prometheus` child process listening on 127.0.0.1:`port`, its
    data in `storage_dir`, its output in `log_path` (default: beside the
    data)."""

    def __init__(self, storage_dir, port, config, log_path=None, preexec_fn=None):
        self.storage_dir, self.port, self.config = storage_dir, port, config
        self.log_path = log_path or os.path.join(storage_dir, "prometheus.log")
        self.config_path = os.path.join(storage_dir, "prometheus.yml")
        self.preexec_fn = preexec_fn
        self.popen = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout=60):
        """Starts the server and waits until it says it is ready."""
        os.makedirs(self.storage_dir, exist_ok=True)
        with open(self.config_path, "w") as f:
            f.write(self.config)
        argv = [binary(), f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.storage_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}"]
        try:
            with open(self.log_path, "ab") as log:
                self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True,
                                              preexec_fn=self.preexec_fn)
        except OSError as e:
            raise PrometheusError(f"cannot run {argv[0]}: {e} (install the Debian package "
                                  "prometheus: tools/setup; or set $PROMETHEUS)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise PrometheusError(f"{argv[0]} exited with code {self.popen.returncode} "
                                      f"before it was ready; its log ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(f"{argv[0]} was not ready within {timeout} s; its log ends:\n"
                              f"{self.log_tail()}")

    def stop(self):
        """Ends the server by its PID: SIGTERM, then SIGKILL after a grace
        period. Safe to call twice, or when start() failed."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def wait_for_targets(self, count, timeout=30):
        """Waits until Prometheus has taken `count` targets from discovery
        (it applies new ones only every 5 s), so that it scrapes processes
        from their start; returns whether it has."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/api/v1/targets?state=active",
                                            timeout=5) as r:
                    if len(json.load(r)["data"]["activeTargets"]) >= count:
                        return True
            except (urllib.error.URLError, OSError, KeyError, ValueError):
                pass
            time.sleep(0.2)
        return False

    def query(self, promql, at=None):
        """The result list of an instant query (/api/v1/query) at UNIX time
        `at`, by default now."""
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.load(r)
        except urllib.error.HTTPError as e:
            raise PrometheusError(f"query {promql!r}: HTTP {e.code}: "
                                  f"{e.read().decode(errors='replace')}")
        if answer.get("status") != "success":
            raise PrometheusError(f"query {promql!r}: {answer}")
        return answer["data"]["result"]

    def log_tail(self, lines=15):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:]) or "(empty)\n"
        except OSError as e:
            return f"(no log: {e})\n"
