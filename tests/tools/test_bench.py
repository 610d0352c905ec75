#!/usr/bin/python3
"""tools/bench: its arguments, its table and JSON on constructed rows, --diff
of two constructed runs, and short real runs: bench_ps beside raw ZeroMQ, and
bench_compute beside PyTorch, with PyTorch hidden (its row then says "not
installed") and, where it is installed, present; both kernel libraries of
the CPU backend; the PyTorch RPC parameter server peer on its own."""

import ast
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

import support
from pstrain_tools import bench

BENCH = os.path.join(support.TOOLS, "bench")


def run(*args, env=None):
    return subprocess.run([sys.executable, BENCH, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=120)


@contextlib.contextmanager
def without_torch():
    """An environment whose PyTorch fails to import (a torch package ahead of
    the real one), so only pstrain's rows are timed and peers read "not
    installed"."""
    with tempfile.TemporaryDirectory() as hide:
        os.mkdir(os.path.join(hide, "torch"))
        with open(os.path.join(hide, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('hidden by test_bench')\n")
        yield dict(os.environ, PYTHONPATH=hide)


def torch_importable():
    return subprocess.run([sys.executable, "-c", "import torch"],
                          stderr=subprocess.DEVNULL).returncode == 0


def result(rows, machine="Test CPU"):
    return {"version": 1, "command": "tools/bench", "machine": machine, "cores": 2,
            "started": "2024-01-01 00:00:00", "quick": True, "reps": 3, "rows": rows}


class Arguments(unittest.TestCase):
    def test_bad_arguments_are_usage_errors(self):
        for args in (["--reps", "0"], ["--diff", "only-one.json"], ["--only", "no such bench"],
                     ["--frobnicate"]):
            with self.subTest(args=args):
                p = run(*args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn("usage", p.stderr)


class Rows(unittest.TestCase):
    def test_ratio_is_ours_over_peer_of_the_medians(self):
        r = bench.row("compute mlp", [3.0, 1.0, 2.0], [4.0, 8.0, 1.0], "PyTorch", "ok")
        self.assertEqual(r["ours_stats"], {"min": 1.0, "median": 2.0, "max": 3.0})
        self.assertEqual(r["peer_stats"], {"min": 1.0, "median": 4.0, "max": 8.0})
        self.assertAlmostEqual(r["ratio"], 0.5)
        self.assertEqual(r["unit"], "samples/s")
        self.assertEqual(bench.row("ps push 4 KiB, 1 ps", [1.0], [1.0], "raw ZeroMQ", "ok")["unit"],
                         "GB/s")

    def test_table_states_direction_and_a_missing_peer(self):
        text = bench.table(result([
            bench.row("compute mlp", [150000.0, 100000.0], [50000.0], "PyTorch", "ok"),
            bench.row("compute cnn", [4000.0], None, "PyTorch", "not installed")]))
        lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
        self.assertIn("2.50x (higher is better)", lines["compute mlp"])
        self.assertIn("125,000 (100,000-150,000)", lines["compute mlp"])
        self.assertIn("not installed", lines["compute cnn"])
        self.assertIn("Test CPU", text)

    def test_a_target_not_reached_has_no_ratio(self):
        inf = float("inf")
        never = bench.row("time to 88%, cnn", [30.0, 28.0, inf], [inf, inf], "DDP", "ok")
        self.assertIsNone(never["ratio"])
        ours_late = bench.row("time to 88%, cnn", [inf, inf, 5.0], [6.0], "DDP", "ok")
        self.assertIsNone(ours_late["ratio"])  # median not reached
        text = bench.table(result([never, ours_late]))
        first, second = [line for line in text.splitlines() if line.startswith("| time to")]
        self.assertIn("| not reached in any rep | - |", first)
        self.assertIn("30 (28-not reached)", first)
        self.assertIn("not reached (5-not reached)", second)

    def test_diff_compares_medians_and_ratios_row_by_row(self):
        a = result([bench.row("compute mlp", [100.0], [50.0], "PyTorch", "ok"),
                    bench.row("sync mlp", [10.0], None, "PyTorch", "not installed")], "CPU A")
        b = result([bench.row("compute mlp", [150.0], [50.0], "PyTorch", "ok"),
                    bench.row("ps pull 4 KiB, 1 ps", [1.0], [2.0], "raw ZeroMQ", "ok")], "CPU B")
        with tempfile.TemporaryDirectory() as tmp:
            paths = [os.path.join(tmp, n) for n in ("a.json", "b.json")]
            for path, r in zip(paths, (a, b)):
                with open(path, "w") as f:
                    json.dump(r, f)
            p = run("--diff", *paths)
        self.assertEqual(p.returncode, 0, p.stderr)
        cells = {line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")]
                 for line in p.stdout.splitlines() if line.startswith("| ")}
        self.assertEqual(cells["compute mlp"][1:], ["100", "150", "1.50x", "2.00x", "3.00x"])
        self.assertEqual(cells["sync mlp"][3:], ["only in A", "-", "-"])
        self.assertEqual(cells["ps pull 4 KiB, 1 ps"][3:], ["only in B", "-", "0.50x"])
        self.assertIn("CPU A", p.stdout)
        self.assertIn("CPU B", p.stdout)


class QuickRuns(unittest.TestCase):
    def run_json(self, *args, env=None):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "run.json")
            p = run("--quick", "--out", out, *args, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                return json.load(f), p.stdout

    def test_ps_beside_raw_zeromq(self):
        r, text = self.run_json("--only", "^ps$", "--reps", "2")
        rows = [row for row in r["rows"] if "memcpy" not in row["name"]]
        names = [row["name"] for row in rows]
        self.assertEqual(len(names), 12)  # 3 operations x 4 KiB, 64 KiB x 1 and 2 ps
        self.assertIn("ps push_pull 64 KiB, 2 ps", names)
        # The limit beside them, a memcpy of each size, with no peer.
        limits = [row for row in r["rows"] if "memcpy" in row["name"]]
        self.assertEqual([row["name"] for row in limits],
                         ["ps memcpy 4 KiB (a copy's limit)", "ps memcpy 64 KiB (a copy's limit)"])
        self.assertTrue(all(v > 0 for row in limits for v in row["ours"]) and
                        all(row["peer"] is None for row in limits))
        # A push's row names what the optimizer's apply cost.
        self.assertIn("of which the SGD apply", text)
        for row in rows:
            self.assertEqual(row["peer_name"], "raw ZeroMQ")
            self.assertEqual(len(row["ours"]), 2)
            self.assertEqual(len(row["peer"]), 2)
            self.assertTrue(all(v > 0 for v in row["ours"] + row["peer"]))
            self.assertAlmostEqual(row["ratio"],
                                   row["ours_stats"]["median"] / row["peer_stats"]["median"])
        self.assertIn("| ps pull 4 KiB, 1 ps | GB/s |", text)

    def test_compute_without_pytorch_says_not_installed(self):
        with without_torch() as env:
            r, text = self.run_json("--only", "compute mlp", "--reps", "1", env=env)
        self.assertEqual(len(r["rows"]), 2)  # oneDNN and OpenBLAS kernels
        for row in r["rows"]:
            self.assertEqual(row["peer_status"], "not installed")
            self.assertIsNone(row["peer"])
            self.assertIsNone(row["ratio"])
            self.assertEqual(len(row["ours"]), 1)
            self.assertGreater(row["ours"][0], 0)
        self.assertIn("not installed", text)

    def test_compute_on_both_kernel_libraries(self):
        with without_torch() as env:
            r, text = self.run_json("--only", "compute cnn", "--reps", "1",
                                    env=env)
        self.assertEqual([row["name"] for row in r["rows"]],
                         ["compute cnn, 1 thread, batch 64",
                          "compute cnn, 1 thread, batch 64, OpenBLAS kernels"])
        for row in r["rows"]:
            self.assertEqual(len(row["ours"]), 1)
            self.assertGreater(row["ours"][0], 0)
        self.assertIn("| compute cnn, 1 thread, batch 64, OpenBLAS kernels |", text)

    def test_async_rows_launch_the_default_job_with_the_overrides(self):
        with without_torch() as env, tempfile.TemporaryDirectory() as traces:
            r, text = self.run_json("--only", "^async mlp$", "--reps", "1",
                                    "--set", "net.wire_dtype=bf16", "--trace", traces, env=env)
            # --trace kept each launched run's timeline: the warm-up's and the rep's.
            kept = sorted(os.listdir(traces))
            self.assertEqual(len(kept), 2, kept)
            for name in kept:
                with open(os.path.join(traces, name)) as f:
                    self.assertIn("traceEvents", json.load(f))
            # The override reaches the launched run: one it refuses fails the bench.
            bad = run("--quick", "--only", "^async mlp$", "--reps", "1",
                      "--set", "net.wire_dtype=int8", env=env)
        [row] = r["rows"]
        self.assertTrue(row["name"].startswith("async mlp, 2 ps + 2 workers vs DDP 2x1"))
        self.assertEqual(row["unit"], "samples/s")
        self.assertGreater(row["ours"][0], 0)
        self.assertEqual(row["peer_status"], "not installed")
        self.assertEqual(r["sets"], ["net.wire_dtype=bf16"])
        self.assertIn("--set net.wire_dtype=bf16", text)
        self.assertNotEqual(bad.returncode, 0)

    @unittest.skipUnless(torch_importable(), "PyTorch (python3-torch) not installed")
    def test_compute_beside_pytorch(self):
        r, _ = self.run_json("--only", "compute mlp", "--reps", "1")
        self.assertEqual(len(r["rows"]), 2)  # oneDNN and OpenBLAS kernels
        for row in r["rows"]:
            self.assertEqual(row["peer_status"], "ok")
            self.assertEqual(len(row["peer"]), 1)
            self.assertGreater(row["peer"][0], 0)
            self.assertGreater(row["ratio"], 0)


class RpcParameterServer(unittest.TestCase):
    def rpcps(self, *args, env=None):
        return subprocess.run([sys.executable, bench.TORCH_PEER, "rpcps",
                               "--data", bench.FASHION_MNIST, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=120)

    def test_without_pytorch_exits_as_not_installed(self):
        with without_torch() as env:
            p = self.rpcps(env=env)
        self.assertEqual(p.returncode, bench.NOT_INSTALLED, p.stderr)

    @unittest.skipUnless(torch_importable(), "PyTorch (python3-torch) not installed")
    @unittest.skipUnless(os.path.isdir(bench.FASHION_MNIST), "Fashion-MNIST not installed")
    def test_trains_until_the_target_is_reached(self):
        # Target 0: the first evaluation reaches it, after 128 samples, and the
        # trainers stop well before the 0.1 epoch (2 x 46 steps of 64) is done.
        p = self.rpcps("--epochs", "0.1", "--eval-every", "128", "--target", "0")
        self.assertEqual(p.returncode, 0, p.stderr)
        [r] = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        self.assertEqual(r["bench"], "rpcps")
        self.assertGreater(r["samples_per_s"], 0)
        self.assertGreater(r["seconds"], 0)
        self.assertGreaterEqual(r["samples"], 128)
        self.assertLess(r["samples"], 2 * 46 * 64)
        assert_ran_the_faster_way(self, r)


def assert_ran_the_faster_way(test, result):
    """A bench_torch.py result measured both ways of clearing gradients and
    ran the faster one."""
    rates = result["zero_grad_rates"]
    test.assertEqual(sorted(rates), ["none", "zeros"], "the peer did not measure both ways")
    test.assertTrue(all(v > 0 for v in rates.values()), rates)
    test.assertEqual(result["zero_grad"], max(rates, key=rates.get),
                     f"the peer ran zero_grad {result['zero_grad']!r}, measured slower: {rates}")


class PeersAtTheirBest(unittest.TestCase):
    """A peer is only worth beating at its best: no PyTorch peer runs a
    setting measurably slower than another its users could choose. The one
    such setting here is how a step clears gradients (zero_grad's
    set_to_none: a fresh allocation each step, or zeroing in place)."""

    PEERS = ("bench_torch.py", "bench_torch_ctr.py", "bench_torch_embedding.py")

    def test_no_peer_fixes_how_gradients_are_cleared(self):
        # Every zero_grad call takes the way its script measured or was told,
        # except where the gradients are sparse (zeroing a sparse gradient in
        # place keeps its indices and grows it: freeing is the only sane way),
        # said on the call's line.
        for script in self.PEERS:
            path = os.path.join(os.path.dirname(bench.TORCH_PEER), script)
            with open(path) as f:
                source = f.read()
            lines = source.splitlines()
            calls = [node for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                     and node.func.attr == "zero_grad"]
            self.assertTrue(calls, f"{script}: no zero_grad call found")
            for call in calls:
                with self.subTest(script=script, line=call.lineno):
                    way = [k.value for k in call.keywords if k.arg == "set_to_none"]
                    fixed = not way or isinstance(way[0], ast.Constant)
                    sparse = "sparse" in lines[call.lineno - 1]
                    self.assertFalse(fixed and not sparse,
                                     f"{script}:{call.lineno}: {lines[call.lineno - 1].strip()}")

    @unittest.skipUnless(torch_importable(), "PyTorch (python3-torch) not installed")
    def test_compute_runs_the_faster_way(self):
        p = subprocess.run([sys.executable, bench.TORCH_PEER, "compute", "--model", "mlp",
                            "--windows", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        [r] = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        assert_ran_the_faster_way(self, r)
        self.assertEqual(statistics.median(r["samples_per_s"]),
                         r["zero_grad_rates"][r["zero_grad"]])

    @unittest.skipUnless(torch_importable(), "PyTorch (python3-torch) not installed")
    @unittest.skipUnless(os.path.isdir(bench.FASHION_MNIST), "Fashion-MNIST not installed")
    def test_ddp_runs_the_faster_way(self):
        p = subprocess.run([sys.executable, bench.TORCH_PEER, "tta", "--data", bench.FASHION_MNIST,
                            "--epochs", "0.02", "--eval-every", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        [r] = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        assert_ran_the_faster_way(self, r)

    def test_rows_name_the_peers_configuration(self):
        def peer():
            return {"row": 2.0, bench.PEER_CONFIG: "zero_grad set_to_none=False"}
        [r] = bench.Pair("p", ["row"], lambda: {"row": 1.0}, peer, "PyTorch").run(1, lambda _: 0)
        # Warm-up and rep: the same configuration both runs.
        self.assertEqual(r["peer_name"], "PyTorch; zero_grad set_to_none=False (2 of 2 runs)")
        self.assertEqual(r["peer"], [2.0])


if __name__ == "__main__":
    unittest.main()
