#!/usr/bin/python3
"""tools/launch: a whole cluster end to end, a failing process, restarts,
signals, ssh for other hosts and --dry-run. Every cluster runs on loopback
ports that were free a moment before. The restart policy is also tested with
fake_pstrain, a script that fails on cue, so those tests do not depend on how
the C++ side fails or recovers."""

import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import unittest

import support
from pstrain_tools import cluster_config, launch

# Distinct loopback addresses that tools/launch does not count as this host,
# so their processes go through ssh, yet they bind and connect like remote
# hosts would.
REMOTE_PS, REMOTE_WORKER = "127.0.0.2", "127.0.0.3"

FAKE_PSTRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_pstrain")


# Logs its argv and runs the remote command in a new session, as sshd would
# on another host: a signal to the local ssh's process group does not reach
# it; only the end of its stdin (the launcher's pipe) does.
FAKE_SSH = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE_SSH_LOG"
for last; do :; done
exec setsid -w /bin/sh -c "$last"
"""


class LaunchTest(unittest.TestCase):
    def setUp(self):
        support.require_binary(self)
        self.spaces = []

    def tearDown(self):
        for w in self.spaces:
            w.cleanup()

    def workspace(self, doc):
        w = support.Workspace(doc)
        self.spaces.append(w)
        return w

    def fake_ssh(self, w):
        path = os.path.join(w.path, "ssh")
        with open(path, "w") as f:
            f.write(FAKE_SSH)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        log = os.path.join(w.path, "ssh.log")
        # Extra words in $PSTRAIN_SSH are options for ssh.
        return {"PSTRAIN_SSH": f"{path} -p 22", "FAKE_SSH_LOG": log}, log

    def start_launcher(self, w, run_dir, env=None):
        proc = subprocess.Popen(
            [sys.executable, os.path.join(support.TOOLS, "launch"), w.cluster,
             "--run-dir", run_dir],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=support.tool_env(**(env or {})), cwd=support.ROOT)
        self.addCleanup(self.reap, proc)
        return proc

    @staticmethod
    def reap(proc):
        if proc.poll() is None:
            proc.kill()
        proc.communicate()

    def wait_for_processes(self, launcher, count=4):
        """{pid: argv} of the pstrain processes under the launcher, once all
        `count` have started."""
        def started():
            found = support.pstrain_processes_under(launcher.pid)
            return found if len(found) == count else None
        procs = support.wait_for(started, 20, f"the launcher's {count} pstrain processes")
        self.addCleanup(self.kill_leftovers, procs)
        return procs

    @staticmethod
    def kill_leftovers(pids):
        """A failed test must not leave its processes running."""
        for p in pids:
            if support.alive(p) and support.is_pstrain(p):
                os.kill(p, signal.SIGKILL)

    @classmethod
    def kill_recorded(cls, run_dir):
        """kill_leftovers for every attempt launch.json names (a restarted
        process has a PID the test did not see at first)."""
        try:
            record = support.read_json(os.path.join(run_dir, "launch.json"))
        except (OSError, ValueError):
            return
        cls.kill_leftovers([a["pid"] for p in record.get("processes", [])
                            for a in p.get("attempts", [])])

    def assert_all_gone(self, pids, timeout=10):
        def gone():
            return not [p for p in pids if support.alive(p) and support.is_pstrain(p)]
        support.wait_for(gone, timeout, f"processes {sorted(pids)} to end")

    def test_two_ps_two_workers_end_to_end(self):
        w = self.workspace(support.cluster())
        run_dir = os.path.join(w.path, "run")
        r = support.run_tool("launch", [w.cluster, "--run-dir", run_dir])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for name in ("cluster.yaml", "config.yaml", "model.bin", "launch.json", "ps0.log",
                     "ps1.log", "worker0.log", "worker1.log"):
            path = os.path.join(run_dir, name)
            self.assertTrue(os.path.isfile(path), f"{name} missing from the run directory")
            self.assertGreater(os.path.getsize(path), 0, f"{name} is empty")
        for i in (0, 1):
            with open(os.path.join(run_dir, f"worker{i}.metrics.jsonl")) as f:
                records = [json.loads(line) for line in f]
            steps = [r for r in records if "event" not in r]
            self.assertTrue(steps, f"worker {i} wrote no training records")
            self.assertEqual(steps[-1]["local_samples"], 1000)
        self.assertIn("serving on", support.read_text(os.path.join(run_dir, "ps1.log")))
        self.assertRegex(r.stdout, r"\[worker0\] final test accuracy 0\.\d+")
        self.assertRegex(r.stdout, r"\[ps1\] .*serving on tcp://127\.0\.0\.1:"
                         + str(w.doc["ps"][1]["port"]))
        record = support.read_json(os.path.join(run_dir, "launch.json"))
        self.assertEqual(record["exit_code"], 0)
        self.assertEqual([p["name"] for p in record["processes"]],
                         ["ps0", "ps1", "worker0", "worker1"])
        self.assertEqual([p["exit"] for p in record["processes"]], [0, 0, 0, 0])
        self.assertLessEqual(record["start"], record["end"])
        # Every process read the resolved file the launcher wrote, and that
        # file is pstrain's own canonical form of it; all had the launch's
        # run id.
        cluster_file = os.path.join(run_dir, "cluster.yaml")
        for p in record["processes"]:
            self.assertEqual(p["command"][-4:],
                             ["--cluster", cluster_file, "--run-id", record["run_id"]])
        canonical = subprocess.run([support.PSTRAIN, "--check", "--cluster", cluster_file],
                                   capture_output=True, text=True, check=True).stdout
        written = support.read_text(cluster_file)
        self.assertTrue(written.startswith("# Resolved by pstrain --check"), written)
        self.assertEqual(written.split("\n", 1)[1], canonical)
        self.assertIn(f"run_dir: {run_dir}\n", canonical)
        # Which build ran: launch.json and the first line of every log say.
        version = subprocess.run([support.PSTRAIN, "--version"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()[0]
        self.assertEqual(record["pstrain"], {"binary": support.PSTRAIN, "version": version})
        for p in record["processes"]:
            first = support.read_text(os.path.join(run_dir, f"{p['name']}.log")).split("\n")[0]
            self.assertTrue(first.endswith(f"[{p['name']}] {version}"), first)

    def test_a_failing_ps_stops_the_run_and_is_named_with_its_output(self):
        # The workers wait for ps 1 up to request_timeout, then fail on their
        # own; ps 0 waits for them up to worker_timeout. Both are long, so
        # only the launcher's SIGTERM ends them early.
        w = self.workspace(support.cluster(
            train={"straggler_worker": 1, "straggler_delay_ms": 100},
            net={"heartbeat": 0.1, "request_timeout": 40, "worker_timeout": 60}))
        port = w.doc["ps"][1]["port"]
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", port))
            taken.listen()
            # What ps 1 alone exits with when its port is taken.
            alone = subprocess.run([support.PSTRAIN, "--role", "ps", "--index", "1",
                                    "--cluster", w.cluster, "--set",
                                    f"run_dir={os.path.join(w.path, 'alone')}"],
                                   capture_output=True, text=True, timeout=30)
            self.assertNotEqual(alone.returncode, 0)
            run_dir = os.path.join(w.path, "run")
            # --max-restarts 0: today's behaviour, the first failure stops
            # everything (restarts of a failing ps: RestartPolicyTest).
            r = support.run_tool("launch", [w.cluster, "--run-dir", run_dir,
                                            "--max-restarts", "0"])
        self.assertEqual(r.returncode, alone.returncode, r.stderr)
        self.assertNotIn("restart", r.stderr)
        self.assertIn(f"launch: ps1 exited with code {alone.returncode}; stopped the other "
                      "processes", r.stderr)
        self.assertIn("last lines of ps1", r.stderr)
        self.assertIn(f"tcp://127.0.0.1:{port}: Address already in use", r.stderr)
        record = support.read_json(os.path.join(run_dir, "launch.json"))
        self.assertEqual(record["failed"], "ps1")
        pids = [p["pid"] for p in record["processes"]]
        self.addCleanup(self.kill_leftovers, pids)
        self.assert_all_gone(pids)
        # The others were stopped, not waited for: the workers died of the
        # launcher's SIGTERM (a worker that ran to its end, or gave up on
        # ps 1, exits with a code). ps 0 exits 0 on SIGTERM once its handler
        # is in place, and dies of it before.
        self.assertEqual(record["max_restarts"], 0)
        self.assertEqual([len(p["attempts"]) for p in record["processes"]], [1, 1, 1, 1])
        exits = {p["name"]: p.pop("exit") for p in record["processes"]}
        self.assertEqual(exits.pop("ps1"), alone.returncode)
        self.assertEqual(exits.pop("worker0"), -signal.SIGTERM)
        self.assertEqual(exits.pop("worker1"), -signal.SIGTERM)
        self.assertIn(exits.pop("ps0"), (0, -signal.SIGTERM))

    def test_a_killed_worker_is_restarted_and_the_run_completes(self):
        # The straggler keeps worker 1 training for a few seconds: long
        # enough to kill it mid-run.
        w = self.workspace(support.cluster(train={"straggler_worker": 1,
                                                  "straggler_delay_ms": 100}))
        run_dir = os.path.join(w.path, "run")
        launcher = self.start_launcher(w, run_dir)
        procs = self.wait_for_processes(launcher)
        (victim,) = [p for p, a in procs.items() if a[2:5] == ["worker", "--index", "1"]]
        # Once it has trained a little: its first metrics record.
        support.wait_for(lambda: os.path.exists(os.path.join(run_dir, "worker1.metrics.jsonl")),
                         20, "worker 1's first metrics")
        os.kill(victim, signal.SIGKILL)
        self.addCleanup(self.kill_recorded, run_dir)
        out, err = launcher.communicate(timeout=120)
        self.assertEqual(launcher.returncode, 0, out + err)
        self.assertIn(f"launch: worker1 was killed by signal {int(signal.SIGKILL)} (SIGKILL); "
                      "restart 1 of 3 (attempt 2) in 1 s", err)
        self.assertRegex(err, r"launch: worker1 restarted \(attempt 2, PID \d+\)")
        self.assertIn("launch: done", out)
        record = support.read_json(os.path.join(run_dir, "launch.json"))
        self.assertEqual(record["exit_code"], 0)
        entries = {p["name"]: p for p in record["processes"]}
        attempts = entries["worker1"]["attempts"]
        self.assertEqual(len(attempts), 2)
        self.assertEqual((attempts[0]["pid"], attempts[0]["exit"], attempts[0]["signal"],
                          attempts[0]["backoff"]), (victim, -signal.SIGKILL, "SIGKILL", 1.0))
        self.assertEqual(attempts[1]["exit"], 0)
        # The new incarnation ran the same command, a second later or more.
        self.assertEqual(attempts[1]["command"], attempts[0]["command"])
        self.assertGreaterEqual(attempts[1]["start"], attempts[0]["end"] + 1.0)
        self.assertEqual(entries["worker1"]["pid"], attempts[1]["pid"])
        self.assertEqual(entries["worker1"]["exit"], 0)
        for name in ("ps0", "ps1", "worker0"):
            self.assertEqual(len(entries[name]["attempts"]), 1, name)
            self.assertEqual(entries[name]["exit"], 0, name)
        self.assertTrue(os.path.isfile(os.path.join(run_dir, "model.bin")))
        self.assert_all_gone([a["pid"] for p in record["processes"] for a in p["attempts"]])

    def test_sigterm_ends_every_process(self):
        # A straggler keeps the run going long enough to be interrupted.
        w = self.workspace(support.cluster(train={"straggler_worker": 1,
                                                  "straggler_delay_ms": 200}))
        launcher = self.start_launcher(w, os.path.join(w.path, "run"))
        procs = self.wait_for_processes(launcher)
        self.assertEqual(sorted(a[2] + a[4] for a in procs.values()),
                         ["ps0", "ps1", "worker0", "worker1"])
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=30)
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("SIGTERM received; stopped every process", err)
        self.assert_all_gone(procs)

    def test_a_killed_launcher_takes_its_processes_along(self):
        w = self.workspace(support.cluster(train={"straggler_worker": 1,
                                                  "straggler_delay_ms": 200}))
        launcher = self.start_launcher(w, os.path.join(w.path, "run"))
        procs = self.wait_for_processes(launcher)
        launcher.kill()
        launcher.communicate(timeout=30)
        self.assert_all_gone(procs)

    def test_other_hosts_run_over_ssh(self):
        w = self.workspace(support.cluster(ps_hosts=(REMOTE_PS, REMOTE_PS),
                                           worker_hosts=(REMOTE_WORKER, "127.0.0.1")))
        env, log = self.fake_ssh(w)
        run_dir = os.path.join(w.path, "run")
        r = support.run_tool("launch", [w.cluster, "--run-dir", run_dir], **env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.isfile(os.path.join(run_dir, "model.bin")))
        calls = support.read_text(log).splitlines()
        self.assertEqual(len(calls), 3, "ps0, ps1 and worker0 go through ssh; worker1 is local")
        cluster_file = os.path.join(run_dir, "cluster.yaml")
        # The fake ssh logs in the order the processes got to run, not
        # necessarily the cluster's.
        for host, role, index in [(REMOTE_PS, "ps", 0), (REMOTE_PS, "ps", 1),
                                  (REMOTE_WORKER, "worker", 0)]:
            command = shlex.join([support.PSTRAIN, "--role", role, "--index", str(index),
                                  "--cluster", cluster_file]) + " "
            matching = [c for c in calls if command in c]
            self.assertEqual(len(matching), 1, f"{command} in {calls}")
            self.assertTrue(matching[0].startswith(f"-p 22 -o BatchMode=yes {host} cd "),
                            matching[0])

    def test_sigterm_ends_remote_processes_too(self):
        w = self.workspace(support.cluster(
            ps_hosts=(REMOTE_PS, REMOTE_PS), worker_hosts=(REMOTE_WORKER, REMOTE_WORKER),
            train={"straggler_worker": 1, "straggler_delay_ms": 200}))
        env, _ = self.fake_ssh(w)
        launcher = self.start_launcher(w, os.path.join(w.path, "run"), env)
        procs = self.wait_for_processes(launcher)
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=30)
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM)
        self.assert_all_gone(procs)

    def test_dry_run_prints_every_command_and_starts_nothing(self):
        w = self.workspace(support.cluster(worker_hosts=("127.0.0.1", REMOTE_WORKER)))
        env, log = self.fake_ssh(w)
        run_dir = os.path.join(w.path, "run")
        r = support.run_tool("launch", [w.cluster, "--run-dir", run_dir, "--dry-run",
                                        "--set", "optimizer.lr=0.01"], **env)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], f"# run directory: {run_dir}")
        cluster_file = os.path.join(run_dir, "cluster.yaml")
        first = shlex.split(lines[1])
        run_id = first[first.index("--run-id") + 1]
        self.assertRegex(run_id, "^[0-9a-f]{16}$")
        expected = [[support.PSTRAIN, "--role", role, "--index", str(i), "--cluster",
                     cluster_file, "--run-id", run_id]
                    for role, i in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1))]
        self.assertEqual(lines[1:4], [shlex.join(c) for c in expected[:3]])
        remote = shlex.split(lines[4])
        self.assertEqual(remote[:5], [env["PSTRAIN_SSH"].split()[0], "-p", "22", "-o",
                                      "BatchMode=yes"])
        self.assertEqual(remote[5], REMOTE_WORKER)
        self.assertIn(shlex.join(expected[3]), remote[6])
        self.assertEqual(len(lines), 5)
        self.assertFalse(os.path.exists(run_dir))
        self.assertFalse(os.path.exists(log))

    def test_overrides_follow_pstrains_rules(self):
        # One past the end of a list appends, as pstrain --set does.
        w = self.workspace(support.cluster())
        port = support.free_port()
        r = support.run_tool("launch", [w.cluster, "--dry-run", "--set",
                                        f"ps.2={{host: 127.0.0.1, port: {port}}}"])
        self.assertEqual(r.returncode, 0, r.stderr)
        roles = [shlex.split(line)[2:5] for line in r.stdout.splitlines()[1:]]
        self.assertEqual(roles, [["ps", "--index", "0"], ["ps", "--index", "1"],
                                 ["ps", "--index", "2"], ["worker", "--index", "0"],
                                 ["worker", "--index", "1"]])

    def test_workers_auto_without_gpus_is_cpu_workers(self):
        w = self.workspace(support.cluster(workers="auto"))
        r = support.run_tool("launch", [w.cluster, "--dry-run", "--cpu-workers", "3"],
                             CUDA_VISIBLE_DEVICES="")
        self.assertEqual(r.returncode, 0, r.stderr)
        workers = [l for l in r.stdout.splitlines() if "--role worker" in l]
        self.assertEqual(len(workers), 3, r.stdout)

    def test_a_bad_override_is_reported_before_anything_starts(self):
        w = self.workspace(support.cluster())
        run_dir = os.path.join(w.path, "run")
        r = support.run_tool("launch", [w.cluster, "--run-dir", run_dir,
                                        "--set", "optimizer.lr=fast"])
        # pstrain's own code for a bad configuration, and its message.
        self.assertEqual(r.returncode, 2)
        self.assertIn("optimizer.lr: expected a number > 0, got 'fast'", r.stderr)
        self.assertFalse(os.path.exists(run_dir))


class RestartPolicyTest(unittest.TestCase):
    """Restarts, backoff and train.on_worker_loss, with fake_pstrain as the
    binary: each of its processes does what the test's plan says."""

    def setUp(self):
        self.w = support.Workspace(support.cluster())
        self.addCleanup(self.w.cleanup)
        self.run_dir = os.path.join(self.w.path, "run")
        self.log = os.path.join(self.w.path, "fake.log")
        # Registered before anything starts, so it runs even when the test
        # fails half-way: every fake process started for this test ends.
        self.addCleanup(self.kill_fakes)

    def fake_runs(self, log=None):
        """Each fake process started, in order: {"name", "argv", "pid"};
        those logged to `log` (default: this test's current log)."""
        log = log or self.log
        if not os.path.exists(log):
            return []
        with open(log) as f:
            return [json.loads(line) for line in f]

    def kill_fakes(self):
        logs = [os.path.join(self.w.path, n) for n in os.listdir(self.w.path)
                if n.startswith("fake") and n.endswith(".log")]
        for run in (run for log in logs for run in self.fake_runs(log)):
            if support.alive(run["pid"]) and FAKE_PSTRAIN in support.argv(run["pid"]):
                os.kill(run["pid"], signal.SIGKILL)

    def env(self, plan):
        return {"PSTRAIN": FAKE_PSTRAIN, "FAKE_PSTRAIN_LOG": self.log,
                "FAKE_PSTRAIN_PLAN": json.dumps(plan), "FAKE_PSTRAIN_REAL": support.PSTRAIN}

    def launch(self, plan, *args):
        r = support.run_tool("launch", [self.w.cluster, "--run-dir", self.run_dir,
                                        "--restart-backoff", "0.1"] + list(args),
                             **self.env(plan))
        return r, support.read_json(os.path.join(self.run_dir, "launch.json"))

    @staticmethod
    def entries(record):
        return {p["name"]: p for p in record["processes"]}

    def test_every_launch_draws_a_run_id_that_its_restarts_keep(self):
        plan = {"worker1": ["exit 3 0.1", "exit 0 0.1"], "default": "exit 0 0.3"}
        r, record = self.launch(plan)
        self.assertEqual(r.returncode, 0, r.stderr)
        run_id = record["run_id"]
        self.assertRegex(run_id, "^[0-9a-f]{16}$")
        runs = self.fake_runs()
        self.assertEqual(sorted(run["name"] for run in runs),
                         ["ps0", "ps1", "worker0", "worker1", "worker1"])
        for run in runs:  # the restarted worker1 too
            argv = run["argv"]
            self.assertEqual(argv[argv.index("--run-id") + 1], run_id, run["name"])
        # Another launch of the same file gets another run id, so its
        # servers refuse a stale process of this one.
        self.run_dir = os.path.join(self.w.path, "run2")
        self.log = os.path.join(self.w.path, "fake2.log")
        r, again = self.launch({"default": "exit 0 0.1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(again["run_id"], "^[0-9a-f]{16}$")
        self.assertNotEqual(again["run_id"], run_id)
        for run in self.fake_runs():
            argv = run["argv"]
            self.assertEqual(argv[argv.index("--run-id") + 1], again["run_id"], run["name"])

    def test_on_worker_loss_is_what_pstrain_resolved_for_the_mode(self):
        """The launcher restarts by train.on_worker_loss as `pstrain --check`
        resolves it (each mode's default comes from shared/modes.h), and
        refuses a config without one rather than guessing."""
        expected = {"async": "continue", "ssp": "continue", "backup": "continue",
                    "sync": "fail", "local": "fail"}
        for mode, loss in expected.items():
            for given in (None, "continue", "fail"):
                train = {} if given is None else {"on_worker_loss": given}
                w = support.Workspace(support.cluster(mode=mode, train=train))
                self.addCleanup(w.cleanup)
                _, cfg = cluster_config.check(support.PSTRAIN, w.cluster)
                self.assertEqual(launch.on_worker_loss(cfg), given or loss, (mode, given))
        with self.assertRaises(cluster_config.ConfigError) as refused:
            launch.on_worker_loss({"mode": "sync", "train": {}})
        self.assertIn("train.on_worker_loss None", str(refused.exception))

    def test_a_ps_that_keeps_failing_exhausts_its_restarts_and_fails_the_run(self):
        snapshot = os.path.join(self.w.path, "old-snapshot")
        r, record = self.launch({"ps1": ["exit 3 0.1"], "default": "exit 0 30"},
                                "--max-restarts", "2", "--restore", snapshot)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("launch: ps1 exited with code 3; restart 1 of 2 (attempt 2) in 0.1 s "
                      "with --restore latest\n", r.stderr)
        self.assertIn("launch: ps1 exited with code 3; restart 2 of 2 (attempt 3) in 0.2 s "
                      "with --restore latest\n", r.stderr)
        self.assertIn("launch: ps1 exited with code 3; stopped the other processes "
                      "(its 2 restarts are spent).\nlaunch: last lines of ps1", r.stderr)
        self.assertIn("fake ps1 attempt 3: exit 3", r.stderr)
        self.assertEqual(record["failed"], "ps1")
        self.assertEqual(record["exit_code"], 3)
        self.assertEqual(record["max_restarts"], 2)
        ps1 = self.entries(record)["ps1"]
        attempts = ps1["attempts"]
        self.assertEqual([a["exit"] for a in attempts], [3, 3, 3])
        self.assertEqual([a.get("backoff") for a in attempts], [0.1, 0.2, None])
        for before, after in zip(attempts, attempts[1:]):
            self.assertGreaterEqual(after["start"], before["end"] + before["backoff"])
        # The first attempt restores what the user named; the restarts their
        # own newest checkpoint instead, and only that.
        self.assertEqual(attempts[0]["command"][-2:], ["--restore", snapshot])
        for a in attempts[1:]:
            self.assertEqual(a["command"][-2:], ["--restore", "latest"])
            self.assertEqual(a["command"].count("--restore"), 1)
        self.assertEqual(ps1["command"], attempts[0]["command"])
        self.assertEqual((ps1["pid"], ps1["exit"]), (attempts[-1]["pid"], 3))
        runs = [run for run in self.fake_runs() if run["name"] == "ps1"]
        self.assertEqual([run["pid"] for run in runs], [a["pid"] for a in attempts])
        # The others were stopped by the launcher, once each.
        for name in ("ps0", "worker0", "worker1"):
            (a,) = self.entries(record)[name]["attempts"]
            self.assertEqual((a["exit"], a["stopped"]), (-signal.SIGTERM, True), name)

    def test_an_exhausted_worker_under_continue_lets_the_others_go_on(self):
        # async without train.on_worker_loss: continue, the async default.
        # The others finish well after worker 1 has used its restarts.
        r, record = self.launch({"worker1": ["kill SIGKILL 0.1"], "default": "exit 0 2"},
                                "--max-restarts", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(record["on_worker_loss"], "continue")
        self.assertIn("launch: worker1 was killed by signal 9 (SIGKILL); restart 1 of 1 "
                      "(attempt 2) in 0.1 s\n", r.stderr)
        self.assertIn("launch: worker1 was killed by signal 9 (SIGKILL) and has used its 1 "
                      "restarts; the others go on without it (train.on_worker_loss: "
                      "continue).", r.stderr)
        self.assertEqual(record["exit_code"], 0)
        self.assertEqual(record["lost"], ["worker1"])
        self.assertNotIn("failed", record)
        entries = self.entries(record)
        self.assertEqual([(a["exit"], a["signal"]) for a in entries["worker1"]["attempts"]],
                         [(-signal.SIGKILL, "SIGKILL")] * 2)
        # A process that exits 0 ran once, to its own end.
        for name in ("ps0", "ps1", "worker0"):
            (a,) = entries[name]["attempts"]
            self.assertEqual(a["exit"], 0, name)
            self.assertNotIn("stopped", a, name)
        self.assertEqual(sorted(run["name"] for run in self.fake_runs()),
                         ["ps0", "ps1", "worker0", "worker1", "worker1"])

    def test_losing_every_worker_fails_the_run_even_under_continue(self):
        r, record = self.launch({"worker0": ["exit 6 0.1"], "worker1": ["exit 6 0.6"],
                                 "default": "exit 0 30"}, "--max-restarts", "1")
        self.assertEqual(r.returncode, 6, r.stderr)
        self.assertEqual(record["on_worker_loss"], "continue")
        self.assertIn("launch: every worker is lost; stopping the run.", r.stderr)
        self.assertIn("launch: worker1 exited with code 6; stopped the other processes "
                      "(its 1 restarts are spent).", r.stderr)
        self.assertEqual((record["failed"], record["lost"]), ("worker1", ["worker0", "worker1"]))
        entries = self.entries(record)
        for name in ("ps0", "ps1"):
            self.assertEqual(entries[name]["exit"], -signal.SIGTERM, name)

    def test_an_exhausted_worker_under_fail_stops_the_run(self):
        for overrides in (["--mode", "sync"], ["--set", "train.on_worker_loss=fail"]):
            with self.subTest(overrides=overrides):
                # A run directory and a fake log of its own for each case.
                self.run_dir = os.path.join(self.w.path, f"run-{overrides[1]}")
                self.log = os.path.join(self.w.path, f"fake-{overrides[1]}.log")
                r, record = self.launch({"worker1": ["exit 4 0.1"], "default": "exit 0 30"},
                                        "--max-restarts", "1", *overrides)
                self.assertEqual(r.returncode, 4, r.stderr)
                self.assertEqual(record["on_worker_loss"], "fail")
                self.assertEqual(record["failed"], "worker1")
                self.assertIn("launch: worker1 exited with code 4; stopped the other processes "
                              "(its 1 restarts are spent).", r.stderr)
                entries = self.entries(record)
                self.assertEqual([a["exit"] for a in entries["worker1"]["attempts"]], [4, 4])
                for name in ("ps0", "ps1", "worker0"):
                    self.assertEqual(entries[name]["exit"], -signal.SIGTERM, name)

    def test_max_restarts_0_stops_everything_at_the_first_failure(self):
        # Even a worker under on_worker_loss continue: 0 is today's behaviour.
        r, record = self.launch({"worker1": ["exit 4 0.2"], "default": "exit 0 30"},
                                "--max-restarts", "0")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertNotIn("restart", r.stderr)
        self.assertIn("launch: worker1 exited with code 4; stopped the other processes.\n",
                      r.stderr)
        self.assertEqual(record["failed"], "worker1")
        self.assertNotIn("lost", record)
        entries = self.entries(record)
        self.assertEqual([len(p["attempts"]) for p in record["processes"]], [1, 1, 1, 1])
        for name in ("ps0", "ps1", "worker0"):
            self.assertEqual(entries[name]["exit"], -signal.SIGTERM, name)
        self.assertEqual(len(self.fake_runs()), 4)

    def test_sigterm_during_a_backoff_restarts_nothing(self):
        proc = subprocess.Popen(
            [sys.executable, os.path.join(support.TOOLS, "launch"), self.w.cluster,
             "--run-dir", self.run_dir, "--restart-backoff", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=support.tool_env(**self.env({"worker1": ["exit 5 0.1"],
                                             "default": "exit 0 60"})),
            cwd=support.ROOT)
        self.addCleanup(LaunchTest.reap, proc)
        path = os.path.join(self.run_dir, "launch.json")

        def waiting():
            try:
                record = support.read_json(path)
            except (OSError, ValueError):
                return False
            attempts = self.entries(record)["worker1"]["attempts"]
            return "end" in attempts[-1]
        support.wait_for(waiting, 20, "worker 1 to fail")
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("restart 1 of 3 (attempt 2) in 20 s", err)
        self.assertNotIn("restarted", err)
        self.assertIn("SIGTERM received; stopped every process", err)
        record = support.read_json(path)
        self.assertEqual(len(self.entries(record)["worker1"]["attempts"]), 1)
        self.assertEqual([run["name"] for run in self.fake_runs()].count("worker1"), 1)
        for run in self.fake_runs():
            self.assertFalse(support.alive(run["pid"]), run)


class AutoTest(unittest.TestCase):
    """cluster_config.auto_overrides on what pstrain --check prints (every
    value a string), with the host's GPU count given."""

    def overrides(self, workers, gpus):
        saved = cluster_config.gpu_count
        cluster_config.gpu_count = lambda: gpus
        self.addCleanup(setattr, cluster_config, "gpu_count", saved)
        return cluster_config.auto_overrides({"workers": workers}, cpu_workers=2)

    @staticmethod
    def worker(host="127.0.0.1", device="cpu", gpu="auto"):
        return {"host": host, "device": device, "gpu": gpu}

    def resolved(self, workers, gpus):
        (override,) = self.overrides(workers, gpus)
        key, value = override.split("=", 1)
        self.assertEqual(key, "workers")
        return json.loads(value)

    def test_nothing_auto_needs_no_override(self):
        self.assertEqual(self.overrides([self.worker(), self.worker("h", "cuda", "1")], 4), [])

    def test_workers_auto_is_one_cuda_worker_per_gpu_else_cpu_workers(self):
        self.assertEqual(self.resolved("auto", 2), [self.worker(device="cuda", gpu="0"),
                                                    self.worker(device="cuda", gpu="1")])
        self.assertEqual(self.resolved("auto", 0), [self.worker(), self.worker()])

    def test_device_auto_and_gpus_per_host(self):
        workers = [self.worker("a", "auto"), self.worker("a", "cuda"), self.worker("b", "cuda"),
                   self.worker("a", "cuda", "7")]
        self.assertEqual(self.resolved(workers, 1), [
            self.worker("a", "cuda", "0"), self.worker("a", "cuda", "1"),
            self.worker("b", "cuda", "0"), self.worker("a", "cuda", "7")])
        self.assertEqual(self.resolved([self.worker("a", "auto")], 0), [self.worker("a")])


if __name__ == "__main__":
    unittest.main()
