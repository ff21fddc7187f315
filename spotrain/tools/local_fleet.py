"""`spotrain run play local RUN`: a submitted run of the `local` environment, trained on this
host by the machines its deployed groups launch; `spotrain run reclaim local RUN`: EC2's reclaim
of one of them, rehearsed.

The machines are those of the region the run trains in (home until it moves, then its epoch's).
That region's deployed handler's capacity check starts the run's groups (as the schedule does
every 5 minutes in an account); each instance in service then boots here from the run's deployed
launch template (`localcloud/machines.py`: its own metadata service and work disk, the user data
and the boot script run for real, spotrain from this checkout instead of the container), each on
the market EC2 launched it on (the on-demand one coordinates the run). Their lines are printed
after their instance id. `play` follows the groups as EC2 would: an instance the group launches
later (a replacement) boots, and one that leaves service (a scale-in: `run cancel`, a spend-cap
hold) is stopped, SIGTERM first, so it publishes its emergency checkpoint. It ends when every
machine it booted has exited and the groups launch no other. Ctrl-C stops every machine at once,
as a scale-in does (each publishes its emergency checkpoint; none is counted a crash), and EC2
takes their instances back.

A reclaim is asked of the `play` that runs the machine (a request file in its folder, since
that process holds the machine's metadata service) and carried out as EC2 does it: the notice
on the machine's metadata service, the EventBridge warning to the deployed handler, the
instance terminated once the machine has left or the notice's two minutes are over, and the
group's replacement booted.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrain.core import run_epochs, run_lifecycle
from spotrain.core.capacity import SPOT
from spotrain.core.catalog_schema import CHECKPOINTS_TABLE_SUFFIX, EVENTS_TABLE_SUFFIX
from spotrain.core.errors import SpotrainError
from spotrain.core.handler_settings import CAPACITY_CHECK_MINUTES
from spotrain.localcloud import control
from spotrain.localcloud.machines import (
    LocalMachine,
    deployed_user_data,
    in_service,
    on_demand_first,
)
from spotrain.tools.rehearsal import deliver_capacity_check, deliver_interruption

RECLAIM_REQUEST = "reclaim-request"
"""A file in a played machine's folder that asks the `play` running it to reclaim it."""
RECLAIM_OUTCOME = "reclaimed.json"
"""What the reclaim did, written by `play` next to the request."""
PLAYING = "playing.json"
"""The machines `play` runs now (instance id -> market), in its folder."""
NOTICE_S = 120.0
"""EC2 terminates a reclaimed spot instance two minutes after its notice."""
FOLLOW_EVERY_S = 2.0


@dataclass
class _Reclaim:
    machine: LocalMachine
    noticed_at: float


def play(
    run: str, *, work: Path, say: Callable[[str], None], timeout_s: float = 3600,
    ranks_per_machine: int = 1,
) -> dict[str, int]:  # fmt: skip
    """Boot `run`'s machines and follow them and their group; each machine's exit status by
    instance id."""
    player = _Player(run, work=work, say=say, ranks_per_machine=ranks_per_machine)
    deadline = time.monotonic() + timeout_s
    try:
        while player.going():
            if time.monotonic() > deadline:
                raise SpotrainError(f"the machines of run {run} ran past {timeout_s:.0f} s: "
                                    f"stopped them (their boot logs are under {work})")  # fmt: skip
            time.sleep(0.5)
    except (KeyboardInterrupt, SpotrainError):
        say("stopping every machine at once, as a scale-in does (SIGTERM: emergency checkpoints)")
        player.stop_all()
        raise
    finally:
        player.close()
    ended = run_lifecycle.read(player.events, run)
    if ended.finished_step is not None or ended.cancelled_at is not None:
        # The machine time up to the end is counted (`spotrain cost report`); a run that
        # ended otherwise (its machines failed) is left for `run status` to explain, not
        # started again unplayed.
        player.check()
    return {i: m.wait(timeout=10) for i, m in player.machines.items()}


class _Player:
    """`play`'s state: the machines it booted, the reclaims it carries out, the group it
    follows."""

    def __init__(self, run: str, *, work: Path, say: Callable[[str], None],
                 ranks_per_machine: int) -> None:  # fmt: skip
        from spotrain.core import resource_names as names
        from spotrain.tools import deploy

        self.run, self.work, self.say, self.ranks = run, work, say, ranks_per_machine
        self.cloud = control.require()
        config = deploy.environment("local", local_endpoint=self.cloud.endpoint)
        catalog = names.environment_resource(config.name, CHECKPOINTS_TABLE_SUFFIX)
        # The run's machines are where it trains: home until it moves, then its epoch's region
        # (whose handler starts its groups there, and whose copies its machines use).
        self.region = trains_in(config.region_names, run, lambda region: control.resource(
            "dynamodb", self.cloud.endpoint, region).Table(catalog))  # fmt: skip
        home = self.region == config.primary_region
        if not home:
            say(f"run {run} trains in {self.region} (it moved): its machines there")
        self.aws_env = control.aws_environment(self.cloud.endpoint, self.region)
        os.environ.update(self.aws_env)  # the handler's check runs here, on the local cloud
        self.autoscaling = control.client("autoscaling", self.cloud.endpoint, self.region)
        self.ec2 = control.client("ec2", self.cloud.endpoint, self.region)
        self.group, self.handler = (
            names.fleet_group(config.name, run, None if home else self.region),
            names.interruption_handler(config.name),
        )
        self.events = control.resource("dynamodb", self.cloud.endpoint, self.region).Table(
            names.environment_resource(config.name, EVENTS_TABLE_SUFFIX)
        )
        checked = self.check()
        say(f"capacity check: {checked['decision']}: {checked['reason']}")
        members, template = in_service(self.autoscaling, self.group)
        if not members:
            raise SpotrainError(f"run {run} has no machine in service after the capacity check "
                                f"({checked['decision']}: {checked['reason']}): submit it with "
                                f"`spotrain run submit local {run}`, or see `spotrain run "
                                f"status local {run}`")  # fmt: skip
        self.user_data, self.template = deployed_user_data(self.ec2, template), template
        self.port = control.free_port()
        self.machines: dict[str, LocalMachine] = {}
        self.printed: dict[str, int] = {}
        self.reclaims: dict[str, _Reclaim] = {}
        self.stopping: set[str] = set()
        """Machines that left service, being stopped."""
        self.followed = time.monotonic()
        self.boot(members)
        say(
            f"{len(self.machines)} machine(s) of {self.group} boot from {template}: "
            + ", ".join(f"{m.instance_id} ({m.lifecycle})" for m in self.machines.values())
        )

    def check(self) -> dict[str, Any]:
        """The handler's capacity check, as its schedule delivers it (and the spend it counts)."""
        self.checked = time.monotonic()
        return deliver_capacity_check(self.cloud, self.handler, self.region, self.run)

    def boot(self, members: list[dict[str, Any]]) -> None:
        for member, market in on_demand_first(self.ec2, members):
            machine = LocalMachine.of_member(
                member, lifecycle=market, root=self.work, user_data=self.user_data,
                aws_env=self.aws_env, rdzv_port=self.port, default_type="g5.xlarge",
                launch_template=self.template,
                settings={"SPOTRAIN_RDZV_LAST_CALL": "5",
                          "SPOTRAIN_NPROC_PER_NODE": str(self.ranks)},
            )  # fmt: skip
            (machine.root / RECLAIM_REQUEST).unlink(missing_ok=True)
            self.machines[machine.instance_id] = machine.start()
            self.printed[machine.instance_id] = 0
        _write_playing(self.work, self.machines)

    def going(self) -> bool:
        """One turn: print, carry out reclaims, follow the group. False once every machine
        has exited and the group launches no other."""
        _print_new(list(self.machines.values()), self.printed, self.say)
        self._start_reclaims()
        self._finish_reclaims()
        if time.monotonic() - self.checked >= CAPACITY_CHECK_MINUTES * 60:
            self.check()  # as the deployed schedule does: the ledger keeps counting
        if time.monotonic() - self.followed < FOLLOW_EVERY_S:
            return True
        self.followed = time.monotonic()
        return self._follow_group() or bool(self.reclaims)

    def _start_reclaims(self) -> None:
        for instance, machine in self.machines.items():
            if (instance in self.reclaims or not machine.running()
                    or not (machine.root / RECLAIM_REQUEST).exists()):  # fmt: skip
                continue
            (machine.root / RECLAIM_REQUEST).unlink()  # asked once: EC2 reclaims once
            self.say(f"reclaiming {instance} as EC2 does: its spot notice, the handler's "
                     "warning, then the instance taken back")  # fmt: skip
            machine.announce_interruption()
            deliver_interruption(self.cloud, self.handler, instance, self.region, self.say)
            self.reclaims[instance] = _Reclaim(machine, time.monotonic())

    def _finish_reclaims(self) -> None:
        for instance, reclaim in list(self.reclaims.items()):
            since = time.monotonic() - reclaim.noticed_at
            if reclaim.machine.running() and since < NOTICE_S:
                continue  # EC2 waits out the notice for a machine still saving
            del self.reclaims[instance]
            _take_back(self.autoscaling, reclaim.machine)
            self.check()  # its time ends with it
            process = reclaim.machine.process
            code = process.poll() if process is not None else None
            outcome = {"instance": instance, "exit": code, "noticed_s": round(since, 1)}
            (reclaim.machine.root / RECLAIM_OUTCOME).write_text(json.dumps(outcome))
            self.say(f"{instance} reclaimed (exit {code}): EC2 took it back; the group "
                     "replaces it")  # fmt: skip
            _write_playing(self.work, self.machines)

    def _follow_group(self) -> bool:
        """Boot what the group launched, stop what left service; True while anything runs."""
        current = in_service(self.autoscaling, self.group)[0]
        ids = {m["InstanceId"] for m in current}
        leaving = [i for i, m in self.machines.items() if m.running() and i not in ids
                   and i not in self.reclaims and i not in self.stopping]  # fmt: skip
        # A finished run's groups go to 0 while its machines end on their own: only a run
        # scaled in before its end (a cancel, a spend cap) has its machines stopped.
        if leaving and run_lifecycle.read(self.events, self.run).finished_step is None:
            for instance in leaving:
                self.say(f"{instance} left service (a scale-in): stopping it as EC2 does "
                         "(SIGTERM: its emergency checkpoint)")  # fmt: skip
                self.stopping.add(instance)
                _in_background(self.machines[instance].shut_down)
        new = [m for m in current if m["InstanceId"] not in self.machines]
        if new:
            self.say("the group launched " + ", ".join(m["InstanceId"] for m in new) + ": boots")
            self.boot(new)
        return any(m.running() for m in self.machines.values())

    def stop_all(self) -> None:
        running = [m for m in self.machines.values() if m.running()]
        for stopper in [_in_background(m.shut_down) for m in running]:
            stopper.join()
        for machine in running:
            _take_back(self.autoscaling, machine)

    def close(self) -> None:
        _print_new(list(self.machines.values()), self.printed, self.say)
        for machine in self.machines.values():
            machine.stop()
        (self.work / PLAYING).unlink(missing_ok=True)


def trains_in(regions: Sequence[str], run: str, catalog_in: Callable[[str], Any]) -> str:
    """The region `run` trains in, from the first copy of the catalog that answers, in the
    environment's order (`catalog_in(region)`: that region's table): its current epoch's, or
    home (the first) when it never moved, or when no copy answers. A copy that answers with a
    refusal is raised: a fault to fix, not an outage to work round."""
    from spotrain.core.errors import does_not_answer

    for region in regions:
        try:
            chain = run_epochs.read_chain(catalog_in(region), run)
        except Exception as error:
            if not does_not_answer(error):
                raise
            continue  # that region is down: another's copy says as much
        return run_epochs.trains_in(chain, regions[0])
    return regions[0]


def reclaim(run: str, *, work: Path, instance: str | None, say: Callable[[str], None],
            timeout_s: float = NOTICE_S + 60) -> dict[str, Any]:  # fmt: skip
    """Ask the `play` running `run`'s machines to reclaim `instance` (default: its newest spot
    machine) and wait for the outcome."""
    playing = _read_playing(work)
    if not playing:
        raise SpotrainError(f"no machine of run {run} is being played here: start `spotrain run "
                            f"play local {run}` (another terminal), then reclaim one of its "
                            "machines")  # fmt: skip
    spot = [i for i, market in playing.items() if market == SPOT]
    chosen = instance or (spot[-1] if spot else None)
    if chosen is None or chosen not in playing:
        listed = ", ".join(f"{i} ({m})" for i, m in playing.items())
        raise SpotrainError(f"{instance or 'a spot machine'} is not among the machines run "
                            f"{run} plays: {listed}; name one with --machine")  # fmt: skip
    folder = work / chosen
    (folder / RECLAIM_OUTCOME).unlink(missing_ok=True)
    (folder / RECLAIM_REQUEST).write_text(f"{time.time()}\n")
    say(f"asked to reclaim {chosen} ({playing[chosen]}): its notice, the handler's warning, then "
        "EC2 takes it back")  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not (folder / RECLAIM_OUTCOME).exists():
        if time.monotonic() > deadline:
            raise SpotrainError(f"{chosen} was not reclaimed within {timeout_s:.0f} s: is "
                                f"`spotrain run play local {run}` still running? (its boot "
                                f"log: {folder / 'boot.log'})")  # fmt: skip
        time.sleep(0.5)
    outcome: dict[str, Any] = json.loads((folder / RECLAIM_OUTCOME).read_text())
    say(f"{chosen} reclaimed {outcome['noticed_s']:.0f} s after its notice (its trainer "
        f"exited {outcome['exit']}); the group launches its replacement, which `run play` "
        "boots")  # fmt: skip
    return outcome


def _take_back(autoscaling: Any, machine: LocalMachine) -> None:
    """EC2 takes the instance back (the group launches a replacement), stopping it first if it
    still runs."""
    if machine.running():
        machine.shut_down()
    from botocore.exceptions import BotoCoreError, ClientError

    with contextlib.suppress(ClientError, BotoCoreError):  # already gone: nothing to take
        autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=machine.instance_id, ShouldDecrementDesiredCapacity=False
        )


def _in_background(work: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def _write_playing(work: Path, machines: dict[str, LocalMachine]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    listed = {i: m.lifecycle for i, m in machines.items() if m.running()}
    (work / PLAYING).write_text(json.dumps(listed))


def _read_playing(work: Path) -> dict[str, str]:
    try:
        return dict(json.loads((work / PLAYING).read_text()))
    except (OSError, ValueError):
        return {}


def _print_new(machines: list[LocalMachine], printed: dict[str, int],
               say: Callable[[str], None]) -> None:  # fmt: skip
    for machine in machines:
        lines = machine.lines_from(printed[machine.instance_id])
        for line in lines:
            text = line.rstrip("\n")
            say(f"{machine.instance_id}  {text}")
        printed[machine.instance_id] += len(lines)
