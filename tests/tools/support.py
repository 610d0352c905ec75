"""Shared pieces of the tools' tests: the binary, free ports, small cluster
files, and the process tree under a launcher. Importing it puts tools/ on
sys.path, so that a test run without ctest's $PYTHONPATH imports
pstrain_tools too: import it before pstrain_tools."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools")
PSTRAIN = os.path.abspath(os.environ.get("PSTRAIN") or os.path.join(ROOT, "build", "pstrain"))

if TOOLS not in sys.path:
    sys.path.append(TOOLS)


def require_binary(testcase):
    if not os.access(PSTRAIN, os.X_OK):
        testcase.fail(f"no pstrain binary at {PSTRAIN}; set $PSTRAIN (ctest does)")


_ports_given = set()


def free_port():
    """A loopback port free now, and never one this process was given
    before: the kernel may hand a port just probed and closed out again, so
    two calls could name one port for two servers."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def cluster(ps_hosts=("127.0.0.1", "127.0.0.1"), worker_hosts=("127.0.0.1", "127.0.0.1"),
            **sections):
    """A small synthetic job on free ports; `sections` replace or extend the
    defaults section by section (train={...} merges into train)."""
    doc = {
        "job": "tooltest",
        "ps": [{"host": h, "port": free_port()} for h in ps_hosts],
        "workers": [{"host": h} for h in worker_hosts],
        "data": {"name": "synthetic", "synthetic_train": 2000, "synthetic_test": 500},
        # A short heartbeat gives every worker several metrics records even in
        # a run of a second or two.
        "net": {"heartbeat": 0.1, "worker_timeout": 20, "request_timeout": 10},
        "train": {"batch_size": 32, "epochs": 1, "eval_every": 400},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
        else:
            doc[key] = value
    return doc


def default_job(ports=None, **train):
    """The README's default cluster.yaml with its servers on `ports` (free
    loopback ports when not given), `train` merged into its train section."""
    with open(os.path.join(ROOT, "cluster.yaml")) as f:
        doc = yaml.safe_load(f)
    ports = ports or [free_port() for _ in doc["ps"]]
    doc["ps"] = [{"host": "127.0.0.1", "port": p} for p in ports]
    doc["train"].update(train)
    return doc


class Workspace:
    """A temporary folder with a cluster file in it."""

    def __init__(self, doc):
        self._tmp = tempfile.TemporaryDirectory(prefix="pstrain-tools-")
        self.path = self._tmp.name
        self.doc = doc
        self.cluster = os.path.join(self.path, "cluster.yaml")
        with open(self.cluster, "w") as f:
            yaml.safe_dump(doc, f)

    def cleanup(self):
        self._tmp.cleanup()


def read_text(path):
    with open(path) as f:
        return f.read()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def tool_env(**extra):
    env = dict(os.environ, PSTRAIN=PSTRAIN)
    env.update(extra)
    return env


def run_tool(tool, args, timeout=120, **env):
    return subprocess.run([sys.executable, os.path.join(TOOLS, tool)] + args,
                          capture_output=True, text=True, timeout=timeout, env=tool_env(**env),
                          cwd=ROOT)


def children():
    """{pid: parent pid} of every process, from /proc."""
    tree = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; fields after it
        # are plain.
        fields = stat[stat.rindex(")") + 2:].split()
        tree[int(entry)] = int(fields[1])
    return tree


def descendants(pid):
    tree = children()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in tree.items() if p in frontier} - found
        found |= frontier
    return found


def argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def is_pstrain(pid):
    """Whether `pid` runs the binary under test (not a shell that names it)."""
    return argv(pid)[:1] == [PSTRAIN]


def alive(pid):
    """Whether `pid` still runs (a zombie has ended; its parent just has not
    reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def pstrain_processes_under(pid):
    """{pid: argv} of the pstrain processes among the descendants of `pid`."""
    return {p: argv(p) for p in descendants(pid) if is_pstrain(p)}


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
