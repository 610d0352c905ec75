#!/usr/bin/python3
"""Scaling curves on hosts made of network namespaces (docs/scaling.md):
samples/s of W workers and P parameter servers, every process on a host of
its own, at each link rate, beside what `pstrain --plan` predicted for the
same cluster file.

    sudo bench/bench_scaling.py [--rates 100mbit,1gbit,10gbit] [--workers 1,2,4,8]
        [--servers 1,2,4] [--models mlp,cnn,ctr] [--modes async,sync,ssp]
        [--steps 100] [--step-ms mlp=0.9,cnn=28,ctr=1.5] [--out DIR]

Each rate gets one lab (tools/netlab run --hosts max(P) + max(W)): ps i on
host i, worker j on host max(P) + j. The workers are emulated
(`device: emulated`): each step takes --step-ms of the model (by default
this machine's forward and backward at batch 64 measured by bench_step,
1 thread; give a GPU's to see a GPU cluster) and pushes gradients of the
real size, so 2 cores can stand in for 8 workers and the curves show the
network's and the servers' share. Every cell runs --steps steps per
worker on synthetic data of the model's shape (synthetic, synthetic-ctr).
Samples/s is worker 0's count of global samples over its training time.

The figures the kernel's copies of the bytes cost are this machine's: at
10 Gbit its 2 cores, not the links, bound most cells, which the planner
does not model (its table says so beside each cell where it misses by more
than 20%).

Writes DIR/rows.jsonl (one line a cell), DIR/scaling.md (the tables) and
DIR/scaling-MODEL.png (samples/s against workers, a line per ps count, a
panel per rate; the mode async). --report-only redraws them from
rows.jsonl with each cell predicted again by the planner of this build.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
from pstrain_tools import netlab, paths  # noqa: E402

# The forward and backward of a batch of 64 (ctr: 128), ms, measured with
# bench_step (compute alone, 1 thread) on the 2-core machine of the README's
# Benchmarks: the stand-in when --step-ms does not say.
DEFAULT_STEP_MS = {"mlp": 0.9, "cnn": 28.0, "ctr": 1.5}
FINAL = re.compile(r"final: device emulated \(([\d.]+) ms a step\), no test accuracy; "
                   r"(\d+) global samples, ([\d.]+) s")


def model_section(model, steps, workers):
    """The model, data and optimizer of a cell: `steps` batches per worker."""
    if model == "ctr":
        batch = 128
        return batch, {
            "model": {"preset": "dlrm", "embedding_dim": 16, "bottom_mlp": [64],
                      "top_mlp": [64]},
            "optimizer": {"name": "adam", "lr": 0.002, "sparse": {"name": "adagrad", "lr": 0.05}},
            "data": {"name": "synthetic-ctr", "synthetic_train": steps * batch * workers,
                     "synthetic_test": 1000, "synthetic_ctr": {"vocab_scale": 0.1}},
        }
    batch = 64
    return batch, {
        "model": model,
        "optimizer": {"name": "momentum", "lr": 0.02, "momentum": 0.9},
        "data": {"name": "synthetic", "synthetic_train": steps * batch * workers,
                 "synthetic_test": 100},
    }


def cell_config(hosts, model, mode, workers, servers, max_servers, steps, step_ms):
    batch, doc = model_section(model, steps, workers)
    doc.update({
        "job": f"scaling-{model}-{mode}-w{workers}-p{servers}",
        "mode": mode,
        "ps": [{"host": hosts[s], "port": 7100} for s in range(servers)],
        "workers": [{"host": hosts[max_servers + w], "device": "emulated"}
                    for w in range(workers)],
    })
    doc["train"] = {"batch_size": batch, "epochs": 1, "eval_every": 0,
                    "emulated_step_ms": step_ms}
    return doc


def predict(binary, cluster, rate, step_ms, servers):
    r = subprocess.run([binary, "--plan", rate, "--step-ms", str(step_ms), "--cluster", cluster],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return None, r.stderr.strip()
    row = re.search(rf"\| {servers} \(this file\) \| ([\d,]+) \| ([^|]+) \|", r.stdout)
    return (float(row.group(1).replace(",", "")), row.group(2).strip()) if row else (None, "")


def inside(args):
    """In a lab's console: every cell of one rate, each a line of rows.jsonl."""
    hosts = os.environ["NETLAB_HOSTS"].split()
    max_servers = max(args.servers)
    binary = os.environ.get("PSTRAIN", paths.BINARY)
    with open(os.path.join(args.out, "rows.jsonl"), "a") as rows:
        for model in args.models:
            step_ms = args.step_ms[model]
            for mode in args.modes:
                for workers in args.workers:
                    for servers in args.servers:
                        row = run_cell(args, binary, hosts, model, mode, workers, servers,
                                       max_servers, step_ms)
                        rows.write(json.dumps(row) + "\n")
                        rows.flush()
                        print(f"[scaling {time.strftime('%H:%M:%S')}] {args.rate} {model} {mode} "
                              f"W={workers} P={servers}: {row.get('samples_per_s', '-')} "
                              f"samples/s, predicted {row.get('predicted', '-')}",
                              file=sys.stderr, flush=True)
    return 0


def run_cell(args, binary, hosts, model, mode, workers, servers, max_servers, step_ms):
    row = {"rate": args.rate, "model": model, "mode": mode, "workers": workers,
           "servers": servers, "step_ms": step_ms, "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="pstrain-scaling-") as tmp:
        cluster = os.path.join(tmp, "cluster.yaml")
        with open(cluster, "w") as f:
            yaml.safe_dump(cell_config(hosts, model, mode, workers, servers, max_servers,
                                       args.steps, step_ms), f)
        row["predicted"], row["predicted_limit"] = predict(binary, cluster, args.rate, step_ms,
                                                           servers)
        try:
            r = subprocess.run([sys.executable, paths.LAUNCH, cluster, "--run-dir",
                                os.path.join(tmp, "run"), "--max-restarts", "0"],
                               capture_output=True, text=True, timeout=args.cell_timeout)
        except subprocess.TimeoutExpired:
            row["error"] = f"did not finish in {args.cell_timeout} s"
            return row
        done = FINAL.search(r.stdout)
        if r.returncode != 0 or not done:
            row["error"] = (r.stdout + r.stderr)[-800:]
            return row
        row["samples_per_s"] = round(int(done.group(2)) / float(done.group(3)), 1)
    return row


def repredict(rows, binary):
    """Each cell's prediction again, by this build's planner, from the cell's
    own cluster file (the addresses do not matter to it)."""
    hosts = [f"198.18.0.{i}" for i in range(1, 254)]
    with tempfile.TemporaryDirectory(prefix="pstrain-scaling-") as tmp:
        cluster = os.path.join(tmp, "cluster.yaml")
        for r in rows:
            servers = r["servers"]
            with open(cluster, "w") as f:
                yaml.safe_dump(cell_config(hosts, r["model"], r["mode"], r["workers"], servers,
                                           servers, r["steps"], r["step_ms"]), f)
            r["predicted"], r["predicted_limit"] = predict(binary, cluster, r["rate"],
                                                           r["step_ms"], servers)
    return rows


def load_rows(out):
    with open(os.path.join(out, "rows.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_report(out, rows):
    lines = ["| rate | model | mode | workers | ps | samples/s | predicted | error | bound by "
             "(planner) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        measured, predicted = r.get("samples_per_s"), r.get("predicted")
        error = f"{measured / predicted - 1:+.0%}" if measured and predicted else "-"
        lines.append(f"| {r['rate']} | {r['model']} | {r['mode']} | {r['workers']} | "
                     f"{r['servers']} | {measured if measured else r.get('error', '-')[:60]} | "
                     f"{predicted or '-'} | {error} | {r.get('predicted_limit', '-')} |")
    within = [r for r in rows if r.get("samples_per_s") and r.get("predicted")]
    good = [r for r in within if abs(r["samples_per_s"] / r["predicted"] - 1) <= 0.2]
    lines.append("")
    lines.append(f"The planner within 20% of the measured samples/s in {len(good)} of "
                 f"{len(within)} cells.")
    # Where it holds and where not, by rate, model and mode: the median error
    # and the cells within 20%.
    lines += ["", "| rate | model | mode | cells within 20% | median error |",
              "|---|---|---|---|---|"]
    groups = {}
    for r in within:
        groups.setdefault((r["rate"], r["model"], r["mode"]), []).append(
            r["samples_per_s"] / r["predicted"] - 1)
    for (rate, model, mode), errors in sorted(
            groups.items(), key=lambda g: (netlab.parse_rate(g[0][0]), g[0][1], g[0][2])):
        inside = sum(abs(e) <= 0.2 for e in errors)
        lines.append(f"| {rate} | {model} | {mode} | {inside} of {len(errors)} | "
                     f"{statistics.median(errors):+.0%} |")
    with open(os.path.join(out, "scaling.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for model in sorted({r["model"] for r in rows}):
        cells = [r for r in rows if r["model"] == model and r["mode"] == "async"]
        rates = sorted({r["rate"] for r in cells}, key=netlab.parse_rate)
        if not rates:
            continue
        fig, axes = plt.subplots(1, len(rates), figsize=(4.5 * len(rates), 3.6), squeeze=False)
        for ax, rate in zip(axes[0], rates):
            for servers in sorted({r["servers"] for r in cells}):
                line = sorted((r["workers"], r.get("samples_per_s"), r.get("predicted"))
                              for r in cells if r["rate"] == rate and r["servers"] == servers)
                xs = [w for w, m, _ in line if m]
                ax.plot(xs, [m for _, m, _ in line if m], marker="o", label=f"{servers} ps")
                ax.plot([w for w, _, p in line if p], [p for _, _, p in line if p],
                        linestyle=":", color=ax.lines[-1].get_color())
            ax.set_title(f"{model}, {rate} links (dotted: planner)")
            ax.set_xlabel("emulated workers")
            ax.set_ylabel("samples/s")
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"scaling-{model}.png"), dpi=110)
        plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100mbit,1gbit,10gbit")
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--servers", default="1,2,4")
    p.add_argument("--models", default="mlp,cnn,ctr")
    p.add_argument("--modes", default="async,sync,ssp")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-ms", default="", help="model=ms,... (default: this machine's)")
    p.add_argument("--cell-timeout", type=float, default=600)
    p.add_argument("--out", default="scaling")
    p.add_argument("--inside", metavar="RATE", help=argparse.SUPPRESS)
    p.add_argument("--report-only", action="store_true",
                   help="redraw from DIR/rows.jsonl, predicted again by this build's planner")
    args = p.parse_args()
    args.workers = [int(x) for x in args.workers.split(",")]
    args.servers = [int(x) for x in args.servers.split(",")]
    args.models = args.models.split(",")
    args.modes = args.modes.split(",")
    step_ms = dict(DEFAULT_STEP_MS)
    for item in filter(None, args.step_ms.split(",")):
        model, ms = item.split("=")
        step_ms[model] = float(ms)
    args.step_ms = step_ms
    args.out = os.path.abspath(args.out)
    if args.inside:
        args.rate = args.inside
        return inside(args)
    if not args.report_only:
        os.makedirs(args.out, exist_ok=True)
        netlab.run_script_per_rate(
            os.path.abspath(__file__), args.rates.split(","),
            max(args.servers) + max(args.workers),
            ["--workers", ",".join(map(str, args.workers)),
             "--servers", ",".join(map(str, args.servers)),
             "--models", ",".join(args.models), "--modes", ",".join(args.modes),
             "--steps", str(args.steps), "--cell-timeout", str(args.cell_timeout),
             "--step-ms", ",".join(f"{m}={v}" for m, v in step_ms.items()), "--out", args.out],
            "bench_scaling")
    rows = load_rows(args.out)
    if args.report_only:
        rows = repredict(rows, os.environ.get("PSTRAIN", paths.BINARY))
    write_report(args.out, rows)
    print(open(os.path.join(args.out, "scaling.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
