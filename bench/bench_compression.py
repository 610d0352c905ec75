#!/usr/bin/python3
"""Gradient compression where it matters (docs/scaling.md): the default job
(cluster.yaml: the MLP on Fashion-MNIST, 2 ps and 2 workers computing for
real) with every process on a host of its own in a netlab lab, once per wire
format, at each link rate: bytes a worker pushes per step, samples/s, time
to the target accuracy and the final accuracy, against float32 in the same
lab.

    sudo bench/bench_compression.py [--rates 100mbit,1gbit]
        [--variants none,bf16,topk:0.05,topk:0.01,sign] [--target 0.85] [--out DIR]

A variant is net.compression's value (topk:RATIO, sign), `bf16` (net.wire_dtype,
no compression) or `none` (float32, the baseline). Writes DIR/rows.jsonl (a
line a run) and DIR/compression.md (the table).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
from pstrain_tools import netlab, paths, report  # noqa: E402

HOSTS = 4  # ps 0 and 1, then workers 0 and 1, each on a host of its own


def variant_config(hosts, variant):
    with open(os.path.join(ROOT, "cluster.yaml")) as f:
        doc = yaml.safe_load(f)
    doc["job"] = f"compression-{variant.replace(':', '-')}"
    doc["ps"] = [{"host": hosts[s], "port": 7100} for s in range(2)]
    doc["workers"] = [{"host": hosts[2 + w]} for w in range(2)]
    net = doc.setdefault("net", {})
    if variant == "bf16":
        net["wire_dtype"] = "bf16"
    elif variant != "none":
        net["compression"] = variant
    return doc


def run_variant(args, hosts, variant):
    row = {"rate": args.rate, "variant": variant}
    with tempfile.TemporaryDirectory(prefix="pstrain-compression-") as tmp:
        cluster, run_dir = os.path.join(tmp, "cluster.yaml"), os.path.join(tmp, "run")
        with open(cluster, "w") as f:
            yaml.safe_dump(variant_config(hosts, variant), f)
        r = subprocess.run([sys.executable, paths.LAUNCH, cluster, "--run-dir", run_dir,
                            "--max-restarts", "0"], capture_output=True, text=True,
                           timeout=args.run_timeout)
        if r.returncode != 0:
            row["error"] = (r.stdout + r.stderr)[-800:]
            return row
        run = report.Run(run_dir)
        summary = report.summarize(run, target=args.target)
        last = [records[-1] for records in run.train.values()]
        row.update({
            "samples_per_s": round(summary["samples_per_s"], 1),
            "time_to_target_s": summary["time_to_target_s"],
            "final_accuracy": summary["final_accuracy"],
            "push_bytes_per_step": round(sum(r["push_bytes"] for r in last)
                                         / sum(r["step"] for r in last)),
            "float32_bytes_per_step": round(sum(r["push_bytes_float32"] for r in last)
                                            / sum(r["step"] for r in last)),
        })
    return row


def inside(args):
    """In a lab's console: every variant at one rate, each a line of rows.jsonl."""
    args.rate = args.inside
    hosts = os.environ["NETLAB_HOSTS"].split()
    with open(os.path.join(args.out, "rows.jsonl"), "a") as rows:
        for variant in args.variants:
            row = run_variant(args, hosts, variant)
            rows.write(json.dumps(row) + "\n")
            rows.flush()
            print(f"[compression {time.strftime('%H:%M:%S')}] {args.rate} {variant}: "
                  f"{row.get('time_to_target_s', '-')} s to {args.target}, final "
                  f"{row.get('final_accuracy', row.get('error', '-'))}", file=sys.stderr,
                  flush=True)
    return 0


def write_report(out, rows, target):
    lines = [f"| rate | wire | bytes pushed a step | of float32 | samples/s | time to "
             f"{target} (s) | final accuracy |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['rate']} | {r['variant']} | failed: "
                         f"{r['error'][-60:].strip()} | | | | |")
            continue
        ttt = r["time_to_target_s"]
        lines.append(f"| {r['rate']} | {r['variant']} | {r['push_bytes_per_step']:,} | "
                     f"{r['push_bytes_per_step'] / r['float32_bytes_per_step']:.1%} | "
                     f"{r['samples_per_s']:,.0f} | "
                     f"{f'{ttt:.1f}' if ttt is not None else 'not reached'} | "
                     f"{r['final_accuracy']:.4f} |")
    with open(os.path.join(out, "compression.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--variants", default="none,bf16,topk:0.05,topk:0.01,sign")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--run-timeout", type=float, default=1200)
    p.add_argument("--out", default="compression")
    p.add_argument("--inside", metavar="RATE", help=argparse.SUPPRESS)
    p.add_argument("--report-only", action="store_true", help="redraw from DIR/rows.jsonl")
    args = p.parse_args()
    args.variants = args.variants.split(",")
    args.out = os.path.abspath(args.out)
    if args.inside:
        return inside(args)
    if not args.report_only:
        os.makedirs(args.out, exist_ok=True)
        netlab.run_script_per_rate(
            os.path.abspath(__file__), args.rates.split(","), HOSTS,
            ["--variants", ",".join(args.variants), "--target", str(args.target),
             "--run-timeout", str(args.run_timeout), "--out", args.out], "bench_compression")
    with open(os.path.join(args.out, "rows.jsonl")) as f:
        write_report(args.out, [json.loads(line) for line in f if line.strip()], args.target)
    print(open(os.path.join(args.out, "compression.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
