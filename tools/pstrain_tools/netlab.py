"""Many hosts on one machine: Linux network namespaces joined by a bridge,
each link shaped to a rate by the kernel.

    tools/netlab run --hosts N [--rate RATE] [--ssh] [--name NAME]
                     [--stats FILE] [--stats-interval S] -- COMMAND [ARG ...]
    tools/netlab exec NAME HOST COMMAND    (an ssh stand-in: $PSTRAIN_SSH)
    tools/netlab down NAME [--force]       (what a killed run left)
    tools/netlab list

`run` makes a lab, runs COMMAND in it and removes everything it made when
COMMAND ends, or when the tool gets SIGTERM, SIGINT or SIGHUP (COMMAND's
process group gets SIGTERM and 10 s, then every process left inside the
lab's namespaces is ended). It exits with COMMAND's status, 128 + the
signal's number when stopped by one, 2 when the lab cannot be made. A lab
NAME (default `nl<pid>`) is:

- a namespace NAME-sw holding the bridge;
- hosts NAME-h1 ... NAME-hN, each with `lo` and `eth0` at 198.18.K.i/24
  (198.18.0.0/15 is reserved for benchmarking networks, RFC 2544; K is
  picked so that no two labs share a subnet), its link to the bridge shaped
  both ways to RATE by a token-bucket filter (`tc tbf`: what leaves the
  host on eth0, and what the bridge sends it), so a host sends and receives
  at most RATE each way, as on a full-duplex link;
- a console NAME-c at 198.18.K.254, unshaped, where COMMAND runs: the
  operator's machine, from which tools/launch reaches the hosts.

Nothing is added to the namespace the tool was started in (the pairs of
links are created inside the lab's namespaces), so no traffic of the lab
can leave it and no route of this machine changes.

COMMAND gets NETLAB_NAME, NETLAB_HOSTS (the hosts' addresses, space
separated) and PSTRAIN_SSH, the way tools/launch starts processes on other
hosts: with --ssh a real sshd (Debian's openssh-server) listens on each
host's port 22 with a key made for the lab, and PSTRAIN_SSH is `ssh -F` a
config that names that key and the lab's host key; without it, PSTRAIN_SSH
is `tools/netlab exec NAME`, which runs the command in the host's namespace
as `ip netns exec` would.

--stats FILE samples each host's eth0 byte counters every --stats-interval
seconds (default 0.5) into FILE (JSON lines: t, host, tx_bytes, rx_bytes) and
prints, at the end, each host's highest send and receive rates over spans of
samples at least one second long, beside the link's.

A lab's record is kept in /run/pstrain-netlab/NAME (its namespaces, its
tool's PID, the ssh keys); `down NAME` removes a lab from it after its tool
was killed with SIGKILL. It needs root (network namespaces and tc), and
says so otherwise. See docs/scaling.md.
"""

import argparse
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

# tools/netlab, the command this module is the body of.
TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "netlab")

STATE_ROOT = "/run/pstrain-netlab"
SUBNETS = ipaddress.ip_network("198.18.0.0/15")
CONSOLE_HOST = 254
MAX_HOSTS = 64
SSHD = "/usr/sbin/sshd"
GRACE_SECONDS = 5.0
_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


class NetlabError(Exception):
    """A lab cannot be made or used; the message says why."""


def parse_rate(text):
    """Bits per second of a tc-style rate (100mbit, 1gbit, 2.5gbit)."""
    m = _RATE.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise NetlabError(f"--rate {text!r}: not a rate; give a number and bit, kbit, mbit, "
                          "gbit or tbit (per second), e.g. 100mbit or 1gbit")
    bits = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if bits < 10**5:
        raise NetlabError(f"--rate {text!r}: below 100kbit, too slow for a training run")
    return int(bits)


def check_root():
    if os.geteuid() != 0:
        raise NetlabError("netlab needs root: network namespaces, links and tc are "
                          "root's (run it with sudo)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise NetlabError(f"netlab needs `{tool}` (Debian's iproute2)")


def _ip(*args, ns=None, check=True):
    cmd = (["ip", "-n", ns] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetlabError(f"`{shlex.join(cmd)}` failed: {r.stderr.strip()}")
    return r


def namespaces():
    """Every network namespace `ip netns` knows, by name."""
    r = _ip("-j", "netns", "list", check=False)
    try:
        return {n["name"] for n in json.loads(r.stdout or "[]")}
    except ValueError:
        return set()


def lab_dir(name):
    return os.path.join(STATE_ROOT, name)


def load_record(name):
    try:
        with open(os.path.join(lab_dir(name), "lab.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        raise NetlabError(f"no lab named {name!r} ({lab_dir(name)} does not exist)") from None


def labs():
    try:
        return sorted(os.listdir(STATE_ROOT))
    except FileNotFoundError:
        return []


def free_subnet():
    taken = set()
    for name in labs():
        try:
            taken.add(load_record(name)["subnet"])
        except (NetlabError, KeyError, ValueError):
            pass
    for subnet in SUBNETS.subnets(new_prefix=24):
        if str(subnet) not in taken:
            return subnet
    raise NetlabError("every /24 of 198.18.0.0/15 is taken by a lab: `tools/netlab list`")


def tbf(rate_bits):
    """tc arguments shaping a link to `rate_bits`: a bucket of 4 ms of the
    rate (at least 64 KiB, one offloaded segment) so that the rate holds over
    any window of more than a few ms, and 50 ms of queue. The second bucket
    (peakrate, 1% over the rate, 128 KiB: two offloaded segments) keeps a
    host that idled from spending its saved 4 ms at once, faster than any
    wire: without it, one MLP worker, whose link idles while it computes and
    waits for its last reply, stepped 1.39x faster on a 1 Gbit lab link
    (8,000 samples/s against 5,754) than a wire would let it."""
    burst = max(64 * 1024, rate_bits // 8 // 250)
    return ["tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "latency", "50ms",
            "peakrate", f"{rate_bits * 101 // 100}bit", "mtu", "131072"]


class Lab:
    """One lab: claim() takes its name, make() builds it, and remove()
    undoes it, a make() that failed halfway too. The record on disk is
    written before each namespace is made, so `down` finds whatever a
    SIGKILL left."""

    def __init__(self, name, hosts, rate_bits, ssh):
        self.name, self.rate_bits, self.ssh = name, rate_bits, ssh
        self.subnet = free_subnet()
        base = self.subnet.network_address
        self.hosts = {f"h{i}": str(base + i) for i in range(1, hosts + 1)}
        self.console = str(base + CONSOLE_HOST)
        self.dir = lab_dir(name)
        self.record = {"name": name, "subnet": str(self.subnet), "rate_bits": rate_bits,
                       "hosts": self.hosts, "console": self.console, "namespaces": [],
                       "owner": os.getpid()}

    def ns(self, host):
        return f"{self.name}-{host}"

    def save(self):
        tmp = os.path.join(self.dir, "lab.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.record, f, indent=1)
        os.replace(tmp, os.path.join(self.dir, "lab.json"))

    def add_namespace(self, ns):
        self.record["namespaces"].append(ns)
        self.save()
        _ip("netns", "add", ns)
        _ip("link", "set", "lo", "up", ns=ns)

    def claim(self):
        """Takes the name: the record's folder, made or refused atomically,
        so two tools given one name cannot both build (or remove) a lab."""
        os.makedirs(STATE_ROOT, exist_ok=True)
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            raise NetlabError(f"--name {self.name!r} is taken: {self.dir} exists (`tools/netlab "
                              f"down {self.name}` removes what a killed tool left)") from None
        self.save()

    def make(self):
        sw = self.ns("sw")
        self.add_namespace(sw)
        _ip("link", "add", "br0", "type", "bridge", ns=sw)
        _ip("link", "set", "br0", "up", ns=sw)
        for host, addr in [("c", self.console)] + list(self.hosts.items()):
            ns = self.ns(host)
            self.add_namespace(ns)
            # Both ends are born inside the lab: the pair never exists in
            # the namespace the tool runs in.
            _ip("link", "add", "eth0", "type", "veth", "peer", "name", host, "netns", sw, ns=ns)
            _ip("addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", host, "master", "br0", "up", ns=sw)
            if host != "c":
                for dev, where in (("eth0", ns), (host, sw)):
                    r = subprocess.run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root"]
                                       + tbf(self.rate_bits), capture_output=True, text=True)
                    if r.returncode != 0:
                        raise NetlabError(f"shaping {host}'s link: tc said {r.stderr.strip()}")
        if self.ssh:
            self.start_sshd()

    def start_sshd(self):
        d = os.path.join(self.dir, "ssh")
        os.mkdir(d, 0o700)
        for key in ("host_key", "id_ed25519"):
            r = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                                f"netlab {self.name}", "-f", os.path.join(d, key)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise NetlabError(f"ssh-keygen failed: {r.stderr.strip()}")
        shutil.copy(os.path.join(d, "id_ed25519.pub"), os.path.join(d, "authorized_keys"))
        with open(os.path.join(d, "host_key.pub")) as f:
            host_key = " ".join(f.read().split()[:2])
        with open(os.path.join(d, "known_hosts"), "w") as f:
            f.write(",".join(self.hosts.values()) + " " + host_key + "\n")
        with open(os.path.join(d, "ssh_config"), "w") as f:
            f.write(f"Host *\n  User root\n  IdentityFile {d}/id_ed25519\n  IdentitiesOnly yes\n"
                    f"  UserKnownHostsFile {d}/known_hosts\n  StrictHostKeyChecking yes\n"
                    "  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n")
        # sshd wants its privilege-separation folder, which the Debian
        # service makes at boot and a container may lack.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        daemons = {}
        for host, addr in self.hosts.items():
            config = os.path.join(d, f"sshd_{host}.conf")
            with open(config, "w") as f:
                f.write(f"ListenAddress {addr}:22\nHostKey {d}/host_key\n"
                        f"AuthorizedKeysFile {d}/authorized_keys\n"
                        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                        "PidFile none\nMaxStartups 64\nMaxSessions 64\n")
            log = os.path.join(d, f"sshd_{host}.log")
            with open(log, "w") as err:
                # A session of its own: a terminal's signals are the tool's
                # to handle, and SIGHUP would make sshd restart itself.
                daemons[host] = subprocess.Popen(
                    ["ip", "netns", "exec", self.ns(host), SSHD, "-D", "-e", "-f", config],
                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 15
        for host, addr in self.hosts.items():
            log = os.path.join(d, f"sshd_{host}.log")
            while True:
                r = subprocess.run(["ip", "netns", "exec", self.ns("c"), "ssh", "-F",
                                    os.path.join(d, "ssh_config"), addr, "true"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    break
                ended = daemons[host].poll() is not None
                if ended or time.monotonic() > deadline:
                    with open(log) as f:
                        tail = " / ".join(f.read().strip().splitlines()[-3:])
                    raise NetlabError(f"sshd of {host} ({addr}) "
                                      f"{'exited' if ended else 'did not answer in 15 s'}: "
                                      f"ssh said {r.stderr.strip()!r}; sshd said {tail!r}")
                time.sleep(0.2)

    def env(self):
        env = dict(os.environ, NETLAB_NAME=self.name,
                   NETLAB_HOSTS=" ".join(self.hosts.values()))
        if self.ssh:
            env["PSTRAIN_SSH"] = "ssh -F " + os.path.join(self.dir, "ssh", "ssh_config")
        else:
            env["PSTRAIN_SSH"] = f"{shlex.quote(TOOL)} exec {self.name}"
        return env


def _end_pids(pids, grace=GRACE_SECONDS):
    """SIGTERM, then after `grace` SIGKILL, to those of `pids` still alive."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            alive.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid):
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:
        pass  # not our child: ask the kernel
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _pids_inside(names):
    pids = []
    for ns in names:
        r = _ip("netns", "pids", ns, check=False)
        pids += [int(p) for p in r.stdout.split() if p.isdigit()]
    return pids


def remove(name, names):
    """Ends every process inside the lab's namespaces `names` (all descend
    from the lab: its command and what that started, its sshd and their
    sessions; found by namespace, never by a PID recorded earlier, which the
    kernel may have given to another process since), deletes the namespaces
    (their links and the bridge go with them) and the lab's record. Returns
    the namespaces it could not delete."""
    _end_pids(_pids_inside(names))
    # What a process that was forking meanwhile started.
    _end_pids(_pids_inside(names), grace=1)
    left = []
    known = namespaces()
    for ns in names:
        if ns in known and _ip("netns", "del", ns, check=False).returncode != 0:
            left.append(ns)
    if not left:
        shutil.rmtree(lab_dir(name), ignore_errors=True)
    return left


class _Stop(Exception):
    pass


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_stopping = []


def _on_signal(signum, frame):
    # Once: a second signal while the lab is being removed must not cut
    # that short.
    if not _stopping:
        _stopping.append(signum)
        raise _Stop(signal.Signals(signum).name)


def _say(text):
    """To stderr, if there still is one (a closed terminal, a dead pipe)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


class StatsSampler(threading.Thread):
    """Every `interval` s, each host's eth0 counters into `out` (JSON lines),
    each sample timed at the middle of its read."""

    def __init__(self, lab, out, interval):
        super().__init__(daemon=True)
        self.lab, self.out, self.interval = lab, out, interval
        self.stop = threading.Event()
        self.samples = {host: [] for host in lab.hosts}

    def counters(self, host):
        r = _ip("-j", "-s", "link", "show", "dev", "eth0", ns=self.lab.ns(host), check=False)
        stats = json.loads(r.stdout)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]

    def run(self):
        while True:
            for host in self.lab.hosts:
                before = time.monotonic()
                try:
                    tx, rx = self.counters(host)
                except (ValueError, KeyError, IndexError):
                    continue  # the lab is going away
                after = time.monotonic()
                if after - before > self.interval / 2:
                    continue  # too unsure when the counters were read
                t = (before + after) / 2
                self.samples[host].append((t, tx, rx))
                self.out.write(json.dumps({"t": round(t, 4), "host": host, "tx_bytes": tx,
                                           "rx_bytes": rx}) + "\n")
            self.out.flush()
            if self.stop.wait(self.interval):
                return


def peaks(samples, window=1.0):
    """The highest send and receive rates (bits/s) over spans of samples at
    least `window` s long, each span the shortest such that ends at its
    sample; None when no span is that long."""
    best, j, found = [0.0, 0.0], 0, False
    for i in range(len(samples)):
        while j + 1 < i and samples[i][0] - samples[j + 1][0] >= window:
            j += 1
        dt = samples[i][0] - samples[j][0]
        if dt >= window:
            found = True
            for k in (0, 1):
                best[k] = max(best[k], (samples[i][k + 1] - samples[j][k + 1]) * 8 / dt)
    return best if found else None


def check_run_args(args):
    rate_bits = parse_rate(args.rate)
    if not 1 <= args.hosts <= MAX_HOSTS:
        raise NetlabError(f"--hosts {args.hosts}: give 1 to {MAX_HOSTS}")
    if not _NAME.match(args.name):
        raise NetlabError(f"--name {args.name!r}: a lowercase letter, then up to 11 lowercase "
                          "letters or digits")
    if not args.stats_interval >= 0.05:
        raise NetlabError(f"--stats-interval {args.stats_interval}: at least 0.05 s")
    if not args.command:
        raise NetlabError("no command: tools/netlab run ... -- COMMAND")
    check_root()
    if args.ssh:
        for tool in (SSHD, shutil.which("ssh-keygen"), shutil.which("ssh")):
            if not tool or not os.path.exists(tool):
                raise NetlabError("--ssh needs Debian's openssh-server and openssh-client "
                                  "(tools/setup installs them)")
        with open("/etc/shadow") as f:
            root = next((line.split(":") for line in f if line.startswith("root:")), None)
        if root and root[1].startswith("!"):
            raise NetlabError("--ssh: root's account is locked (its password in /etc/shadow "
                              "starts with '!'), and sshd refuses key logins to a locked "
                              "account; `usermod -p '*' root` unlocks it without a password")
    if any(ns.startswith(args.name + "-") for ns in namespaces()):
        raise NetlabError(f"--name {args.name!r} is taken: a network namespace of that name "
                          "exists")
    return rate_bits


def run_script_per_rate(script, rates, hosts, args, tool):
    """Runs `script --inside RATE ARGS...` in a lab of its own (`hosts`
    hosts) at each rate in turn, as bench_scaling and bench_compression
    measure; a lab that ends badly is reported by `tool`'s name and the
    next rate still runs."""
    for rate in rates:
        r = subprocess.run([sys.executable, TOOL, "run", "--hosts", str(hosts), "--rate", rate,
                            "--", sys.executable, script, "--inside", rate] + list(args))
        if r.returncode != 0:
            print(f"{tool}: the lab at {rate} ended with {r.returncode}", file=sys.stderr)


def run(args):
    args.name = args.name or f"nl{os.getpid()}"
    rate_bits = check_run_args(args)
    stats = None
    if args.stats:
        try:
            stats = open(args.stats, "w")
        except OSError as e:
            raise NetlabError(f"--stats {args.stats}: {e.strerror}") from None
    lab = Lab(args.name, args.hosts, rate_bits, args.ssh)
    lab.claim()
    child = sampler = None
    code = 1
    try:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, _on_signal)
        lab.make()
        _say(f"netlab {lab.name}: {args.hosts} hosts at {args.rate} "
             f"({', '.join(f'{h} {a}' for h, a in lab.hosts.items())}), console {lab.console}"
             f"{', sshd on each' if args.ssh else ''}")
        if stats:
            sampler = StatsSampler(lab, stats, args.stats_interval)
            sampler.start()
        child = subprocess.Popen(["ip", "netns", "exec", lab.ns("c")] + args.command,
                                 env=lab.env(), start_new_session=True)
        code = child.wait()
        code = code if code >= 0 else 128 - code
    except _Stop as stop:
        _say(f"netlab {lab.name}: {stop}: ending the command and removing the lab")
        code = 128 + _stopping[0]
    except (NetlabError, OSError, subprocess.CalledProcessError) as e:
        _say(f"netlab {lab.name}: {e}")
        code = 2
    finally:
        # Nothing may cut the removal short now: the signals wait.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        left = []
        try:
            if child is not None and child.poll() is None:
                # The command's own grace (tools/launch gives its
                # processes 5 s) before remove() ends what is left.
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                    child.wait(GRACE_SECONDS * 2)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            if sampler:
                sampler.stop.set()
                sampler.join()
        finally:
            left = remove(lab.name, lab.record["namespaces"])
        if stats:
            stats.close()
        if sampler:
            for host, samples in sampler.samples.items():
                p = peaks(samples)
                _say(f"netlab {lab.name}: {host}: too short to measure a rate over 1 s" if p is None
                     else f"netlab {lab.name}: {host} peak over 1 s: sent {p[0] / 1e6:.1f} "
                     f"Mbit/s, received {p[1] / 1e6:.1f} Mbit/s (link {rate_bits / 1e6:g} Mbit/s)")
        if left:
            _say(f"netlab {lab.name}: could not remove {', '.join(left)}")
            code = code or 1
    return code


def exec_in(args):
    """ssh's calling convention ([-o OPTION]... HOST COMMAND), run in the
    namespace of the lab's host with that address."""
    rest = list(args.rest)
    while rest and rest[0] == "-o":
        rest = rest[2:]
    if len(rest) < 2:
        raise NetlabError("exec: give HOST COMMAND")
    host, command = rest[0], " ".join(rest[1:])
    check_root()
    record = load_record(args.name)
    for h, addr in record["hosts"].items():
        if host in (h, addr):
            os.execvp("ip", ["ip", "netns", "exec", f"{args.name}-{h}", "sh", "-c", command])
    raise NetlabError(f"exec: {host!r} is not a host of lab {args.name} "
                      f"({', '.join(record['hosts'].values())})")


def down(args):
    """Removes a lab whose tool was killed: by its record, or where a SIGKILL
    came before the record was written, by its namespaces' names."""
    check_root()
    try:
        record = load_record(args.name)
    except NetlabError:
        if not os.path.isdir(lab_dir(args.name)):
            raise
        record = {"owner": None, "namespaces": []}
    if record["owner"] and _alive(record["owner"]) and not args.force:
        raise NetlabError(f"lab {args.name} is in use by its tool (PID {record['owner']}): "
                          "end that, or give --force")
    names = set(record["namespaces"]) | {ns for ns in namespaces()
                                         if ns.startswith(args.name + "-")}
    left = remove(args.name, sorted(names))
    if left:
        raise NetlabError(f"could not remove {', '.join(left)}")
    print(f"netlab {args.name}: removed", file=sys.stderr)
    return 0


def list_labs(args):
    check_root()
    for name in labs():
        try:
            r = load_record(name)
            owner = "running" if _alive(r["owner"]) else "left behind (tools/netlab down)"
            print(f"{name}\t{r['subnet']}\t{len(r['hosts'])} hosts\t"
                  f"{r['rate_bits'] / 1e6:g} Mbit/s\t{owner}")
        except (NetlabError, KeyError, ValueError):
            print(f"{name}\t(unreadable record)")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="netlab", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("run", help="make a lab, run a command in it, remove the lab")
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--rate", default="1gbit", help="each host's link, each way (tc style)")
    p.add_argument("--ssh", action="store_true", help="a real sshd on every host")
    p.add_argument("--name", help="the lab's name (default nl<pid>)")
    p.add_argument("--stats", metavar="FILE", help="sample each host's byte counters into FILE")
    p.add_argument("--stats-interval", type=float, default=0.5)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)
    p = sub.add_parser("exec", help="run a command on a lab's host (an ssh stand-in)")
    p.add_argument("name")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=exec_in)
    p = sub.add_parser("down", help="remove a lab a killed tool left")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="even while its tool runs")
    p.set_defaults(func=down)
    sub.add_parser("list", help="the labs there are").set_defaults(func=list_labs)
    args = parser.parse_args(argv)
    if getattr(args, "command", None) and args.command[0] == "--":
        args.command = args.command[1:]
    try:
        return args.func(args)
    except (NetlabError, OSError) as e:
        print(f"netlab: {e}", file=sys.stderr)
        return 2
