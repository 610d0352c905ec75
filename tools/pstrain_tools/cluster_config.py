"""The cluster file as the tools see it: pstrain resolves it, the tools only `auto`.

`pstrain --check` applies the --set overrides and validates the file with the
code every process runs, and prints the resolved configuration. This module
reads that output and makes `workers: auto`, `device: auto` and `gpu: auto`
explicit, which needs this host's GPUs. The answer goes back to pstrain as
one more override, so the file the processes read is pstrain's own output:
the tools never apply an override or spell a value themselves.
"""

import json
import os
import shutil
import subprocess
import sys

import yaml

from . import paths


class ConfigError(Exception):
    """pstrain rejected the file or the overrides; `code` is its exit code."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def pstrain_binary(tool):
    """$PSTRAIN, else paths.BINARY; `tool` exits naming itself if there is none."""
    path = os.environ.get("PSTRAIN") or paths.BINARY
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        sys.exit(f"{tool}: no pstrain binary at {path}; build it (tools/build) or set $PSTRAIN")
    return os.path.abspath(path)


def version(binary):
    """The first line of `binary --version`: "pstrain 0.1.0-g24ea120"."""
    r = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (r.stdout.splitlines() or [f"pstrain --version exited with code {r.returncode}"])[0]


def check(binary, cluster, overrides=()):
    """(text, doc): the resolved configuration as pstrain prints it, and
    parsed. Every value in `doc` is a string, exactly as pstrain wrote it:
    YAML 1.1's guesses would turn a job named `yes` into a boolean."""
    r = subprocess.run([binary, "--check", "--cluster", cluster]
                       + [a for o in overrides for a in ("--set", o)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ConfigError(r.stderr.strip() or f"pstrain --check {cluster} exited with code "
                          f"{r.returncode}", r.returncode)
    return r.stdout, yaml.load(r.stdout, Loader=yaml.BaseLoader)


class EmitError(Exception):
    """The cluster file cannot run under a scheduler (`tools/launch --emit`)
    as it is; the message says why."""


def scheduled_device(workers, scheduler):
    """The one device ("cpu" or "cuda") of a checked config's workers, for
    `scheduler` (named in the errors), which runs them all alike on nodes it
    picks: `workers: auto`, `device: auto` (this host's GPUs) and mixed
    devices are refused."""
    if workers == "auto":
        raise EmitError(f"workers: auto counts this host's GPUs; for {scheduler} give the "
                        "workers as {count: N} (with device: cpu or cuda)")
    items = workers if isinstance(workers, list) else [workers]
    devices = {w.get("device", "cpu") for w in items if isinstance(w, dict)}
    if "auto" in devices:
        raise EmitError(f"workers: device: auto means this host's GPUs; for {scheduler} say "
                        "device: cpu or device: cuda")
    if len(devices) > 1:
        raise EmitError(f"workers: {scheduler} runs all workers alike; give them one device "
                        f"(got {sorted(devices)})")
    return devices.pop()


def gpu_count():
    """GPUs visible to this host, from nvidia-smi; 0 where there is none."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    lines = [l for l in out.splitlines() if l.startswith("GPU ")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return min(len(lines), len([v for v in visible.split(",") if v.strip()]))
    return len(lines)


def auto_overrides(doc, cpu_workers=2):
    """The --set overrides that make the `auto` values of a checked `doc`
    explicit; [] when it has none. `workers: auto` is one CUDA worker per GPU
    of this host, else `cpu_workers` CPU workers; `device: auto` is cuda when
    this host has a GPU; the CUDA workers with `gpu: auto` get GPUs 0, 1, ...
    of their host in turn."""
    gpus = None

    def host_gpus():
        nonlocal gpus
        if gpus is None:
            gpus = gpu_count()
        return gpus

    workers = doc["workers"]
    changed = workers == "auto"
    if changed:
        workers = ([{"host": "127.0.0.1", "device": "cuda", "gpu": str(i)}
                    for i in range(host_gpus())]
                   or [{"host": "127.0.0.1", "device": "cpu", "gpu": "auto"}
                       for _ in range(cpu_workers)])
    next_gpu = {}
    for w in workers:
        if w["device"] == "auto":
            w["device"] = "cuda" if host_gpus() else "cpu"
            changed = True
        if w["device"] == "cuda" and w["gpu"] == "auto":
            w["gpu"] = str(next_gpu.get(w["host"], 0))
            next_gpu[w["host"]] = int(w["gpu"]) + 1
            changed = True
    # JSON is YAML: every value quoted, so pstrain reads back what we meant.
    return [f"workers={json.dumps(workers)}"] if changed else []


def metrics_urls(doc):
    """[(process name, its /metrics URL)] of a resolved `doc`, ps first; []
    when metrics.enabled is off. The ports follow pstrain's metrics_port():
    ps i on port_base + i, worker j on port_base + (number of ps) + j, each
    at the host others dial."""
    metrics = doc.get("metrics") or {}
    if metrics.get("enabled") != "true":
        return []
    base = int(metrics["port_base"])
    hosts = [("ps", p["host"]) for p in doc["ps"]] + [("worker", w["host"])
                                                      for w in doc["workers"]]
    urls, counts = [], {"ps": 0, "worker": 0}
    for offset, (role, host) in enumerate(hosts):
        # Where a ps binds every interface it is still dialled at its host.
        shown = f"[{host}]" if ":" in host else host
        urls.append((f"{role}{counts[role]}", f"http://{shown}:{base + offset}/metrics"))
        counts[role] += 1
    return urls


def write(text, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("# Resolved by pstrain --check for tools/launch: overrides applied, "
                "`auto` values made explicit.\n")
        f.write(text)
    os.replace(tmp, path)
