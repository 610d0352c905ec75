#!/usr/bin/python3
"""tools/netlab: hosts in network namespaces with shaped links. The default
job trained across two hosts through a real sshd in each, the links' rate
held (from the hosts' own byte counters), nothing left behind after a
SIGTERM, and bad input refused before anything is made. Needs root, as CI
runs; every lab is removed by the tool, and what a failing test might leave
by tearDown."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest

import yaml

import support
from pstrain_tools import netlab

NETLAB = os.path.join(support.TOOLS, "netlab")
LINK = "200mbit"
LINK_BITS = 200e6
# What leaves a host, and what it receives, over any second: the kernel's
# token bucket at the link's rate, and the counters' own sampling.
RATE_TOLERANCE = 1.05

# A sender and a receiver that move bytes as fast as the link lets them:
# `serve ADDR` counts what arrives on port 5001, `send ADDR SECONDS` sends.
BLAST = r"""
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.socket()
    s.bind((sys.argv[2], 5001))
    s.listen()
    c, _ = s.accept()
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    print("received", n)
else:
    for _ in range(100):
        try:
            c = socket.create_connection((sys.argv[2], 5001))
            break
        except OSError:
            time.sleep(0.1)
    buf, end = b"x" * (1 << 20), time.time() + float(sys.argv[3])
    while time.time() < end:
        c.sendall(buf)
    c.close()
"""


# Runs in a lab's console: writes the cluster file TEMPLATE with @h1@,
# @h2@, ... replaced by the lab's host addresses ($NETLAB_HOSTS) as OUT,
# then runs the rest of its arguments.
IN_LAB = r"""
import os, sys
template, out = sys.argv[1], sys.argv[2]
with open(template) as f:
    text = f.read()
for i, host in enumerate(os.environ["NETLAB_HOSTS"].split(), 1):
    text = text.replace(f"@h{i}@", host)
with open(out, "w") as f:
    f.write(text)
os.execvp(sys.argv[3], sys.argv[3:])
"""


# Runs in a lab's console beside tools/launch: scrapes every metrics URL of
# RUN_DIR's prometheus_targets.json once, across the lab's links, and
# writes {target: text} to OUT (what it could read within 120 s).
SCRAPE = r"""
import json, os, sys, time, urllib.request
run_dir, out = sys.argv[1], sys.argv[2]
path = os.path.join(run_dir, "prometheus_targets.json")
scraped, targets, deadline = {}, None, time.time() + 120
while time.time() < deadline and (targets is None or set(targets) - set(scraped)):
    try:
        with open(path) as f:
            targets = [t for group in json.load(f) for t in group["targets"]]
    except (OSError, ValueError):
        pass
    for target in set(targets or ()) - set(scraped):
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=2) as r:
                scraped[target] = r.read().decode()
        except OSError:
            pass
    time.sleep(0.2)
with open(out, "w") as f:
    json.dump(scraped, f)
"""


def lab_namespaces(name):
    return {ns for ns in netlab.namespaces() if ns.startswith(name + "-")}


def p_host(record, name):
    """The host launch.json gives process `name`."""
    return next(p["host"] for p in record["processes"] if p["name"] == name)


class PeaksTest(unittest.TestCase):
    """The rate summary on samples made by hand (no root needed)."""

    def test_the_highest_rate_over_spans_of_at_least_a_second(self):
        # (t, sent, received): 1 MB/s, then 3 MB/s for 1.2 s, then idle.
        samples = [(0.0, 0, 0), (0.6, 600_000, 0), (1.2, 1_200_000, 10), (1.8, 3_000_000, 10),
                   (2.4, 4_800_000, 10), (3.0, 4_800_000, 10)]
        sent, received = netlab.peaks(samples)
        self.assertAlmostEqual(sent, 3_600_000 * 8 / 1.2)
        self.assertAlmostEqual(received, 10 * 8 / 1.2)
        self.assertIsNone(netlab.peaks(samples[:2]))
        self.assertIsNone(netlab.peaks([]))


class NetlabTest(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.fail("tools/netlab needs root (CI runs as root): run this test as root")
        self.tmp = tempfile.TemporaryDirectory(prefix="pstrain-netlab-")
        self.addCleanup(self.tmp.cleanup)
        self.name = f"t{os.getpid()}"
        self.addCleanup(self.remove_leftovers)
        self.in_lab = os.path.join(self.tmp.name, "in_lab.py")
        with open(self.in_lab, "w") as f:
            f.write(IN_LAB)

    def remove_leftovers(self):
        """What a failed test left of its lab: processes, namespaces, record."""
        netlab.remove(self.name, sorted(lab_namespaces(self.name)))

    def netlab(self, *args, timeout=600):
        return subprocess.run([sys.executable, NETLAB] + list(args), capture_output=True,
                              text=True, timeout=timeout, env=support.tool_env(), cwd=support.ROOT)

    def assert_nothing_left(self):
        self.assertEqual(lab_namespaces(self.name), set(), "namespaces left behind")
        self.assertFalse(os.path.exists(netlab.lab_dir(self.name)), "the lab's record is left")

    def launch_in_lab(self, doc, run_dir, hosts, rate, *options, scrape_to=None):
        """tools/launch of `doc` (hosts written @h1@, @h2@, ...) in a lab;
        with `scrape_to`, SCRAPE beside it from the console."""
        template = os.path.join(self.tmp.name, "template.yaml")
        with open(template, "w") as f:
            yaml.safe_dump(doc, f)
        cluster = os.path.join(self.tmp.name, "cluster.yaml")
        launch = [sys.executable, os.path.join(support.TOOLS, "launch"), cluster, "--run-dir",
                  run_dir, "--max-restarts", "0"]
        if scrape_to:
            scrape = os.path.join(self.tmp.name, "scrape.py")
            with open(scrape, "w") as f:
                f.write(SCRAPE)
            launch = ["sh", "-c", f'{sys.executable} {scrape} {run_dir} {scrape_to} & exec "$@"',
                      "sh"] + launch
        return self.netlab("run", "--hosts", str(hosts), "--rate", rate, "--name", self.name,
                           *options, "--", sys.executable, self.in_lab, template, cluster,
                           *launch)

    def peaks(self, stderr):
        """{host: (sent, received)} Mbit/s, from the tool's summary."""
        return {m[0]: (float(m[1]), float(m[2])) for m in re.findall(
            r"(h\d) peak over 1 s: sent ([\d.]+) Mbit/s, received ([\d.]+) Mbit/s", stderr)}

    def assert_link_rate_held(self, stderr, busiest):
        peaks = self.peaks(stderr)
        self.assertTrue(peaks, stderr)
        for host, rates in peaks.items():
            for rate in rates:
                self.assertLessEqual(rate * 1e6, LINK_BITS * RATE_TOLERANCE, f"{host}: {stderr}")
        # The traffic really crossed the link: the busiest direction came
        # near the rate.
        self.assertGreater(max(peaks[busiest]) * 1e6, 0.5 * LINK_BITS, stderr)

    def test_a_shaped_link_holds_its_rate_both_ways(self):
        blast = os.path.join(self.tmp.name, "blast.py")
        with open(blast, "w") as f:
            f.write(BLAST)
        stats = os.path.join(self.tmp.name, "stats.jsonl")
        # h2 sends to h1 for 4 s as fast as TCP goes.
        script = (f'set -- $NETLAB_HOSTS; ip netns exec {self.name}-h1 {sys.executable} {blast} '
                  f'serve $1 & $PSTRAIN_SSH $2 "{sys.executable} {blast} send $1 4"; wait')
        r = self.netlab("run", "--hosts", "2", "--rate", LINK, "--name", self.name, "--stats",
                        stats, "--", "sh", "-c", script)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("received", r.stdout)
        received = int(r.stdout.split()[-1])
        self.assertGreater(received * 8 / 4, 0.5 * LINK_BITS, "the sender was not at the rate")
        self.assert_link_rate_held(r.stderr, "h2")
        with open(stats) as f:
            samples = [json.loads(line) for line in f]
        self.assertEqual({s["host"] for s in samples}, {"h1", "h2"})
        self.assert_nothing_left()

    def test_the_default_job_trains_across_hosts_through_sshd(self):
        # A ps on h1, both workers on h2: every byte of the model crosses
        # the 200 Mbit link, through sshd in each namespace as users' ssh,
        # under CURVE (each process's key handed over ssh), each process's
        # metrics scraped from the console across the lab.
        with open(os.path.join(support.ROOT, "cluster.yaml")) as f:
            doc = yaml.safe_load(f)
        doc["ps"] = [{"host": "@h1@", "port": 7100}, {"host": "@h1@", "port": 7101}]
        doc["workers"] = {"count": 2, "host": "@h2@"}
        doc["security"] = {"curve": True}
        doc["metrics"] = {"enabled": True, "port_base": 9400}
        run_dir = os.path.join(self.tmp.name, "run")
        scraped_file = os.path.join(self.tmp.name, "scraped.json")
        r = self.launch_in_lab(doc, run_dir, 2, LINK, "--ssh", "--stats",
                               os.path.join(self.tmp.name, "stats.jsonl"),
                               scrape_to=scraped_file)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        found = re.findall(r"final test accuracy (\d+\.\d+)", r.stdout + r.stderr)
        self.assertTrue(found, r.stdout[-3000:])
        print(f"default job across a {LINK} link: final test accuracy {found[-1]}",
              file=sys.stderr)
        self.assertGreaterEqual(float(found[-1]), 0.85)
        # Every process went through ssh (none is this host's), and the
        # ps's log names the address it bound, which only h1 has.
        record = support.read_json(os.path.join(run_dir, "launch.json"))
        h1 = {p["host"] for p in record["processes"] if p["name"].startswith("ps")}
        self.assertEqual(len(h1), 1)
        h1 = h1.pop()
        ps0_log = support.read_text(os.path.join(run_dir, "ps0.log"))
        self.assertIn(h1, ps0_log)
        self.assertIn(", CURVE)", ps0_log)
        # Every process's metrics URL names its own host, and answered there.
        urls = {p["name"]: p["metrics_url"] for p in record["processes"]}
        self.assertEqual(len(urls), 4, record)
        scraped = support.read_json(scraped_file)
        for name, url in urls.items():
            target = url.split("/")[2]
            self.assertEqual(target.split(":")[0], p_host(record, name))
            self.assertIn(target, scraped, f"{name} at {url} never answered: {scraped.keys()}")
            self.assertIn("pstrain_", scraped[target])
        self.assertNotEqual(p_host(record, "worker0"), h1)
        self.assert_link_rate_held(r.stderr, "h1")
        self.assert_nothing_left()

    def test_the_planner_predicts_two_measured_cells_within_20_percent(self):
        # The MLP with 2 emulated workers (20 ms a step), each process on a
        # host of its own at 100 Mbit: 1 ps (its link binds) and 2 ps (the
        # workers' links bind), measured through the ip netns exec path.
        measured, predicted = {}, {}
        for servers in (1, 2):
            doc = {
                "job": "plan",
                "ps": [{"host": f"@h{1 + s}@", "port": 7100} for s in range(servers)],
                "workers": [{"host": f"@h{3 + w}@", "device": "emulated"} for w in range(2)],
                "model": "mlp",
                # 120 steps of 64 for each of the 2 workers.
                "data": {"name": "synthetic", "synthetic_train": 2 * 120 * 64,
                         "synthetic_test": 100},
                "train": {"batch_size": 64, "epochs": 1, "eval_every": 0,
                          "emulated_step_ms": 20},
                "optimizer": {"name": "sgd", "lr": 0.01},
            }
            # The plan needs no hosts: any address will do for it.
            cluster = os.path.join(self.tmp.name, f"plan{servers}.yaml")
            with open(cluster, "w") as f:
                yaml.safe_dump(doc, f)
            plan = subprocess.run([support.PSTRAIN, "--plan", "100mbit", "--step-ms", "20",
                                   "--cluster", cluster], capture_output=True, text=True,
                                  timeout=60)
            self.assertEqual(plan.returncode, 0, plan.stderr)
            row = re.search(rf"\| {servers} \(this file\) \| ([\d,]+) \|", plan.stdout)
            self.assertIsNotNone(row, plan.stdout)
            predicted[servers] = float(row.group(1).replace(",", ""))
            r = self.launch_in_lab(doc, os.path.join(self.tmp.name, f"run{servers}"), 4,
                                   "100mbit")
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            done = re.search(r"final: device emulated \(20 ms a step\), no test accuracy; "
                             r"(\d+) global samples, ([\d.]+) s", r.stdout)
            self.assertIsNotNone(done, r.stdout[-3000:])
            measured[servers] = int(done.group(1)) / float(done.group(2))
            self.assert_nothing_left()
        for servers in (1, 2):
            error = measured[servers] / predicted[servers] - 1
            print(f"planner, MLP, 2 emulated workers x 20 ms, {servers} ps, 100 Mbit: predicted "
                  f"{predicted[servers]:.0f}, measured {measured[servers]:.0f} samples/s "
                  f"({error:+.1%})", file=sys.stderr)
            self.assertLessEqual(abs(error), 0.2, f"{servers} ps")
        # The second ps is worth having here, and both say so.
        self.assertGreater(measured[2], 1.2 * measured[1])

    def test_exec_runs_a_command_on_a_host_without_sshd(self):
        # As ssh: the host's namespace, its address alone, and stdin passed
        # through (tools/launch hands CURVE keys over that way).
        copy = os.path.join(self.tmp.name, "copied")
        script = ('set -- $NETLAB_HOSTS; echo "hosts $1 $2"; '
                  '$PSTRAIN_SSH -o BatchMode=yes $2 "ip -o -4 addr show dev eth0"; '
                  f'printf secret | $PSTRAIN_SSH -o BatchMode=yes $2 "cat > {copy}"')
        r = self.netlab("run", "--hosts", "2", "--rate", "1gbit", "--name", self.name, "--",
                        "sh", "-c", script)
        self.assertEqual(r.returncode, 0, r.stderr)
        first, second = re.search(r"hosts (\S+) (\S+)", r.stdout).groups()
        self.assertIn(f"{second}/24", r.stdout)
        self.assertNotIn(f"{first}/", r.stdout)
        self.assertEqual(support.read_text(copy), "secret")
        self.assert_nothing_left()

    def test_sigterm_leaves_nothing_behind(self):
        out = open(os.path.join(self.tmp.name, "netlab.out"), "w+")
        self.addCleanup(out.close)
        tool = subprocess.Popen([sys.executable, NETLAB, "run", "--hosts", "2", "--rate", LINK,
                                 "--ssh", "--name", self.name, "--", "sleep", "600"],
                                stdout=out, stderr=subprocess.STDOUT, env=support.tool_env())
        self.addCleanup(lambda: tool.poll() is None and tool.kill())
        started = self.wait_until_up()
        tool.send_signal(signal.SIGTERM)
        self.assertEqual(tool.wait(60), 128 + signal.SIGTERM)
        out.seek(0)
        self.assertIn("SIGTERM", out.read())
        self.assert_nothing_left()
        self.assertFalse([p for p in started if support.alive(p)], "processes left running")

    def wait_until_up(self):
        """The PIDs inside the lab once both sshd and the command run."""
        names = [f"{self.name}-{h}" for h in ("c", "h1", "h2")]

        def up():
            inside = [netlab._pids_inside([ns]) for ns in names]
            return sum(inside, []) if all(inside) else None
        return support.wait_for(up, 60, "the lab to come up")

    def test_down_removes_what_a_killed_tool_left(self):
        tool = subprocess.Popen([sys.executable, NETLAB, "run", "--hosts", "2", "--rate", LINK,
                                 "--ssh", "--name", self.name, "--", "sleep", "600"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=support.tool_env())
        self.addCleanup(lambda: tool.poll() is None and tool.kill())
        started = self.wait_until_up()
        tool.kill()
        tool.wait(10)
        self.assertEqual(len(lab_namespaces(self.name)), 4, "SIGKILL leaves the lab")
        r = self.netlab("list")
        self.assertIn("left behind", r.stdout)
        r = self.netlab("down", self.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_nothing_left()
        self.assertFalse([p for p in started if support.alive(p)], "processes left running")

    def test_bad_input_is_named_and_changes_nothing(self):
        cases = [
            (["--rate", "fast"], "not a rate"),
            (["--rate", "1kbit"], "below 100kbit"),
            (["--hosts", "0"], "give 1 to 64"),
            (["--name", "Bad_Name"], "lowercase"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                r = self.netlab("run", "--hosts", "2", "--name", self.name, *args, "--", "true")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assert_nothing_left()
        r = self.netlab("run", "--hosts", "2", "--name", self.name, "--stats",
                        "/nonexistent/dir/s.jsonl", "--", "true")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--stats /nonexistent/dir/s.jsonl", r.stderr)
        self.assert_nothing_left()
        # A name taken by a namespace that is not a lab's.
        subprocess.run(["ip", "netns", "add", f"{self.name}-x"], check=True)
        try:
            r = self.netlab("run", "--hosts", "2", "--name", self.name, "--", "true")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("is taken", r.stderr)
            self.assertEqual(lab_namespaces(self.name), {f"{self.name}-x"})
        finally:
            subprocess.run(["ip", "netns", "del", f"{self.name}-x"], check=True)
        # Not root: said before anything is tried.
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, NETLAB, "run", "--hosts", "2", "--name", self.name,
                            "--", "true"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("needs root", r.stderr)
        self.assert_nothing_left()


if __name__ == "__main__":
    unittest.main()
