"""Helpers shared by tests: reading synthesized stacks, creating the catalog table and Auto
Scaling groups, spot availability built to break a deadline policy."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from spotrain.core import catalog_schema as schema
from spotrain.localcloud import control


def load_stack(synth_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((synth_dir / "stacks" / name / "cdk.tf.json").read_text())


def resources(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return stack.get("resource", {}).get(kind, {})


def data_sources(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return stack.get("data", {}).get(kind, {})


def create_catalog_table(client: Any, name: str, *, stream: bool = False) -> None:
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        **(
            {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}}
            if stream
            else {}
        ),
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": a, "AttributeType": "S"} for a in ("pk", "sk", schema.LINEAGE_KEY)
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": schema.LINEAGE_INDEX,
                "KeySchema": [
                    {"AttributeName": schema.LINEAGE_KEY, "KeyType": "HASH"},
                    {"AttributeName": "sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )


def stream_records(dynamodb: Any, streams: Any, table: str) -> list[dict[str, Any]]:
    """Every record a table's stream holds, oldest first, as Lambda receives them."""
    arn = dynamodb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    records: list[dict[str, Any]] = []
    for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records += streams.get_records(ShardIterator=iterator, Limit=1000)["Records"]
    return records


def kms_only_bucket(s3: Any, kms: Any, bucket: str) -> str:
    """A bucket with the checkpoint buckets' put policy (SSE-KMS with its own key only), on
    the local cloud; returns the key's ARN."""
    key = kms.create_key()["KeyMetadata"]["Arn"]
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_encryption(  # as the storage stack sets it
        Bucket=bucket,
        ServerSideEncryptionConfiguration={"Rules": [{"ApplyServerSideEncryptionByDefault": {
            "SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}, "BucketKeyEnabled": True}]},
    )  # fmt: skip
    from spotrain.constructs.encrypted_bucket import kms_only_puts
    from spotrain.constructs.policy import policy_json

    policy = policy_json(kms_only_puts(f"arn:aws:s3:::{bucket}/*", key))
    s3.put_bucket_policy(Bucket=bucket, Policy=policy)
    return str(key)


def launch_template(ec2: Any, name: str) -> str:
    """A launch template of the region's first image (what a group needs to launch)."""
    image = control.stock_image(ec2)
    template = ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": image}
    )
    return str(template["LaunchTemplate"]["LaunchTemplateId"])


def rest_of(process: Any, timeout: float) -> str:
    """What a process started with a text stdout pipe writes from here to its end, read
    through the file object a test already read lines from, once the process has exited.
    (`communicate` with a timeout reads the pipe itself, so the lines that object had already
    taken from the pipe, beyond the last one the test read, were lost: a flake under load.)
    Its stdin, if piped, is closed first, as `communicate` does."""
    import subprocess
    import threading

    if process.stdin is not None:
        process.stdin.close()
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(process.stdout.read()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        process.kill()
        reader.join(10)
        raise subprocess.TimeoutExpired(process.args, timeout)
    process.stdout.close()
    process.wait(timeout=30)
    return read[0] if read else ""


def adversarial_availability(ticks: int) -> list[tuple[str, tuple[int, ...]]]:
    """Spot that goes for good at every tick (among them the one where the slack runs out);
    that comes only at each moment; bursts shorter than a changeover (spot that never
    trains); and a fifth of the patterns of 8 ticks, repeated."""
    found = [(f"gone at {k}", (1,) * k + (0,) * (ticks - k)) for k in range(ticks)]
    found += [(f"from {k}", (0,) * k + (1,) * (ticks - k)) for k in range(0, ticks, 3)]
    found.append(("bursts", (1, 0) * (ticks // 2)))
    found += [(f"pattern {p}", (p * (ticks // 8 + 1))[:ticks])
              for p in itertools.product((0, 1), repeat=8)][::5]  # fmt: skip
    return found
