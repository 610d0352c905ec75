#!/usr/bin/python3
"""tools/launch --emit slurm: the script's content without a scheduler, and
the default job trained by `sbatch` of the emitted script on a real
one-node Slurm (slurm_fixture.py: munged, slurmctld and slurmd started by
the test, stopped by PID). Where the daemons cannot start the test fails
with their logs; it never skips."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

import yaml

import slurm_fixture
import support

TARGET_ACCURACY = 0.85
JOB_DEADLINE_S = 240


def emit(cluster, run_dir, *extra):
    return subprocess.run(
        [sys.executable, os.path.join(support.TOOLS, "launch"), cluster, "--emit", "slurm",
         "--run-dir", run_dir, *extra],
        capture_output=True, text=True, env=support.tool_env(), cwd=support.ROOT, timeout=60)


class EmitTest(unittest.TestCase):
    """The script's content: no daemons needed."""

    def setUp(self):
        support.require_binary(self)
        self.tmp = tempfile.TemporaryDirectory(prefix="pstrain-emit-")
        self.addCleanup(self.tmp.cleanup)

    def emitted(self, doc, *extra):
        w = support.Workspace(doc)
        self.addCleanup(w.cleanup)
        run_dir = os.path.join(self.tmp.name, "run")
        r = emit(w.cluster, run_dir, *extra)
        return r, run_dir

    def test_cpu_workers_one_step_of_every_task(self):
        r, run_dir = self.emitted(support.default_job(), "--max-restarts", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = r.stdout
        self.assertIn("#SBATCH --ntasks=4\n", s)
        self.assertIn("#SBATCH --job-name=fashion-mlp\n", s)
        self.assertIn(f"#SBATCH --output={run_dir}/slurm-%j.out\n", s)
        self.assertIn("step=(srun --ntasks=4 --kill-on-bad-exit=1 --label)", s)
        self.assertIn(f"--cluster {run_dir}/cluster.yaml", s)
        self.assertNotIn("--role", s)
        self.assertNotIn("gpus", s)
        self.assertNotIn("hetjob", s)
        # Two restarts after the launcher's backoff, servers (tasks 0, 1) restoring.
        self.assertIn("delays=(1 2)", s)
        self.assertIn('if [ "$SLURM_PROCID" -lt 2 ]; then exec "$@" --restore latest', s)
        # The file the tasks read is pstrain's own resolution, run_dir set.
        with open(os.path.join(run_dir, "cluster.yaml")) as f:
            resolved = yaml.load(f, Loader=yaml.BaseLoader)
        self.assertEqual(resolved["run_dir"], run_dir)
        self.assertEqual(subprocess.run(["bash", "-n"], input=s, text=True).returncode, 0)

    def test_gpu_workers_heterogeneous_job(self):
        doc = support.default_job()
        doc["workers"] = {"count": 3, "host": "127.0.0.1", "device": "cuda"}
        r, _ = self.emitted(doc, "--max-restarts", "0", "-o", os.path.join(self.tmp.name, "j.sh"))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.tmp.name, "j.sh")) as f:
            s = f.read()
        self.assertIn("#SBATCH --ntasks=2\n#SBATCH hetjob\n#SBATCH --ntasks=3 --gpus-per-task=1\n",
                      s)
        self.assertIn("step=(srun --het-group=0,1 --kill-on-bad-exit=1 --label)", s)
        self.assertIn("delays=()", s)

    def test_auto_workers_refused(self):
        doc = support.default_job()
        doc["workers"] = "auto"
        r, _ = self.emitted(doc)
        self.assertEqual(r.returncode, 2)
        self.assertIn("workers: auto counts this host's GPUs", r.stderr)


class SlurmTrainTest(unittest.TestCase):
    """sbatch of the emitted script trains the default job on a real Slurm."""

    def setUp(self):
        support.require_binary(self)

    def test_default_job_trains_under_sbatch(self):
        tmp = tempfile.TemporaryDirectory(prefix="pstrain-slurmjob-")
        self.addCleanup(tmp.cleanup)
        w = support.Workspace(support.default_job())
        self.addCleanup(w.cleanup)
        run_dir = os.path.join(tmp.name, "run")
        script = os.path.join(tmp.name, "job.sh")
        r = emit(w.cluster, run_dir, "-o", script, "--max-restarts", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        with slurm_fixture.SlurmCluster() as slurm:
            job = slurm.sbatch(script, cwd=support.ROOT)
            fields = slurm.wait_job(job, JOB_DEADLINE_S)
            out_path = os.path.join(run_dir, f"slurm-{job}.out")
            out = support.read_text(out_path) if os.path.exists(out_path) else "(no output)"
            context = f"\n--- {out_path}:\n{out[-4000:]}\n{slurm.daemon_logs()}"
        self.assertEqual(fields.get("JobState"), "COMPLETED",
                         f"job {job}: {fields.get('JobState')} {fields.get('Reason')}" + context)
        self.assertEqual(fields.get("NumTasks"), "4", context)
        # Slurm numbered 4 tasks (--label prefixes); each ran its own role.
        self.assertEqual({int(t) for t in re.findall(r"^\s*(\d+): ", out, re.M)}, {0, 1, 2, 3},
                         context)
        for name in ("ps0", "ps1", "worker0", "worker1"):
            self.assertTrue(os.path.exists(os.path.join(run_dir, f"{name}.log")),
                            f"no {name}.log in {run_dir}" + context)
        # Worker 0 is task 2, the first after the servers.
        found = re.findall(r"^\s*2: final test accuracy (\d+\.\d+)", out, re.M)
        self.assertTrue(found, "worker 0 (task 2) printed no final accuracy" + context)
        accuracy = float(found[-1])
        print(f"slurm job {job}: final test accuracy {accuracy:.4f}", file=sys.stderr)
        self.assertGreaterEqual(accuracy, TARGET_ACCURACY, context)


if __name__ == "__main__":
    unittest.main(verbosity=2)
