"""The image: Dockerfile pins, the Packer recipe's security settings, the boot service, and the
bootstrap script run for real under a harness (local metadata service, local cloud, the
trainer from PATH instead of the container; Docker and Packer have no engine here)."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import hcl2
import pytest
from helpers import create_catalog_table, kms_only_bucket
from training import TINY_MODEL

from spotrain import cli
from spotrain.cli import train as train_command
from spotrain.constructs.spot_fleet import USER_DATA, user_data_values
from spotrain.core import fleet_state
from spotrain.core.image_reference import BAKED_IMAGE, REGISTRY_PULL_ACTIONS
from spotrain.core.resource_names import image_parameter
from spotrain.localcloud import control
from spotrain.localcloud.imds import LocalMetadataService
from spotrain.stacks.runs import read_run
from spotrain.trainer.catalog import DynamoCatalog
from spotrain.trainer.storage import LocalStorage

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
BOOTSTRAP = IMAGES / "bootstrap.sh"


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


def dockerfile(name: str = "Dockerfile") -> list[tuple[str, str]]:
    """(instruction, arguments): comment lines dropped first (as Docker does, also inside a
    continued instruction), then continuation lines joined."""
    kept = [
        line
        for line in (IMAGES / name).read_text().splitlines()
        if not line.strip().startswith("#")
    ]
    text = re.sub(r"\\\n", " ", "\n".join(kept))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def unquote(value: Any) -> Any:
    return value.strip('"') if isinstance(value, str) else value


def test_dockerfile_pins_the_versions_the_tests_run_with() -> None:
    instructions = dockerfile()
    base = next(args for kind, args in instructions if kind == "FROM")
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-[\w.-]+", base), "base image needs an exact tag"
    args = dict(a.split("=", 1) for kind, a in instructions if kind == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == pins()["torch"]
    assert args["DEEPSPEED_VERSION"] == pins()["deepspeed"]
    runs = " ".join(a for kind, a in instructions if kind == "RUN")
    assert 'pip install "torch==${TORCH_VERSION}"' in runs  # torch first, pinned
    deepspeed = 'DS_BUILD_OPS=0 pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}"'
    assert deepspeed in runs
    assert "-c /tmp/constraints.txt" in runs  # everything else from the same pins
    # EFA's user-space software and NCCL's plugin for it, pinned, without the kernel module.
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["EFA_INSTALLER_VERSION"])
    assert "efa_installer.sh -y --skip-kmod" in runs
    env = " ".join(a for kind, a in instructions if kind == "ENV")
    assert "/opt/amazon/ofi-nccl/lib" in env  # where NCCL finds the plugin
    user = [a for kind, a in instructions if kind == "USER"]
    assert user and user[-1] not in ("root", "0")


def test_dockerfile_copies_every_package_folder_that_exists() -> None:
    copied = [a.split()[0].rstrip("/") for kind, a in dockerfile() if kind == "COPY"]
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    pyproject = (ROOT / "pyproject.toml").read_text()
    folders = set(re.findall(r'"spotrain\.\w+" = "(\w+)"', pyproject))
    assert folders and folders <= set(copied)


def test_packer_recipe_bakes_an_imdsv2_only_encrypted_image_and_publishes_its_id() -> None:
    recipe = hcl2.loads((IMAGES / "spotrain.pkr.hcl").read_text())
    plugin = recipe["packer"][0]["required_plugins"][0]["amazon"]
    assert unquote(plugin["version"]).startswith("= ")  # pinned exactly
    source = recipe["source"][0]['"amazon-ebs"']['"trainer"']
    metadata = source["metadata_options"][0]
    assert unquote(metadata["http_tokens"]) == "required"
    assert metadata["http_put_response_hop_limit"] == 1
    assert unquote(source["imds_support"]) == "v2.0"
    assert source["encrypt_boot"] is True
    assert all(d["encrypted"] is True for d in source["launch_block_device_mappings"])
    build = recipe["build"][0]
    files = [p['"file"'] for p in build["provisioner"] if '"file"' in p]
    for file in files:
        local = unquote(file["source"]).replace("${path.root}", str(IMAGES))
        assert Path(local).exists(), local
    shell = " ".join(unquote(c) for p in build["provisioner"] if '"shell"' in p
                     for c in p['"shell"']["inline"])  # fmt: skip
    unit = configparser.ConfigParser(strict=False)
    unit.read(IMAGES / "spotrain-trainer.service")
    assert "/opt/spotrain/bootstrap.sh /opt/spotrain/bootstrap.sh" not in shell
    assert unit["Service"]["ExecStart"] in shell  # the service runs what the recipe installs
    assert "snap services amazon-ssm-agent | grep -q enabled" in shell  # Session Manager
    publish = " ".join(
        unquote(c) for p in build["post-processor"] if '"shell-local"' in p
        for c in p['"shell-local"']["inline"]
    )  # fmt: skip
    parameter = image_parameter("${var.environment}")
    assert f"--name {parameter}" in publish  # where the fleet's launch template reads it
    # The image it bakes is the name the boot script runs when a run pins none.
    assert f"docker tag ${{var.trainer_image}} {BAKED_IMAGE}" in shell
    assert f"BAKED_IMAGE={BAKED_IMAGE} " in BOOTSTRAP.read_text()
    # Docker logs in to the registry with the machine's role, on the build machine and on
    # every fleet machine (a run that pins another image pulls it at boot).
    assert "apt-get install -y -q amazon-ecr-credential-helper" in shell
    assert '{\\"credsStore\\": \\"ecr-login\\"}' in shell
    assert shell.index("ecr-login") < shell.index("docker pull")
    # The build machine may pull from the image's repository and nothing else.
    [profile] = source["temporary_iam_instance_profile_policy_document"]
    pulls, login = profile["Statement"]
    assert [unquote(a) for a in pulls["Action"]] == list(REGISTRY_PULL_ACTIONS)
    assert pulls["Resource"] == ["${local.repository_arn}"]
    assert [unquote(a) for a in login["Action"]] == ["ecr:GetAuthorizationToken"]


def test_boot_service_waits_longer_than_an_emergency_checkpoint_and_stops_crash_loops() -> None:
    unit = configparser.ConfigParser(strict=False)
    unit.read(IMAGES / "spotrain-trainer.service")
    assert int(unit["Service"]["TimeoutStopSec"]) > train_command.DEFAULT_SHUTDOWN_TIMEOUT_S
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    assert unit["Service"]["Restart"] == "on-failure"
    assert int(unit["Unit"]["StartLimitBurst"]) >= 1


def test_launch_template_user_data_writes_every_setting_the_bootstrap_requires() -> None:
    from dataclasses import fields

    from spotrain.constructs.spot_fleet import SpotFleetProps

    required = re.search(r"for name in ([A-Z_ ]+); do", BOOTSTRAP.read_text())
    assert required is not None
    values: dict[str, Any] = {f.name: f"x-{f.name}" for f in fields(SpotFleetProps)}
    values |= {"instance_types": ("g5.xlarge", "g6.xlarge"), "subnet_ids": ["s"], "min_size": 1,
               "desired_size": 1, "max_size": 2, "on_demand_base_capacity": 1,
               "data_kms_key_arns": ("arn:key", "arn:replica-key"), "tags": {},
               "vpc_endpoint_ids": ("vpce-1",), "efa_interfaces": {}, "placement_group": False,
               "image": None, "image_repository_arn": None, "registry_endpoint_ids": (),
               "emulator_drift_tolerance": False}  # fmt: skip
    script = USER_DATA % tuple(user_data_values(SpotFleetProps(**values)))
    written = set(re.findall(r"^(SPOTRAIN_\w+)=", script, flags=re.MULTILINE))
    assert set(required.group(1).split()) <= written
    assert "SPOTRAIN_KMS_KEY_ID=arn:key" in script  # the primary region's key


def test_bootstrap_names_what_is_missing() -> None:
    result = subprocess.run(
        ["bash", str(BOOTSTRAP)], capture_output=True, text=True,
        env={"PATH": os.environ["PATH"], "SPOTRAIN_RUN_ENV": "/nonexistent",
             "SPOTRAIN_RUN": "r", "SPOTRAIN_REGION": "us-east-1"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "missing SPOTRAIN_BUCKET SPOTRAIN_CATALOG_TABLE SPOTRAIN_KMS_KEY_ID" in result.stderr
    assert "redeploy the run's stack" in result.stderr


STAND_IN_SPOTRAIN = """#!/bin/bash
# spotrain's machine-side commands, as far as a coordinator's boot needs them: the claim
# answers with the rendezvous, training lasts until SIGTERM, everything else succeeds.
case "$*" in
  *"coordinator --claim"*) echo 127.0.0.1:29400 ;;
  train*) trap 'kill "$trains"; exit 143' TERM; echo training; sleep 600 & trains=$!; wait ;;
esac
exit 0
"""


def test_a_coordinator_asked_to_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    """The service ends when its boot script's last process does, and the instance with it:
    the coordinator's heartbeat pause, orphaned by its stop, once kept a stopped machine
    (trained out, published) up for the rest of a period, billed. The boot script runs for real
    (a stand-in for spotrain's own commands on PATH); every process it started is gone once it
    has exited."""
    import signal
    import time

    from spotrain.localcloud.machines import process_tree, signal_all

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "spotrain").write_text(STAND_IN_SPOTRAIN)
    (bin_dir / "spotrain").chmod(0o755)
    run_env = tmp_path / "run.env"
    run_env.write_text("SPOTRAIN_RUN=r\nSPOTRAIN_REGION=us-east-1\nSPOTRAIN_BUCKET=b\n"
                       "SPOTRAIN_CATALOG_TABLE=t\nSPOTRAIN_KMS_KEY_ID=k\n"
                       "SPOTRAIN_EVENTS_TABLE=e\nSPOTRAIN_NNODES=2\n")  # fmt: skip
    with LocalMetadataService(instance_id="i-0c00d", instance_type="g6.xlarge",
                              lifecycle="on-demand") as imds:  # fmt: skip
        log = tmp_path / "boot.log"
        with log.open("w") as output:
            boot = subprocess.Popen(
                ["bash", str(BOOTSTRAP)], stdout=output, stderr=subprocess.STDOUT,
                env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SPOTRAIN_RUN_ENV": str(run_env),
                     "SPOTRAIN_IMDS_ENDPOINT": imds.endpoint,
                     "SPOTRAIN_CONTAINER_RUNTIME": "none",
                     "SPOTRAIN_WORK_DIR": str(tmp_path / "disk"),
                     "SPOTRAIN_COORDINATOR_HEARTBEAT": "300"},
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while "training" not in log.read_text():  # until it trains, coordinating the run
            assert boot.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "coordinates run r at 127.0.0.1:29400" in log.read_text()
        started = process_tree(boot.pid)
        boot.send_signal(signal.SIGTERM)  # the service is stopped: the instance is leaving
        assert boot.wait(timeout=60) == 143, log.read_text()

    def left() -> list[int]:
        return [
            pid
            for pid in started
            if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        ]

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    behind = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left()}
    signal_all(list(behind), signal.SIGKILL)
    assert behind == {}


@pytest.mark.integration
def test_bootstrap_starts_training_that_publishes_to_the_environment(
    corpus: str, tmp_path: Path, local_cloud: control.RunningCloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import json

    region = "us-east-1"
    bucket, table = "bootstrap-checkpoints", "bootstrap-catalog"
    key = kms_only_bucket(
        control.client("s3", local_cloud.endpoint, region),
        control.client("kms", local_cloud.endpoint, region),
        bucket,
    )
    dynamodb = control.client("dynamodb", local_cloud.endpoint, region)
    create_catalog_table(dynamodb, table)
    create_catalog_table(dynamodb, "bootstrap-events")  # the fleet state uses the same keys
    # The run's configuration lives in the bucket, where every machine of the fleet reads it.
    config = tmp_path / "train.json"
    config.write_text(json.dumps({"run": "booted", "store": f"s3://{bucket}", "data": corpus,
                                  "work_dir": "/placeholder", "steps": 2,
                                  "checkpoint_every": 2, "micro_batch": 4,
                                  "model": TINY_MODEL}))  # fmt: skip
    for name, value in control.aws_environment(local_cloud.endpoint, region).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["config", "put", str(config), "--store", f"s3://{bucket}"]) == 0
    run_env = tmp_path / "run.env"
    run_env.write_text(
        f"SPOTRAIN_RUN=booted\nSPOTRAIN_REGION={region}\nSPOTRAIN_BUCKET={bucket}\n"
        f"SPOTRAIN_CATALOG_TABLE={table}\nSPOTRAIN_KMS_KEY_ID={key}\n"
        "SPOTRAIN_EVENTS_TABLE=bootstrap-events\nSPOTRAIN_LOG_GROUP=/spotrain/booted/machines\n"
    )
    logs = control.client("logs", local_cloud.endpoint, region)
    logs.create_log_group(logGroupName="/spotrain/booted/machines")

    def boot(instance: str = "i-0feedface", **env: str) -> subprocess.CompletedProcess[str]:
        with LocalMetadataService(instance_id=instance, instance_type="g6.xlarge") as imds:
            return subprocess.run(
                ["bash", str(BOOTSTRAP)], capture_output=True, text=True, timeout=300,
                env={**os.environ, **control.aws_environment(local_cloud.endpoint, region),
                     "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                     "SPOTRAIN_RUN_ENV": str(run_env),
                     "SPOTRAIN_IMDS_ENDPOINT": imds.endpoint,
                     "SPOTRAIN_CONTAINER_RUNTIME": "none", "SPOTRAIN_NPROC_PER_NODE": "1",
                     "SPOTRAIN_WORK_DIR": str(tmp_path / "disk"), **env},
            )  # fmt: skip

    result = boot()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "i-0feedface (g6.xlarge in us-east-1a, spot) joins run booted" in output
    assert f"s3://{bucket}/runs/booted/config/" in output  # fetched, not baked in
    assert "spot_notice_endpoint=http://127.0.0.1:" in output  # the trainer watches IMDS
    assert "trainer exit 0 on i-0feedface: finished" in output
    # The machine's output, to its last line, is in its log stream too.
    shipped = [e["message"] for e in logs.get_log_events(
        logGroupName="/spotrain/booted/machines", logStreamName="i-0feedface",
        startFromHead=True)["events"]]  # fmt: skip
    assert shipped == [line for line in result.stdout.splitlines() if line.strip()]
    assert shipped[-1].startswith("trainer exit 0 on i-0feedface: finished")
    head = DynamoCatalog(table, "booted", LocalStorage(tmp_path / "unused"), client=dynamodb).head()
    assert head is not None and head.step == 2
    # A machine whose trainer cannot even start has its group replace it, not idle, billed.
    autoscaling = control.client("autoscaling", local_cloud.endpoint, region)
    ec2 = control.client("ec2", local_cloud.endpoint, region)
    image = control.stock_image(ec2)
    template = {"ImageId": image, "InstanceType": "g6.xlarge"}
    ec2.create_launch_template(LaunchTemplateName="booted-lt", LaunchTemplateData=template)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="booted-fleet", MinSize=1, MaxSize=1, AvailabilityZones=[f"{region}a"],
        LaunchTemplate={"LaunchTemplateName": "booted-lt"},
    )  # fmt: skip
    [member] = autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=["booted-fleet"])["AutoScalingGroups"][0]["Instances"]  # fmt: skip
    broken = tmp_path / "broken.json"
    broken.write_text(config.read_text().replace(corpus, "/no/such/corpus.bin"))
    failed = boot(member["InstanceId"], SPOTRAIN_CONFIG=str(broken))
    assert failed.returncode != 0
    assert "marked unhealthy (trainer exited 2 before its first step)" in failed.stdout
    [health] = autoscaling.describe_auto_scaling_instances(
        InstanceIds=[member["InstanceId"]])["AutoScalingInstances"]  # fmt: skip
    assert health["HealthStatus"].upper() == "UNHEALTHY"
    # A run that pins an image the machine cannot pull trains nothing: the machine says why,
    # accounts for itself with the baked image's spotrain, and its group replaces it. (Docker
    # has no engine here: a stand-in knows the baked image only, fails every pull as a
    # registry would for a digest it lacks, and runs each container's command on this host.)
    docker = tmp_path / "docker-bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(DOCKER_WITHOUT_AN_ENGINE)
    docker.chmod(0o755)
    ran = tmp_path / "containers-run"
    devices = tmp_path / "infiniband"  # the machine's EFA devices, as the kernel names them
    devices.mkdir()
    (devices / "uverbs0").touch()
    missing = f"123456789012.dkr.ecr.{region}.amazonaws.com/spotrain-x/trainer@sha256:{'0' * 64}"
    unpulled = boot(
        member["InstanceId"],
        SPOTRAIN_CONTAINER_RUNTIME="docker",
        SPOTRAIN_IMAGE=missing,
        SPOTRAIN_EFA_DEVICES=str(devices),
        CONTAINERS_RUN=str(ran),
        PATH=f"{docker.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    assert unpulled.returncode == 2, unpulled.stdout + unpulled.stderr
    assert f"pulling the run's image {missing}" in unpulled.stdout
    assert f"cannot train: its image {missing} could not be pulled (manifest unknown)" in (
        unpulled.stdout + unpulled.stderr)  # fmt: skip
    assert f"marked unhealthy (its image {missing} could not be pulled" in unpulled.stdout
    assert "spotrain train" not in unpulled.stdout + unpulled.stderr
    assert set(ran.read_text().split()) == {BAKED_IMAGE}  # nothing ran in the missing image
    # Every container got the machine's EFA device, and NCCL libfabric's EFA provider.
    for args in (tmp_path / "containers-run.args").read_text().splitlines():
        assert f"--device {devices}/uverbs0 --ulimit memlock=-1:-1 -e FI_PROVIDER=efa" in args
    autoscaling.delete_auto_scaling_group(AutoScalingGroupName="booted-fleet", ForceDelete=True)
    ec2.delete_launch_template(LaunchTemplateName="booted-lt")  # the local cloud is shared
    # After repeated crashes the run is held: the machine does not start the trainer again.
    events = boto3.resource("dynamodb", endpoint_url=local_cloud.endpoint, region_name=region,
                            verify=local_cloud.ca_bundle,
                            aws_access_key_id="local", aws_secret_access_key="local")  # fmt: skip
    for _ in range(3):
        fleet_state.record_exit(events.Table("bootstrap-events"), "booted", "i-0dead", 1,
                                max_crashes=3)  # fmt: skip
    held = boot()
    assert held.returncode == 3
    assert "held after repeated crashes" in held.stdout
    assert "spotrain train" not in held.stdout + held.stderr


DOCKER_WITHOUT_AN_ENGINE = r"""#!/bin/bash
# `docker` for a host without an engine: it has the baked image only, a pull fails as the
# registry answers for a digest it lacks, and `run` runs the container's command here.
case "$1" in
  image) [[ "$2" == inspect && "$3" == spotrain-trainer:baked ]] ;;
  pull) echo "manifest unknown" >&2; exit 1 ;;
  run)
    shift
    echo "$*" >>"$CONTAINERS_RUN.args"
    while (($#)); do
      case "$1" in
        --rm | -i | --init) shift ;;
        -v | -e | --gpus | --network | --ipc | --stop-signal | --stop-timeout) shift 2 ;;
        --device | --ulimit) shift 2 ;;
        *) break ;;
      esac
    done
    echo "$1" >>"$CONTAINERS_RUN"
    shift
    exec "$@"
    ;;
  *) echo "docker $1: not known here" >&2; exit 1 ;;
esac
"""


def test_bootstrap_looks_for_the_marker_the_trainer_writes() -> None:
    """The boot script tells a start that never trained (its machine is replaced) from a later
    crash by the trainer's first-step marker: one name on both sides."""
    from spotrain.trainer.membership import FIRST_STEP_MARKER

    assert f"first_step=$WORK_DIR/work/{FIRST_STEP_MARKER} " in BOOTSTRAP.read_text()


BLOCKER = """
import importlib.abc, json, sys

class Blocked(importlib.abc.MetaPathFinder):
    # What a GPU machine's image does not install (the training extra alone).
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cdktf", "cdktf_cdktf_provider_aws", "constructs", "moto",
                                  "matplotlib", "yaml"):
            raise ImportError(f"{name} is not in a training machine's image")
        return None

sys.meta_path.insert(0, Blocked())
import spotrain.trainer.train  # the trainer's entry point (each rank runs it)
import spotrain.trainer.entry_point  # a user's script's rank process
from spotrain.cli import main
for argv in json.loads(sys.argv[1]):  # one command after another, each said apart
    print("==>", json.dumps(argv))
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    print(f"<== exit {code}")
"""

MACHINE_SIDE_COMMANDS = [
    (["--help"], "spotrain local up|down|status"),
    (["train", "{tmp}/none.json"], "training configuration {tmp}/none.json not found"),
    (["config", "get", "--store", "file://{tmp}/store", "--run", "r", "--to", "{tmp}/c.json"],
     "run 'r' has no training configuration"),
    (["fleet", "exit", "--run", "r"], "needs --events-table and --run"),
    (["fleet", "may-start", "--run", "Bad!", "--events-table", "t"], "is not valid"),
    (["logs", "ship", "--group", "", "--stream", "i-0"], "is not a log group name"),
    (["data", "show", "--store", "file://{tmp}/store", "--name", "d"], "dataset 'd'"),
]  # fmt: skip


def test_the_machine_side_commands_need_only_the_training_extra(tmp_path: Path) -> None:
    """The image installs the training extra alone: the trainer and every command a machine
    runs import without CDKTF, the provider bindings, the emulator, matplotlib or YAML (one
    process runs them all in turn: a module that one of them imports stays blocked for the
    next). A command of an extra that is not installed names the extra."""
    commands = [[a.replace("{tmp}", str(tmp_path)) for a in argv]
                for argv, _ in MACHINE_SIDE_COMMANDS]  # fmt: skip
    plot = [
        "cost",
        "simulate",
        "--interruptions-per-hour",
        "0.1",
        "--work-hours",
        "1",
        "--on-demand-price",
        "3",
        "--spot-price",
        "1",
        "--plot",
        str(tmp_path / "f.png"),
    ]
    done = subprocess.run([sys.executable, "-u", "-c", BLOCKER, json.dumps([*commands, plot])],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)  # fmt: skip
    output = done.stdout
    assert done.returncode == 0 and "Traceback" not in output, output[-3000:]
    said = re.findall(r"==> (.*?)\n(.*?)<== exit (\S+)", output, re.S)
    assert [json.loads(argv) for argv, _, _ in said] == [*commands, plot], output[-3000:]
    for (_, expected), (_, words, _) in zip(MACHINE_SIDE_COMMANDS, said, strict=False):
        assert "not in a training machine's image" not in words, words
        assert expected.replace("{tmp}", str(tmp_path)) in words, words
    *_, (_, words, code) = said
    assert code == "2" and "needs the plots extra" in words, words
    assert "pip install 'spotrain[plots]'" in words


def test_every_library_of_an_extra_is_named_for_the_message_that_asks_for_it() -> None:
    import tomllib

    from spotrain.cli import EXTRA_OF

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    modules = {"PyYAML": "yaml", "moto[server]": "moto"}
    extras_of: dict[str, set[str]] = {}
    for extra, requirements in extras.items():
        if extra == "dev":
            continue
        for requirement in requirements:
            name = requirement.split("==")[0]
            extras_of.setdefault(modules.get(name, name.replace("-", "_")), set()).add(extra)
    for module, having in extras_of.items():
        smallest = min(having, key=lambda extra: (len(extras[extra]), extra))
        assert EXTRA_OF.get(module) == smallest, f"{module} ({', '.join(sorted(having))})"


def test_the_code_image_layers_the_checkout_and_its_pinned_requirements_on_the_trainer() -> None:
    """images/Dockerfile.code: FROM the trainer image it is given (by digest), the code's own
    requirements pinned, the checkout as the working directory (entry points are found from
    its root); the build context leaves out what was built or installed here."""
    steps = dockerfile("Dockerfile.code")
    assert steps[:2] == [("ARG", "TRAINER_IMAGE"), ("FROM", "${TRAINER_IMAGE}")]
    copies = [args.split() for kind, args in steps if kind == "COPY"]
    assert ["images/requirements-code.txt", "/tmp/requirements-code.txt"] in copies
    assert copies[-1][-2:] == [".", "/code"] and steps[-1] == ("WORKDIR", "/code")
    assert ("USER", "trainer") in steps
    requirements = [line for line in (IMAGES / "requirements-code.txt").read_text().splitlines()
                    if line and not line.startswith("#")]  # fmt: skip
    assert requirements and all(re.fullmatch(r"[\w.\-\[\]]+==[\w.]+", r) for r in requirements)
    for name, version in (r.split("==") for r in requirements):
        assert pins().get(name, version) == version, f"{name} differs from constraints.txt"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".git/", ".venv/", "node_modules/", "cdktf.out/", ".spotrain/"} <= set(ignored)


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _manifest(layer: str) -> str:
    """An image manifest whose digest the emulator derives from its layer (without layers it
    draws one of 101 digests at random, so two pushes could share one)."""
    return ('{"schemaVersion": 2, "config": {"digest": "sha256:' + "3" * 64 + '"}, '
            '"layers": [{"digest": "sha256:' + layer * 64 + '"}]}')  # fmt: skip


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Any:
    from moto import mock_aws

    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "t",
                       "AWS_SECRET_ACCESS_KEY": "t"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    with mock_aws():
        for region in ("us-west-2", "us-east-1"):  # dev's regions: each has its repository
            ecr = boto3.client("ecr", region_name=region)
            ecr.create_repository(repositoryName="spotrain-dev/trainer",
                                  imageTagMutability="IMMUTABLE")  # fmt: skip
        yield ecr


def test_image_build_pushes_the_trainer_then_the_code_on_it_by_digest(
    registry: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["image", "build", "dev", "--dry-run"]) == 0
    out = capsys.readouterr().out
    uri = registry.describe_repositories()["repositories"][0]["repositoryUri"]
    commands = [shlex.split(line.removeprefix("$ ")) for line in out.splitlines()
                if line.startswith("$ ")]  # fmt: skip
    tag = re.search(r":trainer-(\S+)$", commands[0][-2])
    assert tag, out
    commit = tag[1]  # the checkout's commit (a clean checkout's; else shown as <commit>)
    west = uri.replace(".us-east-1.", ".us-west-2.")
    assert commands == [
        ["docker", "build", "-f", "images/Dockerfile", "-t", f"{uri}:trainer-{commit}", "."],
        ["docker", "push", f"{uri}:trainer-{commit}"],
        ["docker", "build", "-f", "images/Dockerfile.code", "--build-arg",
         f"TRAINER_IMAGE={uri}@<digest of trainer-{commit}>", "-t", f"{uri}:code-{commit}", "."],
        ["docker", "push", f"{uri}:code-{commit}"],
        # The code image in every other region's repository: machines pull from their own.
        ["docker", "tag", f"{uri}:code-{commit}", f"{west}:code-{commit}"],
        ["docker", "push", f"{west}:code-{commit}"],
    ]  # fmt: skip
    # An image already pushed for the commit is reused, by its digest, not built again.
    registry.put_image(repositoryName="spotrain-dev/trainer", imageManifest=_manifest("1"),
                       imageManifestMediaType=OCI_MANIFEST,
                       imageTag=f"trainer-{commit}")  # fmt: skip
    [pushed] = registry.describe_images(repositoryName="spotrain-dev/trainer")["imageDetails"]
    assert cli.main(["image", "build", "dev", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{uri}:trainer-{commit} is in the registry already" in out
    assert f"TRAINER_IMAGE={uri}@{pushed['imageDigest']}" in out
    assert f"spotrain image bake dev --image {uri}@<digest of code-{commit}>" in out
    # Once both are there, the line it prints is what a run file pins.
    registry.put_image(repositoryName="spotrain-dev/trainer", imageManifest=_manifest("2"),
                       imageManifestMediaType=OCI_MANIFEST,
                       imageTag=f"code-{commit}")  # fmt: skip
    assert cli.main(["image", "build", "dev", "--dry-run"]) == 0
    [pin] = [line.strip() for line in capsys.readouterr().out.splitlines()
             if line.strip().startswith("image = ")]  # fmt: skip
    run_file = tmp_path / "dev" / "pinned.toml"
    run_file.parent.mkdir()
    run_file.write_text(f'{pin}\nowner = "ml@example.com"\ninstance_types = ["g5.xlarge", '
                        '"g5.2xlarge"]\n[training]\nsteps = 4\nglobal_batch = 24\n')  # fmt: skip
    run = read_run(run_file, "dev")
    assert run.image is not None and run.image.startswith(f"{uri}@sha256:")


def test_a_pinned_image_must_be_in_every_regions_registry(registry: Any) -> None:
    """A run's machines pull from their own region's repository: an image pushed at home
    only is refused, naming the region that lacks it and the command that pushes it there."""
    from spotrain.cli.image import check_pushed
    from spotrain.core.errors import SpotrainError

    def push(region: str, layer: str, tag: str) -> str:
        pushed = boto3.client("ecr", region_name=region).put_image(
            repositoryName="spotrain-dev/trainer", imageManifest=_manifest(layer),
            imageManifestMediaType=OCI_MANIFEST, imageTag=tag)  # fmt: skip
        return f"{uri}@{pushed['image']['imageId']['imageDigest']}"

    uri = registry.describe_repositories()["repositories"][0]["repositoryUri"]
    home_only = push("us-east-1", "4", "code-once")
    with pytest.raises(SpotrainError, match=r"not in the registry in us-west-2: push it with "
                       r"`spotrain image build dev`"):  # fmt: skip
        check_pushed("dev", home_only)
    with pytest.raises(SpotrainError, match=r"not in the registry in us-east-1: push it"):
        check_pushed("dev", push("us-west-2", "5", "code-west"))  # home lacking it as well
    assert push("us-west-2", "4", "code-both") == home_only  # the same image in both regions
    check_pushed("dev", home_only)


def test_image_bake_takes_one_image_by_digest_and_runs_the_recipe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["image", "bake", "dev", "--image", "repo:latest"]) == 2
    assert "needs --image REPOSITORY@sha256:DIGEST" in capsys.readouterr().err
    image = "123.dkr.ecr.us-east-1.amazonaws.com/spotrain-dev/trainer@sha256:" + "a" * 64
    assert cli.main(["image", "bake", "dev", "--image", image, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"$ packer init {IMAGES}" in out
    copies = "'copy_regions=[\"us-west-2\"]'"  # the machine image is copied to every region
    assert (f"$ packer build -var environment=dev -var region=us-east-1 -var {copies} "
            f"-var trainer_image={image} {IMAGES}") in out  # fmt: skip
    assert "/spotrain/dev/image-id" in out
