#!/usr/bin/python3
"""tools/compare and tools/report.py: a short async-versus-sync comparison
writes report.md and real PNGs; the report's numbers are checked on metrics
files written here, whose answers are known by construction."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import support

sys.path.insert(0, support.TOOLS)
import report  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TARGET = 0.3


def metrics(run_dir):
    """{worker index: training records}, eval records, final record."""
    train, evals, final = {}, [], None
    for path in glob.glob(os.path.join(run_dir, "worker*.metrics.jsonl")):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("event") == "eval":
                    evals.append(r)
                elif r.get("event") == "final":
                    final = r
                else:
                    train.setdefault(r["index"], []).append(r)
    return train, evals, final


def table_rows(markdown):
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[1] in ("async", "sync"):
            rows[cells[0]] = cells
    return rows


class CompareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.space = support.Workspace(support.cluster(
            data={"synthetic_train": 4000}, train={"eval_every": 300}))
        cls.out = os.path.join(cls.space.path, "cmp")
        if os.access(support.PSTRAIN, os.X_OK):
            cls.result = support.run_tool("compare", [
                cls.space.cluster, "--straggler", "worker1=3ms", "--target", str(TARGET),
                "--out", cls.out, "--set", "optimizer.lr=0.05"], timeout=240)

    @classmethod
    def tearDownClass(cls):
        cls.space.cleanup()

    def setUp(self):
        support.require_binary(self)

    def test_both_modes_ran_with_the_same_job_and_the_straggler(self):
        r = self.result
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        for mode in ("async", "sync"):
            cfg = support.read_json(os.path.join(self.out, mode, "launch.json"))
            self.assertEqual(cfg["mode"], mode)
            self.assertEqual(cfg["exit_code"], 0)
            resolved = support.read_text(os.path.join(self.out, mode, "cluster.yaml"))
            self.assertIn("straggler_worker: 1", resolved)
            self.assertIn("straggler_delay_ms: 3", resolved)
            self.assertIn("lr: 0.05", resolved)
        train, _, _ = metrics(os.path.join(self.out, "sync"))
        self.assertTrue(all("allreduce_ms" in r for rs in train.values() for r in rs))
        self.assertFalse(any("staleness" in r for rs in train.values() for r in rs))

    def test_the_report_covers_both_runs(self):
        # The numbers themselves are checked on constructed metrics
        # (ReportNumbersTest); here: one row per run, printed as written.
        rows = table_rows(support.read_text(os.path.join(self.out, "report.md")))
        self.assertEqual(sorted(rows), ["async", "sync"])
        self.assertEqual(table_rows(self.result.stdout), rows)
        self.assertEqual([rows[m][1] for m in ("async", "sync")], ["async", "sync"])
        self.assertNotEqual(rows["async"][6], "-", "async reports staleness")
        self.assertEqual(rows["sync"][6], "-", "sync has no staleness")

    def test_the_plots_are_real_images(self):
        import matplotlib.image
        text = support.read_text(os.path.join(self.out, "report.md"))
        names = ["accuracy_vs_time.png", "loss_vs_samples.png", "throughput_per_worker.png",
                 "staleness_histogram.png"]
        for name in names:
            path = os.path.join(self.out, name)
            self.assertIn(f"]({name})", text, f"report.md does not show {name}")
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), PNG_SIGNATURE, name)
            pixels = matplotlib.image.imread(path)
            self.assertGreaterEqual(pixels.shape[0], 200, name)
            self.assertGreaterEqual(pixels.shape[1], 300, name)
            # Axes, lines and labels: far more than a blank canvas's one colour.
            colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7].tolist()}
            self.assertGreater(len(colours), 20, f"{name} looks blank")

    def test_bad_arguments_are_named(self):
        r = support.run_tool("compare", [self.space.cluster, "--straggler", "worker1=fast"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--straggler: 'worker1=fast': expected workerN=DELAY", r.stderr)
        r = support.run_tool("compare", [self.space.cluster, "--target", "85"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--target: '85': expected an accuracy in (0, 1]", r.stderr)
        r = support.run_tool("compare", [self.space.cluster, "--out", self.out])
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"{self.out} is not empty", r.stderr)

    def test_sigterm_stops_the_comparison_and_its_processes(self):
        w = support.Workspace(support.cluster(train={"straggler_worker": 1,
                                                     "straggler_delay_ms": 200}))
        self.addCleanup(w.cleanup)
        compare = subprocess.Popen(
            [sys.executable, os.path.join(support.TOOLS, "compare"), w.cluster,
             "--out", os.path.join(w.path, "cmp")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=support.tool_env(), cwd=support.ROOT)
        self.addCleanup(lambda: compare.poll() is None and compare.kill())

        def started():
            found = support.pstrain_processes_under(compare.pid)
            return found if len(found) == 4 else None
        procs = support.wait_for(started, 20, "the async run's 4 pstrain processes")
        compare.send_signal(signal.SIGTERM)
        _, err = compare.communicate(timeout=30)
        self.assertEqual(compare.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("compare: SIGTERM received; stopped", err)
        self.assertFalse(os.path.exists(os.path.join(w.path, "cmp", "sync")),
                         "the sync run must not start after a signal")
        support.wait_for(lambda: not [p for p in procs if support.alive(p)
                                      and support.is_pstrain(p)], 10, "every process to end")

    def test_report_names_a_run_without_metrics(self):
        empty = os.path.join(self.space.path, "empty")
        os.makedirs(empty)
        with self.assertRaisesRegex(report.ReportError, "empty: no worker.*metrics.jsonl"):
            report.Run(empty)
        with open(os.path.join(empty, "worker0.metrics.jsonl"), "w") as f:
            f.write('{"time": 1, "index": 0}\nnot json\n')
        with self.assertRaisesRegex(report.ReportError, r"worker0.metrics.jsonl:2: not JSON"):
            report.Run(empty)



def train_record(time, step, local_samples, samples_per_s, **extra):
    return dict(time=time, step=step, local_samples=local_samples,
                samples_per_s=samples_per_s, global_samples=local_samples, loss=1.0, **extra)


def eval_record(time, eval_s, accuracy):
    return {"event": "eval", "time": time, "eval_s": eval_s, "test_accuracy": accuracy,
            "global_samples": 0}


def write_run(path, mode, workers, evals, final_accuracy, start, end):
    """A run directory as pstrain and tools/launch leave it: one metrics file
    per worker (worker 0's also holds the evaluations and the final one) and
    launch.json."""
    os.makedirs(path)
    for index, records in workers.items():
        lines = [dict(r, index=index) for r in records]
        if index == 0:
            lines += evals + [{"event": "final", "test_accuracy": final_accuracy}]
        with open(os.path.join(path, f"worker{index}.metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    with open(os.path.join(path, "launch.json"), "w") as f:
        json.dump({"mode": mode, "start": start, "end": end, "exit_code": 0}, f)


class ReportNumbersTest(unittest.TestCase):
    """tools/report.py on two constructed runs. Each metrics window is
    (samples since the last record) / samples_per_s seconds long, ending at
    the record's time:

    async, worker 0: windows 100/50 = 2 s (8..10), 200/100 = 2 s (11..13),
      100/25 = 4 s (13..17): 400 samples in 8 s of training, 50/s; it
      started at 8. Steps 10, 20, 10 at staleness 1, 2, 4 (max 2, 5, 3).
    async, worker 1: windows 200/100 = 2 s (7..9), 400/200 = 2 s (9..11):
      600 samples in 4 s, 150/s; it started at 7, the run's origin. Steps 4,
      6 at staleness 0.5, 3 (max 1, 7).
      Run: 1000 samples over the longest training time, 8 s: 125/s.
      Staleness by steps: (10 + 40 + 40 + 2 + 18) / 50 = 2.2; max 7.
      Evaluations (pulled at time - eval_s, minus the origin 7): 0.5 at 4,
      0.8 at 8.5, 0.7 at 12.5, 0.9 at 14.5. Wall time 112.5 - 100.
    sync, worker 0: 320/160 = 2 s (3..5), 320/160 = 2 s: 640 in 4 s, 160/s.
    sync, worker 1: 320/320 = 1 s (4..5), 320/80 = 4 s: 640 in 5 s, 128/s.
      Run: 1280 / 5 s = 256/s; origin 3; evaluation 0.76 at 7.5 - 0.5 - 3 = 4.
    """

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="pstrain-report-")
        cls.async_dir = os.path.join(cls.tmp.name, "async")
        cls.sync_dir = os.path.join(cls.tmp.name, "sync")
        stale = lambda mean, peak: {"staleness": mean, "max_staleness": peak}
        write_run(cls.async_dir, "async", {
            0: [train_record(10.0, 10, 100, 50.0, **stale(1.0, 2)),
                train_record(13.0, 30, 300, 100.0, **stale(2.0, 5)),
                train_record(17.0, 40, 400, 25.0, **stale(4.0, 3))],
            1: [train_record(9.0, 4, 200, 100.0, **stale(0.5, 1)),
                train_record(11.0, 10, 600, 200.0, **stale(3.0, 7))],
        }, evals=[eval_record(20.0, 0.5, 0.7), eval_record(12.0, 1.0, 0.5),
                  eval_record(22.0, 0.5, 0.9), eval_record(16.0, 0.5, 0.8)],
            final_accuracy=0.8125, start=100.0, end=112.5)
        write_run(cls.sync_dir, "sync", {
            0: [train_record(5.0, 10, 320, 160.0, allreduce_ms=3.0),
                train_record(7.0, 20, 640, 160.0, allreduce_ms=3.0)],
            1: [train_record(5.0, 10, 320, 320.0, allreduce_ms=3.0),
                train_record(9.0, 20, 640, 80.0, allreduce_ms=3.0)],
        }, evals=[eval_record(7.5, 0.5, 0.76)], final_accuracy=0.75, start=50.0, end=58.0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def summary(self, run_dir, target):
        return report.summarize(report.Run(run_dir), target)

    def test_async_run(self):
        s = self.summary(self.async_dir, 0.75)
        self.assertEqual(s["mode"], "async")
        self.assertEqual(s["workers"], 2)
        self.assertEqual(s["samples"], 1000)
        self.assertEqual(s["time_to_target_s"], 8.5)
        self.assertEqual(s["final_accuracy"], 0.8125)
        self.assertEqual(s["samples_per_s"], 125.0)
        self.assertEqual(s["samples_per_s_per_worker"], [50.0, 150.0])
        self.assertAlmostEqual(s["mean_staleness"], 2.2, places=12)
        self.assertEqual(s["max_staleness"], 7)
        self.assertEqual(s["wall_s"], 12.5)

    def test_sync_run(self):
        run = report.Run(self.sync_dir)
        self.assertTrue(run.synchronous)
        self.assertFalse(report.Run(self.async_dir).synchronous)
        s = report.summarize(run, 0.75)
        self.assertEqual(s["time_to_target_s"], 4.0)
        self.assertEqual(s["final_accuracy"], 0.75)
        self.assertEqual(s["samples"], 1280)
        self.assertEqual(s["samples_per_s"], 256.0)
        self.assertEqual(s["samples_per_s_per_worker"], [160.0, 128.0])
        self.assertIsNone(s["mean_staleness"])
        self.assertIsNone(s["max_staleness"])
        self.assertEqual(s["wall_s"], 8.0)

    def test_time_to_target_is_the_first_evaluation_at_or_above_it(self):
        self.assertEqual(self.summary(self.async_dir, 0.5)["time_to_target_s"], 4.0)
        self.assertEqual(self.summary(self.async_dir, 0.8)["time_to_target_s"], 8.5)
        self.assertEqual(self.summary(self.async_dir, 0.85)["time_to_target_s"], 14.5)
        self.assertIsNone(self.summary(self.async_dir, 0.95)["time_to_target_s"])

    def test_report_tool_writes_the_table_and_summary(self):
        out = os.path.join(self.tmp.name, "report")
        r = subprocess.run([sys.executable, os.path.join(support.TOOLS, "report.py"), out,
                            self.async_dir, self.sync_dir, "--target", "0.75"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), [
            "| run | mode | time to 75% (s) | final accuracy | samples/s | samples/s per worker "
            "| staleness mean / max | wall time (s) |",
            "|---|---|---|---|---|---|---|---|",
            "| async | async | 8.5 | 0.8125 | 125 | 50 150 | 2.20 / 7.00 | 12.5 |",
            "| sync | sync | 4.0 | 0.7500 | 256 | 160 128 | - | 8.0 |",
        ])
        self.assertIn(r.stdout, support.read_text(os.path.join(out, "report.md")))
        summaries = support.read_json(os.path.join(out, "summary.json"))
        self.assertEqual([(s["run"], s["samples_per_s"]) for s in summaries],
                         [("async", 125.0), ("sync", 256.0)])
        r = subprocess.run([sys.executable, os.path.join(support.TOOLS, "report.py"), out,
                            self.async_dir, "--target", "0.95"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| async | async | not reached | 0.8125 |", r.stdout)


if __name__ == "__main__":
    unittest.main()
