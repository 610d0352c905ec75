#!/usr/bin/python3
"""Summary, plots and report.md for one or more pstrain run directories.

    tools/report.py OUT_DIR RUN_DIR [RUN_DIR ...] [--target 0.85]

tools/compare uses it on its async and sync runs; run it by hand to redo a
report, or to compare any runs (e.g. two learning rates).

What the numbers mean (all from the workers' metrics files):
- Time runs from the run's first training step: for each worker, the time of
  its first metrics record minus that record's window (local_samples /
  samples_per_s); the earliest worker's is the origin.
- An evaluation's time is when its weights were pulled (the eval record's
  time minus eval_s). Time to target is the first evaluation at or above the
  target accuracy.
- A worker's samples/s is its samples over its training time, the sum of its
  metrics windows (each window's samples / samples_per_s). The run's
  samples/s is all workers' samples over the longest worker training time.
- Staleness (async only) is weighted by steps: each record's staleness is the
  mean over the steps of its window.
"""

import argparse
import glob
import json
import os
import sys

import yaml


class ReportError(Exception):
    pass


def json_record(path, number, line):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}:{number}: not JSON: {e}") from e


class Run:
    """One run directory's metrics, split into training records, evaluations
    and the final evaluation."""

    def __init__(self, run_dir):
        self.dir = run_dir
        self.launch = self._read_json(os.path.join(run_dir, "launch.json"))
        self.config = self._read_config()
        self.mode = (self.launch or {}).get("mode") or self.config.get("mode", "async")
        self.label = os.path.basename(os.path.normpath(run_dir))
        self.train = {}   # worker index -> training records in time order
        self.evals = []
        self.final = None
        files = sorted(glob.glob(os.path.join(run_dir, "worker*.metrics.jsonl")))
        if not files:
            raise ReportError(f"{run_dir}: no worker*.metrics.jsonl files")
        for path in files:
            with open(path) as f:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        self._add(json_record(path, number, line))
        if not self.train:
            raise ReportError(f"{run_dir}: the metrics hold no training records")
        for records in self.train.values():
            records.sort(key=lambda r: r["time"])
        self.evals.sort(key=lambda r: r["time"])

    def _add(self, rec):
        event = rec.get("event")
        if event == "eval":
            self.evals.append(rec)
        elif event == "final":
            self.final = rec
        elif event is None:
            self.train.setdefault(rec["index"], []).append(rec)

    @staticmethod
    def _read_json(path):
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _read_config(self):
        try:
            with open(os.path.join(self.dir, "config.yaml")) as f:
                return yaml.safe_load(f) or {}
        except FileNotFoundError:
            return {}

    @property
    def synchronous(self):
        """Whether the workers actually all-reduced (sync metrics carry
        allreduce_ms), whatever mode was asked for."""
        return any("allreduce_ms" in r for rs in self.train.values() for r in rs)

    def windows(self, index):
        """(samples, seconds, steps, record) of each metrics window of a worker."""
        prev_samples = prev_steps = 0
        for r in self.train[index]:
            samples = r["local_samples"] - prev_samples
            steps = r["step"] - prev_steps
            prev_samples, prev_steps = r["local_samples"], r["step"]
            rate = r["samples_per_s"]
            yield samples, (samples / rate if rate > 0 else 0.0), steps, r

    def worker_start(self, index):
        first = next(self.windows(index))
        return first[3]["time"] - first[1]

    @property
    def origin(self):
        return min(self.worker_start(i) for i in self.train)

    def worker_train_s(self, index):
        return sum(w[1] for w in self.windows(index))

    def eval_points(self):
        """(seconds since the first step, accuracy, global samples) per evaluation."""
        t0 = self.origin
        return [(e["time"] - e.get("eval_s", 0.0) - t0, e["test_accuracy"], e["global_samples"])
                for e in self.evals]


def summarize(run, target):
    workers = sorted(run.train)
    per_worker = {}
    total_samples = 0
    for i in workers:
        samples = run.train[i][-1]["local_samples"]
        seconds = run.worker_train_s(i)
        per_worker[i] = samples / seconds if seconds > 0 else 0.0
        total_samples += samples
    longest = max(run.worker_train_s(i) for i in workers)
    reached = next(((t, acc) for t, acc, _ in run.eval_points() if acc >= target), None)
    summary = {
        "run": run.label,
        "mode": run.mode,
        "dir": run.dir,
        "workers": len(workers),
        "target": target,
        "time_to_target_s": reached[0] if reached else None,
        "final_accuracy": run.final["test_accuracy"] if run.final else None,
        "samples": total_samples,
        "samples_per_s": total_samples / longest if longest > 0 else 0.0,
        "samples_per_s_per_worker": [per_worker[i] for i in workers],
        "mean_staleness": None,
        "max_staleness": None,
        "wall_s": (run.launch["end"] - run.launch["start"])
        if run.launch and "end" in run.launch else None,
    }
    weighted = steps = 0.0
    peak = None
    for i in workers:
        for _, _, n, r in run.windows(i):
            if "staleness" in r:
                weighted += r["staleness"] * n
                steps += n
                peak = max(peak if peak is not None else 0.0, r["max_staleness"])
    if steps > 0:
        summary["mean_staleness"] = weighted / steps
        summary["max_staleness"] = peak
    return summary


def _fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def table(summaries):
    """The summary as a Markdown table (also printed by tools/compare)."""
    target = summaries[0]["target"]
    head = ["run", "mode", f"time to {target:.0%} (s)", "final accuracy", "samples/s",
            "samples/s per worker", "staleness mean / max", "wall time (s)"]
    rows = []
    for s in summaries:
        stale = ("-" if s["mean_staleness"] is None
                 else f"{s['mean_staleness']:.2f} / {s['max_staleness']:.2f}")
        rows.append([s["run"], s["mode"], _fmt(s["time_to_target_s"], ".1f", "not reached"),
                     _fmt(s["final_accuracy"], ".4f"), f"{s['samples_per_s']:.0f}",
                     " ".join(f"{r:.0f}" for r in s["samples_per_s_per_worker"]),
                     stale, _fmt(s["wall_s"], ".1f")])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plots(runs, out_dir):
    """Writes the PNGs; returns {title: file name}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}

    def save(fig, name, title):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=100)
        plt.close(fig)
        files[title] = name

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        points = run.eval_points()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=run.label)
    ax.set(xlabel="seconds since the first step", ylabel="test accuracy",
           title="Test accuracy vs wall time")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "accuracy_vs_time.png", "Test accuracy vs wall time")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        records = sorted((r for rs in run.train.values() for r in rs),
                         key=lambda r: r["global_samples"])
        ax.plot([r["global_samples"] for r in records], [r["loss"] for r in records],
                label=run.label, alpha=0.8)
    ax.set(xlabel="global samples", ylabel="training loss (mean over a metrics window)",
           title="Loss vs global samples")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, "loss_vs_samples.png", "Loss vs global samples")

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), sharey=True,
                             squeeze=False)
    for ax, run in zip(axes[0], runs):
        t0 = run.origin
        for i in sorted(run.train):
            rs = run.train[i]
            ax.plot([r["time"] - t0 for r in rs], [r["samples_per_s"] for r in rs],
                    marker=".", label=f"worker {i}")
        ax.set(xlabel="seconds since the first step", title=f"{run.label}: throughput per worker")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("samples/s")
    save(fig, "throughput_per_worker.png", "Throughput per worker")

    stale_runs = [r for r in runs if any("staleness" in x for rs in r.train.values() for x in rs)]
    if stale_runs:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for run in stale_runs:
            values, weights = [], []
            for i in run.train:
                for _, _, n, r in run.windows(i):
                    values.append(r["staleness"])
                    weights.append(n)
            ax.hist(values, bins=30, weights=weights, alpha=0.6, label=run.label)
        ax.set(xlabel="staleness (updates by others between a pull and its push)",
               ylabel="steps", title="Staleness histogram (mean per metrics window)")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "staleness_histogram.png", "Staleness histogram")
    return files


def write(runs, out_dir, target, notes=()):
    """Writes report.md, summary.json and the plots into out_dir; returns the
    table."""
    os.makedirs(out_dir, exist_ok=True)
    summaries = [summarize(r, target) for r in runs]
    text = table(summaries)
    figures = plots(runs, out_dir)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summaries, f, indent=1)
    md = ["# pstrain run comparison", ""]
    md += [f"- **{s['run']}**: {s['mode']}, {s['workers']} workers, "
           f"{s['samples']} samples, run directory `{s['dir']}`" for s in summaries]
    md += [f"- {n}" for n in notes]
    md += ["", text, __doc__.split("What the numbers mean")[1].split("\n", 1)[1].strip(), ""]
    for title, name in figures.items():
        md += [f"## {title}", "", f"![{title}]({name})", ""]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(md))
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--target", type=float, default=0.85,
                    help="test accuracy whose time to reach is reported (default 0.85)")
    args = ap.parse_args(argv)
    try:
        runs = [Run(d) for d in args.run_dirs]
    except ReportError as e:
        sys.exit(f"report: {e}")
    print(write(runs, args.out_dir, args.target), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
