"""Fleet machines played on this host, from what is deployed.

A machine of the fleet boots from its launch template: the user data writes the run's
settings, then the boot service runs `images/bootstrap.sh`. Here each machine gets a metadata
service of its own (the instance id, type and zone of a real instance of the Auto Scaling
group on the local cloud), the deployed user data decoded and run into a scratch root instead
of /, its own work disk, and bootstrap.sh run with spotrain from this environment instead of
the container. Used by the fleet rehearsal and the tests.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from spotrain.core.capacity import ON_DEMAND, SPOT
from spotrain.localcloud.imds import LocalMetadataService

CHECKOUT = Path(__file__).resolve().parents[2]
"""What the image carries as its code folder (a run's entry-point script is found there)."""
IMAGES = CHECKOUT / "images"
BOOTSTRAP = IMAGES / "bootstrap.sh"


def _service_stop_timeout_s() -> float:
    """How long the image's service manager waits between SIGTERM and SIGKILL when the
    machine stops (the trainer unit's TimeoutStopSec)."""
    unit = (IMAGES / "spotrain-trainer.service").read_text()
    [value] = re.findall(r"^TimeoutStopSec=(\d+)\s*$", unit, re.M)
    return float(value)


SERVICE_STOP_TIMEOUT_S = _service_stop_timeout_s()


def deployed_user_data(ec2: Any, launch_template: str) -> str:
    """The user data of the template's newest version, as the local cloud holds it."""
    versions = ec2.describe_launch_template_versions(
        LaunchTemplateName=launch_template, Versions=["$Latest"]
    )["LaunchTemplateVersions"]
    return base64.b64decode(versions[0]["LaunchTemplateData"]["UserData"]).decode()


def in_service(autoscaling: Any, group: str) -> tuple[list[dict[str, Any]], str]:
    """The group's instances in service, and the name of the launch template they boot from
    (read in one call)."""
    [described] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
        "AutoScalingGroups"
    ]
    instances = [i for i in described.get("Instances", [])
                 if i.get("LifecycleState", "InService") == "InService"]  # fmt: skip
    policy = described.get("MixedInstancesPolicy", {})
    spec = policy.get("LaunchTemplate", {}).get("LaunchTemplateSpecification") or described.get(
        "LaunchTemplate", {}
    )
    return instances, str(spec.get("LaunchTemplateName", ""))


def on_demand_first(ec2: Any, members: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """The group's instances with their markets, the on-demand ones (coordinators) first, each
    with the type and zone EC2 launched it with (what its metadata service says, and what the
    spend ledger prices)."""
    ids = [m["InstanceId"] for m in members]
    pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=ids) if ids else []
    launched = {i["InstanceId"]: i for page in pages for r in page["Reservations"]
                for i in r["Instances"]}  # fmt: skip
    paired = []
    for member in members:
        found = launched.get(member["InstanceId"], {})
        as_launched = {**member,
                       "InstanceType": found.get("InstanceType") or member.get("InstanceType"),
                       "AvailabilityZone": found.get("Placement", {}).get("AvailabilityZone")
                       or member.get("AvailabilityZone")}  # fmt: skip
        paired.append((as_launched, SPOT if found.get("InstanceLifecycle") == SPOT
                       else ON_DEMAND))  # fmt: skip
    return sorted(paired, key=lambda pair: pair[1] == SPOT)


def instance_role_keys(
    aws_env: dict[str, str], launch_template: str, instance_id: str
) -> dict[str, str]:
    """What EC2 gives an instance of `launch_template` through its metadata service: a session
    of its instance profile's role, named for the instance. The local cloud judges what the
    machine does with it by the role's policies (S3 and DynamoDB, `authorization`), its
    requests coming through its VPC's endpoints."""
    from spotrain.localcloud import control

    endpoint, region = aws_env["AWS_ENDPOINT_URL"], aws_env["AWS_DEFAULT_REGION"]
    versions = control.client("ec2", endpoint, region).describe_launch_template_versions(
        LaunchTemplateName=launch_template, Versions=["$Latest"]
    )["LaunchTemplateVersions"]
    profile = versions[0]["LaunchTemplateData"]["IamInstanceProfile"]
    name = profile.get("Name") or profile["Arn"].rsplit("/", 1)[-1]
    iam = control.client("iam", endpoint, region)
    [role] = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
    session = control.client("sts", endpoint, region).assume_role(
        RoleArn=role["Arn"], RoleSessionName=instance_id, DurationSeconds=3600
    )["Credentials"]
    return {"AWS_ACCESS_KEY_ID": session["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": session["SecretAccessKey"],
            "AWS_SESSION_TOKEN": session["SessionToken"]}  # fmt: skip


class LocalMachine:
    """One instance: `start()` runs its user data and boots it; `output` is its boot log."""

    def __init__(
        self,
        *,
        instance_id: str,
        instance_type: str,
        zone: str,
        lifecycle: str,
        root: Path,
        user_data: str,
        aws_env: dict[str, str],
        rdzv_port: int,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.instance_id, self.lifecycle, self.root = instance_id, lifecycle, root
        self.user_data, self.aws_env, self.rdzv_port = user_data, aws_env, rdzv_port
        self.settings = settings or {}
        self.imds = LocalMetadataService(
            instance_id=instance_id, instance_type=instance_type, availability_zone=zone,
            lifecycle=lifecycle,
        )  # fmt: skip
        self.process: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    @classmethod
    def of_member(
        cls, member: dict[str, Any], *, lifecycle: str, root: Path, user_data: str,
        aws_env: dict[str, str], rdzv_port: int, default_type: str, launch_template: str,
        settings: dict[str, str] | None = None,
    ) -> LocalMachine:  # fmt: skip
        """The Auto Scaling group's instance `member` (as DescribeAutoScalingGroups lists it),
        played under `root / its id` (`default_type` where the listing names no type), with
        its instance role's keys (`launch_template`'s profile) in place of `aws_env`'s."""
        instance_id = member["InstanceId"]
        keys = instance_role_keys(aws_env, launch_template, instance_id)
        return cls(
            instance_id=instance_id,
            instance_type=member.get("InstanceType") or default_type,
            zone=member.get("AvailabilityZone") or "us-east-1a", lifecycle=lifecycle,
            root=root / instance_id, user_data=user_data, aws_env={**aws_env, **keys},
            rdzv_port=rdzv_port, settings=settings,
        )  # fmt: skip

    def start(self) -> LocalMachine:
        self.root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["bash", "-c", self.user_data], check=True, timeout=60,
                       env={**os.environ, "SPOTRAIN_ROOT": str(self.root)})  # fmt: skip
        run_env = self.root / "etc" / "spotrain" / "run.env"
        # One host plays every machine: the coordinator hosts the rendezvous on a free port.
        lines = [line for line in run_env.read_text().splitlines()
                 if not line.startswith("SPOTRAIN_RDZV_PORT=")]  # fmt: skip
        run_env.write_text("\n".join([*lines, f"SPOTRAIN_RDZV_PORT={self.rdzv_port}", ""]))
        self.imds.start()
        self.process = subprocess.Popen(
            ["bash", str(BOOTSTRAP)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,  # ended as EC2 ends a machine: all of it
            cwd=CHECKOUT,  # the image's working directory is its code folder
            env={**os.environ, **self.aws_env,
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                 "SPOTRAIN_RUN_ENV": str(run_env), "SPOTRAIN_IMDS_ENDPOINT": self.imds.endpoint,
                 "SPOTRAIN_CONTAINER_RUNTIME": "none", "SPOTRAIN_NPROC_PER_NODE": "1",
                 "SPOTRAIN_WORK_DIR": str(self.root / "disk"), **self.settings},
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.process.stdout, (self.root / "boot.log").open("w") as log:
            for line in self.process.stdout:
                self._lines.append(line)
                log.write(line)
                log.flush()

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def lines_from(self, first: int) -> list[str]:
        """What it printed from line `first` on (each line with its newline)."""
        return self._lines[first:]

    def announce_interruption(self) -> None:
        self.imds.announce_interruption()

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        code = self.process.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=10)
        return code

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def shut_down(self, timeout_s: float = SERVICE_STOP_TIMEOUT_S) -> int | None:
        """The instance is terminated (its group scaled in, a run cancelled): its OS stops the
        trainer service as systemd does with the unit's `KillMode=mixed`, SIGTERM to its main
        process (the boot script, which passes it on) and SIGKILL to whatever of it is left
        after `timeout_s`. The boot script's exit status (None if it was never started)."""
        if self.process is None:
            return None
        if self.running():
            tree = process_tree(self.process.pid)
            os.kill(self.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
                self.process.poll()  # reaps the boot script, our own child
                time.sleep(0.2)
            signal_all([pid for pid in tree if _alive(pid)], signal.SIGKILL)
        code = self.process.wait(timeout=60)
        self.stop()
        return code

    def stop(self) -> None:
        """Gone at once, as a machine that loses power is: every process it started."""
        if self.running():
            assert self.process is not None
            signal_all(process_tree(self.process.pid), signal.SIGKILL)
            self.process.wait(timeout=60)
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.process is not None:
            self.imds.stop()


def process_tree(root: int) -> list[int]:
    """A process and every descendant, parents first (torchrun starts its ranks in sessions of
    their own, so a process-group signal would miss them; a service's cgroup does not)."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(status.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(parent, []).append(int(status.parent.name))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending += children.get(pid, [])
    return tree


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:  # parents first: none of them can react by starting another
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
