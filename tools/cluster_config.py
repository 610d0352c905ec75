"""cluster.yaml as the tools see it: load, apply --set overrides, resolve `auto`.

The full validation is pstrain's own (`pstrain --check`); this module only
reads what the launcher needs: the job name, the ps list and the workers.
"""

import copy
import os
import shutil
import subprocess

import yaml


class ConfigError(Exception):
    pass


def load(path, overrides=()):
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for o in overrides:
        apply_override(doc, o)
    return doc


def apply_override(doc, override):
    """Sets a dotted key ("optimizer.lr=0.05", "workers.1.device=cpu")."""
    if "=" not in override:
        raise ConfigError(f"--set {override}: expected key=value")
    key, value = override.split("=", 1)
    parts = key.split(".")
    node = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {key}: '{part}' is not an index of the list")
            part = int(part)
        elif not isinstance(node, dict):
            raise ConfigError(f"--set {key}: '{parts[i - 1]}' is not a mapping")
        if last:
            node[part] = yaml.safe_load(value) if value else ""
        else:
            if isinstance(node, dict) and part not in node:
                node[part] = {}
            node = node[part]


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


def resolve(doc, cpu_workers=2):
    """A copy of `doc` with an explicit workers list and no `auto` left."""
    cfg = copy.deepcopy(doc)
    for key in ("ps", "workers"):
        if key not in cfg:
            raise ConfigError(f"{key}: missing (expected a list)")
    if not isinstance(cfg["ps"], list) or not cfg["ps"]:
        raise ConfigError("ps: expected a non-empty list of {host, port}")
    cfg.setdefault("job", "pstrain")

    workers = cfg["workers"]
    gpus = None
    if workers == "auto":
        gpus = gpu_count()
        workers = ([{"host": "127.0.0.1", "device": "cuda", "gpu": i} for i in range(gpus)]
                   or [{"host": "127.0.0.1", "device": "cpu"} for _ in range(cpu_workers)])
    elif isinstance(workers, dict):
        count = workers.get("count")
        if not isinstance(count, int) or count < 1:
            raise ConfigError("workers.count: expected an integer >= 1")
        entry = {k: v for k, v in workers.items() if k != "count"}
        workers = [dict(entry) for _ in range(count)]
    elif not isinstance(workers, list) or not workers:
        raise ConfigError("workers: expected a list, {count: N, host: H} or auto")

    next_gpu = {}
    for w in workers:
        w.setdefault("host", "127.0.0.1")
        if w.get("device", "cpu") == "auto":
            if gpus is None:
                gpus = gpu_count()
            w["device"] = "cuda" if gpus else "cpu"
        if w.get("device") == "cuda" and w.get("gpu", "auto") in ("auto", -1):
            w["gpu"] = next_gpu.get(w["host"], 0)
            next_gpu[w["host"]] = w["gpu"] + 1
    cfg["workers"] = workers
    return cfg


def write(cfg, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("# Resolved by tools/launch: overrides applied, `auto` values made explicit.\n")
        yaml.safe_dump(cfg, f, sort_keys=False)
    os.replace(tmp, path)
