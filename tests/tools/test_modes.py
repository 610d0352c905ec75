#!/usr/bin/python3
"""The consistency modes between async and sync (docs/modes.md), each
training the default job under tools/launch: ssp keeps every applied update
within its staleness bound with a straggler (as the servers' logs record
it), backup keeps stepping while a worker is stopped with SIGSTOP and drops
late gradients, local SGD trains; each reaches 85%."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest


import support

TARGET_ACCURACY = 0.85
RUN_DEADLINE_S = 240


class Run:
    """tools/launch of `doc` (with `overrides`) in a temporary run directory,
    started; wait() ends it."""

    def __init__(self, testcase, doc, *overrides):
        tmp = tempfile.TemporaryDirectory(prefix="pstrain-modes-")
        testcase.addCleanup(tmp.cleanup)
        w = support.Workspace(doc)
        testcase.addCleanup(w.cleanup)
        self.run_dir = os.path.join(tmp.name, "run")
        args = [w.cluster, "--run-dir", self.run_dir, "--max-restarts", "0"]
        for o in overrides:
            args += ["--set", o]
        self.out = open(os.path.join(tmp.name, "launch.out"), "w+")
        self.popen = subprocess.Popen(
            [sys.executable, os.path.join(support.TOOLS, "launch")] + args,
            stdout=self.out, stderr=subprocess.STDOUT, env=support.tool_env(),
            cwd=support.ROOT, start_new_session=True)
        testcase.addCleanup(self.kill)

    def kill(self):
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        self.out.close()

    def wait(self):
        code = self.popen.wait(RUN_DEADLINE_S)
        self.out.seek(0)
        self.text = self.out.read()
        return code

    def accuracy(self):
        found = re.findall(r"final test accuracy (\d+\.\d+)", self.text)
        return float(found[-1]) if found else None

    def ps_log(self, index):
        return support.read_text(os.path.join(self.run_dir, f"ps{index}.log"))

    def worker_pid(self, index):
        """The PID of worker `index`, once it runs."""
        def find():
            for pid, argv in support.pstrain_processes_under(self.popen.pid).items():
                if "--role" in argv and argv[argv.index("--role") + 1] == "worker" and \
                        argv[argv.index("--index") + 1] == str(index):
                    return pid
            return None
        return support.wait_for(find, 60, f"worker {index} to start")

    def global_samples(self):
        """Worker 0's latest global sample count, from its metrics lines."""
        path = os.path.join(self.run_dir, "worker0.metrics.jsonl")
        if not os.path.exists(path):
            return 0
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        return lines[-1]["global_samples"] if lines else 0


class ModesTest(unittest.TestCase):
    def setUp(self):
        support.require_binary(self)

    def finished(self, run):
        code = run.wait()
        self.assertEqual(code, 0, run.text[-4000:])
        accuracy = run.accuracy()
        self.assertIsNotNone(accuracy, run.text[-4000:])
        return accuracy

    def test_ssp_keeps_every_update_within_the_bound(self):
        # Worker 1 lags 5 ms a step, so worker 0 would run ahead unboundedly
        # in async mode; under ssp:1 the servers hold its pulls.
        run = Run(self, support.default_job(), "mode=ssp", "train.staleness_bound=1",
                  "train.straggler_worker=1", "train.straggler_delay_ms=5")
        accuracy = self.finished(run)
        print(f"ssp:1, worker 1 +5 ms: final test accuracy {accuracy:.4f}", file=sys.stderr)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY)
        for ps in range(2):
            found = re.findall(r"mode ssp: the largest staleness of an applied update was "
                               r"(\d+) steps \(train.staleness_bound 1\)", run.ps_log(ps))
            self.assertEqual(len(found), 1, run.ps_log(ps)[-2000:])
            self.assertLessEqual(int(found[0]), 1, f"ps {ps}")

    def test_backup_steps_on_while_a_worker_is_stopped(self):
        doc = support.default_job(lr_scaling=True)
        doc["workers"]["count"] = 3
        run = Run(self, doc, "mode=backup", "train.backup_workers=1",
                  "net.worker_timeout=30")
        stopped = run.worker_pid(2)
        support.wait_for(lambda: run.global_samples() > 20000, 120, "training under way")
        os.kill(stopped, signal.SIGSTOP)
        try:
            before = run.global_samples()
            time.sleep(3)
            # The other two went on: their steps need 3 - 1 gradients.
            during = run.global_samples()
        finally:
            os.kill(stopped, signal.SIGCONT)
        self.assertGreater(during, before + 3000, "steps stalled while worker 2 was stopped")
        accuracy = self.finished(run)
        print(f"backup:1 of 3 workers, worker 2 stopped 3 s: final test accuracy "
              f"{accuracy:.4f}", file=sys.stderr)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY)
        dropped = 0
        for ps in range(2):
            found = re.findall(r"mode backup: (\d+) chunk steps applied, (\d+) late gradients "
                               r"dropped", run.ps_log(ps))
            self.assertEqual(len(found), 1, run.ps_log(ps)[-2000:])
            self.assertGreater(int(found[0][0]), 0)
            dropped += int(found[0][1])
        self.assertGreater(dropped, 0, "worker 2's late gradients were not dropped")

    def test_local_sgd_trains(self):
        run = Run(self, support.default_job(), "mode=local", "train.local_steps=8")
        accuracy = self.finished(run)
        print(f"local:8: final test accuracy {accuracy:.4f}", file=sys.stderr)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY)
        self.assertIn("local SGD: weights averaged every 8 steps", run.text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
