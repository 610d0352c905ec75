#!/usr/bin/python3
"""Chaos: an async run of 2 ps + 3 CPU workers under tools/launch survives
three `kill -9`s of random processes at random times.

The run is done twice with the same configuration and seed: once clean, once
while the test kills (SIGKILL) a random worker, a random ps and another
random worker, in an order and at times drawn from a seeded generator. The
seed is printed with the schedule and the kills actually sent, so a failure
can be replayed: CHAOS_SEED=<seed> tests/tools/test_chaos.py (CHAOS_KEEP=DIR
keeps the two runs' directories and the launcher's output in DIR).

The kills go to the PIDs tools/launch records in launch.json (rewritten at
every attempt's start), only to the current attempt of a process of this
launcher. A ps is killed only once it has a checkpoint: a ps that restarts
with nothing to restore is refused by the workers, by design.

What must hold: the launcher exits 0; worker 0's final accuracy is within one
point of the clean run's; every kill is in launch.json and on the launcher's
console as a restart of that process; a killed ps logs the checkpoint it
restored (`restored_from <seq>`); and no process of the run is left alive.

With `replication: {replicas: 2}` (the second test) the same kills, the ps
one always of ps 1 (ps 0 also holds the run's control state, which is not
replicated), and without waiting for a checkpoint: ps 0 serves ps 1's shard
from its copy and hands it back to ps 1's restarted process, which re-joins
(docs/failures.md, "Fail-over" and "Re-join"), and no acknowledged update is
lost, so the accuracy holds as well.
"""

import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import unittest

import support
from pstrain_tools.supervisor import PS_FENCED

SEED = int(os.environ.get("CHAOS_SEED", "20250110"))
# The failures, shuffled by the seed: two workers and one ps.
KILLS = ["worker", "worker", "ps"]
WORKERS, SERVERS = 3, 2
MAX_RESTARTS = 3
BACKOFF = 0.5
ACCURACY_TOLERANCE = 0.01
# How long a run may take before the test gives up on it.
RUN_TIMEOUT = 75


def chaos_cluster(**sections):
    """The job both runs share: about 15 s of training on 2 cores."""
    return support.cluster(**sections,
        ps_hosts=("127.0.0.1",) * SERVERS, worker_hosts=("127.0.0.1",) * WORKERS,
        job="chaos", mode="async", model="mlp",
        data={"name": "synthetic", "synthetic_train": 6000, "synthetic_test": 1000},
        # A killed process is noticed within seconds: resends reach a ps that
        # restarted on its port; a worker silent for worker_timeout is absent
        # until its restart says hello.
        net={"heartbeat": 0.2, "worker_timeout": 4, "request_timeout": 6,
             "retry_interval": 0.5},
        train={"batch_size": 32, "epochs": 36, "eval_every": 0, "seed": 7,
               "on_worker_loss": "continue"},
        checkpoint={"every_s": 1, "keep": 3})


REPLICATED = {"replication": {"replicas": 2, "backup_silence": 1}}


class Run:
    """One tools/launch run in the background, its output in files."""

    def __init__(self, testcase, workspace, base, name, extra_args=()):
        self.run_dir = os.path.join(base, name)
        self.stdout_path = os.path.join(base, name + ".stdout")
        self.stderr_path = os.path.join(base, name + ".stderr")
        self.record_path = os.path.join(self.run_dir, "launch.json")
        self.started = time.monotonic()
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(support.TOOLS, "launch"), workspace.cluster,
                 "--run-dir", self.run_dir, "--max-restarts", str(MAX_RESTARTS),
                 "--restart-backoff", str(BACKOFF)] + list(extra_args),
                stdout=out, stderr=err, text=True, env=support.tool_env(), cwd=support.ROOT)
        testcase.addCleanup(self.cleanup)

    def elapsed(self):
        return time.monotonic() - self.started

    def record(self):
        """launch.json as it is now (it is replaced atomically), or None."""
        try:
            return support.read_json(self.record_path)
        except (OSError, ValueError):
            return None

    def all_pids(self):
        record = self.record() or {}
        return [a["pid"] for p in record.get("processes", []) for a in p.get("attempts", [])]

    def wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"tools/launch did not finish within {timeout} s\n"
                                 + self.tail())
        self.stdout = support.read_text(self.stdout_path)
        self.stderr = support.read_text(self.stderr_path)
        return self.proc.returncode

    def tail(self, lines=40):
        out = support.read_text(self.stdout_path).splitlines()
        err = support.read_text(self.stderr_path).splitlines()
        out = [line for line in out if " progress " not in line]
        return ("launcher stderr:\n" + "\n".join(err[-lines:]) +
                "\nlauncher stdout (last lines):\n" + "\n".join(out[-lines:]))

    def cleanup(self):
        """A failed test leaves nothing behind: the launcher and every
        pstrain it ever started."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.all_pids():
            if support.alive(pid) and support.is_pstrain(pid):
                os.kill(pid, signal.SIGKILL)

    def final_accuracy(self):
        found = re.findall(r"^\[worker0\] final test accuracy (\d+\.\d+)", self.stdout, re.M)
        return float(found[-1]) if found else None


def current_attempt(record, name):
    """(pid, attempt number) of `name`'s running attempt, or None while it is
    ended or waiting out its backoff."""
    for p in (record or {}).get("processes", []):
        if p["name"] == name and p["attempts"]:
            a = p["attempts"][-1]
            if "end" not in a and support.alive(a["pid"]) and support.is_pstrain(a["pid"]):
                return a["pid"], a["attempt"]
    return None


def has_checkpoint(run_dir, ps):
    return bool(glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*", f"ps{ps}.bin")))


class ChaosTest(unittest.TestCase):
    def setUp(self):
        support.require_binary(self)
        self.replicated = "replicated" in self._testMethodName
        self.w = support.Workspace(chaos_cluster(**(REPLICATED if self.replicated else {})))
        self.addCleanup(self.w.cleanup)
        # The run directories: CHAOS_KEEP=DIR keeps them in DIR.
        self.base = os.environ.get("CHAOS_KEEP") or self.w.path
        os.makedirs(self.base, exist_ok=True)

    def log(self, text):
        print(f"chaos: {text}", file=sys.stderr, flush=True)

    def test_async_run_survives_kills_of_workers_and_a_ps(self):
        self.chaos()

    def test_replicated_run_survives_kills_of_workers_and_a_ps_without_a_restore(self):
        self.chaos()

    def chaos(self):
        clean = Run(self, self.w, self.base, "clean")
        code = clean.wait(RUN_TIMEOUT)
        self.assertEqual(code, 0, "the clean run failed\n" + clean.tail())
        clean_wall = clean.elapsed()
        clean_accuracy = clean.final_accuracy()
        self.assertIsNotNone(clean_accuracy, "the clean run printed no final accuracy\n"
                             + clean.tail())
        self.log(f"clean run: {clean_wall:.1f} s, final accuracy {clean_accuracy:.4f}")

        # The schedule: one kill in each third of [15%, 60%] of the clean
        # run's wall time, so that each lands while the run trains.
        rng = random.Random(SEED)
        roles = KILLS[:]
        rng.shuffle(roles)
        lo, hi = 0.15 * clean_wall, 0.6 * clean_wall
        slot = (hi - lo) / len(roles)
        schedule = [(lo + i * slot + rng.uniform(0.1, 0.9) * slot, role, rng.random())
                    for i, role in enumerate(roles)]
        self.log(f"seed {SEED} (replay: CHAOS_SEED={SEED}); schedule: " + ", ".join(
            f"{role} at {t:.1f} s" for t, role, _ in schedule))

        chaos = Run(self, self.w, self.base, "chaos")
        kills = []
        for at, role, pick in schedule:
            kills.append(self.kill_one(chaos, at, role, pick))
        code = chaos.wait(RUN_TIMEOUT)
        record = chaos.record()
        self.log(f"chaos run: {chaos.elapsed():.1f} s, exit {code}, final accuracy "
                 f"{chaos.final_accuracy()}")
        context = (f"seed {SEED}, kills {json.dumps(kills)}\n" + chaos.tail())

        # Nothing of the run is left alive, whatever else went wrong.
        pids = chaos.all_pids()
        support.wait_for(lambda: not [p for p in pids if support.alive(p)], 10,
                         f"every process of the chaos run to end: {pids}")

        self.assertEqual(code, 0, "the chaos run failed\n" + context)
        self.assertEqual(record["exit_code"], 0, context)
        self.assertNotIn("lost", record, context)

        by_name = {p["name"]: p for p in record["processes"]}
        for kill in kills:
            name, pid = kill["name"], kill["pid"]
            attempts = by_name[name]["attempts"]
            killed = [a for a in attempts if a["pid"] == pid]
            self.assertEqual(len(killed), 1, f"{name}'s PID {pid} not in launch.json\n" + context)
            a = killed[0]
            self.assertEqual(a.get("exit"), -signal.SIGKILL, f"{name} attempt {a}\n" + context)
            self.assertEqual(a.get("signal"), "SIGKILL", context)
            self.assertIn("backoff", a, f"{name} was not restarted after the kill\n" + context)
            self.assertFalse(a.get("stopped"), context)
            self.assertGreater(len(attempts), a["attempt"],
                               f"no attempt of {name} after the kill\n" + context)
            restart = attempts[a["attempt"]]
            self.assertIn(f"launch: {name} was killed by signal 9 (SIGKILL); restart "
                          f"{a['attempt']} of {MAX_RESTARTS} (attempt {a['attempt'] + 1})",
                          chaos.stderr, context)
            self.assertIn(f"launch: {name} restarted (attempt {a['attempt'] + 1}, "
                          f"PID {restart['pid']})", chaos.stderr, context)
            if name.startswith("ps") and self.replicated:
                # Its backup held its shard and handed it back to the new
                # process, which serves it again.
                self.assertIn(f"hands {name[:2]} {name[2:]}'s shard",
                              support.read_text(os.path.join(chaos.run_dir, "ps0.log")), context)
                self.assertIn("re-joined", support.read_text(
                    os.path.join(chaos.run_dir, f"{name}.log")), context)
                # launch.json tells each step, by attempt: the new process
                # re-joined (and got ps 0's copy again); ps 0 handed back.
                steps = [e["event"] for e in restart.get("replication", [])]
                self.assertIn("rejoined", steps, f"{name} attempt {restart}\n" + context)
                self.assertIn("copy_received", steps, context)
                backup = [e["event"] for a in by_name["ps0"]["attempts"]
                          for e in a.get("replication", [])]
                self.assertIn("handed_back", backup, context)
            elif name.startswith("ps"):
                self.assertEqual(restart["command"][-2:], ["--restore", "latest"], context)
                # The restarted ps restored a checkpoint; it did not start fresh.
                restored = re.findall(rf"^\[{name}\] .*restored_from (\d+)", chaos.stdout, re.M)
                self.assertGreaterEqual(len(restored), 2, context)
                self.assertGreater(int(restored[a["attempt"]]), 0,
                                   f"{name} restarted without a checkpoint\n" + context)
                # ... and its log file (appended by every attempt) says so too.
                logged = re.findall(r"restored_from (\d+)", support.read_text(
                    os.path.join(chaos.run_dir, f"{name}.log")))
                self.assertEqual(logged, restored, context)
        # The kills were the only failures: no process failed because of
        # another's death (a worker giving up on a restarted ps, say). A ps
        # whose backup took its shard over while it starved exits PS_FENCED
        # to be restarted: no failure.
        killed_pids = {k["pid"] for k in kills}
        others = [f"{n} attempt {a['attempt']} exit {a.get('exit')}"
                  for n, p in by_name.items() for a in p["attempts"]
                  if a.get("exit") not in ((0, PS_FENCED) if n.startswith("ps") else (0,))
                  and a["pid"] not in killed_pids]
        self.assertEqual(others, [], "failures the test did not cause\n" + context)
        # Every process ended with 0 at last.
        self.assertEqual({n: p["exit"] for n, p in by_name.items()},
                         {n: 0 for n in by_name}, context)

        accuracy = chaos.final_accuracy()
        self.assertIsNotNone(accuracy, "the chaos run printed no final accuracy\n" + context)
        self.assertLessEqual(abs(accuracy - clean_accuracy), ACCURACY_TOLERANCE,
                             f"final accuracy {accuracy:.4f} against {clean_accuracy:.4f} "
                             "clean\n" + context)

    def kill_one(self, run, at, role, pick):
        """Sends SIGKILL, at `at` s into `run`, to a running process of
        `role` chosen by `pick` (in [0, 1)); a ps only once it has a
        checkpoint. Waits for a candidate if none runs at that moment (one
        restarting, say)."""
        while run.elapsed() < at:
            self.assertIsNone(run.proc.poll(), "the launcher ended before the kills\n"
                              + run.tail())
            time.sleep(0.05)
        count = SERVERS if role == "ps" else WORKERS
        order = [(int(pick * count) + k) % count for k in range(count)]
        if role == "ps" and self.replicated:
            order = [1]

        def target():
            if run.proc.poll() is not None:
                raise AssertionError("the launcher ended before the kills\n" + run.tail())
            record = run.record()
            for index in order:
                name = f"{role}{index}"
                if role == "ps" and not self.replicated and not has_checkpoint(run.run_dir, index):
                    continue
                current = current_attempt(record, name)
                if current:
                    return (name,) + current
            return None

        name, pid, attempt = support.wait_for(target, 30, f"a running {role} to kill")
        os.kill(pid, signal.SIGKILL)
        kill = {"name": name, "pid": pid, "attempt": attempt, "at": round(run.elapsed(), 2)}
        self.log(f"kill -9 {name} (PID {pid}, attempt {attempt}) at {kill['at']:.1f} s")
        return kill


if __name__ == "__main__":
    unittest.main()
