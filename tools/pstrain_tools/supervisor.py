"""The launcher's restart policy, apart from the processes it applies to.

A process that exits non-zero or dies of a signal the launcher did not send
is restarted, up to `max_restarts` times, after a backoff that doubles at
each restart of that process, capped at 30 s. A process that exits 0 is
never restarted, nor one that ends while the launcher stops the run. When a
process's restarts are spent, a ps stops the run; so does a worker under
train.on_worker_loss `fail`, while under `continue` the others go on without
it, unless it was the last worker. With max_restarts 0 the first failure
stops the run, whatever on_worker_loss says. A ps that exits with
PS_FENCED is no failure: its backup serves its shard (replicated shards),
and a restart re-joins it; it is restarted while restarts are left, and the
run goes on without it after. launch.py starts and stops the processes;
Supervisor only says what to do when one ends.
"""

import collections

BACKOFF_CAP_SECONDS = 30.0

# The exit code of a ps whose backup took its shard over (server/request_loop.h,
# kExitFenced).
PS_FENCED = 75

# What to do about a process that ended (Verdict.action).
LEAVE = "leave"      # nothing: it succeeded, the run is stopping, or has already failed
RESTART = "restart"  # start it again after Verdict.delay seconds
LOSE = "lose"        # go on without this worker (on_worker_loss: continue)
FAIL = "fail"        # stop the run: this process failed it

# `delay`: the backoff before a RESTART; `every_worker_lost`: a FAIL because
# the last worker was lost under on_worker_loss continue.
Verdict = collections.namedtuple("Verdict", "action delay every_worker_lost",
                                 defaults=(0.0, False))


def backoff(restart, base):
    """Seconds to wait before restart number `restart` (1, 2, ...) of one
    process: base, 2 base, 4 base, ..., at most BACKOFF_CAP_SECONDS."""
    return min(base * 2 ** (restart - 1), BACKOFF_CAP_SECONDS)


class Supervisor:
    """The restart policy of one run of `workers` workers (and any number of
    servers), and what it decided so far."""

    def __init__(self, workers, max_restarts=0, backoff_base=1.0, worker_loss="fail"):
        self.workers = workers
        self.max_restarts = max_restarts
        self.backoff_base = backoff_base
        self.worker_loss = worker_loss
        self.restarts = collections.Counter()  # process name -> restarts given
        self.lost = []     # the workers the run goes on without, in the order lost
        self.failed = None  # the name of the process that failed the run

    def ended(self, name, role, code, stopping=False):
        """The Verdict on process `name` (`role` "ps" or "worker"), which ended
        with `code`: its exit status, or minus the signal that killed it.
        `stopping`: the launcher is stopping the run (it received SIGINT or
        SIGTERM), so this end may be its own doing."""
        if code == 0 or stopping:
            return Verdict(LEAVE)
        if self.restarts[name] < self.max_restarts:
            self.restarts[name] += 1
            return Verdict(RESTART, backoff(self.restarts[name], self.backoff_base))
        if role == "ps" and code == PS_FENCED:
            return Verdict(LEAVE)
        goes_on = self.max_restarts > 0 and role == "worker" and self.worker_loss == "continue"
        if goes_on and len(self.lost) + 1 < self.workers:
            self.lost.append(name)
            return Verdict(LOSE)
        if self.failed is not None:
            return Verdict(LEAVE)
        self.failed = name
        # Under continue too once every worker is lost: nothing would train,
        # and the servers would only wait for their timeouts.
        if goes_on:
            self.lost.append(name)
        return Verdict(FAIL, every_worker_lost=goes_on)
