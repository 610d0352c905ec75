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
from unittest import mock

import support
from pstrain_tools import compare, report

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


class CtrCompareTest(unittest.TestCase):
    """tools/compare over a click model (DLRM on synthetic-ctr): the report
    speaks AUC, from the runs' own evaluations."""

    @classmethod
    def setUpClass(cls):
        cls.space = support.Workspace(support.cluster(
            model={"preset": "dlrm", "embedding_dim": 8, "bottom_mlp": [16], "top_mlp": [16]},
            optimizer={"name": "adam", "lr": 0.003, "sparse": {"name": "adagrad", "lr": 0.05}},
            data={"name": "synthetic-ctr", "synthetic_train": 20000, "synthetic_test": 4000,
                  "synthetic_ctr": {"vocab_scale": 0.001}},
            train={"batch_size": 128, "eval_every": 5000}))
        cls.out = os.path.join(cls.space.path, "cmp")
        if os.access(support.PSTRAIN, os.X_OK):
            cls.result = support.run_tool("compare", [
                cls.space.cluster, "--modes", "async,sync", "--target", "0.6",
                "--out", cls.out], timeout=240)

    @classmethod
    def tearDownClass(cls):
        cls.space.cleanup()

    def setUp(self):
        support.require_binary(self)

    def test_the_report_is_in_auc(self):
        r = self.result
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        summary = support.read_json(os.path.join(self.out, "summary.json"))
        self.assertEqual(summary["metric"], "auc")
        runs = {run["mode"]: run for run in summary["runs"]}
        self.assertEqual(sorted(runs), ["async", "sync"])
        for mode, run in runs.items():
            # Each run's final AUC is the one its worker 0 wrote, and learnt.
            _, _, final = metrics(os.path.join(self.out, mode))
            self.assertEqual(run["final_auc"], final["test_auc"], mode)
            self.assertGreater(run["final_auc"], 0.6, mode)
            self.assertIsNotNone(run["time_to_target_s"], mode)
        text = support.read_text(os.path.join(self.out, "report.md"))
        self.assertIn("time to AUC 0.6", text)
        self.assertIn("final AUC", text)
        self.assertIn("](auc_vs_time.png)", text)


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


def auc_eval_record(time, eval_s, accuracy, auc, logloss):
    """A click model's evaluation: its accuracy, AUC and log loss."""
    return dict(eval_record(time, eval_s, accuracy), test_auc=auc, test_logloss=logloss,
                test_loss=logloss)


def _stale(mean, peak):
    return {"staleness": mean, "max_staleness": peak}


# The training records of the two fake runs the report tests read (their
# docstrings work out what each implies).
ASYNC_STEPS = {
    0: [train_record(10.0, 10, 100, 50.0, **_stale(1.0, 2)),
        train_record(13.0, 30, 300, 100.0, **_stale(2.0, 5)),
        train_record(17.0, 40, 400, 25.0, **_stale(4.0, 3))],
    1: [train_record(9.0, 4, 200, 100.0, **_stale(0.5, 1)),
        train_record(11.0, 10, 600, 200.0, **_stale(3.0, 7))],
}
SYNC_STEPS = {
    0: [train_record(5.0, 10, 320, 160.0, allreduce_ms=3.0),
        train_record(7.0, 20, 640, 160.0, allreduce_ms=3.0)],
    1: [train_record(5.0, 10, 320, 320.0, allreduce_ms=3.0),
        train_record(9.0, 20, 640, 80.0, allreduce_ms=3.0)],
}


def write_run(path, mode, workers, evals, final_accuracy, start, end, final_extra=None):
    """A run directory as pstrain and tools/launch leave it: one metrics file
    per worker (worker 0's also holds the evaluations and the final one, with
    `final_extra`'s keys) and launch.json."""
    os.makedirs(path)
    for index, records in workers.items():
        lines = [dict(r, index=index) for r in records]
        if index == 0:
            lines += evals + [dict({"event": "final", "test_accuracy": final_accuracy},
                                   **(final_extra or {}))]
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
        write_run(cls.async_dir, "async", ASYNC_STEPS, evals=[eval_record(20.0, 0.5, 0.7), eval_record(12.0, 1.0, 0.5),
                  eval_record(22.0, 0.5, 0.9), eval_record(16.0, 0.5, 0.8)],
            final_accuracy=0.8125, start=100.0, end=112.5)
        write_run(cls.sync_dir, "sync", SYNC_STEPS, evals=[eval_record(7.5, 0.5, 0.76)], final_accuracy=0.75, start=50.0, end=58.0)

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

    def test_accuracy_bands_interpolate_the_runs_on_one_grid(self):
        # async's evaluations: 0.5 at 4, 0.8 at 8.5, 0.7 at 12.5, 0.9 at 14.5;
        # sync's one: 0.76 at 4, held to the end. The grid runs 4 to 14.5.
        group = report.Group("both", "", [report.Run(self.async_dir), report.Run(self.sync_dir)])
        grid, median, low, high = report.accuracy_bands(group)
        self.assertEqual((grid[0], grid[-1], len(grid)), (4.0, 14.5, 200))
        at = lambda t: int(round((t - 4.0) / 10.5 * 199))  # noqa: E731
        for t, async_acc in [(4.0, 0.5), (14.5, 0.9)]:
            i = at(t)
            self.assertAlmostEqual(low[i], min(async_acc, 0.76))
            self.assertAlmostEqual(high[i], max(async_acc, 0.76))
            self.assertAlmostEqual(median[i], (async_acc + 0.76) / 2)
        i = at(4.0 + 10.5 * 60 / 199)  # between 4 and 8.5: linear from 0.5 to 0.8
        expected = 0.5 + 0.3 * (grid[i] - 4.0) / 4.5
        self.assertAlmostEqual(low[i], min(expected, 0.76))
        self.assertAlmostEqual(high[i], max(expected, 0.76))

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
            "",
            "- **sync** reached the target soonest (4.0 s); its range overlaps no other mode's",
            "- **async** ended with the best final accuracy (0.8125); "
            "its range overlaps no other mode's",
        ])
        self.assertIn(r.stdout, support.read_text(os.path.join(out, "report.md")))
        summary = support.read_json(os.path.join(out, "summary.json"))
        self.assertEqual([(s["run"], s["samples_per_s"]) for s in summary["runs"]],
                         [("async", 125.0), ("sync", 256.0)])
        self.assertEqual([(w["column"], w["mode"]) for w in summary["winners"]],
                         [("time_to_target_s", "sync"), ("final_accuracy", "async")])
        r = subprocess.run([sys.executable, os.path.join(support.TOOLS, "report.py"), out,
                            self.async_dir, "--target", "0.95"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| async | async | not reached | 0.8125 |", r.stdout)

    def test_an_accuracy_job_reports_accuracy_as_before(self):
        # No test_auc in its evaluations: no AUC anywhere, the default
        # target 0.85, the accuracy plot.
        out = os.path.join(self.tmp.name, "report-accuracy")
        r = subprocess.run([sys.executable, os.path.join(support.TOOLS, "report.py"), out,
                            self.async_dir, self.sync_dir],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines()[:4], [
            "| run | mode | time to 85% (s) | final accuracy | samples/s | samples/s per worker "
            "| staleness mean / max | wall time (s) |",
            "|---|---|---|---|---|---|---|---|",
            "| async | async | 14.5 | 0.8125 | 125 | 50 150 | 2.20 / 7.00 | 12.5 |",
            "| sync | sync | not reached | 0.7500 | 256 | 160 128 | - | 8.0 |",
        ])
        self.assertIn("- **async** ended with the best final accuracy (0.8125)", r.stdout)
        text = support.read_text(os.path.join(out, "report.md"))
        for word in ("AUC", "auc", "logloss", "Click models"):
            self.assertNotIn(word, text)
        self.assertIn("## Test accuracy vs wall time\n\n"
                      "![Test accuracy vs wall time](accuracy_vs_time.png)", text)
        self.assertTrue(os.path.exists(os.path.join(out, "accuracy_vs_time.png")))
        self.assertFalse(os.path.exists(os.path.join(out, "auc_vs_time.png")))
        summary = support.read_json(os.path.join(out, "summary.json"))
        self.assertEqual(summary["metric"], "accuracy")
        self.assertEqual([(s["metric"], s["target"], s["final_accuracy"], s["final_auc"],
                           s["final_logloss"]) for s in summary["runs"]],
                         [("accuracy", 0.85, 0.8125, None, None),
                          ("accuracy", 0.85, 0.75, None, None)])
        self.assertEqual([(g["metric"], g["final_accuracy"]["median"], g["final_auc"],
                           g["final_logloss"]) for g in summary["groups"]],
                         [("accuracy", 0.8125, None, None), ("accuracy", 0.75, None, None)])
        self.assertEqual([w["column"] for w in summary["winners"]],
                         ["time_to_target_s", "final_accuracy"])


class AucReportTest(unittest.TestCase):
    """tools/report.py on a click model's runs, whose evaluations carry
    test_auc and test_logloss: the training records are ReportNumbersTest's
    (origins 7 and 3; 125 and 256 samples/s), the accuracy is high from the
    start (a click model's mostly-negative test split), the AUC is not.

    async: evaluations pulled at 4 (accuracy 0.97, no AUC: a test split of
      one class), 8.5 (AUC 0.74), 12.5 (0.76), 14.5 (0.79); final AUC
      0.785, log loss 0.4412, accuracy 0.971.
    sync: one evaluation at 4, AUC 0.77; final AUC 0.77, log loss 0.4523,
      accuracy 0.965.
    By accuracy both would reach 0.75 at 4 s; by AUC async gets there at
    12.5 s.
    """

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="pstrain-report-auc-")
        cls.async_dir = os.path.join(cls.tmp.name, "async")
        cls.sync_dir = os.path.join(cls.tmp.name, "sync")
        write_run(cls.async_dir, "async", ASYNC_STEPS, evals=[auc_eval_record(20.0, 0.5, 0.97, 0.76, 0.46),
                  eval_record(12.0, 1.0, 0.97),
                  auc_eval_record(22.0, 0.5, 0.97, 0.79, 0.45),
                  auc_eval_record(16.0, 0.5, 0.97, 0.74, 0.47)],
            final_accuracy=0.971, start=100.0, end=112.5,
            final_extra={"test_auc": 0.785, "test_logloss": 0.4412, "test_loss": 0.4412})
        write_run(cls.sync_dir, "sync", SYNC_STEPS, evals=[auc_eval_record(7.5, 0.5, 0.96, 0.77, 0.455)], final_accuracy=0.965,
            start=50.0, end=58.0,
            final_extra={"test_auc": 0.77, "test_logloss": 0.4523, "test_loss": 0.4523})

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def report_tool(self, name, *args):
        out = os.path.join(self.tmp.name, name)
        r = subprocess.run([sys.executable, os.path.join(support.TOOLS, "report.py"), out,
                            self.async_dir, self.sync_dir, *args],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out, r.stdout

    def test_time_to_target_is_the_first_evaluation_with_auc_at_or_above_it(self):
        run = report.Run(self.async_dir)
        self.assertTrue(run.has_auc)
        self.assertTrue(report.Run(self.sync_dir).has_auc)
        self.assertEqual([(t, v) for t, v, _ in run.eval_points("auc")],
                         [(8.5, 0.74), (12.5, 0.76), (14.5, 0.79)])
        at = lambda target: report.summarize(run, target)["time_to_target_s"]  # noqa: E731
        # The evaluation at 4 s has no AUC: it reaches no AUC target.
        self.assertEqual(at(0.6), 8.5)
        self.assertEqual(at(0.75), 12.5)
        self.assertEqual(at(0.78), 14.5)
        self.assertIsNone(at(0.8))
        s = report.summarize(run)
        self.assertEqual((s["metric"], s["target"], s["time_to_target_s"]), ("auc", 0.75, 12.5))
        self.assertEqual((s["final_auc"], s["final_logloss"], s["final_accuracy"]),
                         (0.785, 0.4412, 0.971))
        self.assertEqual(report.summarize(run, 0.75, "accuracy")["time_to_target_s"], 4.0)

    def test_report_tool_speaks_auc_with_the_default_target_0_75(self):
        out, stdout = self.report_tool("report")
        self.assertEqual(stdout.splitlines(), [
            "| run | mode | time to AUC 0.75 (s) | final AUC | final logloss | samples/s "
            "| samples/s per worker | staleness mean / max | wall time (s) |",
            "|---|---|---|---|---|---|---|---|---|",
            "| async | async | 12.5 | 0.7850 | 0.4412 | 125 | 50 150 | 2.20 / 7.00 | 12.5 |",
            "| sync | sync | 4.0 | 0.7700 | 0.4523 | 256 | 160 128 | - | 8.0 |",
            "",
            "- **sync** reached the target soonest (4.0 s); its range overlaps no other mode's",
            "- **async** ended with the best final AUC (0.7850); "
            "its range overlaps no other mode's",
        ])
        text = support.read_text(os.path.join(out, "report.md"))
        self.assertIn(stdout, text)
        self.assertIn("Click models", text)
        summary = support.read_json(os.path.join(out, "summary.json"))
        self.assertEqual(summary["metric"], "auc")
        self.assertEqual([(s["run"], s["metric"], s["target"], s["time_to_target_s"],
                           s["final_auc"], s["final_logloss"], s["final_accuracy"])
                          for s in summary["runs"]],
                         [("async", "auc", 0.75, 12.5, 0.785, 0.4412, 0.971),
                          ("sync", "auc", 0.75, 4.0, 0.77, 0.4523, 0.965)])
        self.assertEqual([(g["metric"], g["final_auc"]["median"], g["final_logloss"]["median"],
                           g["final_accuracy"]["median"]) for g in summary["groups"]],
                         [("auc", 0.785, 0.4412, 0.971), ("auc", 0.77, 0.4523, 0.965)])
        self.assertEqual([(w["column"], w["mode"]) for w in summary["winners"]],
                         [("time_to_target_s", "sync"), ("final_auc", "async")])

    def test_target_is_in_auc_units(self):
        _, stdout = self.report_tool("report-target", "--target", "0.78")
        self.assertIn("| time to AUC 0.78 (s) | final AUC | final logloss |", stdout)
        self.assertIn("| async | async | 14.5 | 0.7850 | 0.4412 |", stdout)
        self.assertIn("| sync | sync | not reached | 0.7700 | 0.4523 |", stdout)
        self.assertIn("- **async** reached the target soonest (14.5 s)", stdout)

    def test_the_plot_is_of_auc(self):
        out, _ = self.report_tool("report-plot")
        text = support.read_text(os.path.join(out, "report.md"))
        self.assertIn("## Test AUC vs wall time\n\n![Test AUC vs wall time](auc_vs_time.png)",
                      text)
        self.assertNotIn("Test accuracy vs wall time", text)
        self.assertFalse(os.path.exists(os.path.join(out, "accuracy_vs_time.png")))
        with open(os.path.join(out, "auc_vs_time.png"), "rb") as f:
            self.assertEqual(f.read(8), PNG_SIGNATURE)
        # The figure itself: its title, axis label and the AUC points.
        import matplotlib.figure
        seen = {}
        original = matplotlib.figure.Figure.savefig

        def record(fig, path, *args, **kwargs):
            ax = fig.axes[0]
            seen[os.path.basename(path)] = (ax.get_title(), ax.get_ylabel(),
                                            [list(line.get_ydata()) for line in ax.get_lines()])
            return original(fig, path, *args, **kwargs)
        runs = [report.Run(self.async_dir), report.Run(self.sync_dir)]
        plots_dir = os.path.join(self.tmp.name, "plots-only")
        os.makedirs(plots_dir)
        with mock.patch.object(matplotlib.figure.Figure, "savefig", record):
            files = report.plots(runs, plots_dir, metric="auc")
        self.assertEqual(files["Test AUC vs wall time"], "auc_vs_time.png")
        self.assertEqual(seen["auc_vs_time.png"][:2], ("Test AUC vs wall time", "test AUC"))
        self.assertEqual(seen["auc_vs_time.png"][2], [[0.74, 0.76, 0.79], [0.77]])

    def test_the_group_table_speaks_auc(self):
        a, s = report.Run(self.async_dir), report.Run(self.sync_dir)
        out = os.path.join(self.tmp.name, "report-groups")
        text = report.write([a, s, a], out, None, [], [report.Group("async", "w1", [a, a]),
                                                    report.Group("sync", "none", [s])])
        lines = text.splitlines()
        self.assertEqual(lines[:4], [
            "| straggler | mode | runs | time to AUC 0.75 (s) | final AUC | final logloss "
            "| samples/s | staleness mean / max |",
            "|---|---|---|---|---|---|---|---|",
            "| w1 | async | 2 | 12.5 | 0.7850 | 0.4412 | 125 | 2.20 / 7.00 |",
            "| none | sync | 1 | 4.0 | 0.7700 | 0.4523 | 256 | - |",
        ])
        self.assertIn("- with w1: **async** ended with the best final AUC (0.7850); "
                      "its range overlaps no other mode's", lines)
        self.assertTrue(os.path.exists(os.path.join(out, "auc_vs_time.png")))


class SpecTest(unittest.TestCase):
    """--modes and --straggler as compare reads them, without pstrain."""

    def test_modes_become_their_overrides(self):
        modes = compare.parse_modes("async,sync,ssp:1,ssp:4,backup:1,local:8")
        self.assertEqual([(m.spec, m.dir, m.overrides) for m in modes], [
            ("async", "async", ["mode=async"]),
            ("sync", "sync", ["mode=sync"]),
            ("ssp:1", "ssp-1", ["mode=ssp", "train.staleness_bound=1"]),
            ("ssp:4", "ssp-4", ["mode=ssp", "train.staleness_bound=4"]),
            ("backup:1", "backup-1", ["mode=backup", "train.backup_workers=1"]),
            ("local:8", "local-8", ["mode=local", "train.local_steps=8"]),
        ])
        self.assertEqual([m.spec for m in compare.parse_modes(" sync , ssp:0")], ["sync", "ssp:0"])

    def test_bad_modes_are_named(self):
        for text, message in [
                ("ssp:x", "'ssp:x': ssp needs a whole number staleness bound"),
                ("ssp", "'ssp': ssp needs a whole number staleness bound"),
                ("backup:-1", "'backup:-1': backup needs a whole number of backup workers"),
                ("local:1.5", "'local:1.5': local needs a whole number of local steps"),
                ("sync:2", "'sync:2': sync takes no parameter"),
                ("async,bsp", "'bsp': unknown mode; expected async, sync, ssp:S, backup:B or"),
                ("async,ssp:1,async", "async listed twice")]:
            with self.subTest(text):
                with self.assertRaises(compare.argparse.ArgumentTypeError) as caught:
                    compare.parse_modes(text)
                self.assertIn(message, str(caught.exception))
        r = support.run_tool("compare", ["cluster.yaml", "--modes", "ssp:x"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--modes: 'ssp:x': ssp needs a whole number staleness bound", r.stderr)

    def test_stragglers_become_their_overrides(self):
        rest = ["train.straggler_jitter_ms=0", "train.straggler_pause_probability=0",
                "train.straggler_pause_ms=0"]
        for text, label, overrides in [
                ("worker1=30ms", "worker1=30ms",
                 ["train.straggler_worker=1", "train.straggler_delay_ms=30"] + rest),
                ("worker0=0.5s", "worker0=500ms",
                 ["train.straggler_worker=0", "train.straggler_delay_ms=500"] + rest),
                ("worker1=30ms±20ms", "worker1=30ms±20ms",
                 ["train.straggler_worker=1", "train.straggler_delay_ms=30",
                  "train.straggler_jitter_ms=20", "train.straggler_pause_probability=0",
                  "train.straggler_pause_ms=0"]),
                ("worker1=30ms+-0.02s", "worker1=30ms±20ms",
                 ["train.straggler_worker=1", "train.straggler_delay_ms=30",
                  "train.straggler_jitter_ms=20", "train.straggler_pause_probability=0",
                  "train.straggler_pause_ms=0"]),
                ("worker*=5%:200ms", "worker*=5%:200ms",
                 ["train.straggler_worker=all", "train.straggler_delay_ms=0",
                  "train.straggler_jitter_ms=0", "train.straggler_pause_probability=0.05",
                  "train.straggler_pause_ms=200"]),
                ("none", "none", ["train.straggler_worker=-1"])]:
            with self.subTest(text):
                s = compare.parse_straggler(text)
                self.assertEqual((s.label, s.overrides), (label, overrides))
        dirs = [compare.parse_straggler(t).dir
                for t in ("worker1=30ms", "worker1=30ms±20ms", "worker*=5%:200ms", "none")]
        self.assertEqual(dirs, ["worker1-30ms", "worker1-30ms-pm20ms", "worker-all-5pct-200ms",
                                "none"])

    def test_bad_stragglers_are_named(self):
        for text in ("worker1=fast", "worker=30ms", "worker1=30", "worker1=30ms±",
                     "worker*=150%:200ms", "worker*=5%", "all=30ms"):
            with self.subTest(text):
                with self.assertRaises(compare.argparse.ArgumentTypeError) as caught:
                    compare.parse_straggler(text)
                self.assertIn(f"'{text}': expected workerN=DELAY, workerN=DELAY±JITTER, "
                              "workerN=P%:PAUSE", str(caught.exception))
        r = support.run_tool("compare", ["cluster.yaml", "--straggler", "none",
                                         "--straggler", "none"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--straggler: a setting is given twice", r.stderr)
        r = support.run_tool("compare", ["cluster.yaml", "--repeats", "0"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--repeats: '0': expected a whole number >= 1", r.stderr)

    def test_target_defaults_by_metric(self):
        # compare's --target is None until the runs say which metric;
        # report.write resolves it.
        self.assertEqual((report.default_target("accuracy"), report.default_target("auc")),
                         (0.85, 0.75))
        r = support.run_tool("compare", ["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(default 0.75)", " ".join(r.stdout.split()))


def run_summary(run, time_to_target, final, samples_per_s, staleness=None):
    return {"run": run, "time_to_target_s": time_to_target, "final_accuracy": final,
            "samples_per_s": samples_per_s, "mean_staleness": staleness and staleness[0],
            "max_staleness": staleness and staleness[1]}


def group_summary(mode, straggler, *summaries):
    return report.summarize_group(report.Group(mode, straggler, []), list(summaries))


class RepeatsTest(unittest.TestCase):
    """Medians, ranges and winners of repeated runs, on constructed summaries."""

    def test_spread_ranks_not_reached_last(self):
        self.assertEqual(report.spread([3.0, 1.0, 2.0]), {"median": 2.0, "min": 1.0, "max": 3.0})
        self.assertEqual(report.spread([4.0, 1.0]), {"median": 2.5, "min": 1.0, "max": 4.0})
        self.assertEqual(report.spread([None, 1.0, 2.0]),
                         {"median": 2.0, "min": 1.0, "max": None})
        # Half the runs not reaching it: the median falls on "not reached".
        self.assertEqual(report.spread([None, 1.0]), {"median": None, "min": 1.0, "max": None})
        self.assertIsNone(report.spread([]))

    def test_groups_take_medians_ranges_and_the_staleness(self):
        g = group_summary("async", "worker1=30ms",
                          run_summary("a", 2.2, 0.85, 1000, (0.5, 20)),
                          run_summary("b", 5.1, 0.86, 3000, (0.75, 24)),
                          run_summary("c", 3.0, 0.84, 2000, (1.5, 10)))
        self.assertEqual(g["time_to_target_s"], {"median": 3.0, "min": 2.2, "max": 5.1})
        self.assertEqual(g["final_accuracy"], {"median": 0.85, "min": 0.84, "max": 0.86})
        self.assertEqual(g["samples_per_s"], {"median": 2000, "min": 1000, "max": 3000})
        self.assertEqual((g["mean_staleness"], g["max_staleness"]), (0.75, 24))
        self.assertEqual(g["runs"], ["a", "b", "c"])
        sync = group_summary("sync", "", run_summary("s", 4.0, 0.9, 100))
        self.assertIsNone(sync["mean_staleness"])

    def test_overlap(self):
        r = lambda lo, hi: {"median": lo, "min": lo, "max": hi}  # noqa: E731
        self.assertTrue(report.overlaps(r(1, 3), r(2, 5)))
        self.assertTrue(report.overlaps(r(2, 5), r(1, 3)))
        self.assertTrue(report.overlaps(r(1, 3), r(3, 4)))
        self.assertFalse(report.overlaps(r(1, 2), r(2.5, 4)))
        self.assertFalse(report.overlaps(r(2.5, 4), r(1, 2)))
        self.assertTrue(report.overlaps(r(1, None), r(50, 60)))
        self.assertFalse(report.overlaps(r(1, 2), r(None, None)))

    def test_winners_are_named_with_their_overlaps(self):
        groups = [
            group_summary("async", "w1", run_summary("a1", 2.0, 0.85, 1),
                          run_summary("a2", 5.0, 0.86, 1)),
            group_summary("sync", "w1", run_summary("s1", 20.0, 0.87, 1),
                          run_summary("s2", 24.0, 0.88, 1)),
            group_summary("ssp:4", "w1", run_summary("p1", 3.0, 0.80, 1),
                          run_summary("p2", 4.5, 0.81, 1)),
            group_summary("local:8", "w1", run_summary("l1", None, 0.70, 1),
                          run_summary("l2", None, 0.71, 1)),
            group_summary("async", "none", run_summary("n1", 1.0, 0.85, 1),
                          run_summary("n2", None, 0.85, 1)),
            group_summary("sync", "none", run_summary("m1", 9.0, 0.86, 1),
                          run_summary("m2", 9.5, 0.87, 1)),
        ]
        named = {(w["straggler"], w["column"]): w for w in report.winners(groups)}
        self.assertEqual(sorted(named), [("none", "final_accuracy"), ("none", "time_to_target_s"),
                                         ("w1", "final_accuracy"), ("w1", "time_to_target_s")])
        soonest = named[("w1", "time_to_target_s")]
        # async's median 3.5 s beats ssp:4's 3.75 s, but [2, 5] holds [3, 4.5].
        self.assertEqual(soonest["mode"], "async")
        self.assertEqual(soonest["overlaps"], ["ssp:4"])
        self.assertEqual(soonest["text"],
                         "with w1: **async** reached the target soonest (median 3.5 s, range "
                         "2.0-5.0 s); not a clear winner: ranges overlap with ssp:4")
        best = named[("w1", "final_accuracy")]
        self.assertEqual((best["mode"], best["overlaps"]), ("sync", []))
        self.assertEqual(best["text"],
                         "with w1: **sync** ended with the best final accuracy (median 0.8750, "
                         "range 0.8700-0.8800); its range overlaps no other mode's")
        # One of async's two runs never reached it: its median is "not
        # reached", ranked after sync's 9.25 s, though its range overlaps.
        unstraggled = named[("none", "time_to_target_s")]
        self.assertEqual((unstraggled["mode"], unstraggled["overlaps"]), ("sync", ["async"]))
        self.assertIn("not a clear winner: ranges overlap with async", unstraggled["text"])

    def test_the_group_table(self):
        groups = [group_summary("async", "worker1=30ms", run_summary("a1", 2.0, 0.85, 1000,
                                                                    (0.5, 20)),
                                run_summary("a2", None, 0.86, 3000, (1.0, 24))),
                  group_summary("sync", "worker1=30ms", run_summary("s1", 20.0, 0.87, 500),
                                run_summary("s2", 20.0, 0.87, 500))]
        self.assertEqual(report.group_table(groups, 0.85).splitlines(), [
            "| straggler | mode | runs | time to 85% (s) | final accuracy | samples/s "
            "| staleness mean / max |",
            "|---|---|---|---|---|---|---|",
            "| worker1=30ms | async | 2 | not reached [2.0-not reached] | 0.8550 [0.8500-0.8600] "
            "| 2000 [1000-3000] | 0.75 / 24.00 |",
            "| worker1=30ms | sync | 2 | 20.0 | 0.8700 | 500 | - |",
        ])


def recomputed(run_dir, target):
    """(time to target or None, final accuracy, samples/s) from a run's
    metrics files, worked out here rather than by tools/report.py."""
    train, evals, final = metrics(run_dir)
    starts, longest, samples = [], 0.0, 0
    for records in train.values():
        records.sort(key=lambda r: r["time"])
        seconds, prev = 0.0, 0
        for r in records:
            seconds += (r["local_samples"] - prev) / r["samples_per_s"]
            prev = r["local_samples"]
        first = records[0]
        starts.append(first["time"] - first["local_samples"] / first["samples_per_s"])
        longest = max(longest, seconds)
        samples += records[-1]["local_samples"]
    origin = min(starts)
    reached = [e["time"] - e["eval_s"] - origin
               for e in sorted(evals, key=lambda e: e["time"]) if e["test_accuracy"] >= target]
    return (reached[0] if reached else None), final["test_accuracy"], samples / longest


class RepeatedCompareTest(unittest.TestCase):
    """A short real comparison with --repeats 2: each mode runs with seeds 42
    and 43, and the table's medians and ranges are those of the runs'
    metrics files."""

    @classmethod
    def setUpClass(cls):
        cls.space = support.Workspace(support.cluster(train={"eval_every": 400}))
        cls.out = os.path.join(cls.space.path, "cmp")
        if os.access(support.PSTRAIN, os.X_OK):
            cls.result = support.run_tool("compare", [
                cls.space.cluster, "--modes", "async,sync", "--repeats", "2",
                "--target", str(TARGET), "--out", cls.out, "--set", "optimizer.lr=0.05"],
                timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.space.cleanup()

    def setUp(self):
        support.require_binary(self)

    def test_every_mode_ran_with_the_same_seeds(self):
        r = self.result
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        for mode in ("async", "sync"):
            for seed in (42, 43):
                run_dir = os.path.join(self.out, mode, f"seed{seed}")
                self.assertEqual(support.read_json(os.path.join(run_dir, "launch.json"))["mode"],
                                 mode)
                resolved = support.read_text(os.path.join(run_dir, "cluster.yaml"))
                self.assertIn(f"seed: {seed}\n", resolved)

    def test_the_table_gives_the_runs_medians_and_ranges(self):
        text = support.read_text(os.path.join(self.out, "report.md"))
        self.assertIn(text[text.index("| straggler |"):text.index("\n\n", text.index(
            "| straggler |"))], self.result.stdout)
        rows = {}
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| - |"):
                rows[cells[1]] = cells
        self.assertEqual(sorted(rows), ["async", "sync"])
        summary = support.read_json(os.path.join(self.out, "summary.json"))
        for mode in ("async", "sync"):
            runs = [recomputed(os.path.join(self.out, mode, f"seed{s}"), TARGET)
                    for s in (42, 43)]
            times = sorted(t if t is not None else float("inf") for t, _, _ in runs)
            finals = sorted(f for _, f, _ in runs)
            rates = sorted(r for _, _, r in runs)

            def cell(values, spec):
                shown = ["not reached" if v == float("inf") else format(v, spec)
                         for v in values]
                median = (values[0] + values[1]) / 2
                median = "not reached" if median == float("inf") else format(median, spec)
                return median if shown[0] == shown[1] and values[0] == values[1] \
                    else f"{median} [{shown[0]}-{shown[1]}]"
            with self.subTest(mode):
                self.assertEqual(rows[mode][2], "2")
                self.assertEqual(rows[mode][3], cell(times, ".1f"))
                self.assertEqual(rows[mode][4], cell(finals, ".4f"))
                self.assertEqual(rows[mode][5], cell(rates, ".0f"))
                group = next(g for g in summary["groups"] if g["mode"] == mode)
                self.assertAlmostEqual(group["final_accuracy"]["median"], sum(finals) / 2)
        self.assertEqual(sorted(w["column"] for w in summary["winners"]),
                         ["final_accuracy", "time_to_target_s"])
        for w in summary["winners"]:
            self.assertIn(f"- {w['text']}", text)

    def test_the_accuracy_plot_is_an_image(self):
        import matplotlib.image
        pixels = matplotlib.image.imread(os.path.join(self.out, "accuracy_vs_time.png"))
        colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7].tolist()}
        self.assertGreater(len(colours), 20, "accuracy_vs_time.png looks blank")

if __name__ == "__main__":
    unittest.main()
