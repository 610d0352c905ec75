"""Starts every process of a pstrain cluster and waits for them.

    tools/launch cluster.yaml [--set key=value ...] [--mode async|sync]
                 [--run-dir DIR] [--cpu-workers N] [--restore DIR]
                 [--max-restarts N] [--restart-backoff S] [--dry-run]
                 [--prometheus [--scrape-interval S]] [--trace]
                 [--emit slurm|k8s|tfjob [-o FILE] [k8s options]]

Processes on this host run as child processes; those on other hosts are
started over ssh ($PSTRAIN_SSH, default `ssh`; the binary, the working
directory and the run directory must exist at the same paths there). Each run
gets its own run directory (runs/<job>-<time>) with every process's log and
metrics, the resolved cluster file and launch.json (start and end time, each
process's command, PID and exit status, every attempt of a restarted
process, the exit code). Output lines are prefixed with the process's name;
the progress line of worker 0 stays at the bottom of a terminal. Every
launch draws a run id (`--run-id`, recorded in launch.json) that all its
processes share, restarts included: the servers refuse a process of any
other launch, a stale one of an earlier run of the same file too.

A process that exits non-zero or dies of a signal the launcher did not send is
restarted on its host, up to --max-restarts times (default 3, as torchrun),
after a backoff of --restart-backoff seconds (default 1) doubled at each
restart of that process and capped at 30 s: 1, 2, 4 s. A restarted ps gets
`--restore latest` (replacing a --restore DIR given to the launcher), so it
continues from its newest checkpoint; a restarted worker gets its own command
again. A process that exits 0 is never restarted. A ps that exits 75 (its
backup took its shard over: replicated shards) is restarted to re-join, and
is no failure once its restarts are spent. When a process's restarts
are spent, a ps stops the run; a worker stops it too if the resolved
`train.on_worker_loss` is `fail` (the default in sync mode), while under
`continue` (the default in async mode) the others go on and the run succeeds
if every ps ends with 0 (losing every worker fails it). --max-restarts 0
restarts nothing and stops the run at the first failure, whatever
on_worker_loss says. Ctrl-C or SIGTERM ends every child and restarts nothing.
These rules are supervisor.py; details: docs/failures.md. The binary comes
from $PSTRAIN, else build/pstrain (installed as pstrain-launch: the
installed pstrain); the launcher never builds it. launch.json records its
version (`pstrain --version`).

With `metrics.enabled` every process serves /metrics (docs/metrics.md):
launch.json gives each process's `metrics_url`, and the run directory's
prometheus_targets.json lists them for Prometheus' file-based discovery.
`--prometheus` turns metrics on, starts Debian's `prometheus` for the run on
a free port of 127.0.0.1 (data in <run_dir>/prometheus, scraping every
--scrape-interval seconds, default 1), waits (up to 30 s) until it has taken
the run's targets, so that it scrapes every process from its start, prints
its address and stops it by its PID when the run ends. Unless the file sets
metrics.linger_s, each process then serves on after its work until a scrape
has read its final values, for at most three scrape intervals (5 s at
least).

`--trace` has every process write its timeline (`pstrain --trace`: a
worker's steps, a ps's requests) into <run_dir>/trace/<name>.json and merges
this host's files into <run_dir>/trace.json at the end, which Perfetto and
chrome://tracing open and `tools/trace` breaks down (docs/performance.md).

`--emit slurm` starts nothing: it writes the resolved cluster file into the
run directory (which must be on a file system every node shares) and prints
a batch script for `sbatch` (to FILE with -o) that runs the job as one srun
step, restarts included (emit_slurm.py, docs/clusters.md). `--emit k8s`
prints Kubernetes manifests (a ConfigMap with the resolved file, per role a
headless Service and a StatefulSet), `--emit tfjob` the same job as a
Kubeflow TFJob (emit_k8s.py, docs/clusters.md); the run directory here
keeps the resolved file and, with CURVE, the tool's key.

With `security.curve: true` every run gets a fresh set of CURVE keys
(`pstrain --keygen`, made in a private temporary folder that is removed once
the keys are handed out): each process gets only its own secret key and the
public list, in <run_dir>/keys/<name>/ on its host (copied over ssh for a
remote one, mode 0600), named to it by $PSTRAIN_KEYS. docs/security.md.
"""

import argparse
import collections
import ctypes
import json
import os
import secrets
import selectors
import shlex
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from . import cluster_config, emit_k8s, emit_slurm, prometheus_server, supervisor, trace

GRACE_SECONDS = 5.0
TAIL_LINES = 15
PR_SET_PDEATHSIG = 1


def local_hosts():
    names = {"127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn()}
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


def die_with_launcher():
    """Runs in each local child before exec: if the launcher itself is killed
    (SIGKILL, a crash), the child gets SIGTERM instead of living on."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Process:
    def __init__(self, name, role, cmd, host, log_path, ssh=None):
        """`cmd` runs pstrain on `host`; `ssh` (the ssh command, for another
        host) or None (this host)."""
        self.name, self.role, self.cmd, self.host = name, role, cmd, host
        self.log_path, self.ssh = log_path, ssh
        self.remote = ssh is not None
        self.env = {}  # set for pstrain on top of ours (PSTRAIN_KEYS)
        self.popen = None
        self.partial = b""
        # The last output lines: shown when the process fails, also for a
        # remote process whose log file is on another host.
        self.recent = collections.deque(maxlen=TAIL_LINES)
        # What launch.json says of it; `attempts` grows with each restart.
        self.entry = {"name": name, "host": host, "command": self.argv, "attempts": []}

    @property
    def argv(self):
        if not self.remote:
            return self.cmd
        return self.ssh + ["-o", "BatchMode=yes", self.host, remote_command(self.cmd, self.env)]

    def prepare_restart(self):
        """The command of the next attempt: a ps restores its newest
        checkpoint (`--restore latest`, in place of any --restore DIR)."""
        if self.role == "ps":
            cmd = []
            i = 0
            while i < len(self.cmd):
                if self.cmd[i] == "--restore":
                    i += 2
                    continue
                cmd.append(self.cmd[i])
                i += 1
            self.cmd = cmd + ["--restore", "latest"]

    def start(self):
        # A new session per child, so a signal to its group reaches everything
        # it started and nothing of ours. A remote process gets a pipe as
        # stdin that the launcher never writes: its end of file on the remote
        # host (the launcher closed it, or died) is what stops the process
        # there, since a signal to the local ssh does not cross the wire.
        self.popen = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if self.remote else subprocess.DEVNULL,
            start_new_session=True, preexec_fn=None if self.remote else die_with_launcher,
            env=None if self.remote or not self.env else dict(os.environ, **self.env))
        os.set_blocking(self.popen.stdout.fileno(), False)
        self.entry["pid"] = self.popen.pid
        self.entry.pop("exit", None)
        self.entry["attempts"].append({"attempt": len(self.entry["attempts"]) + 1,
                                       "start": time.time(), "pid": self.popen.pid,
                                       "command": self.argv})

    def ended(self, stopped=False):
        """Records how the current attempt ended: `exit` is its code, or minus
        the signal that killed it (for a remote process: its ssh's);
        `stopped` when the launcher itself stopped it."""
        code = self.popen.returncode
        attempt = self.entry["attempts"][-1]
        attempt.update(end=time.time(), exit=code)
        if code < 0:
            attempt["signal"] = signal_name(-code)
        if stopped:
            attempt["stopped"] = True
        self.entry["exit"] = code

    def close_stdin(self):
        if self.popen and self.popen.stdin and not self.popen.stdin.closed:
            self.popen.stdin.close()

    def stop(self, sig):
        self.close_stdin()
        if self.popen and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def how(self):
        code = self.popen.returncode
        if code < 0:
            return f"was killed by signal {-code} ({signal_name(-code)})"
        return f"exited with code {code}"

    def tail(self):
        return "".join(line + "\n" for line in self.recent) or "(no output)\n"


class Console:
    """Prefixed output; worker 0's progress line stays at the bottom of a terminal."""

    def __init__(self):
        self.tty = sys.stdout.isatty()
        self.status = ""

    def line(self, name, text):
        if self.tty and name == "worker0" and text.startswith("progress "):
            self.status = f"[{name}] {text[len('progress '):]}"
            self._redraw()
            return
        if self.tty and self.status:
            sys.stdout.write("\r\x1b[K")
        sys.stdout.write(f"[{name}] {text}\n")
        self._redraw()

    def _redraw(self):
        if self.tty and self.status:
            width = os.get_terminal_size().columns if self.tty else 120
            sys.stdout.write("\r\x1b[K" + self.status[: width - 1])
        sys.stdout.flush()

    def notice(self, text):
        """A launcher message on stderr, below the progress line."""
        if self.tty and self.status:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
        self._redraw()

    def finish(self):
        if self.tty and self.status:
            sys.stdout.write("\n")
            sys.stdout.flush()


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def on_worker_loss(cfg):
    """train.on_worker_loss of the config `pstrain --check` resolved, which
    holds the mode's default where the file gives none (shared/modes.h): the
    launcher does not decide it a second time."""
    value = (cfg.get("train") or {}).get("on_worker_loss")
    if value not in ("continue", "fail"):
        raise cluster_config.ConfigError(
            f"pstrain --check printed train.on_worker_loss {value!r}, not continue or fail: "
            "is $PSTRAIN an older pstrain than this launcher?", 2)
    return value


def remote_command(cmd, env=None):
    """The shell command ssh runs: `cmd` in this working directory (with the
    variables `env` sets), ended with SIGTERM when ssh's stdin reaches end of
    file."""
    if env:
        cmd = ["env"] + [f"{k}={v}" for k, v in sorted(env.items())] + list(cmd)
    return ("cd " + shlex.quote(os.getcwd()) + " || exit 1; exec 3<&0; "
            + shlex.join(cmd) + " </dev/null & pid=$!; "
            "{ cat <&3 >/dev/null; kill -TERM $pid; } >/dev/null 2>&1 & "
            "exec 3<&-; wait $pid")


def new_run_id():
    """This launch's nonce (`pstrain --run-id`): every process of the launch
    gets it, restarts included, and the servers refuse processes of any other
    launch, stale ones of an earlier run of the same file too."""
    while True:
        run_id = secrets.token_hex(8)
        if int(run_id, 16) != 0:
            return run_id


def build_processes(cfg, binary, cluster_file, run_dir, ssh, run_id, restore=None, trace=False):
    here = local_hosts()
    procs = []
    roles = [("ps", p["host"]) for p in cfg["ps"]] + [("worker", w["host"]) for w in cfg["workers"]]
    counters = {"ps": 0, "worker": 0}
    for role, host in roles:
        index = counters[role]
        counters[role] += 1
        name = f"{role}{index}"
        cmd = [binary, "--role", role, "--index", str(index), "--cluster", cluster_file,
               "--run-id", run_id]
        if role == "ps" and restore:
            cmd += ["--restore", restore]
        if trace:
            cmd += ["--trace", os.path.join(os.path.abspath(run_dir), "trace", f"{name}.json")]
        procs.append(Process(name, role, cmd, host, os.path.join(run_dir, f"{name}.log"),
                             None if host in here else ssh))
    return procs


class KeysError(Exception):
    """The keys could not be made or handed out; the message says where."""


def write_private(path, data):
    """Creates `path` readable by its owner only (mode 0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_keys(binary, cluster_file):
    """A fresh key set for the cluster (`pstrain --keygen`), as {file name:
    bytes}, made in a private temporary folder that is removed at once."""
    with tempfile.TemporaryDirectory(prefix="pstrain-keys-") as tmp:
        made = os.path.join(tmp, "keys")
        r = subprocess.run([binary, "--keygen", made, "--cluster", cluster_file],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise KeysError(r.stderr.strip() or f"pstrain --keygen exited with {r.returncode}")
        keys = {}
        for name in os.listdir(made):
            with open(os.path.join(made, name), "rb") as f:
                keys[name] = f.read()
        return keys


def hand_out_keys(procs, binary, cluster_file, run_dir):
    """security.curve: a fresh key set for the run, of which each process
    gets its own secret key and the public list only, in
    <run_dir>/keys/<name>/ on its host, named by $PSTRAIN_KEYS."""
    keys = make_keys(binary, cluster_file)
    public = keys["public_keys"]
    for p in procs:
        stem = f"{p.role}-{p.name[len(p.role):]}"
        secret = keys[stem + ".key"]
        dest = os.path.join(os.path.abspath(run_dir), "keys", p.name)
        p.env["PSTRAIN_KEYS"] = dest
        if p.remote:
            copy_over_ssh(p, dest, {stem + ".key": secret, "public_keys": public})
            continue
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest, mode=0o700)
        write_private(os.path.join(dest, stem + ".key"), secret)
        write_private(os.path.join(dest, "public_keys"), public)


def copy_over_ssh(p, dest, files):
    """Writes `files` ({name: bytes}) into `dest` on `p`'s host, each with
    mode 0600 (umask 077 before anything is created)."""
    for i, (name, data) in enumerate(files.items()):
        make = f"rm -rf {shlex.quote(dest)} && mkdir -p {shlex.quote(dest)} && " if i == 0 else ""
        command = f"umask 077 && {make}cat > {shlex.quote(os.path.join(dest, name))}"
        try:
            r = subprocess.run(p.ssh + ["-o", "BatchMode=yes", p.host, command], input=data,
                               capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise KeysError(f"copying {p.name}'s keys to {p.host}: ssh did not finish in 60 s")
        if r.returncode != 0:
            raise KeysError(f"copying {p.name}'s keys to {p.host} failed: "
                            + r.stderr.decode(errors="replace").strip())


def metrics_overrides(cfg, scrape_interval):
    """--prometheus: the overrides that turn metrics on and, unless the file
    sets a linger, keep each process serving until a scrape read its final
    values (at most three scrape intervals)."""
    metrics = cfg.get("metrics") or {}
    out = [] if metrics.get("enabled") == "true" else ["metrics.enabled=true"]
    if float(metrics.get("linger_s", "0")) == 0:
        out.append(f"metrics.linger_s={max(5.0, 3 * scrape_interval):g}")
    return out


def start_prometheus(run_dir, scrape_interval, targets_count):
    """--prometheus: a Prometheus server for this run on a free port of
    127.0.0.1, scraping the run's prometheus_targets.json (which lists
    `targets_count` processes) once it has taken them; it dies with the
    launcher. Raises prometheus_server.PrometheusError."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    targets = os.path.join(os.path.abspath(run_dir), prometheus_server.TARGETS_FILE)
    server = prometheus_server.PrometheusServer(
        os.path.join(os.path.abspath(run_dir), "prometheus"), port,
        prometheus_server.config_text([targets], scrape_interval),
        preexec_fn=die_with_launcher)
    server.start()
    if not server.wait_for_targets(targets_count):
        server.stop()
        raise prometheus_server.PrometheusError(
            f"it did not take the {targets_count} targets of {targets} within 30 s; its log "
            f"ends:\n{server.log_tail()}")
    return server


def write_record(path, record):
    """launch.json: what ran, with which PIDs, and how it ended."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)


def run(procs, console, record, record_path, max_restarts=0, backoff_base=1.0,
        worker_loss="fail"):
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    sel = selectors.DefaultSelector()
    record["start"] = time.time()
    record["max_restarts"] = max_restarts
    record["on_worker_loss"] = worker_loss
    for p in procs:
        p.start()
        sel.register(p.popen.stdout, selectors.EVENT_READ, p)
    # The entries are the processes' own dicts: a restart updates them in place.
    record["processes"] = [p.entry for p in procs]
    write_record(record_path, record)

    policy = supervisor.Supervisor(sum(p.role == "worker" for p in procs), max_restarts,
                                   backoff_base, worker_loss)
    failed = None
    # A list, not a set: processes found ended in the same poll are judged in
    # cluster order, so the name in the report does not depend on hashing.
    running = list(procs)
    # [(monotonic time due, process)]: ended, to be started again.
    waiting = []
    while (running or waiting) and failed is None and stop["signal"] is None:
        changed = False
        for key, _ in sel.select(timeout=0.1 if waiting else 0.2):
            changed = drain(key.data, console) or changed
        for p in list(running):
            code = p.popen.poll()
            if code is None:
                continue
            drain(p, console, final=True)
            sel.unregister(p.popen.stdout)
            p.popen.stdout.close()
            p.close_stdin()
            running.remove(p)
            p.ended()
            changed = True
            # The launcher signals its children only after this loop, so a
            # failure seen here is the process's own (or someone else's kill).
            verdict = policy.ended(p.name, p.role, code, stopping=stop["signal"] is not None)
            if verdict.action == supervisor.RESTART:
                restarts = policy.restarts[p.name]
                p.entry["attempts"][-1]["backoff"] = verdict.delay
                p.prepare_restart()
                extra = " with --restore latest" if p.role == "ps" else ""
                console.notice(f"launch: {p.name} {p.how()}; restart {restarts} of "
                               f"{max_restarts} (attempt {restarts + 1}) in {verdict.delay:g} s"
                               f"{extra}")
                waiting.append((time.monotonic() + verdict.delay, p))
            elif verdict.action == supervisor.LOSE:
                console.notice(f"launch: {p.name} {p.how()} and has used its {max_restarts} "
                               f"restarts; the others go on without it "
                               f"(train.on_worker_loss: continue).\n"
                               f"launch: last lines of {p.name} (log: {p.log_path} on {p.host}):\n"
                               f"{p.tail()}")
            elif (verdict.action == supervisor.LEAVE and p.role == "ps"
                  and code == supervisor.PS_FENCED and stop["signal"] is None):
                spent = f"its {max_restarts} restarts are spent" if max_restarts else \
                    "restarts are off"
                console.notice(f"launch: {p.name} {p.how()}: its backup serves its shard; "
                               f"{spent}, the run goes on without it")
            elif verdict.action == supervisor.FAIL:
                if verdict.every_worker_lost:
                    console.notice("launch: every worker is lost; stopping the run.")
                failed = p
        now = time.monotonic()
        for item in list(waiting):
            due, p = item
            if now < due or failed is not None or stop["signal"] is not None:
                continue
            waiting.remove(item)
            p.partial = b""
            p.start()
            sel.register(p.popen.stdout, selectors.EVENT_READ, p)
            running.append(p)
            changed = True
            console.notice(f"launch: {p.name} restarted (attempt {policy.restarts[p.name] + 1}, "
                           f"PID {p.popen.pid})")
        if changed:
            write_record(record_path, record)

    if running:
        for p in running:
            p.stop(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in running):
            for key, _ in sel.select(timeout=0.1):
                drain(key.data, console)
        for p in running:
            p.stop(signal.SIGKILL)
            p.popen.wait()
            drain(p, console, final=True)
            p.ended(stopped=True)
    console.finish()
    record["end"] = time.time()
    if policy.lost:
        record["lost"] = policy.lost

    if stop["signal"] is not None:
        name = signal.Signals(stop["signal"]).name
        print(f"launch: {name} received; stopped every process", file=sys.stderr)
        record.update(exit_code=128 + stop["signal"], signal=name)
    elif failed:
        p, code = failed, failed.popen.returncode
        restarts = policy.restarts[p.name]
        spent = f" (its {restarts} restarts are spent)" if restarts else ""
        print(f"launch: {p.name} {p.how()}; stopped the other processes{spent}.\n"
              f"launch: last lines of {p.name} (log: {p.log_path} on {p.host}):\n{p.tail()}",
              file=sys.stderr, end="")
        record.update(exit_code=code if code > 0 else 1, failed=p.name)
    else:
        record["exit_code"] = 0
    write_record(record_path, record)
    return record["exit_code"]


# What a replicated ps logs at each step of a fail-over and re-join
# (server/replicator.h, server/dispatcher.h; docs/failures.md): each such
# line of a ps is recorded under its attempt's `replication` in launch.json,
# so the record tells who served which shard when, beside the restarts.
REPLICATION_EVENTS = (
    ("takes over ps ", "took_over"),
    (") serves this ps's shard now (", "fenced"),
    (": serving on without backup ps ", "backup_given_up"),
    (" answers again: copying this shard to it", "copying_to_backup"),
    (" holds this shard's copy again", "backup_has_copy"),
    ("back to a new process of ps ", "handed_back"),
    (": re-joined: ", "rejoined"),
    ("'s shard again: ", "copy_received"),
)


MAX_REPLICATION_EVENTS = 64  # per attempt


def replication_event(text):
    """The replication step a ps's output line tells of, or None."""
    for marker, event in REPLICATION_EVENTS:
        if marker in text:
            return event
    return None


def drain(p, console, final=False):
    """Shows what `p` wrote since the last call; True when a line was
    recorded in its launch.json entry (a replication step)."""
    recorded = False
    try:
        data = p.popen.stdout.read() or b""
    except (BlockingIOError, ValueError):
        data = b""
    data = p.partial + data
    *lines, p.partial = data.split(b"\n")
    if final and p.partial:
        lines.append(p.partial)
        p.partial = b""
    for line in lines:
        text = line.decode(errors="replace").rstrip("\r")
        if not text.startswith("progress "):
            p.recent.append(text)
        console.line(p.name, text)
        event = replication_event(text) if p.role == "ps" else None
        if event and p.entry["attempts"]:
            steps = p.entry["attempts"][-1].setdefault("replication", [])
            # Bounded, as a ps whose backup keeps failing logs a step each time.
            if len(steps) < MAX_REPLICATION_EVENTS:
                steps.append({"time": time.time(), "event": event, "line": text})
                recorded = True
    return recorded


def slurm_script(args, binary, overrides, run_dir):
    """--emit slurm: the resolved file in `run_dir`, and the batch script."""
    text, cfg = cluster_config.check(binary, args.cluster,
                                     overrides + [f"run_dir={json.dumps(run_dir)}"])
    cluster_file = os.path.join(run_dir, "cluster.yaml")
    delays = [supervisor.backoff(n, args.restart_backoff)
              for n in range(1, args.max_restarts + 1)]
    body = emit_slurm.script(cfg, binary, cluster_file, run_dir, os.getcwd(), delays)
    os.makedirs(run_dir, exist_ok=True)
    if args.trace:
        # Remote hosts need the same folder on their side: the run directory
        # is a shared path there too (as for the logs).
        os.makedirs(os.path.join(run_dir, "trace"), exist_ok=True)
    cluster_config.write(text, cluster_file)
    return body, f"submit it with: sbatch {args.output}"


def kubernetes_manifests(args, binary, overrides, cfg, run_dir):
    """--emit k8s|tfjob: the manifests, the resolved file inside them (servers
    and workers in the count form, run_dir the pods' own). With CURVE, the
    keys are made here and the tool's kept in <run_dir>/keys/tool."""
    overrides = (overrides + emit_k8s.count_overrides(cfg)
                 + [f"run_dir={json.dumps(emit_k8s.RUN_DIR)}"])
    text, cfg = cluster_config.check(binary, args.cluster, overrides)
    opts = {"image": args.image, "namespace": args.namespace, "binary": args.image_binary,
            "ps_cpu": args.ps_cpu, "ps_memory": args.ps_memory,
            "worker_cpu": args.worker_cpu, "worker_memory": args.worker_memory,
            "volume_size": args.volume_size, "storage_class": args.storage_class,
            "max_restarts": args.max_restarts, "run_id": new_run_id()}
    # The run directory here keeps what was emitted: the pods' cluster file
    # and, with CURVE, the tool's key (the pods get theirs in Secrets).
    os.makedirs(run_dir, exist_ok=True)
    cluster_file = os.path.join(run_dir, "cluster.yaml")
    cluster_config.write(text, cluster_file)
    keys = None
    if cfg.get("security", {}).get("curve") == "true":
        keys = make_keys(binary, cluster_file)
        tool_dir = os.path.join(run_dir, "keys", "tool")
        os.makedirs(tool_dir, mode=0o700)
        write_private(os.path.join(tool_dir, "tool.key"), keys.pop("tool.key"))
        write_private(os.path.join(tool_dir, "public_keys"), keys["public_keys"])
    emitter = emit_k8s.Emitter(cfg, text, opts, keys)
    objs = emitter.k8s() if args.emit == "k8s" else emitter.tfjob()
    apply = f"apply it with: kubectl apply -f {args.output}"
    return emit_k8s.dump(objs), apply


def emit(args, binary, overrides, cfg, run_dir):
    """--emit: what the scheduler runs, to -o FILE or standard output."""
    try:
        if args.emit == "slurm":
            body, then = slurm_script(args, binary, overrides, run_dir)
        else:
            body, then = kubernetes_manifests(args, binary, overrides, cfg, run_dir)
    except (cluster_config.EmitError, KeysError) as e:
        print(f"launch: --emit {args.emit}: {e}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as f:
            f.write(body)
        print(f"launch: wrote {args.output}; {then}", file=sys.stderr)
    else:
        sys.stdout.write(body)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cluster", nargs="?", default="cluster.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the file in every process")
    ap.add_argument("--mode", choices=["async", "sync", "ssp", "backup", "local"],
                    help="shorthand for --set mode=... (docs/modes.md)")
    ap.add_argument("--run-dir", help="run directory (default runs/<job>-<time>)")
    ap.add_argument("--cpu-workers", type=int, default=2,
                    help="workers for 'workers: auto' on a host without GPUs (default 2)")
    ap.add_argument("--restore", metavar="DIR",
                    help="start the servers from the snapshot in DIR (a run's snapshot/ folder)")
    ap.add_argument("--max-restarts", type=int, default=3, metavar="N",
                    help="restarts of each failed process before giving up (default 3; "
                         "0: the first failure stops the run)")
    ap.add_argument("--restart-backoff", type=float, default=1.0, metavar="SECONDS",
                    help="wait before a process's first restart, doubled at each of its "
                         "next ones, at most 30 s (default 1)")
    ap.add_argument("--dry-run", action="store_true", help="print every command and exit")
    ap.add_argument("--trace", action="store_true",
                    help="every process writes a timeline (pstrain --trace) into "
                    "<run_dir>/trace/, merged into <run_dir>/trace.json at the end")
    ap.add_argument("--prometheus", action="store_true",
                    help="turn metrics on and start a Prometheus server for the run, stopped "
                         "with it (docs/metrics.md)")
    ap.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS",
                    help="with --prometheus: how often it scrapes every process (default 1)")
    ap.add_argument("--emit", choices=["slurm", "k8s", "tfjob"],
                    help="start nothing; write the job's batch script (slurm) or manifests "
                         "(k8s: Services and StatefulSets; tfjob: a Kubeflow TFJob)")
    ap.add_argument("-o", "--output", metavar="FILE",
                    help="with --emit: write the script to FILE (default: standard output)")
    k8s = ap.add_argument_group("with --emit k8s or tfjob")
    k8s.add_argument("--image", default="pstrain:latest",
                     help="the pods' image (default pstrain:latest; see Containerfile)")
    k8s.add_argument("--image-binary", default=emit_k8s.IMAGE_BINARY, metavar="PATH",
                     help=f"pstrain inside the image (default {emit_k8s.IMAGE_BINARY}, where "
                          "the package installs it)")
    k8s.add_argument("--namespace", help="the objects' namespace (default: kubectl's current)")
    k8s.add_argument("--ps-cpu", default="1", help="CPU request of a server (default 1)")
    k8s.add_argument("--ps-memory", default="1Gi", help="memory request of a server (default 1Gi)")
    k8s.add_argument("--worker-cpu", default="2", help="CPU request of a worker (default 2)")
    k8s.add_argument("--worker-memory", default="2Gi",
                     help="memory request of a worker (default 2Gi)")
    k8s.add_argument("--volume-size", default="1Gi",
                     help="k8s: each pod's run-directory volume claim (default 1Gi)")
    k8s.add_argument("--storage-class", help="k8s: the claims' storage class (default: the "
                                             "cluster's default)")
    args = ap.parse_args(argv)
    if args.max_restarts < 0:
        ap.error("--max-restarts must be 0 or more")
    if args.restart_backoff < 0:
        ap.error("--restart-backoff must be 0 or more")
    if args.output and not args.emit:
        ap.error("-o/--output applies only to --emit")
    if args.scrape_interval <= 0:
        ap.error("--scrape-interval must be more than 0")
    if args.prometheus and args.emit:
        ap.error("--prometheus starts a server for a run this launcher starts, not --emit's")
    if args.trace and args.emit:
        ap.error("--trace applies to a run this launcher starts; add pstrain --trace FILE to "
                 "--emit's commands by hand")

    overrides = list(args.set) + ([f"mode={args.mode}"] if args.mode else [])
    binary = cluster_config.pstrain_binary("launch")
    # pstrain applies the overrides and validates exactly as every process
    # will, so a bad key is reported once, before anything starts. Every
    # process then reads the file it resolves with `auto` made explicit and
    # the run directory set, so they all agree on one config (and its hash).
    try:
        _, cfg = cluster_config.check(binary, args.cluster, overrides)
        run_dir = args.run_dir or os.path.join(
            "runs", f"{cfg['job']}-{time.strftime('%Y%m%d-%H%M%S')}")
        if args.emit:
            # The processes run on other nodes: the run directory is named
            # the same from all of them, and `auto` is not this host's to
            # decide.
            return emit(args, binary, overrides, cfg, os.path.abspath(run_dir))
        text, cfg = cluster_config.check(
            binary, args.cluster, overrides + cluster_config.auto_overrides(cfg, args.cpu_workers)
            + (metrics_overrides(cfg, args.scrape_interval) if args.prometheus else [])
            + [f"run_dir={json.dumps(run_dir)}"])
    except cluster_config.ConfigError as e:
        print(e, file=sys.stderr)
        return e.code
    cluster_file = os.path.join(run_dir, "cluster.yaml")
    ssh = shlex.split(os.environ.get("PSTRAIN_SSH", "ssh"))
    run_id = new_run_id()
    procs = build_processes(cfg, binary, cluster_file, run_dir, ssh, run_id,
                            os.path.abspath(args.restore) if args.restore else None, args.trace)
    metrics_urls = cluster_config.metrics_urls(cfg)
    for p, (_, url) in zip(procs, metrics_urls):
        p.entry["metrics_url"] = url

    if args.dry_run:
        print(f"# run directory: {run_dir}")
        for p in procs:
            print(shlex.join(p.argv))
        return 0

    os.makedirs(run_dir, exist_ok=True)
    if args.trace:
        # Remote hosts need the same folder on their side: the run directory
        # is a shared path there too (as for the logs).
        os.makedirs(os.path.join(run_dir, "trace"), exist_ok=True)
    cluster_config.write(text, cluster_file)
    if cfg.get("security", {}).get("curve") == "true":
        try:
            hand_out_keys(procs, binary, cluster_file, run_dir)
        except (KeysError, OSError) as e:
            print(f"launch: security.curve: {e}", file=sys.stderr)
            return 2
    if metrics_urls:
        prometheus_server.write_targets(
            os.path.join(run_dir, prometheus_server.TARGETS_FILE), metrics_urls)
    print(f"launch: {len(cfg['ps'])} ps + {len(cfg['workers'])} workers, "
          f"mode {cfg['mode']}, run directory {run_dir}", flush=True)
    record = {"job": cfg["job"], "mode": cfg["mode"], "run_id": run_id,
              "pstrain": {"binary": binary, "version": cluster_config.version(binary)},
              "command": [sys.argv[0]] + (argv if argv is not None else sys.argv[1:])}
    prometheus = None
    if args.prometheus:
        try:
            prometheus = start_prometheus(run_dir, args.scrape_interval, len(metrics_urls))
        except prometheus_server.PrometheusError as e:
            print(f"launch: --prometheus: {e}", file=sys.stderr)
            return 2
        record["prometheus"] = {"url": prometheus.url, "pid": prometheus.popen.pid}
        print(f"launch: Prometheus at {prometheus.url} (every {args.scrape_interval:g} s; "
              f"data in {prometheus.storage_dir})", flush=True)
    try:
        code = run(procs, Console(), record, os.path.join(run_dir, "launch.json"),
                   args.max_restarts, args.restart_backoff, on_worker_loss(cfg))
    finally:
        if prometheus:
            prometheus.stop()
    if args.trace:
        merge_traces(run_dir, [p.name for p in procs if p.host in local_hosts()])
    if code == 0:
        print(f"launch: done; logs, metrics and the saved model are in {run_dir}")
    return code


def merge_traces(run_dir, names):
    """The traces of this host's processes (`names`), <run_dir>/trace/<name>.json,
    into <run_dir>/trace.json: one timeline. Other hosts' files stay apart:
    their clocks are not this host's."""
    folder = os.path.join(run_dir, "trace")
    files = [f for f in (os.path.join(folder, f"{n}.json") for n in names) if os.path.exists(f)]
    if not files:
        print("launch: --trace: no process wrote a trace", file=sys.stderr)
        return
    out = os.path.join(run_dir, "trace.json")
    try:
        trace.merge(files, out)
    except trace.TraceError as e:
        print(f"launch: --trace: {e}", file=sys.stderr)
        return
    print(f"launch: trace of {len(files)} processes in {out} (tools/trace {out} breaks it down)")

