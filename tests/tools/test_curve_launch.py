#!/usr/bin/python3
"""tools/launch with security.curve: a fresh key set per run, each process
given only its own secret key (over ssh too), and a whole run that trains
the default MLP on Fashion-MNIST to 85% test accuracy through CURVE."""

import os
import re
import stat
import unittest

import support
from test_launch import FAKE_SSH, REMOTE_WORKER

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


class CurveLaunchTest(unittest.TestCase):
    def setUp(self):
        support.require_binary(self)
        self.w = support.Workspace(support.cluster(
            worker_hosts=("127.0.0.1", REMOTE_WORKER),
            model="mlp",
            data={"name": "fashion-mnist", "dir": FASHION_MNIST},
            optimizer={"name": "momentum", "lr": 0.02, "momentum": 0.9, "nesterov": True},
            train={"batch_size": 64, "epochs": 2, "seed": 42, "eval_every": 60000},
            net={"heartbeat": 1, "worker_timeout": 60, "request_timeout": 30},
            security={"curve": True}))
        self.addCleanup(self.w.cleanup)

    def fake_ssh(self):
        path = os.path.join(self.w.path, "ssh")
        with open(path, "w") as f:
            f.write(FAKE_SSH)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        log = os.path.join(self.w.path, "ssh.log")
        return {"PSTRAIN_SSH": path, "FAKE_SSH_LOG": log}, log

    def test_a_curve_run_trains_to_85_percent_with_one_key_per_process(self):
        env, ssh_log = self.fake_ssh()
        run_dir = os.path.join(self.w.path, "run")
        r = support.run_tool("launch", [self.w.cluster, "--run-dir", run_dir], timeout=280,
                             **env)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        accuracy = float(re.search(r"\[worker0\] final test accuracy (0\.\d+)", r.stdout)[1])
        self.assertGreaterEqual(accuracy, 0.85, r.stdout[-2000:])
        for ps in ("ps0", "ps1"):
            self.assertIn(", CURVE)", support.read_text(os.path.join(run_dir, f"{ps}.log")))

        # Each process's folder holds its own secret key (0600) and the
        # public list, nothing else; the list names every key once.
        keys = os.path.join(run_dir, "keys")
        self.assertEqual(sorted(os.listdir(keys)), ["ps0", "ps1", "worker0", "worker1"])
        lists = set()
        for name, stem in (("ps0", "ps-0"), ("ps1", "ps-1"), ("worker0", "worker-0"),
                           ("worker1", "worker-1")):
            folder = os.path.join(keys, name)
            self.assertEqual(sorted(os.listdir(folder)), sorted([f"{stem}.key", "public_keys"]))
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(folder, f"{stem}.key")).st_mode),
                             0o600)
            lists.add(support.read_text(os.path.join(folder, "public_keys")))
        self.assertEqual(len(lists), 1, "every process got the same public list")
        listed = [line.split()[0] for line in lists.pop().splitlines()
                  if line and not line.startswith("#")]
        self.assertEqual(listed, ["ps:0", "ps:1", "worker:0", "worker:1", "tool"])

        # Worker 1's host got its key and the list over ssh, with umask 077,
        # and nobody else's; it was told where they are.
        calls = support.read_text(ssh_log).splitlines()
        copies = [c for c in calls if "cat >" in c]
        self.assertEqual(len(copies), 2, calls)
        self.assertTrue(all(REMOTE_WORKER in c and "umask 077" in c for c in copies), copies)
        self.assertIn("worker1/worker-1.key", copies[0])
        self.assertIn("worker1/public_keys", copies[1])
        started = [c for c in calls if "--role worker" in c]
        self.assertEqual(len(started), 1, calls)
        self.assertIn("PSTRAIN_KEYS=" + os.path.join(os.path.abspath(keys), "worker1"),
                      started[0])

    def test_a_sync_run_under_curve_refuses_nothing(self):
        # Sync mode uses every right a worker has: assign (worker 0), kv_set
        # in its own namespace and kv_get of the others' (Gloo's rendezvous).
        w = support.Workspace(support.cluster(security={"curve": True}))
        self.addCleanup(w.cleanup)
        run_dir = os.path.join(w.path, "run")
        r = support.run_tool("launch", [w.cluster, "--mode", "sync", "--run-dir", run_dir])
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        self.assertRegex(r.stdout, r"\[worker0\] final test accuracy 0\.\d+")
        self.assertNotIn("refused", r.stdout)


if __name__ == "__main__":
    unittest.main()
