"""A real one-node Slurm for a test: munged, slurmctld and slurmd from
Debian's slurm-wlm and munge, run in the foreground as children of the test
with their own key, sockets, ports, state, spool, pid and log files in a
temporary folder, so nothing of the machine's own Slurm (if any) is touched.

    with SlurmCluster() as slurm:
        job = slurm.sbatch(script_path, cwd=...)
        state = slurm.wait_job(job, deadline_s=240)

The node declares more CPUs than the machine has (SlurmdParameters=
config_overrides), so a job of a few tasks fits on a 2-core machine. No
cgroups: proctrack/linuxproc and task/none. The daemons run as the test's
user (SlurmUser=root where CI runs as root). Every daemon is stopped by PID,
its whole process group, when the `with` block ends, also on failure. A
daemon that does not start raises SlurmError with the tail of its log: the
test fails saying why, it never passes or skips.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

START_DEADLINE_S = 60.0
STOP_GRACE_S = 5.0
NODE_CPUS = 16  # declared, more than the machine has: config_overrides
LOG_TAIL_LINES = 25


class SlurmError(Exception):
    """A daemon did not start or a command failed; the message says why."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, lines=LOG_TAIL_LINES):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]) or "(empty)\n"
    except OSError as e:
        return f"(no log: {e})\n"


def slurm_conf(tmp, node, ctld_port, slurmd_port, user):
    return f"""# A one-node Slurm for pstrain's tests (tests/tools/slurm_fixture.py).
ClusterName=pstraintest
SlurmctldHost={node}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={tmp}/munge.socket
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self):
        self.tmp = None
        self.daemons = []  # [(name, Popen, log path)]
        self.jobs = []  # ids from sbatch(), cancelled by stop()
        self.conf = None
        self.node = socket.gethostname().split(".")[0]

    # --- lifetime -----------------------------------------------------
    def __enter__(self):
        for tool in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo"):
            if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
                raise SlurmError(f"{tool} is not installed; tools/setup installs slurm-wlm "
                                 "and munge")
        self.tmp = tempfile.mkdtemp(prefix="pstrain-slurm-")
        # munged wants its socket's folder searchable by all (clients of any
        # user reach it); what is secret in it (the key, state) is 0400/0700.
        os.chmod(self.tmp, 0o755)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _start(self):
        t = self.tmp
        for d in ("state", "spool"):
            os.makedirs(os.path.join(t, d), mode=0o700)
        key = os.path.join(t, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        self.conf = os.path.join(t, "slurm.conf")
        user = pwd.getpwuid(os.getuid()).pw_name
        with open(self.conf, "w") as f:
            f.write(slurm_conf(t, self.node, free_port(), free_port(), user))
        self.env = dict(os.environ, SLURM_CONF=self.conf)

        self._spawn("munged", ["munged", "-F", f"--socket={t}/munge.socket",
                               f"--key-file={key}", f"--pid-file={t}/munged.pid",
                               f"--seed-file={t}/munged.seed"],
                    None)  # in the foreground it logs to stderr
        self._wait(lambda: os.path.exists(f"{t}/munge.socket"), "munged",
                   "its socket did not appear")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf],
                    f"{t}/slurmctld.log")
        self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), "slurmctld",
                   "scontrol ping does not answer UP")
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", self.conf],
                    f"{t}/slurmd.log")
        self._wait(lambda: self._ok(["sinfo", "-h", "-N", "-o", "%T"], "idle"), "slurmd",
                   f"sinfo does not show node {self.node} idle")

    def _spawn(self, name, argv, log):
        out = open(os.path.join(self.tmp, name + ".out"), "wb")
        # A new session: the daemon and whatever it forks form one process
        # group, stopped as one by stop().
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env, start_new_session=True)
        out.close()
        self.daemons.append((name, p, log))

    def _ok(self, argv, want):
        try:
            r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and want in r.stdout

    def _wait(self, ready, name, what):
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            for n, p, log in self.daemons:
                if p.poll() is not None:
                    raise SlurmError(self._why(f"{n} exited with code {p.returncode} while "
                                               f"starting {name}"))
            if ready():
                return
            time.sleep(0.3)
        raise SlurmError(self._why(f"{name} did not start in {START_DEADLINE_S:g} s: {what}"))

    def _why(self, headline):
        parts = [headline]
        for n, _, log in self.daemons:
            if log:
                parts.append(f"--- last lines of {n}'s log ({log}):\n{tail(log)}")
            parts.append(f"--- {n}'s stdout/stderr:\n{tail(os.path.join(self.tmp, n + '.out'))}")
        return "\n".join(parts)

    def stop(self):
        """Cancels the jobs still running, ends every daemon by its process
        group, slurmd first, then every process a job left (slurmstepd
        detaches from slurmd's group), then cleans up."""
        self._cancel_jobs()
        for _, p, _ in reversed(self.daemons):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_S
        for _, p, _ in reversed(self.daemons):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # Group members it left behind (job steps, slurmstepd) too.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.daemons = []
        self._kill_job_processes()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _cancel_jobs(self):
        running = [j for j in self.jobs if self._alive(j)]
        if not running:
            return
        subprocess.run(["scancel", *running], env=self.env, capture_output=True, timeout=30)
        deadline = time.monotonic() + STOP_GRACE_S * 2
        while time.monotonic() < deadline and any(self._alive(j) for j in running):
            time.sleep(0.3)

    def _alive(self, job):
        try:
            return self.job_fields(job).get("JobState") in ("PENDING", "RUNNING", "COMPLETING",
                                                             "CONFIGURING")
        except (SlurmError, subprocess.TimeoutExpired):
            return False

    def _kill_job_processes(self):
        """SIGKILL, by PID, to every process whose environment names this
        cluster's slurm.conf: the job's tasks and steps that outlived it."""
        if not self.conf:
            return
        mark = f"SLURM_CONF={self.conf}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if mark in env:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # --- use ----------------------------------------------------------
    def run(self, argv, **kw):
        """A Slurm client command against this cluster; raises SlurmError on failure."""
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, **kw)
        if r.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited with {r.returncode}: "
                             f"{r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def sbatch(self, script, cwd=None):
        """Submits `script`; its job id."""
        out = self.run(["sbatch", "--parsable", script], cwd=cwd)
        job = out.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def job_fields(self, job):
        """scontrol show job's Key=Value fields (accounting is off: no sacct)."""
        out = self.run(["scontrol", "show", "job", "-o", job])
        fields = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait_job(self, job, deadline_s):
        """The job's fields once its JobState is final; SlurmError at the deadline."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                 "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            fields = self.job_fields(job)
            if fields.get("JobState") in final:
                return fields
            for n, p, _ in self.daemons:
                if p.poll() is not None:
                    raise SlurmError(self._why(f"{n} exited with code {p.returncode} while "
                                               f"job {job} ran"))
            time.sleep(1)
        raise SlurmError(self._why(f"job {job} did not end in {deadline_s:g} s "
                                   f"(JobState {self.job_fields(job).get('JobState')})"))

    def daemon_logs(self):
        return self._why("daemon logs")
