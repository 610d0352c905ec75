"""Runs pstrain's benchmarks and their peers in one invocation and prints
min/median/max of each and the ratio of the medians.

    tools/bench [--quick] [--only REGEX] [--reps N] [--set KEY=VALUE] [--out FILE] [--build DIR]
                [--trace DIR]
    tools/bench --diff A.json B.json

Peers: PyTorch (bench/bench_torch.py: single-process compute, DDP with Gloo
2x1, its RPC parameter server 2 ps + 2 trainers; bench/bench_torch_embedding.py:
nn.EmbeddingBag(sparse=True) with Adagrad in one process) and raw ZeroMQ
(DEALER->ROUTER moving the same chunks, inside bench_ps, and the same rows,
inside bench_embeddings); bench/bench_torch_ctr.py: DLRM in one process and in
rpc_ddp_tutorial's layout on the samples of the click-through job
(examples/ctr.yaml). No peer figure is
ever a constant: each comes from a run in this invocation. For compute and
sync, every rep runs pstrain's benchmark and its peer as separate
processes, which one goes first drawn at random, after one untimed run of
each (the warm-up); bench_ps alternates the same way inside
one process. bench_step's async step through one ps is set beside the same
worker's compute alone, both from each run of it: the ratio is the share of
its compute speed the ps path leaves.
The async and time-to-accuracy rows launch the default job (cluster.yaml)
with tools/launch against DDP 2x1 training the same model on Fashion-MNIST
with the same optimizer, learning rate, batch and evaluation cadence; the
async rows again against PyTorch's RPC parameter server (async mlp rpcps,
async cnn rpcps), 2 ps + 2 asynchronous trainers as in the default job.
Without PyTorch (`tools/setup --bench` installs python3-torch) its peer rows
say "not installed".

The ratio is ours / peer for every row; each row says whether higher or
lower is better. --quick runs a few reps at small sizes, without the
time-to-accuracy rows unless --only names them; --set KEY=VALUE changes
pstrain's launched runs (async and time-to-accuracy rows); --out writes the run
as JSON; --diff compares two such files row by row; --trace DIR keeps a
timeline of every launched run in DIR (their figures then include what
recording costs: one span per layer and message). The binaries come from
--build, else the directory of $PSTRAIN, else build/ (installed as
pstrain-bench: the installed ones).
"""

import argparse
import collections
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from . import paths, report

TORCH_PEER = os.path.join(paths.BENCH, "bench_torch.py")
TORCH_EMBEDDING_PEER = os.path.join(paths.BENCH, "bench_torch_embedding.py")
TORCH_CTR_PEER = os.path.join(paths.BENCH, "bench_torch_ctr.py")
NOT_INSTALLED = 3  # bench_torch.py's exit status without PyTorch
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # cluster.yaml's data.dir


class PeerUnavailable(Exception):
    """The peer could not run: its row says why instead of a figure."""


def json_lines(cmd, what, env=None):
    """Runs cmd and returns the JSON objects it printed, one per line."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode == NOT_INSTALLED and cmd[1:2] in ([TORCH_PEER], [TORCH_EMBEDDING_PEER],
                                                         [TORCH_CTR_PEER]):
        raise PeerUnavailable("not installed")
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{what} exited with {proc.returncode}: {tail[0]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def stats(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


# A peer's result may carry its configuration under this key (how it was
# set to run at its best, e.g. how bench_torch.py cleared gradients); the
# rows name every configuration the peer ran in.
PEER_CONFIG = "peer config"


class Pair:
    """Rows measured by running `ours` and `peer` once per rep, alternated.
    Each returns {row name: value} for one run (the peer's also PEER_CONFIG);
    peer is None where there is no peer of this shape."""

    def __init__(self, name, rows, ours, peer, peer_name):
        self.name, self.rows, self.ours, self.peer, self.peer_name = name, rows, ours, peer, peer_name

    def run(self, reps, log):
        ours = {r: [] for r in self.rows}
        theirs = {r: [] for r in self.rows}
        peer_status = "ok" if self.peer else "no peer of this shape"
        configs = collections.Counter()  # the peer's configurations, by runs
        sides = [("ours", self.ours, ours)] + ([("peer", self.peer, theirs)] if self.peer else [])
        for rep in range(reps + 1):  # rep 0 is the warm-up, not recorded
            random.shuffle(sides)
            for side, fn, into in sides:
                if side == "peer" and peer_status != "ok":
                    continue
                try:
                    values = fn()
                except PeerUnavailable as e:
                    peer_status = str(e)
                    continue
                if PEER_CONFIG in values:
                    configs[values.pop(PEER_CONFIG)] += 1
                if rep > 0:
                    for r in self.rows:
                        into[r].append(values[r])
            log(f"{self.name}: rep {rep}/{reps} done" + (" (warm-up)" if rep == 0 else ""))
        runs = sum(configs.values())
        name = self.peer_name and self.peer_name + "".join(
            f"; {config} ({n} of {runs} runs)" for config, n in sorted(configs.items()))
        return [row(r, ours[r], theirs[r] if peer_status == "ok" else None,
                    name if self.peer else None, peer_status) for r in self.rows]


def row(name, ours, peer, peer_name, peer_status):
    unit, better = ("GB/s", "higher") if name.startswith("ps ") else \
        ("rows/s", "higher") if name.startswith("embeddings ") else \
        ("AUC", "higher") if " AUC " in name else \
        ("s", "lower") if name.startswith("time to") else ("samples/s", "higher")
    out = {"name": name, "unit": unit, "better": better, "ours": ours,
           "ours_stats": stats(ours), "peer_name": peer_name, "peer_status": peer_status,
           "peer": peer, "peer_stats": stats(peer) if peer else None, "ratio": None}
    # A side that did not reach an accuracy target has no time: no ratio.
    if peer and all(math.isfinite(out[k]["median"]) for k in ("ours_stats", "peer_stats")):
        out["ratio"] = out["ours_stats"]["median"] / out["peer_stats"]["median"]
    return out


def binary(build, name):
    path = os.path.join(build, "bench", name)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"tools/bench: {path} missing; build it: ninja -C {build} {name}")
    return path


def pairs(args, build):
    """Every benchmark that runs rep by rep beside its peer."""
    py = sys.executable
    windows = "2" if args.quick else "5"
    steps = "40" if args.quick else "200"
    out = []
    for model in ("mlp", "cnn"):
        name = f"compute {model}, 1 thread, batch 64"
        # Both kernel libraries of the CPU backend (PSTRAIN_CPU_KERNELS), in
        # a random order each rep; both rows share the rep's one PyTorch run.
        # The backend's name says which library ran, so a binary that ignores
        # the variable cannot pass one library's figures off as the other's.
        libraries = {name: "oneDNN", name + ", OpenBLAS kernels": "OpenBLAS"}

        def ours(model=model, libraries=libraries):
            values = {}
            for row_name, kernels in random.sample(list(libraries.items()), len(libraries)):
                r = json_lines([binary(build, "bench_compute"), "--json", "--model", model, "1",
                                "64", windows], "bench_compute",
                               env=dict(os.environ, PSTRAIN_CPU_KERNELS=kernels.lower()))[0]
                if f"{kernels} kernels" not in r["backend"]:
                    raise RuntimeError(f"bench_compute ran {r['backend']}, not {kernels} kernels")
                values[row_name] = statistics.median(r["samples_per_s"])
            return values

        def peer(model=model, libraries=libraries):
            r = json_lines([py, TORCH_PEER, "compute", "--model", model, "--batch", "64",
                            "--windows", windows], "bench_torch.py compute")[0]
            return {**{row_name: statistics.median(r["samples_per_s"]) for row_name in libraries},
                    PEER_CONFIG: zero_grad_config(r)}
        out.append(Pair("compute " + model, list(libraries), ours, peer, "PyTorch, 1 thread"))

    sync_rows = {m: f"sync {m}, 2 workers x 1 thread, batch 64" for m in ("mlp", "cnn")}

    def sync_ours():
        lines = json_lines([binary(build, "bench_allreduce"), "--json", "--steps-only", steps, "64"],
                           "bench_allreduce")
        return {sync_rows[r["model"]]: r["samples_per_s"] for r in lines
                if r["bench"] == "sync_step" and r["buckets"] == "overlap"}

    def sync_peer():
        lines = json_lines([py, TORCH_PEER, "ddp", "--steps", steps, "--batch", "64"],
                           "bench_torch.py ddp")
        return {**{sync_rows[r["model"]]: r["samples_per_s"] for r in lines},
                PEER_CONFIG: "; ".join(f"{r['model']} {zero_grad_config(r)}" for r in lines)}
    out.append(Pair("sync", list(sync_rows.values()), sync_ours, sync_peer,
                    "PyTorch DDP, Gloo, 2x1"))

    # The default job (cluster.yaml: 2 ps + 2 async workers, Nesterov
    # momentum 0.9, lr 0.02, batch 64) through tools/launch, against DDP 2x1
    # training the same model on the same data with the same optimizer.
    launched = []  # with --trace: the runs' names, for their traces' files

    def launch(sets):
        cmd = [py, paths.LAUNCH, paths.CLUSTER_EXAMPLE]
        for kv in sets + (args.set or []):
            cmd += ["--set", kv]
        if args.trace:
            cmd.append("--trace")
        with tempfile.TemporaryDirectory() as run_dir:
            subprocess.run(cmd + ["--run-dir", run_dir], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True,
                           env=dict(os.environ, PSTRAIN=os.path.join(build, "pstrain")))
            if args.trace:
                launched.append("_".join(sets).replace("=", "-"))
                keep = os.path.join(args.trace, f"{len(launched):03d}-{launched[-1]}.json")
                try:
                    shutil.copyfile(os.path.join(run_dir, "trace.json"), keep)
                except OSError as e:
                    print(f"tools/bench: --trace: no trace kept for {sets}: {e}", file=sys.stderr)
            return report.Run(run_dir)

    def torch_train(command, model, epochs, eval_every, target):
        return json_lines([py, TORCH_PEER, command, "--data", FASHION_MNIST, "--model", model,
                           "--epochs", str(epochs), "--eval-every", str(eval_every),
                           "--target", str(target)], "bench_torch.py " + command)[0]

    # Throughput: evaluations off, a fraction of an epoch for the CNN. Each
    # model's launch is timed against two peers, DDP and PyTorch's own
    # asynchronous parameter server; a row has one peer, so each peer has
    # its pair of rows, and its own launches of ours, alternated with it.
    epochs = {"mlp": 0.25 if args.quick else 1, "cnn": 0.05 if args.quick else 0.25}
    peers = (("", "DDP 2x1", "tta", "PyTorch DDP, Gloo, 2x1, same data and optimizer"),
             (" rpcps", "PyTorch RPC ps 2+2", "rpcps",
              "PyTorch RPC parameter server, 2 ps + 2 trainers, same data and optimizer"))
    for model in ("mlp", "cnn"):
        for suffix, versus, command, peer_name in peers:
            name = (f"async {model}, 2 ps + 2 workers vs {versus}, batch 64, "
                    f"{epochs[model]:g} epoch")

            def ours(model=model, name=name):
                run = launch([f"model={model}", f"train.epochs={epochs[model]}",
                              "train.eval_every=0"])
                return {name: report.summarize(run, 1.0)["samples_per_s"]}

            def peer(model=model, name=name, command=command):
                r = torch_train(command, model, epochs[model], 0, 1.0)
                return {name: r["samples_per_s"], PEER_CONFIG: zero_grad_config(r)}
            out.append(Pair(f"async {model}{suffix}", [name], ours, peer, peer_name))

    # Time to accuracy: the whole default job, an evaluation every 30,000
    # global samples on both sides, from the first step, within the default
    # job's epochs on both sides ("not reached" otherwise).
    tta_epochs = 3
    for model, target in (("mlp", 0.85), ("cnn", 0.88)):
        name = (f"time to {target:.0%}, {model}: 2 ps + 2 async workers vs DDP 2x1, "
                f"eval every 30000, {tta_epochs} epochs at most")

        def ours(model=model, target=target, name=name):
            run = launch([f"model={model}", f"train.epochs={tta_epochs}"])
            seconds = report.summarize(run, target)["time_to_target_s"]
            return {name: seconds if seconds is not None else float("inf")}

        def peer(model=model, target=target, name=name):
            r = torch_train("tta", model, tta_epochs, 30000, target)
            return {name: r["seconds"] if r["seconds"] is not None else float("inf"),
                    PEER_CONFIG: zero_grad_config(r)}
        out.append(Pair("tta " + model, [name], ours, peer,
                        "PyTorch DDP, Gloo, 2x1, same optimizer and evaluations"))
    return out


def zero_grad_config(result):
    """How a bench_torch.py peer cleared its gradients: the way it measured
    faster in its run (it times both)."""
    return "zero_grad set_to_none=" + ("True" if result["zero_grad"] == "none" else "False")


def size_name(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def step_rows(args, build, log):
    """bench_step: the async trainer's step through one ps against the same
    worker's compute alone, both measured in each run of it; the ratio is
    the share of the compute speed the ps path leaves."""
    cmd = [binary(build, "bench_step"), "--json", "100" if args.quick else "400"]
    runs = []
    for rep in range(args.reps + 1):  # rep 0 is the warm-up, not recorded
        lines = json_lines(cmd, "bench_step")
        if rep > 0:
            runs.append({r["model"]: r for r in lines})
        log(f"step: rep {rep}/{args.reps} done" + (" (warm-up)" if rep == 0 else ""))
    return [row(f"async step {m}, 1 worker + 1 ps", [r[m]["overlapped"] for r in runs],
                [r[m]["compute_only"] for r in runs],
                "the same worker's compute alone (no ps), same run", "ok")
            for m in ("mlp", "cnn")]


def ps_rows(args, build, log):
    """bench_ps alternates ours and raw ZeroMQ itself, rep by rep."""
    cmd = [binary(build, "bench_ps"), "--json", "--reps", str(args.reps)]
    if args.quick:
        cmd += ["--max-bytes", str(64 << 10)]
    log("ps: " + " ".join(os.path.basename(c) for c in cmd))
    # The optimizer's apply on the ps is in our time, not raw ZeroMQ's: the
    # row names what it cost per operation. memcpy: the memory's bandwidth
    # in the same run, the limit of every transport.
    out = []
    for r in json_lines(cmd, "bench_ps"):
        if r["bench"] == "memcpy":
            out.append(row(f"ps memcpy {size_name(r['bytes'])} (a copy's limit)", r["gbs"],
                           None, None, "the limit, not a peer"))
            continue
        out.append(row(f"ps {r['op']} {size_name(r['bytes'])}, {r['servers']} ps",
                       r["ours_gbs"], r["raw_gbs"], "raw ZeroMQ", "ok"))
        if r["opt_ms"]:
            out[-1]["note"] = f"of which the SGD apply {r['opt_ms']:.3g} ms per op"
    return out


def embedding_rows(args, build, log):
    """bench_embeddings alternates ours and raw ZeroMQ itself; the lookup and
    update of both (a pull, then a push of the same rows) is set beside
    PyTorch's EmbeddingBag with Adagrad, run after it in the same invocation."""
    reps = ["--reps", str(args.reps)] + (["--quick"] if args.quick else [])
    cmd = [binary(build, "bench_embeddings"), "rows", "--json"] + reps
    log("embeddings: " + " ".join(os.path.basename(c) for c in cmd))
    ours = json_lines(cmd, "bench_embeddings")
    torch_cmd = [sys.executable, TORCH_EMBEDDING_PEER, "--json"] + reps
    log("embeddings peer: " + " ".join(os.path.basename(c) for c in torch_cmd))
    try:
        torch = {(r["dim"], r["ids"]): r["rows_per_s"]
                 for r in json_lines(torch_cmd, "bench_torch_embedding.py")
                 if r["optimizer"] == "adagrad"}
        torch_status = "ok"
    except (PeerUnavailable, RuntimeError) as e:
        torch, torch_status = {}, str(e)
    out = []
    for r in ours:
        if r["bench"] != "embeddings":
            continue
        what = f"dim {r['dim']}, {r['ids']} ids"
        out.append(row(f"embeddings pull {what}, 1 ps", r["pull_ours"], r["pull_raw"],
                       "raw ZeroMQ", "ok"))
        out.append(row(f"embeddings push {what}, 1 ps", r["push_ours"], r["push_raw"],
                       "raw ZeroMQ", "ok"))
        both = [1 / (1 / a + 1 / b) for a, b in zip(r["pull_ours"], r["push_ours"])]
        peer = torch.get((r["dim"], r["ids"]))
        out.append(row(f"embeddings pull+push {what}, 1 ps", both, peer,
                       "torch EmbeddingBag+Adagrad", "ok" if peer else torch_status))
    return out


def ctr_rows(args, build, log):
    """examples/ctr.yaml (DLRM, 2 ps + 2 async workers, one epoch) against
    PyTorch on the very same samples (written by pstrain --export-data): in one
    process (EmbeddingBag(sparse=True) with Adagrad, the dense layers with
    Adam, every core) and in rpc_ddp_tutorial's layout (the tables on an RPC
    ps, 2 DDP trainers), with the same sizes, optimizers, learning rates,
    batch and initial range. The three run in a random order each rep.
    Rows: samples/s against each layout, the test AUC after the epoch against
    the single process's, and against the data's teacher (the ceiling)."""
    sizes = ["data.synthetic_train=200000", "data.synthetic_test=40000"] if args.quick else []
    binary_path = os.path.join(build, "pstrain")
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="pstrain-bench-ctr-") as folder:
        export = [binary_path, "--export-data", folder, "--cluster", paths.CTR_EXAMPLE]
        for kv in sizes:
            export += ["--set", kv]
        log("ctr: " + " ".join(os.path.basename(c) for c in export[:2]) + " ...")
        subprocess.run(export, stdout=subprocess.DEVNULL, check=True)
        # The job's own settings, for the peer.
        model, optimizer = ctr_settings(binary_path, sizes)
        peer_args = [py, TORCH_CTR_PEER, "--json", "--train", os.path.join(folder, "train.tsv"),
                     "--test", os.path.join(folder, "test.tsv"), "--cache",
                     os.path.join(folder, "parsed.npz"), "--batch", str(model["batch"]),
                     "--embedding-dim", str(model["embedding_dim"]),
                     "--bottom", ",".join(map(str, model["bottom_mlp"])),
                     "--top", ",".join(map(str, model["top_mlp"])),
                     "--dense-optimizer", optimizer["name"], "--lr", str(optimizer["lr"]),
                     "--sparse-optimizer", "adagrad", "--sparse-lr",
                     str(optimizer["sparse_lr"]), "--emb-init", str(model["init"])]

        def ours():
            cmd = [py, paths.LAUNCH, paths.CTR_EXAMPLE, "--set", "train.eval_every=0"]
            for kv in sizes + (args.set or []):
                cmd += ["--set", kv]
            with tempfile.TemporaryDirectory() as run_dir:
                subprocess.run(cmd + ["--run-dir", run_dir], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=True,
                               env=dict(os.environ, PSTRAIN=binary_path))
                run = report.Run(run_dir)
                return {"rate": report.summarize(run, 1.0)["samples_per_s"],
                        "auc": run.final["test_auc"], "teacher": run.final["teacher_auc"]}

        # The single process at its best: one thread or every core, and its
        # dense gradients freed or zeroed in place each step (zero_grad's
        # set_to_none), whichever pair is fastest in the warm-up.
        best = {}

        def peer(layout):
            def once(extra):
                r = json_lines(peer_args + ["--layout", layout] + extra,
                               "bench_torch_ctr.py " + layout)[0]
                return {"rate": r["samples_per_s"], "auc": r["auc"]}
            if layout != "single":
                return once([])
            if not best:
                tried = {(n, z): once(["--threads", str(n), "--zero-grad", z])
                         for n in sorted({1, os.cpu_count()}) for z in ("none", "zeros")}
                best["threads"], best["zero_grad"] = max(tried, key=lambda k: tried[k]["rate"])
                log("ctr: PyTorch 1 process: " + ", ".join(
                    f"{n} thread(s), zero_grad {z}: {v['rate']:.0f}/s"
                    for (n, z), v in tried.items()))
                return tried[best["threads"], best["zero_grad"]]
            return once(["--threads", str(best["threads"]), "--zero-grad", best["zero_grad"]])

        sides = [("ours", ours), ("single", lambda: peer("single")),
                 ("rpc_ddp", lambda: peer("rpc_ddp"))]
        got = {side: [] for side, _ in sides}
        status = "ok"
        for rep in range(args.reps + 1):  # rep 0 is the warm-up, not recorded
            random.shuffle(sides)
            for side, fn in sides:
                if side != "ours" and status != "ok":
                    continue
                try:
                    values = fn()
                except PeerUnavailable as e:
                    status = str(e)
                    continue
                if rep > 0:
                    got[side].append(values)
            log(f"ctr: rep {rep}/{args.reps} done" + (" (warm-up)" if rep == 0 else ""))

    def of(side, key):
        return [v[key] for v in got[side]] if status == "ok" or side == "ours" else None
    what = "DLRM on synthetic-ctr, 1 epoch"
    return [
        row(f"ctr {what}, 2 ps + 2 workers vs 1 process", of("ours", "rate"),
            of("single", "rate"), "PyTorch 1 process, EmbeddingBag(sparse) + Adagrad, "
            f"{best.get('threads', '?')} thread(s), zero_grad {best.get('zero_grad', '?')} "
            "(the fastest in the warm-up)", status),
        row(f"ctr {what}, 2 ps + 2 workers vs rpc_ddp", of("ours", "rate"),
            of("rpc_ddp", "rate"), "PyTorch rpc_ddp_tutorial layout, 1 ps + 2 trainers", status),
        row(f"ctr {what}: test AUC vs 1 process", of("ours", "auc"), of("single", "auc"),
            "PyTorch 1 process, same data and optimizers", status),
        row(f"ctr {what}: test AUC vs the teacher", of("ours", "auc"), of("ours", "teacher"),
            "the data's teacher (the ceiling)", "ok"),
    ]


def ctr_settings(binary_path, sizes):
    """The click-through job's model sizes and optimizers, as pstrain --check
    resolves them, and its tables' initial range."""
    import yaml
    cmd = [binary_path, "--check", "--cluster", paths.CTR_EXAMPLE]
    for kv in sizes:
        cmd += ["--set", kv]
    config = yaml.safe_load(subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                                           check=True).stdout)
    # Tables start uniform in +-0.05 (shared/embedding.h; not a key).
    model = dict(config["model"], batch=config["train"]["batch_size"], init=0.05)
    sparse = config["optimizer"]["sparse"]
    if sparse["name"] != "adagrad":
        raise RuntimeError(f"{paths.CTR_EXAMPLE}: the peer steps its tables with Adagrad, the "
                           f"job with {sparse['name']}")
    return model, {"name": config["optimizer"]["name"], "lr": config["optimizer"]["lr"],
                   "sparse_lr": sparse["lr"]}


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, LC_ALL="C")).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def fmt(value):
    if value is None:
        return "-"
    if math.isinf(value):
        return "not reached"
    return f"{value:,.0f}" if value >= 100 else f"{value:.4g}"


def spread(s):
    if math.isinf(s["min"]):
        return "not reached in any rep"
    return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"


def table(result):
    lines = [f"machine: {result['machine']}, {result['cores']} cores; "
             f"command: {result['command']}; {result['reps']} reps after a warm-up"
             + "".join(f"; --set {kv}" for kv in result.get("sets", [])),
             "",
             "| benchmark | unit | pstrain median (min-max) | peer | peer median (min-max) "
             "| ours/peer |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        peer = r["peer_name"] or "-"
        if r["peer_stats"]:
            peer_figure = spread(r["peer_stats"])
            ratio = f"{r['ratio']:.2f}x ({r['better']} is better)" if r["ratio"] else "-"
        else:
            peer_figure, ratio = r["peer_status"], "-"
        name = r["name"] + (f" ({r['note']})" if r.get("note") else "")
        lines.append(f"| {name} | {r['unit']} | {spread(r['ours_stats'])} | {peer} "
                     f"| {peer_figure} | {ratio} |")
    return "\n".join(lines)


def diff(a, b):
    """Row by row: each run's medians and ratio, and how ours moved from A to B."""
    rows_a = {r["name"]: r for r in a["rows"]}
    rows_b = {r["name"]: r for r in b["rows"]}
    lines = [f"A: {a['machine']}, {a['started']}", f"B: {b['machine']}, {b['started']}", "",
             "| benchmark | ours A | ours B | B/A | ours/peer A | ours/peer B |",
             "|---|---|---|---|---|---|"]

    def ratio(r):
        return f"{r['ratio']:.2f}x" if r and r["ratio"] else "-"
    for name in list(rows_a) + [n for n in rows_b if n not in rows_a]:
        ra, rb = rows_a.get(name), rows_b.get(name)
        ma = ra["ours_stats"]["median"] if ra else None
        mb = rb["ours_stats"]["median"] if rb else None
        change = f"{mb / ma:.2f}x" if ma and mb else "only in " + ("A" if ra else "B")
        lines.append(f"| {name} | {fmt(ma)} | {fmt(mb)} | {change} | {ratio(ra)} | {ratio(rb)} |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 1)[1])
    parser.add_argument("--quick", action="store_true", help="a few reps at small sizes")
    parser.add_argument("--only", metavar="REGEX",
                        help="only the benchmarks whose name (compute mlp, compute cnn, sync, "
                             "step, async mlp, async mlp rpcps, async cnn, async cnn rpcps, "
                             "tta mlp, tta cnn, ps, embeddings, ctr) matches")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a cluster.yaml override for pstrain's launched runs (async, "
                             "tta), e.g. net.wire_dtype=bf16; repeatable")
    parser.add_argument("--reps", type=int, help="timed reps per side (default 5, --quick 3)")
    parser.add_argument("--out", metavar="FILE", help="write the run as JSON")
    parser.add_argument("--trace", metavar="DIR",
                        help="the launched runs (async and time-to-accuracy rows) record "
                        "timelines (tools/launch --trace), kept in DIR, one file per run")
    parser.add_argument("--build", metavar="DIR", help="the build directory")
    parser.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two --out files")
    args = parser.parse_args(argv)
    if args.diff:
        with open(args.diff[0]) as fa, open(args.diff[1]) as fb:
            print(diff(json.load(fa), json.load(fb)))
        return 0
    if args.reps is None:
        args.reps = 3 if args.quick else 5
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
    build = args.build or os.path.dirname(os.path.abspath(os.environ.get("PSTRAIN")
                                                          or paths.BINARY))
    chosen = [p for p in pairs(args, build)
              if (re.search(args.only, p.name) if args.only
                  else not (args.quick and p.name.startswith("tta")))]
    with_step = not args.only or re.search(args.only, "step")
    with_ps = not args.only or re.search(args.only, "ps")
    with_embeddings = not args.only or re.search(args.only, "embeddings")
    with_ctr = not args.only or re.search(args.only, "ctr")
    if not (chosen or with_step or with_ps or with_embeddings or with_ctr):
        parser.error(f"--only {args.only!r} matches no benchmark")

    def log(msg):
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    result = {"version": 1, "command": " ".join(["tools/bench"] + argv), "machine": cpu_model(),
              "cores": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "quick": args.quick, "reps": args.reps, "sets": args.set or [], "rows": []}
    for pair in chosen:
        result["rows"] += pair.run(args.reps, log)
    if with_step:
        result["rows"] += step_rows(args, build, log)
    if with_ps:
        result["rows"] += ps_rows(args, build, log)
    if with_embeddings:
        result["rows"] += embedding_rows(args, build, log)
    if with_ctr:
        result["rows"] += ctr_rows(args, build, log)
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0

