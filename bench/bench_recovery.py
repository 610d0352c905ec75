#!/usr/bin/python3
"""Recovery figures of an async run under tools/launch (issue 10):

  (a) time from a ps `kill -9` to training resuming,
  (b) updates lost per ps restart, as the restarted ps reports them,
  (c) goodput: useful samples/s of a run with three failures over a clean
      run's.

    PSTRAIN=build/pstrain bench/bench_recovery.py [--out FILE.json]
        [--restart-backoff 0.2] [--epochs 30] [--seed 1] [--keep DIR]
        [--servers 2] [--replicas 1] [--backup-silence 1] [--model mlp|ctr]

With --replicas 2 (replicated shards, docs/failures.md "Fail-over" and
"Re-join"; give --servers 4) every run is replicated, the three ps kills are
of ps1, ps3 and ps1 again (ps 0 also holds the run's control state, which is
not replicated) and need no checkpoint: a killed ps's backup serves its
shard until the restarted process re-joins (the shard handed back, its
predecessor's copy made again), so the second kill of ps1 finds two copies
of every shard again; a fifth run, replicas 1 and no failure, gives the
steady-state cost of replication (its wall time over the replicated clean
runs'). Updates lost are then 0 by construction (nothing is restored; the
exactness tests check that none is lost): the bench reports the take-overs,
hand-backs and re-joins instead.

Four runs of the same job (2 ps + 3 CPU workers, synthetic data, the MLP
or with --model ctr DLRM, whose embedding rows live on the ps,
checkpoint.every_s 1, fixed train.seed) on loopback ports:

  clean   no failure;
  ps      three `kill -9`s of a ps (ps1, ps0, ps1) once 20%, 45% and 70% of
          the planned samples are trained: (a), (b) and goodput with ps
          failures;
  mixed   a worker, a ps, a worker (seeded choice of which), as the chaos
          test does, at the same points: goodput with mixed failures;
  clean2  the clean run again, for the baseline.

(a) Workers write a metrics record between steps every net.heartbeat seconds
(README, "Metrics"), so a worker blocked on a dead ps writes none: training
has resumed for a worker at the first record after the kill that ends a
silence longer than --stall (default 0.5 s), or at its first record after the
kill if it never fell silent. The figure is the kill to the last worker's
resumption (all workers training again), split into: the launcher seeing the
death, the restart backoff (--restart-backoff, small here on purpose), the new
process starting until its `serving on` line (restore included), and the
workers' first step after that. Resolution: about one step plus one
heartbeat.

(b) A restarted ps reports per worker how many of its acknowledged updates
the restore lost (`the restore lost N of worker W's acknowledged updates`,
logged when N > 0): the bench sums those lines of each restart. A binary
without that report gives "n/a".

Next to it, an estimate that needs no report: the global samples before the
kill less those the restarted ps restored (its `restored ... global samples`
line), in steps of one worker, each of which pushed one update of every
variable: what the restore rolled back. Only for the run's first ps restart:
after it, the servers' counts differ and ps 0's (the metrics') stands for no
other.

(c) Useful samples are the planned ones (epochs x training set, whatever was
trained twice); time is the launcher's wall time (launch.json start to end).
Goodput = useful samples/s of the run with failures / the clean run's = clean
wall time / wall time with failures. Target >= 0.8. The clean wall time is
the mean of a clean run before the others and one after them, as the
machine's speed drifts while others use it.

Timings on a shared 2-core machine vary by tens of percent between runs.
"""

import argparse
import datetime
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import support  # noqa: E402  (free ports, process checks, small cluster files)

WORKERS = 3
TRAIN = 6000


def model_and_data(model):
    """The job's model, optimizer and data: the MLP on synthetic images, or
    DLRM on synthetic click data (its embedding rows on the ps, as a table
    of each ps's shard)."""
    if model == "ctr":
        return {"model": {"preset": "dlrm", "embedding_dim": 8, "bottom_mlp": [16],
                          "top_mlp": [16]},
                "optimizer": {"name": "adam", "lr": 0.003,
                              "sparse": {"name": "adagrad", "lr": 0.05}},
                "data": {"name": "synthetic-ctr", "synthetic_train": TRAIN,
                         "synthetic_test": 1000, "synthetic_ctr": {"vocab_scale": 0.001}}}
    return {"model": "mlp",
            "data": {"name": "synthetic", "synthetic_train": TRAIN, "synthetic_test": 1000}}


def job(args, replicas=None):
    replicas = args.replicas if replicas is None else replicas
    extra = {"replication": {"replicas": replicas, "backup_silence": args.backup_silence}} \
        if replicas > 1 else {}
    return support.cluster(
        **extra, **model_and_data(args.model),
        ps_hosts=("127.0.0.1",) * args.servers, worker_hosts=("127.0.0.1",) * WORKERS,
        job="recovery", mode="async",
        net={"heartbeat": 0.1, "worker_timeout": 10, "request_timeout": 10,
             "retry_interval": args.retry_interval},
        train={"batch_size": 32, "epochs": args.epochs, "eval_every": 0, "seed": args.seed,
               "on_worker_loss": "continue"},
        checkpoint={"every_s": 1, "keep": 3})


class Run:
    def __init__(self, base, name, doc, args):
        self.servers = args.servers
        self.name = name
        self.dir = os.path.join(base, name)
        os.makedirs(self.dir)
        self.cluster = os.path.join(self.dir, "cluster.in.yaml")
        # Fresh ports per run: the previous run's may linger in TIME_WAIT.
        doc = dict(doc, ps=[{"host": "127.0.0.1", "port": support.free_port()}
                            for _ in range(self.servers)])
        import yaml
        with open(self.cluster, "w") as f:
            yaml.safe_dump(doc, f)
        self.run_dir = os.path.join(self.dir, "run")
        self.out = open(os.path.join(self.dir, "launch.out"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tools", "launch"), self.cluster,
             "--run-dir", self.run_dir, "--max-restarts", "3",
             "--restart-backoff", str(args.restart_backoff)],
            stdout=self.out, stderr=subprocess.STDOUT, env=support.tool_env(), cwd=ROOT)
        self.started = time.monotonic()
        self.kills = []

    def elapsed(self):
        return time.monotonic() - self.started

    def record(self):
        try:
            return support.read_json(os.path.join(self.run_dir, "launch.json"))
        except (OSError, ValueError):
            return None

    def global_samples(self):
        """The most global samples any worker's metrics show so far."""
        best = 0
        for w in range(WORKERS):
            try:
                with open(os.path.join(self.run_dir, f"worker{w}.metrics.jsonl")) as f:
                    for line in f:
                        if '"global_samples"' in line and '"event"' not in line:
                            try:
                                best = max(best, json.loads(line)["global_samples"])
                            except ValueError:
                                pass  # a line being written
            except OSError:
                pass
        return best

    def kill(self, samples, name, ps_checkpoint=False, timeout=30):
        """SIGKILL to `name`'s current attempt once the run has trained
        `samples` global samples (and, for a ps, it has a checkpoint to
        restore). Progress, not time, places the kills: a run slowed down by
        the machine still takes them at the same point of its training."""
        while self.global_samples() < samples and self.proc.poll() is None:
            time.sleep(0.05)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready = not ps_checkpoint or glob.glob(
                os.path.join(self.run_dir, "checkpoints", "ckpt-*", f"{name}.bin"))
            for p in (self.record() or {}).get("processes", []):
                a = p["attempts"][-1] if p["name"] == name and p["attempts"] else None
                if (ready and a and "end" not in a and support.alive(a["pid"])
                        and support.is_pstrain(a["pid"])):
                    os.kill(a["pid"], signal.SIGKILL)
                    self.kills.append({"name": name, "pid": a["pid"], "attempt": a["attempt"],
                                       "time": time.time(), "at": round(self.elapsed(), 2)})
                    print(f"  {self.name}: kill -9 {name} (PID {a['pid']}) at "
                          f"{self.elapsed():.1f} s", file=sys.stderr, flush=True)
                    return True
            time.sleep(0.02)
        print(f"  {self.name}: could not kill {name} (not running)", file=sys.stderr)
        return False

    def wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()
        # Nothing of the run may outlive it.
        for pid in [a["pid"] for p in (self.record() or {}).get("processes", [])
                    for a in p["attempts"]]:
            if support.alive(pid) and support.is_pstrain(pid):
                os.kill(pid, signal.SIGKILL)
        return self.proc.returncode

    def wall(self):
        r = self.record()
        return r["end"] - r["start"] if r and "end" in r else None

    def metrics(self, worker):
        try:
            with open(os.path.join(self.run_dir, f"worker{worker}.metrics.jsonl")) as f:
                records = [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []
        return [r for r in records if "event" not in r]

    def log_lines(self, name):
        try:
            return support.read_text(os.path.join(self.run_dir, f"{name}.log")).splitlines()
        except OSError:
            return []

    def accuracy(self):
        """The final test accuracy, or for the CTR model its AUC."""
        text = support.read_text(os.path.join(self.dir, "launch.out"))
        found = re.findall(r"final test (?:accuracy|AUC) (\d+\.\d+)", text)
        return float(found[-1]) if found else None


def log_time(line, near):
    """UNIX time of a log line's HH:MM:SS.mmm (local time), on the day of
    UNIX time `near`."""
    m = re.match(r"(\d\d):(\d\d):(\d\d\.\d+) ", line)
    if not m:
        return None
    day = datetime.datetime.fromtimestamp(near).replace(hour=0, minute=0, second=0,
                                                        microsecond=0)
    t = day + datetime.timedelta(hours=int(m[1]), minutes=int(m[2]), seconds=float(m[3]))
    return t.timestamp()


def recovery(run, kill, stall):
    """The phases from `kill` (a ps) to every worker training again."""
    t0 = kill["time"]
    record = run.record()
    proc = next(p for p in record["processes"] if p["name"] == kill["name"])
    attempts = proc["attempts"]
    killed = next(a for a in attempts if a["pid"] == kill["pid"])
    nxt = attempts[killed["attempt"]] if len(attempts) > killed["attempt"] else None
    out = {"ps": kill["name"], "at_s": kill["at"],
           "seen_dead_s": killed.get("end", t0) - t0,
           "backoff_s": killed.get("backoff")}
    if nxt is None:
        out["error"] = "not restarted"
        return out
    out["restarted_s"] = nxt["start"] - t0
    serving = [log_time(line, t0) for line in run.log_lines(kill["name"])
               if "serving on" in line]
    serving = [t for t in serving if t and t >= nxt["start"] - 0.5]
    if serving:
        out["serving_s"] = serving[0] - t0
    resumed = []
    for w in range(WORKERS):
        records = sorted(run.metrics(w), key=lambda r: r["time"])
        after = [i for i, r in enumerate(records) if r["time"] > t0]
        found = None
        if after:
            # A worker blocks on the dead ps within a step of the kill: the
            # silence is the interval holding the kill or one of the next two.
            first = after[0]
            for j in range(max(first, 1), min(first + 3, len(records))):
                if records[j]["time"] - records[j - 1]["time"] > stall:
                    found = records[j]["time"]
                    break
            else:
                found = records[first]["time"]  # never fell silent
        resumed.append(None if found is None else found - t0)
    out["workers_resumed_s"] = resumed
    if resumed and all(r is not None for r in resumed):
        out["resumed_s"] = max(resumed)
    return out


# The restarted ps's report, one line per worker that lost any
# (server/coordinator.cc): "the restore lost 37 of worker 0's acknowledged
# updates (it saw ..., the checkpoint held ...)".
LOST_LINE = re.compile(r"the restore lost (\d+) of worker (\d+)'s acknowledged updates")
RESTORED = re.compile(r"restored .* and (\d+) global samples from")


def steps_rolled_back(run, kill, batch):
    """An estimate independent of the ps's own report: the global samples
    the workers saw (ps 0's count) just before the kill, less those the
    restarted ps restored, in steps of one worker (each step pushes one
    update of every variable). ps 0 and ps 1 count the same reports, so the
    difference is what the restore rolled back, give or take one heartbeat."""
    t0 = kill["time"]
    if any(k["name"].startswith("ps") and k["time"] < t0 for k in run.kills):
        # After one ps's restore the servers' counts differ by what it rolled
        # back: ps 0's count (the metrics') no longer stands for the others'.
        return None
    before = [r["global_samples"] for w in range(WORKERS) for r in run.metrics(w)
              if r["time"] <= t0]
    lines = run.log_lines(kill["name"])
    restored = [int(m[1]) for m in map(RESTORED.search, lines) if m]
    # The n-th restore line belongs to the n-th restart.
    n = sum(1 for k in run.kills if k["name"] == kill["name"] and k["time"] <= t0)
    if not before or len(restored) < n:
        return None
    return max(0, (max(before) - restored[n - 1])) / batch


def lost_updates(run, kill, reported):
    """Lines of the killed ps's log that report lost updates after its
    restart, and the numbers they name (per worker)."""
    lines = run.log_lines(kill["name"])
    restored = [i for i, line in enumerate(lines) if "restored_from" in line]
    # The restart's lines: from its serving line (or a restore line just
    # before it) on, up to the next attempt.
    ordinal = kill["attempt"]  # the attempt that follows is number ordinal + 1
    start = restored[ordinal] - 5 if len(restored) > ordinal else None
    end = restored[ordinal + 1] if len(restored) > ordinal + 1 else len(lines)
    if start is None:
        return {"lines": [], "updates": None}
    found = [line for line in lines[max(start, 0):end] if LOST_LINE.search(line)]
    per_worker = {}
    for line in found:
        m = LOST_LINE.search(line)
        per_worker[int(m[2])] = per_worker.get(int(m[2]), 0) + int(m[1])
    numbers = list(per_worker.values())
    # A restore that lost nothing logs nothing: with the report in place, no
    # line means 0 (the hellos that would report it came: the run went on).
    return {"lines": found, "per_worker": per_worker,
            "updates": sum(numbers) if numbers else (0 if reported else None)}


def fmt(value, unit="", digits=2):
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--restart-backoff", type=float, default=0.2,
                    help="tools/launch --restart-backoff (default 0.2 s)")
    ap.add_argument("--retry-interval", type=float, default=1.0,
                    help="net.retry_interval of the job (default 1 s, pstrain's default)")
    ap.add_argument("--epochs", type=float, default=30, help="train.epochs (default 30)")
    ap.add_argument("--seed", type=int, default=1, help="train.seed and the kill choice")
    ap.add_argument("--stall", type=float, default=0.5,
                    help="a gap between a worker's metrics records longer than this is a "
                         "stall (default 0.5 s)")
    ap.add_argument("--keep", metavar="DIR", help="keep the runs in DIR")
    ap.add_argument("--servers", type=int, default=2, help="ps count (default 2)")
    ap.add_argument("--model", choices=("mlp", "ctr"), default="mlp",
                    help="the MLP on synthetic images, or DLRM on synthetic clicks with its "
                         "embedding table on the ps (default mlp)")
    ap.add_argument("--replicas", type=int, default=1, choices=(1, 2),
                    help="replication.replicas (default 1)")
    ap.add_argument("--backup-silence", type=float, default=1.0,
                    help="replication.backup_silence with --replicas 2 (default 1 s)")
    args = ap.parse_args()
    if args.replicas > 1 and args.servers < 4:
        sys.exit("bench_recovery: --replicas 2 wants --servers 4 (kills of ps1 and ps3)")
    replicated = args.replicas > 1
    if not os.access(support.PSTRAIN, os.X_OK):
        sys.exit(f"bench_recovery: no pstrain binary at {support.PSTRAIN}; set $PSTRAIN")

    base = args.keep or tempfile.mkdtemp(prefix="pstrain-recovery-")
    os.makedirs(base, exist_ok=True)
    doc = job(args)
    planned = args.epochs * TRAIN  # each worker trains epochs x its third
    result = {"config": {"model": args.model, "servers": args.servers,
                         "replicas": args.replicas,
                         "workers": WORKERS, "epochs": args.epochs,
                         "train_samples": TRAIN, "planned_samples": planned,
                         "restart_backoff_s": args.restart_backoff,
                         "retry_interval_s": args.retry_interval, "checkpoint_every_s": 1,
                         "seed": args.seed, "binary": support.PSTRAIN},
              "runs": {}}
    try:
        print("clean run ...", file=sys.stderr, flush=True)
        clean = Run(base, "clean", doc, args)
        code = clean.wait(300)
        result["runs"]["clean"] = {"exit": code, "wall_s": clean.wall(),
                                   "accuracy": clean.accuracy()}
        if code != 0 or not clean.wall():
            sys.exit(f"bench_recovery: the clean run failed (exit {code}); see {clean.dir}")
        wall = clean.wall()

        plan = ((0.2, "ps1"), (0.45, "ps3"), (0.7, "ps1")) if replicated else \
            ((0.2, "ps1"), (0.45, "ps0"), (0.7, "ps1"))
        print(f"run with {len(plan)} ps kills ...", file=sys.stderr, flush=True)
        ps_run = Run(base, "ps", doc, args)
        for frac, name in plan:
            ps_run.kill(frac * planned, name, ps_checkpoint=not replicated)
        code = ps_run.wait(300)
        rec = [recovery(ps_run, k, args.stall) for k in ps_run.kills]
        # Whether this binary reports lost updates at all (the worker side of
        # ps restarts): a line of the report's text in it.
        with open(support.PSTRAIN, "rb") as f:
            reported = b"the restore lost " in f.read()
        lost = [lost_updates(ps_run, k, reported) for k in ps_run.kills]
        for r, l, k in zip(rec, lost, ps_run.kills):
            r["lost"] = l
            # Replicated: nothing is restored, so nothing rolled back.
            r["steps_rolled_back_est"] = None if replicated else steps_rolled_back(ps_run, k, 32)
        result["runs"]["ps"] = {"exit": code, "wall_s": ps_run.wall(),
                                "accuracy": ps_run.accuracy(), "kills": ps_run.kills,
                                "recoveries": rec}
        if replicated:
            def lines(text):
                return [line for name in (f"ps{i}" for i in range(args.servers))
                        for line in ps_run.log_lines(name) if text in line]
            result["runs"]["ps"]["takeovers"] = lines("takes over ps")
            result["runs"]["ps"]["handbacks"] = lines("back to a new process")
            result["runs"]["ps"]["rejoins"] = lines("re-joined") + lines("holds this shard's copy again")

        print("run with mixed kills ...", file=sys.stderr, flush=True)
        rng = random.Random(args.seed)
        roles = ["worker", "ps", "worker"]
        mixed = Run(base, "mixed", doc, args)
        for frac, role in zip((0.2, 0.45, 0.7), roles):
            if role == "ps":
                name = "ps1" if replicated else f"ps{rng.randrange(args.servers)}"
            else:
                name = f"worker{rng.randrange(WORKERS)}"
            mixed.kill(frac * planned, name, ps_checkpoint=role == "ps" and not replicated)
        code = mixed.wait(300)
        result["runs"]["mixed"] = {"exit": code, "wall_s": mixed.wall(),
                                   "accuracy": mixed.accuracy(), "kills": mixed.kills}

        # A second clean run: the machine's speed drifts (others share it),
        # so the baseline is the mean of one run before and one after.
        print("clean run again ...", file=sys.stderr, flush=True)
        clean2 = Run(base, "clean2", doc, args)
        code = clean2.wait(300)
        result["runs"]["clean2"] = {"exit": code, "wall_s": clean2.wall(),
                                    "accuracy": clean2.accuracy()}
        if code == 0 and clean2.wall():
            wall = (wall + clean2.wall()) / 2
        result["clean_wall_s"] = wall
        if replicated:
            print("clean run with replicas 1 ...", file=sys.stderr, flush=True)
            single = Run(base, "clean_r1", job(args, replicas=1), args)
            code = single.wait(300)
            result["runs"]["clean_r1"] = {"exit": code, "wall_s": single.wall(),
                                          "accuracy": single.accuracy()}
            if code == 0 and single.wall():
                # Samples/s with replicas 2 over replicas 1: wall times inverted.
                result["replicas2_over_replicas1"] = single.wall() / wall
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    for key in ("ps", "mixed"):
        r = result["runs"][key]
        r["goodput"] = (wall / r["wall_s"]) if r["exit"] == 0 and r["wall_s"] else None
    resumed = [r.get("resumed_s") for r in result["runs"]["ps"]["recoveries"]]
    lost_all = [r["lost"]["updates"] for r in result["runs"]["ps"]["recoveries"]]
    result["summary"] = {
        "ps_kill_to_resume_s": resumed,
        "ps_kill_to_resume_max_s": max(resumed) if resumed and None not in resumed else None,
        "restart_backoff_s": args.restart_backoff,
        "updates_lost_per_ps_restart": lost_all if any(v is not None for v in lost_all)
        else "n/a",
        "steps_rolled_back_per_ps_restart_est": [
            r.get("steps_rolled_back_est") for r in result["runs"]["ps"]["recoveries"]],
        "goodput_ps_kills": result["runs"]["ps"]["goodput"],
        "goodput_mixed_kills": result["runs"]["mixed"]["goodput"],
    }

    if replicated:
        result["summary"]["updates_lost_per_ps_restart"] = "0 (no restore: handed back)"
        for key in ("takeovers", "handbacks", "rejoins"):
            result["summary"][key] = len(result["runs"]["ps"].get(key, []))
        result["summary"]["replicas2_over_replicas1"] = result.get("replicas2_over_replicas1")
    print(f"\n{args.servers} ps (replicas {args.replicas}) + 3 CPU workers, "
          f"{'DLRM on synthetic clicks' if args.model == 'ctr' else 'MLP on synthetic images'}, "
          f"{TRAIN} x {args.epochs:g} epochs, "
          f"checkpoint.every_s 1, net.retry_interval {args.retry_interval:g} s, "
          f"--restart-backoff {args.restart_backoff:g} s\n")
    print(f"{'ps kill':<10} {'seen dead':>9} {'backoff':>8} {'restarted':>9} {'serving':>8} "
          f"{'resumed (per worker)':>24} {'lost updates':>13} {'rolled back (est.)':>19}")
    for r in result["runs"]["ps"]["recoveries"]:
        per = " ".join(fmt(v, "", 2) for v in r.get("workers_resumed_s", []))
        lost_v = r["lost"]["updates"]
        print(f"{r['ps'] + ' @' + format(r['at_s'], '.1f'):<10} {fmt(r['seen_dead_s']):>9} "
              f"{fmt(r['backoff_s']):>8} {fmt(r.get('restarted_s')):>9} "
              f"{fmt(r.get('serving_s')):>8} {fmt(r.get('resumed_s')) + ' (' + per + ')':>24} "
              f"{'n/a' if lost_v is None else lost_v:>13} "
              f"{fmt(r.get('steps_rolled_back_est'), ' steps', 0):>19}")
    print("\n(seconds after the kill; resumed: every worker stepping again; lost updates: as "
          "the ps reports them; rolled back: global samples before the kill less those "
          "restored, in worker steps)\n")
    print(f"{'run':<8} {'exit':>4} {'wall (s)':>9} {'accuracy':>9} {'goodput':>8}  kills")
    for key in ("clean", "clean2", "ps", "mixed", "clean_r1"):
        r = result["runs"].get(key)
        if r is None:
            continue
        kills = ", ".join(f"{k['name']}@{k['at']:.1f}s" for k in r.get("kills", [])) or "-"
        print(f"{key:<8} {r['exit']:>4} {fmt(r['wall_s'], '', 1):>9} "
              f"{fmt(r['accuracy'], '', 4):>9} {fmt(r.get('goodput', 1.0 if key.startswith('clean') else None)):>8}  {kills}")
    s = result["summary"]
    print(f"\nps kill -> training resumed (max): {fmt(s['ps_kill_to_resume_max_s'], ' s')} "
          f"(target <= {2 if replicated else 5} s; backoff {args.restart_backoff:g} s of it)")
    print(f"updates lost per ps restart: {s['updates_lost_per_ps_restart']}"
          + ("  (no ps log line reports lost updates)" if s['updates_lost_per_ps_restart'] == "n/a"
             else ""))
    print("ps restore rolled back (est.): " + ", ".join(
        fmt(v, " steps", 0) for v in s["steps_rolled_back_per_ps_restart_est"]))
    if replicated:
        print(f"take-overs: {s['takeovers']}, hand-backs: {s['handbacks']}, re-joins "
              f"(shards received whole): {s['rejoins']}; samples/s with replicas 2 over replicas 1: "
              f"{fmt(s['replicas2_over_replicas1'])} (target >= 0.85)")
    print(f"goodput: {fmt(s['goodput_ps_kills'])} ({len(plan)} ps kills), "
          f"{fmt(s['goodput_mixed_kills'])} (2 workers + 1 ps)  (target >= 0.8)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
