"""Start, stop and inspect the local cloud, and prepare what real accounts already have.

State lives in `<SPOTRAIN_HOME or .spotrain>/local/`: the server's pid, port and log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotrain.core.errors import LocalCloudError
from spotrain.localcloud import faults
from spotrain.localcloud.tls import create_certificates

DEFAULT_PORT = 4566
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
READY_TIMEOUT_S = 60
# Servers started by this process, kept so they are reaped on `down()` (tests start and stop
# the cloud in one process; the CLI leaves it running on purpose).
_started: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class RunningCloud:
    pid: int
    port: int
    endpoint: str
    log: str
    ca_bundle: str
    """The authority that signed the server's certificate; clients trust it via AWS_CA_BUNDLE."""


def state_dir() -> Path:
    # Absolute: terraform reads AWS_CA_BUNDLE from inside each stack's folder.
    return (Path(os.environ.get("SPOTRAIN_HOME", ".spotrain")) / "local").resolve()


def aws_environment(endpoint: str, region: str) -> dict[str, str]:
    """Environment for terraform and AWS clients talking to the local cloud."""
    return {
        **CREDENTIALS,
        "AWS_CA_BUNDLE": str(ca_bundle()),
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_ENDPOINT_URL": endpoint,
        # Never fall back to instance credentials (callers also drop AWS_PROFILE).
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def shell_exports(endpoint: str, region: str = "us-east-1") -> str:
    """The `export` line that points a shell's AWS tools (boto3, the AWS CLI, terraform and
    spotrain's commands) at the local cloud: `eval "$(spotrain local env)"` runs it."""
    import shlex

    settings = aws_environment(endpoint, region)
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items())


def ca_bundle() -> Path:
    """Certificate authority of the local cloud started from this state directory."""
    return state_dir() / "tls" / "ca.pem"


def faults_file() -> Path:
    """Faults the local cloud started from this state directory plays (see `faults`)."""
    return state_dir() / "faults.json"


def set_faults(
    *,
    regions_down: list[str] | None = None,
    regions_partitioned: list[str] | None = None,
    table_replication_lag_seconds: float | None = None,
    replication_pending: list[str] | None = None,
    unavailable: list[dict[str, Any]] | None = None,
    spot_capacity_gone: list[str] | None = None,
    vcpu_quotas: dict[str, int] | None = None,
    through_vpc_endpoints: dict[str, str] | None = None,
) -> faults.Faults:
    """Replace the named kinds of fault (None leaves a kind as it is); returns all of them."""
    current = faults.read(faults_file())
    if regions_down is not None:
        current.regions_down = sorted(set(regions_down))
    if regions_partitioned is not None:
        current.regions_partitioned = sorted(set(regions_partitioned))
    if table_replication_lag_seconds is not None:
        current.table_replication_lag_seconds = table_replication_lag_seconds
    if replication_pending is not None:
        current.replication_pending = list(dict.fromkeys(replication_pending))
    if unavailable is not None:
        current.unavailable = unavailable
    if spot_capacity_gone is not None:
        current.spot_capacity_gone = list(dict.fromkeys(spot_capacity_gone))
    if vcpu_quotas is not None:
        current.vcpu_quotas = dict(vcpu_quotas)
    if through_vpc_endpoints is not None:
        current.through_vpc_endpoints = through_vpc_endpoints
    faults.write(faults_file(), current)
    return current


def set_price_book(path: Path | None) -> None:
    """The prices the local cloud answers with (EC2 spot price history, Price List): the book
    at `path`, or the checked-in snapshot again (None)."""
    from spotrain.localcloud import price_list

    target = faults_file().with_name(price_list.BOOK_NAME)
    if path is None:
        target.unlink(missing_ok=True)
        return
    staging = target.with_name(target.name + ".partial")
    staging.write_bytes(Path(path).read_bytes())
    staging.replace(target)


def set_schedule_speedup(speedup: float) -> None:
    """How fast the local cloud's schedules run: AWS's periods divided by `speedup` (1: as on
    AWS; 60: a 5-minute check every 5 s; 0: none), from now on."""
    from spotrain.localcloud import schedules

    schedules.write_speedup(faults_file().with_name(schedules.CLOCK_NAME), speedup)


def enforce_identity_policies(endpoint: str, enforce: bool) -> None:
    """Make the cloud judge every request by its caller's IAM policies (True), or serve any
    signed request as it does by default (False). Create the callers' users, roles and keys
    before enforcing: once it enforces, the default credentials are nobody's."""
    import ssl
    import urllib.request

    count = b"0" if enforce else b"inf"
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=count, method="POST",
        headers={"Content-Type": "text/plain"},  # a form body would reach the server empty
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(ca_bundle()))
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        response.read()


def client(
    service: str, endpoint: str, region: str, *, config: Any = None, **credentials: str
) -> Any:
    """A client of the local cloud, with its default credentials unless given others
    (aws_access_key_id, aws_secret_access_key, aws_session_token); `config`: botocore settings
    merged over the local cloud's own (its retries and timeouts)."""
    import boto3

    connection = _connection(endpoint, region)
    if config is not None:
        connection["config"] = connection["config"].merge(config)
    return boto3.client(service, **{**connection, **credentials})


def resource(service: str, endpoint: str, region: str, **credentials: str) -> Any:
    """A resource of the local cloud, with credentials as for `client`."""
    import boto3

    return boto3.resource(service, **{**_connection(endpoint, region), **credentials})


def _connection(endpoint: str, region: str) -> dict[str, Any]:
    from botocore.config import Config

    return dict(
        endpoint_url=endpoint,
        region_name=region,
        verify=str(ca_bundle()),
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=Config(
            retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=60
        ),
    )


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answers(endpoint: str) -> bool:
    import ssl
    import urllib.error
    import urllib.request

    # A bucket listing: cheap however much the cloud holds.
    try:
        context = ssl.create_default_context(cafile=str(ca_bundle()))
        with urllib.request.urlopen(f"{endpoint}/", timeout=10, context=context) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def status() -> RunningCloud | None:
    """The running local cloud, or None. Forgets a cloud whose process has gone."""
    path = state_dir() / "state.json"
    if not path.exists():
        return None
    cloud = RunningCloud(**json.loads(path.read_text()))
    if _alive(cloud.pid):
        return cloud
    path.unlink()
    return None


def up(port: int = DEFAULT_PORT, *, schedule_speedup: float = 1.0) -> RunningCloud:
    """Start the local cloud (or return the one already running). Its schedules run at AWS's
    pace times `schedule_speedup` (0: not at all; see `schedules`)."""
    running = status()
    if running is not None:
        return running
    if port == 0:
        port = free_port()
    elif _port_in_use(port):
        raise LocalCloudError(
            f"port {port} is already in use: stop what listens there, or start the local "
            "cloud on a free port with `spotrain local up --port 0`"
        )
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _, cert, key = create_certificates(directory / "tls")
    faults.write(faults_file(), faults.Faults())  # a new cloud starts healthy
    set_schedule_speedup(schedule_speedup)
    log_path = directory / "server.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spotrain.localcloud.server",
                "--port",
                str(port),
                "--cert",
                str(cert),
                "--key",
                str(key),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, faults.FAULTS_FILE_VARIABLE: str(faults_file())},
            start_new_session=True,  # outlives the command that started it
        )
    endpoint = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _answers(endpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise LocalCloudError(
                f"the local cloud did not start on port {port}; its log ({log_path}) ends:\n{tail}"
            )
        time.sleep(0.2)
    _started[process.pid] = process
    cloud = RunningCloud(
        pid=process.pid, port=port, endpoint=endpoint, log=str(log_path), ca_bundle=str(ca_bundle())
    )
    (directory / "state.json").write_text(json.dumps(asdict(cloud)))
    return cloud


def down() -> bool:
    """Stop the local cloud; False if none was running. Its contents are gone with it."""
    path = state_dir() / "state.json"
    if not path.exists():
        return False
    cloud = RunningCloud(**json.loads(path.read_text()))
    path.unlink()
    if not _alive(cloud.pid):
        return False
    os.kill(cloud.pid, signal.SIGTERM)
    child = _started.pop(cloud.pid, None)
    if child is not None:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return True
    deadline = time.monotonic() + 10
    while _alive(cloud.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(cloud.pid):
        os.kill(cloud.pid, signal.SIGKILL)
    return True


def require() -> RunningCloud:
    cloud = status()
    if cloud is None:
        raise LocalCloudError("the local cloud is not running: start it with `spotrain local up`")
    return cloud


STOCK_IMAGE_NAMES = "amzn2-ami-hvm-*-x86_64-gp2"
"""The emulator's stock Amazon Linux 2 images, which machines on the local cloud boot (the boot
itself is the local cloud's: `machines.py`)."""


def stock_image(ec2: Any) -> str:
    """A machine image of the local cloud's region, asked for by name: listing every image Amazon
    owns (1,301 in moto) costs seconds of CPU on both sides at each call."""
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": [STOCK_IMAGE_NAMES]}]
    )["Images"]
    if not images:
        raise LocalCloudError("the local cloud offers no machine images; restart it")
    return str(min(image["ImageId"] for image in images))


def prepare_account(
    endpoint: str, *, state_bucket: str, region: str, image_parameter: str,
    image_regions: Sequence[str] = (),
) -> None:  # fmt: skip
    """What a real account has before the first deploy: the Terraform state bucket and, in
    `region` and each of `image_regions`, the image id parameter the image bake writes.
    Idempotent."""
    s3 = client("s3", endpoint, region)
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if state_bucket not in existing:
        s3.create_bucket(Bucket=state_bucket)
    s3.put_bucket_versioning(Bucket=state_bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_encryption(
        Bucket=state_bucket,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
        },
    )
    s3.put_public_access_block(
        Bucket=state_bucket,
        PublicAccessBlockConfiguration={
            "BlockPublicAcls": True,
            "IgnorePublicAcls": True,
            "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True,
        },
    )
    for where in dict.fromkeys((region, *image_regions)):
        image_id = stock_image(client("ec2", endpoint, where))
        client("ssm", endpoint, where).put_parameter(
            Name=image_parameter, Value=image_id, Type="String", Overwrite=True
        )
