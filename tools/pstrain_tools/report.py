"""Summary, plots and report.md for one or more pstrain run directories.

    tools/report.py OUT_DIR RUN_DIR [RUN_DIR ...] [--target T]

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
- Repeated runs (tools/compare --repeats) are grouped by mode and straggler
  setting: a group's time to target, final accuracy and samples/s are the
  median of its runs with their range [min-max]; a run that never reached
  the target counts as slower than any that did ("not reached"), so a
  median is "not reached" when at most half the runs reached it. Staleness:
  the median of the runs' means / the largest maximum.
- The winners, per straggler setting: the group with the lowest median time
  to target, and the one with the highest median final accuracy. When the
  winner's range overlaps another group's, the data cannot tell them apart,
  and the summary says so rather than naming a clear winner.

Click models (loss bce, whose evaluations carry test_auc and test_logloss):
when the runs' evaluations carry test_auc, the report's quality metric is
the test AUC instead of the accuracy: the points and plot are of AUC, time
to target is the first evaluation with AUC at or above the target (0.75
unless --target is given), and the winner is the group with the highest
median final AUC. The final log loss (of the final evaluation) is shown
beside it; summary.json keeps the final accuracy too.
"""

import argparse
import glob
import json
import math
import os
import statistics
import sys

import yaml


class ReportError(Exception):
    pass


# The report's quality metric -> (the evaluation records' key, its name in
# headings and sentences, --target's default).
METRICS = {"accuracy": ("test_accuracy", "accuracy", 0.85),
           "auc": ("test_auc", "AUC", 0.75)}


def report_metric(runs):
    """'auc' when the runs' evaluations carry test_auc (a click model's: all
    runs of a comparison are one job), else 'accuracy'."""
    return "auc" if any(run.has_auc for run in runs) else "accuracy"


def default_target(metric):
    """--target when it is not given: 0.85 accuracy, 0.75 AUC."""
    return METRICS[metric][2]


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

    @property
    def has_auc(self):
        """Whether its evaluations carry test_auc (a click model's)."""
        return any("test_auc" in e for e in self.evals + [self.final or {}])

    def eval_points(self, metric="accuracy"):
        """(seconds since the first step, accuracy or AUC, global samples) per
        evaluation that carries the metric (an AUC is left out when the
        test split held one class)."""
        key = METRICS[metric][0]
        t0 = self.origin
        return [(e["time"] - e.get("eval_s", 0.0) - t0, e[key], e["global_samples"])
                for e in self.evals if key in e or metric == "accuracy"]


def summarize(run, target=None, metric=None):
    """The run's numbers; metric (default: the run's own, report_metric)
    'accuracy' or 'auc' decides what time to target measures; target None
    is the metric's default."""
    metric = metric or report_metric([run])
    if target is None:
        target = default_target(metric)
    workers = sorted(run.train)
    per_worker = {}
    total_samples = 0
    for i in workers:
        samples = run.train[i][-1]["local_samples"]
        seconds = run.worker_train_s(i)
        per_worker[i] = samples / seconds if seconds > 0 else 0.0
        total_samples += samples
    longest = max(run.worker_train_s(i) for i in workers)
    reached = next(((t, v) for t, v, _ in run.eval_points(metric) if v >= target), None)
    final = run.final or {}
    summary = {
        "run": run.label,
        "mode": run.mode,
        "dir": run.dir,
        "workers": len(workers),
        "metric": metric,
        "target": target,
        "time_to_target_s": reached[0] if reached else None,
        "final_accuracy": run.final["test_accuracy"] if run.final else None,
        "final_auc": final.get("test_auc"),
        "final_logloss": final.get("test_logloss"),
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


class Group:
    """The runs of one mode under one straggler setting (one per seed)."""

    def __init__(self, mode, straggler, runs):
        self.mode = mode            # the mode as compare's --modes spells it
        self.straggler = straggler  # the straggler setting's label; "" for none given
        self.runs = runs

    @property
    def label(self):
        return f"{self.mode}, {self.straggler}" if self.straggler else self.mode


def spread(values):
    """{median, min, max} of numbers where None means never (slower than any
    number: it sorts last, and a median or bound that falls on it is None);
    None when there are no values."""
    if not values:
        return None
    ranked = [math.inf if v is None else v for v in values]
    finite = lambda v: None if math.isinf(v) else v  # noqa: E731
    return {"median": finite(statistics.median(ranked)), "min": finite(min(ranked)),
            "max": finite(max(ranked))}


def summarize_group(group, summaries):
    """The group's medians and ranges from its runs' summaries."""
    stale = [s["mean_staleness"] for s in summaries if s["mean_staleness"] is not None]
    peaks = [s["max_staleness"] for s in summaries if s["max_staleness"] is not None]
    finals = [s["final_accuracy"] for s in summaries if s["final_accuracy"] is not None]
    present = lambda key: [s[key] for s in summaries if s.get(key) is not None]  # noqa: E731
    return {
        "mode": group.mode,
        "straggler": group.straggler,
        "metric": summaries[0].get("metric", "accuracy") if summaries else "accuracy",
        "runs": [s["run"] for s in summaries],
        "time_to_target_s": spread([s["time_to_target_s"] for s in summaries]),
        "final_accuracy": spread(finals),
        "final_auc": spread(present("final_auc")),
        "final_logloss": spread(present("final_logloss")),
        "samples_per_s": spread([s["samples_per_s"] for s in summaries]),
        "mean_staleness": statistics.median(stale) if stale else None,
        "max_staleness": max(peaks) if peaks else None,
    }


def overlaps(a, b):
    """Whether two spreads' [min, max] ranges share a value (None: never)."""
    lo = lambda v: math.inf if v is None else v  # noqa: E731
    return lo(a["min"]) <= lo(b["max"]) and lo(b["min"]) <= lo(a["max"])


# The columns a winner is named for, per metric: (key, what the winner did,
# higher is better, unit).
WINNER_COLUMNS = {
    "accuracy": (("time_to_target_s", "reached the target soonest", False, " s"),
                 ("final_accuracy", "ended with the best final accuracy", True, "")),
    "auc": (("time_to_target_s", "reached the target soonest", False, " s"),
            ("final_auc", "ended with the best final AUC", True, "")),
}


def winners(group_summaries, metric=None):
    """Per straggler setting and column: the group with the best median, and
    the groups whose range overlaps its own. metric (default: the groups')
    picks the final column: final accuracy or final AUC."""
    if metric is None:
        metric = group_summaries[0].get("metric", "accuracy") if group_summaries else "accuracy"
    out = []
    settings = list(dict.fromkeys(g["straggler"] for g in group_summaries))
    for straggler in settings:
        groups = [g for g in group_summaries if g["straggler"] == straggler]
        for key, what, higher, unit in WINNER_COLUMNS[metric]:
            ranked = [g for g in groups if g[key] is not None]
            if not ranked:
                continue
            # None (not reached) ranks last; higher-is-better columns by -value.
            rank = lambda g: (g[key]["median"] is None,  # noqa: E731
                              (-1 if higher else 1) * (g[key]["median"] or 0))
            best = min(ranked, key=rank)
            entry = {"straggler": straggler, "column": key, "mode": best["mode"],
                     "spread": best[key],
                     "overlaps": [g["mode"] for g in ranked
                                  if g is not best and overlaps(g[key], best[key])]}
            entry["text"] = _winner_text(entry, what, unit, key == "time_to_target_s")
            out.append(entry)
    return out


def _winner_text(entry, what, unit, timed):
    s = entry["spread"]
    setting = f"with {entry['straggler']}: " if entry["straggler"] else ""
    if s["median"] is None:
        return f"{setting}no mode reached the target in most of its runs"
    spec = ".1f" if timed else ".4f"
    text = f"{setting}**{entry['mode']}** {what} ({_spread_text(s, spec, unit)})"
    if entry["overlaps"]:
        return text + "; not a clear winner: ranges overlap with " + ", ".join(entry["overlaps"])
    return text + "; its range overlaps no other mode's"


def _spread_text(s, spec, unit):
    """'4.0 s' for one value, 'median 3.5 s, range 2.0-5.0 s' for several."""
    if s["min"] == s["max"]:
        return f"{s['median']:{spec}}{unit}"
    return (f"median {s['median']:{spec}}{unit}, range {_fmt(s['min'], spec, 'not reached')}-"
            f"{_fmt(s['max'], spec, 'not reached')}{unit}")


def _fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def _quality_head(target, metric):
    """The time to target and final columns' headings: 'time to 85% (s)',
    'final accuracy'; 'time to AUC 0.75 (s)', 'final AUC', 'final logloss'."""
    if metric == "auc":
        return [f"time to AUC {target:g} (s)", "final AUC", "final logloss"]
    return [f"time to {target:.0%} (s)", "final accuracy"]


def _final_keys(metric):
    return ("final_auc", "final_logloss") if metric == "auc" else ("final_accuracy",)


def table(summaries):
    """The summary as a Markdown table (also printed by tools/compare)."""
    target = summaries[0]["target"]
    metric = summaries[0].get("metric", "accuracy")
    head = (["run", "mode"] + _quality_head(target, metric)
            + ["samples/s", "samples/s per worker", "staleness mean / max", "wall time (s)"])
    rows = []
    for s in summaries:
        stale = ("-" if s["mean_staleness"] is None
                 else f"{s['mean_staleness']:.2f} / {s['max_staleness']:.2f}")
        rows.append([s["run"], s["mode"], _fmt(s["time_to_target_s"], ".1f", "not reached")]
                    + [_fmt(s[k], ".4f") for k in _final_keys(metric)]
                    + [f"{s['samples_per_s']:.0f}",
                       " ".join(f"{r:.0f}" for r in s["samples_per_s_per_worker"]),
                       stale, _fmt(s["wall_s"], ".1f")])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _spread_cell(s, spec, missing="-"):
    """'median [min-max]', or the median alone when the range is one value."""
    if s is None:
        return "-"
    median = _fmt(s["median"], spec, missing)
    if s["min"] == s["max"]:
        return median
    return f"{median} [{_fmt(s['min'], spec, missing)}-{_fmt(s['max'], spec, missing)}]"


def group_table(group_summaries, target, metric=None):
    """One row per mode and straggler setting: medians and [min-max] ranges."""
    if metric is None:
        metric = group_summaries[0].get("metric", "accuracy") if group_summaries else "accuracy"
    head = (["straggler", "mode", "runs"] + _quality_head(target, metric)
            + ["samples/s", "staleness mean / max"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in group_summaries:
        stale = ("-" if g["mean_staleness"] is None
                 else f"{g['mean_staleness']:.2f} / {g['max_staleness']:.2f}")
        row = ([g["straggler"] or "-", g["mode"], str(len(g["runs"])),
                _spread_cell(g["time_to_target_s"], ".1f", "not reached")]
               + [_spread_cell(g[k], ".4f") for k in _final_keys(metric)]
               + [_spread_cell(g["samples_per_s"], ".0f"), stale])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def accuracy_bands(group, metric="accuracy"):
    """(time grid, median, min, max) of the group's test accuracy (or AUC):
    each run's evaluations interpolated linearly on a common grid, from the
    latest first evaluation (where every run has one) to the last; a run
    that ended earlier holds its last accuracy."""
    import numpy as np
    curves = [r.eval_points(metric) for r in group.runs]
    curves = [c for c in curves if c]
    if not curves:
        return None
    start = max(c[0][0] for c in curves)
    end = max(c[-1][0] for c in curves)
    grid = np.linspace(start, end, 200)
    values = np.array([np.interp(grid, [p[0] for p in c], [p[1] for p in c]) for c in curves])
    return grid, np.median(values, axis=0), values.min(axis=0), values.max(axis=0)


def plots(runs, out_dir, groups=None, metric="accuracy"):
    """Writes the PNGs; returns {title: file name}. The first is of the
    metric: accuracy_vs_time.png, or auc_vs_time.png for AUC."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}

    def save(fig, name, title):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=100)
        plt.close(fig)
        files[title] = name

    if groups is None:
        groups = [Group(run.label, "", [run]) for run in runs]
    settings = list(dict.fromkeys(g.straggler for g in groups))
    name = METRICS[metric][1]
    quality_title = f"Test {name} vs wall time"
    fig, axes = plt.subplots(1, len(settings), figsize=(7 * len(settings), 4.5), sharey=True,
                             squeeze=False)
    for ax, straggler in zip(axes[0], settings):
        for group in (g for g in groups if g.straggler == straggler):
            if len(group.runs) == 1:
                points = group.runs[0].eval_points(metric)
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                        label=group.mode)
                continue
            bands = accuracy_bands(group, metric)
            if bands is None:
                continue
            grid, median, low, high = bands
            line, = ax.plot(grid, median, label=f"{group.mode} (median of {len(group.runs)})")
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="seconds since the first step",
               title=quality_title + (f": {straggler}" if straggler else ""))
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel(f"test {name}")
    save(fig, f"{metric}_vs_time.png", quality_title)

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


def write(runs, out_dir, target=None, notes=(), groups=None):
    """Writes report.md, summary.json and the plots into out_dir; returns the
    tables. `groups` (default: one per run) are the runs of each mode and
    straggler setting; when some group has several runs or there are several
    settings, a table of medians and ranges comes first. The plots other
    than accuracy (or AUC) show the first run of each group. The metric is
    AUC when the runs' evaluations carry test_auc, else accuracy; target
    None is the metric's default (0.85 accuracy, 0.75 AUC)."""
    os.makedirs(out_dir, exist_ok=True)
    if groups is None:
        groups = [Group(run.label, "", [run]) for run in runs]
    metric = report_metric(runs)
    if target is None:
        target = default_target(metric)
    summaries = [summarize(r, target, metric) for r in runs]
    by_run = {id(r): s for r, s in zip(runs, summaries)}
    grouped = [summarize_group(g, [by_run[id(r)] for r in g.runs]) for g in groups]
    named = winners(grouped, metric)
    text = table(summaries)
    if any(len(g.runs) > 1 for g in groups) or len({g.straggler for g in groups}) > 1:
        text = group_table(grouped, target, metric) + "\n" + text
    text += "\n" + "".join(f"- {w['text']}\n" for w in named)
    figures = plots([g.runs[0] for g in groups], out_dir, groups, metric)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"metric": metric, "runs": summaries, "groups": grouped, "winners": named},
                  f, indent=1)
    meaning, _, click = __doc__.split("What the numbers mean")[1].split("\n", 1)[1].partition(
        "\nClick models")
    md = ["# pstrain run comparison", ""]
    md += [f"- **{s['run']}**: {s['mode']}, {s['workers']} workers, "
           f"{s['samples']} samples, run directory `{s['dir']}`" for s in summaries]
    md += [f"- {n}" for n in notes]
    md += ["", text, meaning.strip(), ""]
    if metric == "auc":
        md[-1:-1] = ["", ("Click models" + click).strip()]
    for title, name in figures.items():
        md += [f"## {title}", "", f"![{title}]({name})", ""]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(md))
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--target", type=float, default=None,
                    help="test accuracy whose time to reach is reported (default 0.85); for "
                         "click models, whose evaluations carry test_auc, the test AUC "
                         "(default 0.75)")
    args = ap.parse_args(argv)
    try:
        runs = [Run(d) for d in args.run_dirs]
    except ReportError as e:
        sys.exit(f"report: {e}")
    print(write(runs, args.out_dir, args.target), end="")
    return 0

