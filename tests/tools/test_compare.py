#!/usr/bin/python3
"""tools/compare and tools/report.py: a short async-versus-sync comparison
writes report.md and real PNGs, and every number of its table can be
recomputed from the runs' metrics files."""

import glob
import json
import os
import signal
import subprocess
import sys
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


def expected_row(run_dir):
    """The table's numbers, straight from the metrics, as the report
    defines them."""
    train, evals, final = metrics(run_dir)
    per_worker, train_s, start = {}, {}, {}
    for i, records in train.items():
        records.sort(key=lambda r: r["time"])
        seconds, prev = 0.0, 0
        for r in records:
            seconds += (r["local_samples"] - prev) / r["samples_per_s"]
            prev = r["local_samples"]
        train_s[i] = seconds
        per_worker[i] = records[-1]["local_samples"] / seconds
        start[i] = records[0]["time"] - records[0]["local_samples"] / records[0]["samples_per_s"]
    origin = min(start.values())
    reached = sorted(e["time"] - e["eval_s"] - origin for e in evals
                     if e["test_accuracy"] >= TARGET)
    stale_sum = stale_steps = 0
    stale_max = None
    for records in train.values():
        prev = 0
        for r in records:
            if "staleness" in r:
                stale_sum += r["staleness"] * (r["step"] - prev)
                stale_steps += r["step"] - prev
                stale_max = max(stale_max or 0.0, r["max_staleness"])
            prev = r["step"]
    launch = support.read_json(os.path.join(run_dir, "launch.json"))
    return {
        "time": reached[0] if reached else None,
        "final": final["test_accuracy"],
        "rate": sum(r[-1]["local_samples"] for r in train.values()) / max(train_s.values()),
        "per_worker": [per_worker[i] for i in sorted(per_worker)],
        "staleness": (stale_sum / stale_steps, stale_max) if stale_steps else None,
        "wall": launch["end"] - launch["start"],
    }


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

    def test_the_report_table_matches_the_metrics(self):
        text = support.read_text(os.path.join(self.out, "report.md"))
        rows = table_rows(text)
        self.assertEqual(sorted(rows), ["async", "sync"])
        # The printed table is the report's.
        self.assertEqual(table_rows(self.result.stdout), rows)
        for mode, cells in rows.items():
            want = expected_row(os.path.join(self.out, mode))
            if want["time"] is None:
                self.assertEqual(cells[2], "not reached")
            else:
                self.assertAlmostEqual(float(cells[2]), want["time"], delta=0.051)
            self.assertAlmostEqual(float(cells[3]), want["final"], delta=0.00006)
            self.assertAlmostEqual(float(cells[4]), want["rate"], delta=0.51)
            got = [float(x) for x in cells[5].split()]
            self.assertEqual(len(got), 2)
            for g, w in zip(got, want["per_worker"]):
                self.assertAlmostEqual(g, w, delta=0.51)
            if want["staleness"] is None:
                self.assertEqual(cells[6], "-")
            else:
                mean, peak = (float(x) for x in cells[6].split(" / "))
                self.assertAlmostEqual(mean, want["staleness"][0], delta=0.0051)
                self.assertAlmostEqual(peak, want["staleness"][1], delta=0.0051)
            self.assertAlmostEqual(float(cells[7]), want["wall"], delta=0.051)
        self.assertEqual(rows["async"][1], "async")
        self.assertNotEqual(rows["async"][6], "-", "async reports staleness")

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


if __name__ == "__main__":
    unittest.main()
