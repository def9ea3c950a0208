"""A storm of faults through one run (issue 53): the bundled trainer on 3 test hosts under `--max-restarts 6`
while, one after another, a rank is killed with SIGKILL, a host is stopped and started again, the data plane
between two hosts is dropped for a minute (the restart after it waits for the link), a rank is frozen with SIGSTOP
past the stall timeout, a host's sshd is restarted and a host's disk is filled and freed.
tests/ssh/test_storm.py asserts on what it records; benchmarks/bench_storm.py times it.

    storm = Storm(cluster, project, disk)    # a 3-host SSHCluster(persistent_roots=True), h3's root on `disk`;
                                             # steps=TEST_STEPS: the test's shorter run (STEPS: the benchmark's)
    code, calm_out = beside(storm, calm)    # or: storm.start(); storm.ride(); storm.finish()
    storm.faults        # one Fault each: when it was injected, seen (detected) and got over (recovered)
    storm.text          # everything `run` printed

A fault is detected when `run` names it (the restart line that ends its attempt, or, for the disk, the rank's
warning); it is recovered from at the first step line that follows (the next attempt training again, or, for the
disk, the rank's "checkpoint: room again"). Every step waits until training is past a checkpoint, so each
restart resumes from a checkpoint the fault did not touch. Every simulated host is this machine: the ranks' pids
are read from /proc (sshcluster.rank_pid).
"""
from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time
from dataclasses import dataclass

import clirun
import dataplane
from sshcluster import rank_pid

STEP = re.compile(r"\] step +(\d+)/(\d+) \|")
CHECKPOINT = re.compile(r"\] step (\d+) \| checkpoint ")
MAX_RESTARTS = 6
STALL_TIMEOUT_S = 8
DROP_S = 60              # how long the data plane stays down
CKPT_EVERY = 10
STEPS = 400              # the benchmark's run (benchmarks/bench_storm.py)
# the test's run (tests/ssh/test_storm.py): the six faults are over by about step 85 (each waits for training to be 2
# steps past the next checkpoint, one every CKPT_EVERY steps, and a restart resumes from the last one), whatever the
# machine's speed; 200 leaves more than twice that, at half the training of 400 in both runs
TEST_STEPS = 200
# ... each at least this long: with ranks that wait without spinning (tests/spinwait/README.md) this model's steps
# come faster than a loaded machine's test reads them, and a fault injected two steps past a checkpoint as read
# from run's output landed in the next checkpoint twice; at 0.25 s the ten steps between checkpoints take 2.5 s
TEST_STEP_S = 0.25


def train(steps: int = STEPS) -> list[str]:
    return ["--n-layers", "2", "--dim", "32", "--n-heads", "2", "--mlp-dim", "64", "--block-size", "32",
            "--batch-size", "4", "--warmup", "5", "--steps", str(steps), "--report-every", "1", "--eval-every", "0",
            "--ckpt-every", str(CKPT_EVERY), "--keep", "2", "--dropout", "0.1",
            # even shares: auto could move rows at other steps than in the undisturbed run (its shares follow
            # measured speeds, and a storm makes them uneven), and the final loss is compared to the last digit
            "--balance", "off"]


TRAIN = train()


def run_args(inventory, steps: int = STEPS, step_s: float = 0.0) -> list[str]:
    """`run`'s arguments for the storm; step_s > 0 makes each step last at least that long (clirun.paced)."""
    return ["--hosts", str(inventory), "--backend", "ring", "--plain", "--max-restarts", str(MAX_RESTARTS),
            "--restart-delay", "2", "--stall-timeout", str(STALL_TIMEOUT_S), *clirun.paced(step_s), "--", *train(steps)]


@dataclass
class Fault:
    name: str              # what was done, in words
    where: str             # the host (and rank)
    injected: float        # monotonic seconds
    detected: float | None = None
    recovered: float | None = None
    named: str = ""        # the line of `run` that named it (the restart line, or the rank's warning)

    def row(self, began: float) -> dict:
        def rel(t):
            return None if t is None else round(t - self.injected, 1)
        return {"fault": self.name, "where": self.where, "at_s": round(self.injected - began, 1),
                "detection_s": rel(self.detected), "recovery_s": rel(self.recovered), "named": self.named}


class Storm:
    def __init__(self, cluster, project, disk, steps_limit_s: float = 240.0, steps: int = STEPS, step_s: float = 0.0):
        self.cluster, self.project, self.disk = cluster, project, disk
        self.steps = steps
        # each fault lands 2 steps past a checkpoint, before the next one (a rank frozen inside a checkpoint's
        # announced quiet phase is a hang, not a stall): a test whose ranks step faster than it reads their lines
        # paces them
        self.step_s = step_s
        self.limit = steps_limit_s
        self.lines: list[tuple[float, str]] = []
        self.seen = 0                     # lines read by the waits so far
        self.inbox: queue.Queue = queue.Queue()
        self.faults: list[Fault] = []
        self.restarts = 0
        self.job = None
        self.run_id = ""
        self.began = 0.0
        self.waits = self.back = ""       # the restart's lines while it waited for the data plane
        self.step = 0                     # the last step past_a_checkpoint read (after ride(): where the faults ended)

    # ---- reading the job's output --------------------------------------------------------------
    def start(self) -> None:
        self.began = time.monotonic()
        self.job = clirun.start("run", *run_args(self.cluster.inventory, self.steps, self.step_s), cwd=self.project,
                                own_cache=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.job.stdout:
            self.inbox.put((time.monotonic(), line))
        self.inbox.put((time.monotonic(), None))

    def wait_for(self, pattern: re.Pattern | str, limit: float | None = None) -> tuple[float, str, re.Match]:
        """Read on until a line matches; (when it came, the line, the match). The job's end or the limit fail."""
        pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + (limit or self.limit)
        while True:
            t, line = self._next(deadline, f"no line like {pattern.pattern!r} in time")
            if line is None:
                raise AssertionError(f"the run ended before a line like {pattern.pattern!r}:\n{self.tail()}")
            if not self.run_id and (m := clirun.TOKEN.search(line)):
                self.run_id = m.group(1)
            if (m := pattern.search(line)):
                return t, line.rstrip("\n"), m

    def past_a_checkpoint(self) -> int:
        """Read until training is 2 steps past a checkpoint; that checkpoint's step."""
        _, _, m = self.wait_for(CHECKPOINT)
        ckpt = int(m.group(1))
        while True:
            _, _, m = self.wait_for(STEP)
            self.step = int(m.group(1))
            if self.step >= ckpt + 2:
                return ckpt

    def tail(self, n: int = 60) -> str:
        """The last n lines but for the step reports (the last 3 of those stay)."""
        steps = [i for i, (_, line) in enumerate(self.lines) if STEP.search(line)][-3:]
        kept = [line for i, (_, line) in enumerate(self.lines) if i in steps or not STEP.search(line)]
        return "".join(kept[-n:])

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def attempt_dir(self) -> str:
        return os.path.join(self.project, "runs", self.run_id, f"attempt-{self.restarts}")

    # ---- the faults ----------------------------------------------------------------------------
    def _restarted(self, fault: Fault) -> None:
        """The attempt the fault ended is named in `run`'s restart line; the next one trains again."""
        self.restarts += 1
        fault.detected, fault.named, _ = self.wait_for(rf"run \S+: .*; restart {self.restarts} of {MAX_RESTARTS} in ")
        self.wait_for(r"resumed from ")
        fault.recovered, _, _ = self.wait_for(STEP)

    def kill_a_rank(self) -> None:
        self.past_a_checkpoint()
        fault = self._inject("a rank killed with SIGKILL", "rank 1 on h2")
        os.kill(rank_pid(self.run_id, 1), signal.SIGKILL)
        self._restarted(fault)

    def stop_a_host(self) -> None:
        """h2's sshd and every session under it go (a Mac switched off); it is started again, its disk as it was,
        while the run waits its restart delay."""
        self.past_a_checkpoint()
        fault = self._inject("a host stopped and started again", "h2")
        self.cluster.stop_host(2)
        self.restarts += 1
        fault.detected, fault.named, _ = self.wait_for(rf"; restart {self.restarts} of {MAX_RESTARTS} in ")
        self.cluster.start_host(2)
        self.wait_for(r"resumed from ")
        fault.recovered, _, _ = self.wait_for(STEP)

    def drop_the_data_plane(self) -> None:
        """h1's and h2's ring endpoints drop every packet for DROP_S seconds (a cable pulled; SSH still up)."""
        self.past_a_checkpoint()
        points = dataplane.endpoints(os.path.join(self.attempt_dir(), "ranks.json"))
        mine = [p for p in points if p[0] in (self.cluster.host(1).address, self.cluster.host(2).address)]
        fault = self._inject(f"the data plane between h1 and h2 dropped for {DROP_S} s", "h1-h2")
        with dataplane.DataPlaneDrop(mine):
            self.restarts += 1
            fault.detected, fault.named, _ = self.wait_for(rf"; restart {self.restarts} of {MAX_RESTARTS} in ")
            # the restart asks the link before it launches, and waits while it is down
            _, self.waits, _ = self.wait_for(rf": restart {self.restarts} waits for the data plane")
            time.sleep(max(fault.injected + DROP_S - time.monotonic(), 0))
        _, self.back, _ = self.wait_for(r": the data plane answers again after \d+s", limit=60)
        self.wait_for(r"resumed from ")
        fault.recovered, _, _ = self.wait_for(STEP)

    def freeze_a_rank(self) -> None:
        self.past_a_checkpoint()
        pid = rank_pid(self.run_id, 2)
        fault = self._inject(f"a rank frozen with SIGSTOP (stall timeout {STALL_TIMEOUT_S} s)", "rank 2 on h3")
        os.kill(pid, signal.SIGSTOP)
        try:
            self._restarted(fault)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def restart_sshd(self) -> None:
        """h1's sshd restarts (its listener away for a moment); the ranks' sessions go on: no attempt is lost,
        which the test checks by the restarts count at the end."""
        self.past_a_checkpoint()
        fault = self._inject("a host's sshd restarted", "h1")
        self.cluster.restart_sshd(1)
        fault.named = "nothing to name: no attempt lost (the ranks' sessions outlive the listener)"
        self.past_a_checkpoint()           # training goes on through a checkpoint after it

    def fill_a_disk(self) -> None:
        """h3's disk fills after a checkpoint: the rank's next report warns that the next checkpoint will not fit;
        freed on that, the next report says so; the checkpoint after it is written."""
        self.past_a_checkpoint()
        fault = self._inject("a host's disk filled, then freed", "h3")
        self.disk.fill()
        fault.detected, fault.named, _ = self.wait_for(r"\[rank 2 h3\] warning: no space left on device for the next "
                                                       r"checkpoint in ")
        self.disk.free()
        fault.recovered, _, _ = self.wait_for(r"\[rank 2 h3\] checkpoint: room again in ")
        self.past_a_checkpoint()

    def _inject(self, name: str, where: str) -> Fault:
        fault = Fault(name, where, time.monotonic())
        self.faults.append(fault)
        return fault

    def ride(self) -> None:
        """The six faults, one after another."""
        for fault in (self.kill_a_rank, self.stop_a_host, self.drop_the_data_plane, self.freeze_a_rank,
                      self.restart_sshd, self.fill_a_disk):
            fault()

    def finish(self, limit: float = 300.0) -> int:
        """Read to the job's end; its exit code."""
        deadline = time.monotonic() + limit
        while self._next(deadline, "the run did not end in time")[1] is not None:
            pass
        return self.job.wait(timeout=30)

    def _next(self, deadline: float, late: str) -> tuple[float, str | None]:
        """The next line `run` printed, kept in self.lines, and when it came; None for a line at the job's end."""
        try:
            t, line = self.inbox.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise AssertionError(f"{late}:\n{self.tail()}") from None
        if line is not None:
            self.lines.append((t, line))
        return t, line

    def stop(self) -> None:
        if self.job is not None and self.job.poll() is None:
            self.job.kill()


def beside(storm: Storm, calm, limit: float = 300.0) -> tuple[int, str]:
    """The storm ridden to its end while `calm` (a clirun.start process: the same run on other hosts) goes on;
    (the storm's exit code, calm's output). Both are stopped whatever happens."""
    try:
        storm.start()
        storm.ride()
        code = storm.finish()
        calm_out, _ = calm.communicate(timeout=limit)
    finally:
        storm.stop()
        calm.kill()
    return code, calm_out
