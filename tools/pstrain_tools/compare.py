"""Runs one job in several consistency modes and reports how they compare.

    tools/compare cluster.yaml [--set key=value ...] [--modes async,sync,ssp:4,...]
                  [--straggler worker1=30ms ...] [--repeats N] [--target T] [--out DIR]
                  [--trace]

Every run uses the same cluster file and overrides (model, data, seed,
epochs); only the mode (and its parameter) differs, and under each
--straggler setting every mode runs again. With --repeats N each runs N
times, with train.seed = the file's seed, +1, ... (the same seeds for every
mode). Each run is started by tools/launch in its own run directory under DIR
(runs/compare-<job>-<time> by default): DIR/<mode>, below DIR/<setting>/ when
there are several straggler settings and above /seed<N> with repeats. Then
DIR/report.md gets the tables, the winners and the plots (report.py
says what each number means), and the tables are printed. The report
measures test accuracy, or test AUC for a click model (its evaluations carry
test_auc); --target is in those units, 0.85 accuracy or 0.75 AUC when not
given. With --trace every run keeps its timeline (tools/launch --trace:
<run_dir>/trace.json) and the report's notes give each run's step as
tools/trace breaks it down: the mean step and its largest parts. Exit code:
0 when every run trained, else 1 (the report then covers the runs that did).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import time

from . import cluster_config, paths, report, trace


class Mode:
    """One --modes entry: its spelling, run directory name and overrides."""

    def __init__(self, spec, name, overrides):
        self.spec = spec
        self.name = name
        self.dir = spec.replace(":", "-")
        self.overrides = [f"mode={name}"] + overrides


# name -> (key of its parameter, what the parameter is) for the modes that take one.
MODE_PARAMETERS = {
    "ssp": ("train.staleness_bound", "a whole number staleness bound"),
    "backup": ("train.backup_workers", "a whole number of backup workers"),
    "local": ("train.local_steps", "a whole number of local steps"),
}


def parse_mode(spec):
    """'async', 'sync', 'ssp:S', 'backup:B' or 'local:H' -> a Mode."""
    name, colon, value = spec.strip().partition(":")
    if name in ("async", "sync"):
        if colon:
            raise argparse.ArgumentTypeError(f"'{spec}': {name} takes no parameter")
        return Mode(name, name, [])
    if name not in MODE_PARAMETERS:
        raise argparse.ArgumentTypeError(
            f"'{spec}': unknown mode; expected async, sync, ssp:S, backup:B or local:H")
    key, what = MODE_PARAMETERS[name]
    if not re.fullmatch(r"\d+", value):
        raise argparse.ArgumentTypeError(f"'{spec}': {name} needs {what}, "
                                         f"e.g. {name}:{1 if name != 'local' else 8}")
    return Mode(f"{name}:{int(value)}", name, [f"{key}={int(value)}"])


def parse_modes(text):
    """'async,sync,ssp:4' -> [Mode], each listed once."""
    modes = [parse_mode(spec) for spec in text.split(",")]
    specs = [m.spec for m in modes]
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"'{text}': {', '.join(twice)} listed twice")
    return modes


class Straggler:
    """One --straggler setting: its label, run directory name and overrides."""

    def __init__(self, label, dir_name, overrides):
        self.label = label
        self.dir = dir_name
        self.overrides = overrides


DURATION = r"(\d+(?:\.\d*)?)(ms|s)"


def milliseconds(number, unit):
    return float(number) * (1000 if unit == "s" else 1)


def parse_straggler(spec):
    """'none', 'workerN=30ms', 'workerN=30ms±20ms' (or +-) or
    'workerN=5%:200ms' (N a worker index, or * for every worker) -> a
    Straggler with its train.straggler_* overrides."""
    text = spec.strip()
    if text == "none":
        return Straggler("none", "none", ["train.straggler_worker=-1"])
    fixed = re.fullmatch(rf"worker(\d+|\*)={DURATION}(?:(?:±|\+-){DURATION})?", text)
    pauses = re.fullmatch(rf"worker(\d+|\*)=(\d+(?:\.\d*)?)%:{DURATION}", text)
    if fixed:
        who, delay, jitter = fixed.group(1), milliseconds(*fixed.group(2, 3)), 0.0
        if fixed.group(4):
            jitter = milliseconds(*fixed.group(4, 5))
        keys = {"delay_ms": delay, "jitter_ms": jitter}
        label = f"{delay:g}ms" + (f"±{jitter:g}ms" if jitter else "")
        name = f"{delay:g}ms" + (f"-pm{jitter:g}ms" if jitter else "")
    elif pauses and float(pauses.group(2)) <= 100:
        who, percent = pauses.group(1), float(pauses.group(2))
        pause = milliseconds(*pauses.group(3, 4))
        keys = {"pause_probability": percent / 100, "pause_ms": pause}
        label, name = f"{percent:g}%:{pause:g}ms", f"{percent:g}pct-{pause:g}ms"
    else:
        raise argparse.ArgumentTypeError(
            f"'{spec}': expected workerN=DELAY, workerN=DELAY±JITTER, workerN=P%:PAUSE "
            "(N a worker index or * for every worker; DELAY in ms or s, P up to 100) or none, "
            "e.g. worker1=30ms")
    worker = "all" if who == "*" else str(int(who))
    overrides = [f"train.straggler_worker={worker}"]
    # Every key of the setting is given, so that one in the file does not
    # leak into a setting that leaves it out.
    for key in ("delay_ms", "jitter_ms", "pause_probability", "pause_ms"):
        overrides.append(f"train.straggler_{key}={keys.get(key, 0):g}")
    return Straggler(f"worker{who}={label}", f"worker{'-all' if who == '*' else who}-{name}",
                     overrides)


def positive_count(text):
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': expected a whole number >= 1")
    return int(text)


def target_accuracy(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"'{text}': expected an accuracy in (0, 1], e.g. 0.85")
    return value


class Launch:
    """tools/launch as a child that a signal to compare stops cleanly: the
    signal is passed on, and the launcher ends its own processes."""

    def __init__(self):
        self.child = None
        self.signal = None
        signal.signal(signal.SIGINT, self._forward)
        signal.signal(signal.SIGTERM, self._forward)

    def _forward(self, signum, _frame):
        self.signal = signum
        if self.child and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self, argv):
        self.child = subprocess.Popen([sys.executable, paths.LAUNCH] + argv)
        code = self.child.wait()
        self.child = None
        return code


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cluster", nargs="?", default="cluster.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the file in every run")
    ap.add_argument("--modes", type=parse_modes, default=parse_modes("async,sync"),
                    metavar="MODE,...",
                    help="the modes to run: async, sync, ssp:S, backup:B, local:H "
                         "(default async,sync)")
    ap.add_argument("--straggler", type=parse_straggler, action="append",
                    metavar="workerN=DELAY",
                    help="slow worker N (or worker* for all) per step: DELAY, DELAY±JITTER or "
                         "P%%:PAUSE, in ms or s; or none; repeat to compare several settings")
    ap.add_argument("--repeats", type=positive_count, default=1, metavar="N",
                    help="runs of each mode, with seeds train.seed, +1, ... (default 1)")
    ap.add_argument("--target", type=target_accuracy, default=None,
                    help="test accuracy whose time to reach is compared (default 0.85); for "
                         "click models, whose evaluations carry test_auc, the test AUC "
                         "(default 0.75)")
    ap.add_argument("--out", help="comparison directory (default runs/compare-<job>-<time>)")
    ap.add_argument("--trace", action="store_true",
                    help="keep each run's timeline (tools/launch --trace) and break its steps "
                    "down in the report's notes")
    args = ap.parse_args(argv)

    stragglers = args.straggler or [Straggler("", "", [])]
    labels = [s.label for s in stragglers]
    if len(set(labels)) < len(labels):
        ap.error("--straggler: a setting is given twice")
    resolved = None
    if args.repeats > 1 or not args.out:
        try:
            resolved = cluster_config.check(cluster_config.pstrain_binary("compare"),
                                            args.cluster, args.set)[1]
        except cluster_config.ConfigError as e:
            sys.exit(f"compare: {e}")
    if args.out:
        out = args.out
    else:
        out = os.path.join("runs", f"compare-{resolved['job']}-{time.strftime('%Y%m%d-%H%M%S')}")
    if os.path.exists(out) and os.listdir(out):
        sys.exit(f"compare: {out} is not empty; give a new --out")
    # One run per seed: the file's seed, then the next ones. A single run
    # keeps the file's seed untouched.
    seeds = [None] if args.repeats == 1 else [
        int(resolved["train"]["seed"]) + i for i in range(args.repeats)]

    launch = Launch()
    runs, groups, failures, traced = [], [], [], []
    for straggler in stragglers:
        for mode in args.modes:
            group = report.Group(mode.spec, straggler.label, [])
            for seed in seeds:
                # Named by the straggler setting only when there are several:
                # one setting keeps the layout and labels of a plain async
                # versus sync comparison.
                several = len(stragglers) > 1
                seed_dir = f"seed{seed}" if seed is not None else ""
                run_dir = os.path.join(*filter(None, [
                    out, straggler.dir if several else "", mode.dir, seed_dir]))
                what = " ".join(filter(None, [mode.spec, straggler.label if several else "",
                                              f"seed {seed}" if seed is not None else ""]))
                overrides = (args.set + straggler.overrides + mode.overrides
                             + ([f"train.seed={seed}"] if seed is not None else []))
                print(f"compare: {what} run in {run_dir}", flush=True)
                code = launch.run([args.cluster, "--run-dir", run_dir]
                                  + [a for o in overrides for a in ("--set", o)]
                                  + (["--trace"] if args.trace else []))
                if launch.signal is not None:
                    print(f"compare: {signal.Signals(launch.signal).name} received; stopped",
                          file=sys.stderr)
                    return 128 + launch.signal
                run = trained(run_dir, code, mode, what, failures)
                if args.trace:
                    traced.append(step_note(run_dir, what))
                if run:
                    run.label = what
                    runs.append(run)
                    group.runs.append(run)
            if group.runs:
                groups.append(group)

    notes = [f"cluster file `{args.cluster}`"
             + (", overrides: " + ", ".join(f"`{o}`" for o in args.set) if args.set else "")]
    notes += [f"straggler {s.label}: " + ", ".join(f"`{o}`" for o in s.overrides)
              for s in stragglers if s.label]
    if args.repeats > 1:
        notes.append(f"{args.repeats} runs of each mode, seeds "
                     + ", ".join(str(s) for s in seeds))
    notes += traced
    notes += [f"FAILED: {f}" for f in failures]
    if runs:
        table = report.write(runs, out, args.target, notes, groups)
        print(f"\ncompare: report in {os.path.join(out, 'report.md')}\n\n{table}", end="")
    for f in failures:
        print(f"compare: {f}", file=sys.stderr)
    return 1 if failures else 0


def step_note(run_dir, what):
    """The report's note on a traced run: its mean step and the three
    largest parts of it, as tools/trace breaks them down."""
    path = os.path.join(run_dir, "trace.json")
    try:
        b = trace.breakdown(trace.load(path))
    except trace.TraceError as e:
        return f"{what}: no trace ({e})"
    if not b["steps"]:
        return f"{what}: the trace `{path}` holds no step"
    parts = sorted(b["parts"].items(), key=lambda kv: -kv[1]["ms"])[:3]
    return (f"{what}: trace `{path}`, {b['steps']} steps of {b['step_ms']:.3f} ms: "
            + ", ".join(f"{name} {p['ms']:.3f} ms ({p['share']:.0%})" for name, p in parts))


def trained(run_dir, code, mode, what, failures):
    """The run's report.Run if it trained as asked; else None, with the
    reason appended to `failures`."""
    if code != 0:
        failures.append(f"the {what} run failed (tools/launch exit code {code}); "
                        f"its logs are in {run_dir}")
        return None
    try:
        run = report.Run(run_dir)
    except report.ReportError as e:
        failures.append(f"the {what} run left no usable metrics: {e}")
        return None
    # A pstrain without sync mode would train asynchronously under
    # mode=sync; comparing that with async would be meaningless.
    if mode.name in ("async", "sync") and run.synchronous != (mode.name == "sync"):
        failures.append(f"the {what} run did not train {mode.name}hronously "
                        f"(its metrics {'lack' if mode.name == 'sync' else 'have'} "
                        f"allreduce_ms): this pstrain's mode {mode.name} does not work")
        return None
    return run

