#!/usr/bin/python3
"""Timelines: `tools/launch --trace` runs a ps and a worker that each write
one (pstrain --trace) and merges them; the file is trace-event JSON whose
spans nest on every thread, the worker recorded exactly train.trace_steps
steps, each covered at least 90% by its parts, with forward and backward of
every layer and a send of every variable, and the ps its requests with the
optimizer's apply inside them. tools/trace breaks the file down, and says
what is wrong with a file that is not a trace."""

import json
import os
import tempfile
import unittest

import support
from pstrain_tools import trace

LAYERS = ("dense0", "dense1", "dense2")  # the mlp preset's
VARIABLES = [f"{layer}/{p}" for layer in LAYERS for p in ("w", "b")]
OPS = {"hello", "init", "pull", "push", "push_pull", "assign", "barrier", "snapshot", "stats",
       "shutdown", "kv_set", "kv_get", "heartbeat", "done", "progress", "sparse_pull",
       "sparse_push", "sparse_push_pull", "step"}  # shared/protocol.cc's names


class TracedRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        support.require_binary(cls)
        cls.space = support.Workspace(support.cluster(
            ps_hosts=("127.0.0.1",), worker_hosts=("127.0.0.1",), model="mlp",
            data={"name": "synthetic", "synthetic_train": 3200, "synthetic_test": 200},
            train={"batch_size": 32, "epochs": 1, "eval_every": 0, "trace_steps": 20,
                   "trace_skip": 3}))
        cls.run_dir = os.path.join(cls.space.path, "run")
        cls.result = support.run_tool("launch", [cls.space.cluster, "--run-dir", cls.run_dir,
                                                 "--trace"])
        cls.file = os.path.join(cls.run_dir, "trace.json")

    @classmethod
    def tearDownClass(cls):
        cls.space.cleanup()

    def setUp(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)

    def events(self):
        with open(self.file) as f:
            doc = json.load(f)  # valid JSON, or this fails
        return doc["traceEvents"]

    def test_every_process_wrote_its_file_and_the_merge_has_both(self):
        self.assertEqual(sorted(os.listdir(os.path.join(self.run_dir, "trace"))),
                         ["ps0.json", "worker0.json"])
        names = {e["args"]["name"] for e in self.events() if e["ph"] == "M"}
        self.assertEqual(names, {"ps 0", "worker 0"})
        for e in self.events():
            if e["ph"] == "X":
                self.assertTrue(all(k in e for k in ("name", "cat", "ts", "dur", "pid", "tid")), e)
                self.assertGreaterEqual(e["dur"], 0, e)

    def test_spans_nest_on_every_thread(self):
        for (pid, tid), spans in trace.threads(self.events()).items():
            with self.subTest(pid=pid, tid=tid):
                trace.tree(spans)  # raises where two spans overlap without nesting

    def worker_steps(self):
        for spans in trace.threads(self.events()).values():
            for span, children in trace.walk(trace.tree(spans)):
                if trace.kind(span["name"]) == "step":
                    yield span, children

    def test_the_worker_recorded_its_steps_each_covered_by_its_parts(self):
        steps = list(self.worker_steps())
        # 3200 samples / batch 32 = 100 steps: 20 recorded, after the first 3.
        self.assertEqual([s["name"] for s, _ in steps], [f"step {i}" for i in range(3, 23)])
        for span, children in steps:
            with self.subTest(step=span["name"]):
                covered = sum(c["dur"] for c, _ in children)
                self.assertGreaterEqual(covered, 0.9 * span["dur"])
                below = [g["name"] for g, _ in trace.walk(children)]
                for layer in LAYERS:
                    self.assertIn(f"forward {layer}", below)
                    self.assertIn(f"backward {layer}", below)
                self.assertEqual(sorted(n[len("send "):] for n in below if n.startswith("send ")),
                                 sorted(VARIABLES))
                self.assertEqual(below.count("wait for replies"), 1)

    def test_the_ps_traced_its_requests_with_the_apply_inside(self):
        served, queued = [], []
        for spans in trace.threads(self.events()).values():
            for span, children in trace.walk(trace.tree(spans)):
                if span["name"] == "message":
                    queued.append(span["args"]["queued_ms"])
                    # Its requests' handlers, one per request, named by op.
                    self.assertTrue(children, span)
                    for child, _ in children:
                        self.assertIn(child["name"], OPS, span)
                if span["name"] == "push_pull":
                    served.append([trace.kind(c["name"]) for c, _ in children])
        self.assertTrue(served, "no push_pull on the ps's timeline")
        # Every push_pull applies its chunk once (none is resent here).
        self.assertTrue(all(kinds.count("apply") == 1 for kinds in served), served[:3])
        self.assertTrue(queued and all(q >= 0 for q in queued), queued[:5])

    def test_tools_trace_breaks_it_down(self):
        r = support.run_tool("trace", [self.file, "--json"])
        self.assertEqual(r.returncode, 0, r.stderr)
        b = json.loads(r.stdout)
        self.assertEqual(b["steps"], 20)
        self.assertGreaterEqual(min(b["coverage"]), 0.9)
        for part in ("forward and backward", "finish"):
            self.assertIn(part, b["parts"])
        self.assertIn("wait for replies", b["parts"]["finish"]["inner"])
        self.assertIn("apply", b["requests"])
        self.assertIn("queued", b["requests"])
        self.assertEqual(b["dropped_events"], 0)
        text = support.run_tool("trace", [self.file])
        self.assertIn("forward and backward", text.stdout)


class Compare(unittest.TestCase):
    def test_compare_keeps_each_runs_trace_and_notes_its_step(self):
        support.require_binary(self)
        space = support.Workspace(support.cluster(
            ps_hosts=("127.0.0.1",), worker_hosts=("127.0.0.1",),
            train={"batch_size": 32, "epochs": 1, "eval_every": 0, "trace_steps": 10}))
        self.addCleanup(space.cleanup)
        out = os.path.join(space.path, "cmp")
        r = support.run_tool("compare", [space.cluster, "--modes", "async,ssp:2", "--out", out,
                                         "--trace"])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "report.md")) as f:
            report = f.read()
        for mode, folder in (("async", "async"), ("ssp:2", "ssp-2")):
            self.assertTrue(os.path.exists(os.path.join(out, folder, "trace.json")), mode)
            self.assertRegex(report, mode + r": trace `[^`]*trace.json`, 10 steps of [0-9.]+ ms: ")


class BadInput(unittest.TestCase):
    def test_a_file_that_is_not_a_trace_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.json")
            with open(bad, "w") as f:
                f.write('{"events": []}')
            r = support.run_tool("trace", [bad])
            self.assertEqual(r.returncode, 1)
            self.assertIn("bad.json: no traceEvents list", r.stderr)
            r = support.run_tool("trace", [os.path.join(tmp, "missing.json")])
            self.assertEqual(r.returncode, 1)
            self.assertIn("missing.json", r.stderr)

    def test_launch_refuses_trace_with_emit(self):
        space = support.Workspace(support.cluster())
        self.addCleanup(space.cleanup)
        r = support.run_tool("launch", [space.cluster, "--trace", "--emit", "slurm"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--trace applies to a run this launcher starts", r.stderr)

    def test_overlapping_spans_are_refused(self):
        spans = [{"name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
                 {"name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 1}]
        with self.assertRaisesRegex(trace.TraceError, "'b' at 5 overlaps 'a'"):
            trace.tree(spans)
        nested = [{"name": "a", "ts": 0, "dur": 10}, {"name": "b", "ts": 2, "dur": 3},
                  {"name": "c", "ts": 6, "dur": 4}]
        [(a, children)] = trace.tree(nested)
        self.assertEqual([c["name"] for c, _ in children], ["b", "c"])


if __name__ == "__main__":
    unittest.main()
