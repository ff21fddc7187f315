"""torchrun, with the repairs an elastic spot fleet needs (torch 2.13).

`spotrain train` runs this module instead of `torch.distributed.run`; the command line is
torchrun's.

1. **A machine that joins a running group never starts.** When the ranks share the agent's
   store (torch's default), the c10d rendezvous handler keeps the address of that store from
   its first round and never publishes it again: in a later round rank 0 reuses its cached
   address while a newly arrived node waits for that round's `MASTER_ADDR` until it times out,
   and the whole group with it (and when rank 0 moved to another machine, the others keep the
   address of one that left). With the sharing turned off (torch's own switch), every round
   publishes (rank 0) and reads (the others) its own address. Only where machines may join:
   a `--standalone` run keeps the shared store, whose port is taken when it is bound (rank 0's
   own store listens on a port the agent found free a moment before, which another process
   may take meanwhile).
2. **A membership change gives the ranks 30 s, not `--shutdown-timeout`.** When a machine
   arrives the agents stop their ranks to re-form the group; the ranks publish an emergency
   checkpoint on that SIGTERM, which may take longer than torchrun's built-in 30 s. The
   restart now waits as long as a shutdown does.

3. **A rank that cannot train is not restarted.** torchrun restarts a failed group up to
   `--max-restarts` times (spotrain allows many, for membership changes); a rank that exits
   `membership.CANNOT_TRAIN_EXIT` (its checkpoint has another definition, its configuration
   is wrong) would fail the same way each time while its machine is billed. Its agent now
   stops at once, and the machine's exit is counted as a crash with the reason.
4. **A stop reaches the rank, not its helpers.** torchrun stops a rank by signalling its whole
   process group, which holds the rank's DataLoader workers and the script's own subprocesses:
   a worker killed by SIGTERM fails the rank's next batch before its emergency checkpoint is
   taken. The stop (SIGTERM, SIGINT) now goes to the rank alone, which publishes and exits;
   its helpers keep serving it until then. SIGKILL, after `--shutdown-timeout`, still takes
   the whole group.
5. **A stop is a shutdown, not a traceback.** torchrun's agent enters its monitor every
   interval through torch's metrics wrapper; a stop signal that lands on the wrapper's first
   line became an UnboundLocalError in its `finally` (a traceback in the machine's log and
   exit 1, a run's cancel seen as a failure). The monitor now runs without the wrapper, whose
   metrics go nowhere here.
6. **A rank starts from the agent's PyTorch.** torchrun starts every rank, at every
   membership change too, as a new interpreter that imports PyTorch again; a rank is now a
   fork of the agent that runs its module as that interpreter would (`forked_rank.py`);
   the agent imports torch's compiler front end, which every rank's optimizer imports, once
   before the first fork. `SPOTRAIN_RANKS_AS_NEW_INTERPRETERS=1` in the environment (the
   image's, on a fleet) starts them as torchrun does.

The first two are checked by the fleet rehearsal, where a replacement machine joins a running
group; the next three by tests/test_user_scripts.py; the last by tests/test_forked_rank.py and
by every training test's golden losses.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from spotrain.trainer.forked_rank import ForkedRank, entry_of
from spotrain.trainer.membership import CANNOT_TRAIN_EXIT

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What asks a rank to publish and exit; only the rank hears it (repair 4)."""

RANKS_AS_NEW_INTERPRETERS = "SPOTRAIN_RANKS_AS_NEW_INTERPRETERS"
"""Set to 1, torchrun starts each rank as a new interpreter (its own way, without repair 6)."""

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""PyTorch's switch: whether CUDA is available is asked of NVML, which leaves forks usable."""


def _repair_torchrun(*, standalone: bool) -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    if not standalone:
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"

    def stop_workers_as_long_as_a_shutdown(self: Any, worker_group: Any) -> None:
        if hasattr(self, "_shutdown_timeout"):
            self._shutdown(timeout=self._shutdown_timeout)
        else:  # an older torchrun: the timeout lives in PContext.close (_older_torchrun)
            self._shutdown()

    LocalElasticAgent._stop_workers = stop_workers_as_long_as_a_shutdown

    # Repair 5: the monitor's own body, without the metrics wrapper (the one wrapped call
    # entered every interval, so that is where a stop landed).
    monitor = getattr(LocalElasticAgent._monitor_workers, "__wrapped__",
                      LocalElasticAgent._monitor_workers)  # fmt: skip

    def no_restart_for_what_cannot_train(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if any(f.exitcode == CANNOT_TRAIN_EXIT for f in result.failures.values()):
            self._remaining_restarts = 0
        return result

    LocalElasticAgent._monitor_workers = no_restart_for_what_cannot_train

    signal_whole_group = SubprocessHandler.close

    def close(self: Any, death_sig: signal.Signals | None = None) -> None:
        if death_sig not in STOP_SIGNALS:
            signal_whole_group(self, death_sig)
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(death_sig)  # the rank alone
        for stream in (self._stdout, self._stderr):
            if stream:
                stream.close()

    SubprocessHandler.close = close

    if os.environ.get(RANKS_AS_NEW_INTERPRETERS) != "1":
        start_a_new_interpreter = SubprocessHandler._popen
        # torchrun asks whether CUDA is available as it starts; asked the default way, that
        # initialises the driver, and no fork can use CUDA after it (each rank would then start
        # as a new interpreter after all). Asked through NVML, it does not; the ranks' own
        # environment stays as the user set it.
        ours = NVML_CHECK not in os.environ
        os.environ.setdefault(NVML_CHECK, "1")

        def start_the_rank(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
            if ours:
                env = {name: value for name, value in env.items() if name != NVML_CHECK}
            entry = entry_of(args)
            if entry is None:
                return start_a_new_interpreter(self, args, env)
            # Every rank's first optimizer step imports torch's compiler front end (2 CPU-s or
            # more; torch's optimizers wrap their methods in it): once here, for every fork.
            import torch._dynamo  # noqa: F401

            return ForkedRank(entry, env=env, stdout=self._stdout, stderr=self._stderr,
                              start_new_session=True)  # fmt: skip

        SubprocessHandler._popen = start_the_rank


def _older_torchrun(argv: list[str]) -> list[str]:
    """torchrun before PyTorch 2.13 (GPU images often carry one) has no `--shutdown-timeout`:
    take it off the command line and make it the least time every stop waits for the ranks."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import PContext

    if "--shutdown-timeout" not in argv or any(
        "--shutdown-timeout" in action.option_strings for action in run.get_args_parser()._actions
    ):
        return argv
    at = argv.index("--shutdown-timeout")
    least = int(argv[at + 1])
    close = PContext.close

    def close_waiting_for_the_checkpoint(
        self: Any, death_sig: Any = None, timeout: int = 30
    ) -> None:
        close(self, death_sig, max(timeout, least))

    PContext.close = close_waiting_for_the_checkpoint
    return argv[:at] + argv[at + 2 :]


def main() -> None:
    import signal
    import sys

    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    _repair_torchrun(standalone="--standalone" in sys.argv)
    sys.argv = _older_torchrun(sys.argv)
    try:
        run.main()
    except SignalException as stopped:
        # The machine is stopping (a reclaim, a cancel, a scale-in): torchrun forwarded the
        # signal and waited for the ranks' emergency checkpoint before it got here. One line,
        # not torchrun's traceback, and the status a signal's death would give.
        name = signal.Signals(stopped.sigval).name
        command = (
            "spotrain-torchrun" if sys.argv[0].endswith("spotrain-torchrun") else ("spotrain train")
        )
        print(f"{command}: stopped by {name} (each rank's emergency checkpoint, or why it has "
              "none, is above)", file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(128 + int(stopped.sigval))


if __name__ == "__main__":
    main()
