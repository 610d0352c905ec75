#!/usr/bin/python3
"""pstrain_tools.supervisor, the launcher's restart policy, on its own: no
process is started; each case says how processes ended and checks what the
policy decides. test_launch.py runs the same policy with real processes."""

import signal
import unittest

import support  # noqa: F401  (puts tools/ on sys.path)
from pstrain_tools.supervisor import (FAIL, LEAVE, LOSE, PS_FENCED, RESTART, Supervisor,
                                      backoff)

FAILED = 3  # an exit status of a failure
KILLED = -signal.SIGKILL  # how a process killed by a signal ended


def fail_until_spent(policy, name, role):
    """Ends `name` with a failure until the policy stops restarting it;
    returns the backoffs of its restarts and the last verdict."""
    delays = []
    while True:
        verdict = policy.ended(name, role, FAILED)
        if verdict.action != RESTART:
            return delays, verdict
        delays.append(verdict.delay)


class BackoffTest(unittest.TestCase):
    def test_doubles_from_the_base_and_is_capped_at_30_seconds(self):
        self.assertEqual([backoff(n, 1.0) for n in range(1, 9)], [1, 2, 4, 8, 16, 30, 30, 30])
        self.assertEqual([backoff(n, 0.25) for n in range(1, 4)], [0.25, 0.5, 1.0])
        self.assertEqual(backoff(1, 45.0), 30)
        self.assertEqual(backoff(5, 0.0), 0)

    def test_each_process_has_its_own_doubling(self):
        policy = Supervisor(workers=2, max_restarts=3, backoff_base=1.0)
        self.assertEqual(policy.ended("ps0", "ps", FAILED).delay, 1)
        self.assertEqual(policy.ended("ps0", "ps", KILLED).delay, 2)
        self.assertEqual(policy.ended("worker1", "worker", FAILED).delay, 1)
        self.assertEqual(policy.ended("ps0", "ps", FAILED).delay, 4)
        self.assertEqual(policy.restarts, {"ps0": 3, "worker1": 1})


class RestartTest(unittest.TestCase):
    def test_a_failure_or_a_foreign_signal_is_restarted_up_to_max_restarts(self):
        for code in (FAILED, 1, KILLED, -signal.SIGTERM):
            with self.subTest(code=code):
                policy = Supervisor(workers=2, max_restarts=2)
                self.assertEqual(policy.ended("worker0", "worker", code).action, RESTART)
                self.assertEqual(policy.ended("worker0", "worker", code).action, RESTART)
                self.assertNotEqual(policy.ended("worker0", "worker", code).action, RESTART)

    def test_exit_0_is_never_restarted(self):
        for role, loss in (("ps", "fail"), ("worker", "fail"), ("worker", "continue")):
            with self.subTest(role=role, on_worker_loss=loss):
                policy = Supervisor(workers=2, max_restarts=3, worker_loss=loss)
                self.assertEqual(policy.ended(f"{role}0", role, 0).action, LEAVE)
                self.assertEqual(policy.restarts[f"{role}0"], 0)
                self.assertIsNone(policy.failed)

    def test_a_process_ending_while_the_launcher_stops_the_run_is_not_restarted(self):
        # The launcher's own SIGTERM (on Ctrl-C or its SIGTERM), or whatever
        # else ends a process then: the run is ending, nothing is restarted
        # and nothing counts as its failure.
        for code in (-signal.SIGTERM, KILLED, FAILED):
            with self.subTest(code=code):
                policy = Supervisor(workers=2, max_restarts=3, worker_loss="continue")
                self.assertEqual(policy.ended("ps0", "ps", code, stopping=True).action, LEAVE)
                self.assertEqual(policy.ended("worker0", "worker", code, stopping=True).action,
                                 LEAVE)
                self.assertEqual(policy.restarts, {})
                self.assertEqual(policy.lost, [])
                self.assertIsNone(policy.failed)


class SpentRestartsTest(unittest.TestCase):
    def test_a_ps_whose_restarts_are_spent_stops_the_run(self):
        for loss in ("fail", "continue"):
            with self.subTest(on_worker_loss=loss):
                policy = Supervisor(workers=2, max_restarts=3, backoff_base=0.5, worker_loss=loss)
                delays, verdict = fail_until_spent(policy, "ps1", "ps")
                self.assertEqual(delays, [0.5, 1, 2])
                self.assertEqual(verdict.action, FAIL)
                self.assertFalse(verdict.every_worker_lost)
                self.assertEqual(policy.failed, "ps1")
                self.assertEqual(policy.lost, [])

    def test_a_fenced_ps_is_restarted_and_no_failure_once_restarts_are_spent(self):
        # Its backup serves its shard; a restart re-joins it.
        policy = Supervisor(workers=2, max_restarts=1)
        self.assertEqual(policy.ended("ps1", "ps", PS_FENCED).action, RESTART)
        self.assertEqual(policy.ended("ps1", "ps", PS_FENCED).action, LEAVE)
        self.assertIsNone(policy.failed)
        self.assertEqual(Supervisor(workers=2).ended("ps1", "ps", PS_FENCED).action, LEAVE)
        # From a worker it is a failure like any other.
        self.assertEqual(Supervisor(workers=2).ended("worker0", "worker", PS_FENCED).action, FAIL)

    def test_a_worker_under_fail_stops_the_run(self):
        policy = Supervisor(workers=3, max_restarts=2, worker_loss="fail")
        delays, verdict = fail_until_spent(policy, "worker1", "worker")
        self.assertEqual(delays, [1, 2])
        self.assertEqual(verdict.action, FAIL)
        self.assertEqual(policy.failed, "worker1")
        self.assertEqual(policy.lost, [])

    def test_a_worker_under_continue_is_lost_and_the_run_goes_on(self):
        policy = Supervisor(workers=3, max_restarts=2, worker_loss="continue")
        delays, verdict = fail_until_spent(policy, "worker1", "worker")
        self.assertEqual(delays, [1, 2])
        self.assertEqual(verdict.action, LOSE)
        self.assertIsNone(policy.failed)
        self.assertEqual(policy.lost, ["worker1"])
        # The others still get their own restarts.
        self.assertEqual(policy.ended("worker0", "worker", FAILED).action, RESTART)

    def test_losing_every_worker_under_continue_fails_the_run(self):
        policy = Supervisor(workers=3, max_restarts=1, worker_loss="continue")
        self.assertEqual(fail_until_spent(policy, "worker2", "worker")[1].action, LOSE)
        self.assertEqual(fail_until_spent(policy, "worker0", "worker")[1].action, LOSE)
        _, verdict = fail_until_spent(policy, "worker1", "worker")
        self.assertEqual(verdict.action, FAIL)
        self.assertTrue(verdict.every_worker_lost)
        self.assertEqual(policy.failed, "worker1")
        self.assertEqual(policy.lost, ["worker2", "worker0", "worker1"])

    def test_a_single_worker_under_continue_fails_the_run(self):
        policy = Supervisor(workers=1, max_restarts=1, worker_loss="continue")
        _, verdict = fail_until_spent(policy, "worker0", "worker")
        self.assertEqual(verdict.action, FAIL)
        self.assertTrue(verdict.every_worker_lost)

    def test_the_first_failure_names_the_run_failed(self):
        # Processes found ended in one poll are judged in turn: the first
        # whose restarts are spent failed the run, a later one changes nothing.
        policy = Supervisor(workers=2, max_restarts=0)
        self.assertEqual(policy.ended("ps1", "ps", FAILED).action, FAIL)
        self.assertEqual(policy.ended("ps0", "ps", KILLED).action, LEAVE)
        self.assertEqual(policy.failed, "ps1")


class NoRestartsTest(unittest.TestCase):
    def test_max_restarts_0_stops_the_run_at_the_first_failure(self):
        for role in ("ps", "worker"):
            for loss in ("fail", "continue"):
                for code in (FAILED, KILLED):
                    with self.subTest(role=role, on_worker_loss=loss, code=code):
                        policy = Supervisor(workers=4, max_restarts=0, worker_loss=loss)
                        verdict = policy.ended(f"{role}0", role, code)
                        self.assertEqual(verdict.action, FAIL)
                        self.assertFalse(verdict.every_worker_lost)
                        self.assertEqual(policy.failed, f"{role}0")
                        self.assertEqual(policy.lost, [])

    def test_max_restarts_0_leaves_a_clean_exit_alone(self):
        policy = Supervisor(workers=2, max_restarts=0)
        self.assertEqual(policy.ended("worker0", "worker", 0).action, LEAVE)
        self.assertIsNone(policy.failed)


if __name__ == "__main__":
    unittest.main()
