"""`spotrain local play RUN`: a submitted run of the `local` environment, trained on this host
by the machines its deployed groups launch.

The deployed handler's capacity check starts the run's groups (as the schedule does every 5
minutes in an account); each instance in service then boots here from the run's deployed
launch template (`localcloud/machines.py`: its own metadata service and work disk, the user
data and the boot script run for real, spotrain from this checkout instead of the container),
each on the market EC2 launched it on (the on-demand one coordinates the run). Their lines
are printed after their instance id until every machine has exited; Ctrl-C stops them as EC2
stops a machine (SIGTERM: each publishes its emergency checkpoint). The run's catalog stream
then takes its groups back to 0 once it published its final step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from spotrain.core.errors import SpotrainError
from spotrain.localcloud import control
from spotrain.localcloud.machines import (
    LocalMachine,
    deployed_user_data,
    in_service,
    on_demand_first,
)
from spotrain.tools.rehearsal import deliver_capacity_check


def play(
    run: str, *, work: Path, say: Callable[[str], None], timeout_s: float = 3600,
    ranks_per_machine: int = 1,
) -> dict[str, int]:  # fmt: skip
    """Boot `run`'s machines and follow them; each machine's exit status by instance id."""
    from spotrain.stacks.interruptions import handler_name
    from spotrain.stacks.runs import fleet_group_name
    from spotrain.tools import deploy

    cloud = control.require()
    config = deploy.environment("local", local_endpoint=cloud.endpoint)
    region = config.primary_region
    aws_env = control.aws_environment(cloud.endpoint, region)
    os.environ.update(aws_env)  # the handler's check runs here, against the local cloud
    autoscaling = control.client("autoscaling", cloud.endpoint, region)
    ec2 = control.client("ec2", cloud.endpoint, region)
    group = fleet_group_name(config.name, run)
    checked = deliver_capacity_check(cloud, handler_name(config), region, run)
    say(f"capacity check: {checked['decision']}: {checked['reason']}")
    members, template = in_service(autoscaling, group)
    if not members:
        raise SpotrainError(f"run {run} has no machine in service after the capacity check "
                            f"({checked['decision']}: {checked['reason']}): submit it with "
                            f"`spotrain run submit local {run}`, or see `spotrain run status "
                            f"local {run}`")  # fmt: skip
    user_data = deployed_user_data(ec2, template)
    port = control.free_port()
    machines = [
        LocalMachine.of_member(
            member, lifecycle=market, root=work, user_data=user_data,
            aws_env=aws_env, rdzv_port=port, default_type="g5.xlarge",
            settings={"SPOTRAIN_RDZV_LAST_CALL": "5",
                      "SPOTRAIN_NPROC_PER_NODE": str(ranks_per_machine)},
        ).start()
        for member, market in on_demand_first(ec2, members)
    ]  # fmt: skip
    say(f"{len(machines)} machine(s) of {group} boot from {template}: "
        + ", ".join(f"{m.instance_id} ({m.lifecycle})" for m in machines))  # fmt: skip
    printed = {m.instance_id: 0 for m in machines}
    deadline = time.monotonic() + timeout_s
    try:
        while any(m.running() for m in machines):
            _print_new(machines, printed, say)
            if time.monotonic() > deadline:
                raise SpotrainError(f"the machines of run {run} ran past {timeout_s:.0f} s: "
                                    f"stopped them (their boot logs are under {work})")  # fmt: skip
            time.sleep(0.5)
    except (KeyboardInterrupt, SpotrainError):
        say("stopping the machines as EC2 stops them (SIGTERM: emergency checkpoints)")
        for machine in machines:
            machine.shut_down()
        raise
    finally:
        _print_new(machines, printed, say)
        for machine in machines:
            machine.stop()
    return {m.instance_id: m.wait(timeout=10) for m in machines}


def _print_new(machines: list[LocalMachine], printed: dict[str, int],
               say: Callable[[str], None]) -> None:  # fmt: skip
    for machine in machines:
        lines = machine.output.splitlines()
        for line in lines[printed[machine.instance_id] :]:
            say(f"{machine.instance_id}  {line}")
        printed[machine.instance_id] = len(lines)
