"""What the emulator lacks and spotrain needs, added faithfully to AWS's documented behaviour.

- Budgets: DescribeSubscribersForNotification, CreateSubscriber, DeleteSubscriber,
  ListTagsForResource, TagResource, UntagResource (moto answers HTTP 500 for these, and the
  aws provider then retries for minutes).
- S3 replication: moto stores replication configuration but never copies objects. Here every
  new object in a bucket with enabled replication rules is copied to each matching rule's
  destination bucket, re-encrypted with the rule's replica KMS key, and both copies report
  `x-amz-replication-status` (COMPLETED on the source, REPLICA on the copy). Replication is
  synchronous: the copy exists when the PUT returns.

- S3 bucket policies: moto denies every request a Deny statement names, ignoring the
  statement's conditions, so a TLS-only policy would refuse everything. Here object requests
  are judged as AWS judges them (`authorization`): a Deny applies only when its conditions hold
  for the request (aws:SecureTransport, the SSE-KMS headers, s3:if-none-match,
  s3:ObjectCreationOperation, aws:SourceVpce). Parts of a multipart upload carry the
  encryption the upload was started with.
- Identity policies, when the cloud enforces them: see `authorization`.
- DynamoDB stream -> Lambda mappings: moto runs a function only in a container (none here)
  and, when it has, drops the stream's records. Here a Python function's deployed zip runs in
  a process of this interpreter, with the function's environment and this cloud's endpoint,
  batch after batch in stream order (one worker per function, up to 100 records a batch),
  after the write that made the records has been answered, as Lambda's poller does; the
  stream keeps its records. Each run's outcome goes to the server log.
- DynamoDB global tables: replicas, asynchronous replication, last writer wins
  (`global_tables`).
- Prices: EC2 spot price history and the Price List API answer from a price book
  (`price_list`).
- GPU quotas: Service Quotas answers for EC2's GPU quotas and CloudWatch's AWS/Usage counts
  their use from the running instances (`account_quotas`).
- Spot placement scores: EC2's GetSpotPlacementScores answers from the `spot_capacity_gone`
  fault (`spot_placement`).
- Auto Scaling markets: moto launches a mixed-instances group's machines with the launch
  template's instance type (none) and all on on-demand. Here each new machine takes the
  group's first override type, and those beyond `OnDemandBaseCapacity` (plus
  `OnDemandPercentageAboveBaseCapacity` of the rest) are spot machines
  (`InstanceLifecycle: spot`), as AWS launches them. An UpdateAutoScalingGroup that names no
  policy keeps the group's (moto drops it, and the group then launches machines of no type).
  Spot machines of a pool the `spot_capacity_gone` fault names do not launch; the group tries
  again whenever it is described, until they do.

`install()` patches moto in this process; the local cloud server calls it before it serves.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import queue
import subprocess
import threading
import zipfile
from typing import Any
from urllib.parse import parse_qs, urlparse

from spotrain.localcloud import (
    account_quotas,
    authorization,
    faults,
    global_tables,
    lambda_environments,
    price_list,
    spot_placement,
)
from spotrain.localcloud.account_quotas import EC2_SPOT

_installed = False


# --- Budgets ------------------------------------------------------------------------------
def _budget_arn(account_id: str, budget_name: str) -> str:
    return f"arn:aws:budgets::{account_id}:budget/{budget_name}"


def _same_notification(stored: dict[str, Any], asked: dict[str, Any]) -> bool:
    keys = ("NotificationType", "ComparisonOperator", "ThresholdType")
    return all(stored.get(k) == asked.get(k) for k in keys) and float(
        stored.get("Threshold", 0)
    ) == float(asked.get("Threshold", 0))


def _install_budgets() -> None:
    from moto.budgets.exceptions import NotFoundException
    from moto.budgets.models import BudgetsBackend
    from moto.budgets.responses import BudgetsResponse

    def tags_of(backend: BudgetsBackend) -> dict[str, dict[str, str]]:
        if not hasattr(backend, "resource_tags"):
            backend.resource_tags = {}  # type: ignore[attr-defined]
        return backend.resource_tags  # type: ignore[attr-defined,no-any-return]

    def requested_notification(response: BudgetsResponse) -> Any:
        """The stored notification that the request's AccountId, BudgetName and Notification
        name; NotFoundException as AWS answers when there is none."""
        name = response._get_param("BudgetName")
        budget = response.backend.budgets[response._get_param("AccountId")].get(name)
        if budget is None:
            raise NotFoundException(f"Unable to get budget: {name} - the budget doesn't exist.")
        asked = response._get_param("Notification")
        for notification in budget.notifications:
            if _same_notification(notification.details, asked):
                return notification
        raise NotFoundException("Unable to find the notification for the budget.")

    original_create_budget = BudgetsResponse.create_budget
    original_delete_budget = BudgetsResponse.delete_budget

    def create_budget(self: BudgetsResponse) -> str:
        result = original_create_budget(self)
        account, budget = self._get_param("AccountId"), self._get_param("Budget")
        tags = {t["Key"]: t["Value"] for t in self._get_param("ResourceTags", [])}
        tags_of(self.backend)[_budget_arn(account, budget["BudgetName"])] = tags
        return result

    def delete_budget(self: BudgetsResponse) -> str:
        result = original_delete_budget(self)
        arn = _budget_arn(self._get_param("AccountId"), self._get_param("BudgetName"))
        tags_of(self.backend).pop(arn, None)
        return result

    def describe_subscribers_for_notification(self: BudgetsResponse) -> str:
        notification = requested_notification(self)
        return json.dumps({"Subscribers": list(notification.subscribers), "NextToken": None})

    def create_subscriber(self: BudgetsResponse) -> str:
        notification = requested_notification(self)
        subscriber = self._get_param("Subscriber")
        if subscriber not in notification.subscribers:
            notification.subscribers = [*notification.subscribers, subscriber]
        return json.dumps({})

    def delete_subscriber(self: BudgetsResponse) -> str:
        notification = requested_notification(self)
        subscriber = self._get_param("Subscriber")
        notification.subscribers = [s for s in notification.subscribers if s != subscriber]
        return json.dumps({})

    def list_tags_for_resource(self: BudgetsResponse) -> str:
        tags = tags_of(self.backend).get(self._get_param("ResourceARN"), {})
        return json.dumps(
            {"ResourceTags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}
        )

    def tag_resource(self: BudgetsResponse) -> str:
        tags = tags_of(self.backend).setdefault(self._get_param("ResourceARN"), {})
        tags.update({t["Key"]: t["Value"] for t in self._get_param("ResourceTags", [])})
        return json.dumps({})

    def untag_resource(self: BudgetsResponse) -> str:
        tags = tags_of(self.backend).setdefault(self._get_param("ResourceARN"), {})
        for key in self._get_param("ResourceTagKeys", []):
            tags.pop(key, None)
        return json.dumps({})

    for function in (
        create_budget,
        delete_budget,
        describe_subscribers_for_notification,
        create_subscriber,
        delete_subscriber,
        list_tags_for_resource,
        tag_resource,
        untag_resource,
    ):
        setattr(BudgetsResponse, function.__name__, function)


# --- S3 replication -----------------------------------------------------------------------
def _matching_destinations(
    replication: dict[str, Any] | None, key_name: str
) -> list[dict[str, Any]]:
    """Destinations of the enabled rules whose prefix filter matches, highest priority first
    per destination bucket (as S3 resolves overlapping rules)."""
    if not replication:
        return []
    chosen: dict[str, tuple[int, dict[str, Any]]] = {}
    for rule in replication.get("Rule", []):
        if rule.get("Status") != "Enabled":
            continue
        rule_filter = rule.get("Filter") or {}
        prefix = rule_filter.get("Prefix", rule.get("Prefix", "")) or ""
        if "And" in rule_filter:
            prefix = rule_filter["And"].get("Prefix", "") or ""
        if not key_name.startswith(prefix):
            continue
        destination = rule["Destination"]
        priority = int(rule.get("Priority", 0))
        bucket = destination["Bucket"]
        if bucket not in chosen or priority > chosen[bucket][0]:
            chosen[bucket] = (priority, destination)
    return [destination for _, destination in chosen.values()]


def _install_s3_replication() -> None:
    from moto.s3.models import FakeKey, S3Backend

    original_put_object = S3Backend.put_object

    def put_object(
        self: S3Backend, bucket_name: str, key_name: str, value: bytes, *args: Any, **kwargs: Any
    ) -> FakeKey:
        new_key = original_put_object(self, bucket_name, key_name, value, *args, **kwargs)
        if getattr(new_key, "replication_status", None) == "REPLICA":
            return new_key
        bucket = self.get_bucket(bucket_name)
        destinations = _matching_destinations(getattr(bucket, "replication", None), key_name)
        if destinations and faults.current().replication_held(bucket_name, key_name):
            new_key.replication_status = "PENDING"  # type: ignore[attr-defined]
            return new_key
        for destination in destinations:
            target = destination["Bucket"].split(":::")[-1]
            replica_key_id = (destination.get("EncryptionConfiguration") or {}).get(
                "ReplicaKmsKeyID"
            )
            replica = original_put_object(
                self,
                target,
                key_name,
                new_key.value,
                storage=destination.get("StorageClass") or new_key.storage_class,
                encryption="aws:kms" if replica_key_id else new_key.encryption,
                kms_key_id=replica_key_id or new_key.kms_key_id,
                checksum_value=new_key.checksum_value,
            )
            replica.set_metadata(new_key.metadata)
            replica.checksum_algorithm = new_key.checksum_algorithm
            replica.replication_status = "REPLICA"  # type: ignore[attr-defined]
        if destinations:
            new_key.replication_status = "COMPLETED"  # type: ignore[attr-defined]
        return new_key

    original_response_dict = FakeKey.response_dict

    def response_dict(self: FakeKey) -> dict[str, Any]:
        headers: dict[str, Any] = original_response_dict.fget(self)  # type: ignore[attr-defined]
        status = getattr(self, "replication_status", None)
        if status:
            headers["x-amz-replication-status"] = status
        return headers

    S3Backend.put_object = put_object  # type: ignore[method-assign]
    FakeKey.response_dict = property(response_dict)  # type: ignore[assignment,method-assign]


# --- S3 bucket policy conditions -----------------------------------------------------------
_request = threading.local()


def evaluate_bucket_policy(
    policy: dict[str, Any], action: str, resource: str, context: authorization.Context
) -> str:
    """ "DENIED", "PERMITTED" or "NEUTRAL" for a request from any principal (statements that
    name specific principals or services are left out: the emulator's default caller is
    nobody in particular)."""
    return authorization.verdict(policy, action, resource, context, resource_policy=True)


def _install_s3_bucket_policy_conditions() -> None:
    from moto.iam.access_control import PermissionResult
    from moto.s3.models import FakeBucket
    from moto.s3.responses import S3Response

    original_key_response = S3Response._key_response

    def _key_response(self: S3Response, request: Any, full_url: str) -> Any:
        context = authorization.s3_context(request.method, full_url, request.headers)
        upload_id = parse_qs(urlparse(full_url).query).get("uploadId")
        if upload_id:
            # Parts and the completion of a multipart upload are judged with the encryption
            # the upload was started with, as S3 does.
            try:
                bucket = self.backend.get_bucket(self.parse_bucket_name_from_url(request, full_url))
                upload = bucket.multiparts.get(upload_id[0])
            except Exception:  # an unknown bucket or upload: moto answers it as usual
                upload = None
            if upload is not None:
                for name, value in (("s3:x-amz-server-side-encryption", upload.sse_encryption),
                                    ("s3:x-amz-server-side-encryption-aws-kms-key-id",
                                     upload.kms_key_id)):  # fmt: skip
                    if value:
                        context[name] = value
        _request.context = context
        try:
            return original_key_response(self, request, full_url)
        finally:
            _request.context = None

    def get_permission(self: FakeBucket, action: str, resource: str) -> Any:
        if self.policy is None:
            return PermissionResult.NEUTRAL
        context = getattr(_request, "context", None) or {"aws:SecureTransport": "true"}
        # moto names POST uploads (CreateMultipartUpload, CompleteMultipartUpload, form posts)
        # s3:PostObject; IAM has no such action: S3 authorizes them as s3:PutObject.
        action = "s3:PutObject" if action == "s3:PostObject" else action
        verdict = evaluate_bucket_policy(json.loads(self.policy), action, resource, context)
        return PermissionResult[verdict]

    S3Response._key_response = _key_response  # type: ignore[method-assign]
    FakeBucket.get_permission = get_permission  # type: ignore[method-assign]


# --- S3 checksums ---------------------------------------------------------------------------
# S3 takes a checksum sent as its header alone (x-amz-checksum-crc32: ...), records it for the
# object, and refuses the write (400 BadDigest) when the bytes do not match it. moto records a
# checksum only when the SDK also names the algorithm, and never checks it.
_VERIFIABLE = ("CRC32", "SHA1", "SHA256")  # computed exactly here without optional libraries


def _install_s3_checksums() -> None:
    from moto.s3.exceptions import S3ClientError
    from moto.s3.responses import S3Response
    from moto.s3.utils import compute_checksum

    class BadDigest(S3ClientError):
        def __init__(self, algorithm: str) -> None:
            super().__init__(
                "BadDigest", f"The {algorithm} you specified did not match the calculated checksum."
            )

    original = S3Response._get_checksum

    def _get_checksum(self: S3Response, response_headers: dict[str, Any]) -> tuple[str, Any]:
        algorithm = self.headers.get("x-amz-sdk-checksum-algorithm", "")
        named = [a for a in _VERIFIABLE if self.headers.get(f"x-amz-checksum-{a.lower()}")]
        if not algorithm and not named:
            return original(self, response_headers)  # type: ignore[no-any-return]
        algorithm = (algorithm or named[0]).upper()
        sent = self.headers.get(f"x-amz-checksum-{algorithm.lower()}")
        if sent and algorithm in _VERIFIABLE:
            actual = compute_checksum(self.body or b"", algorithm).decode()
            if actual != sent:
                raise BadDigest(algorithm)
        if not sent:
            return original(self, response_headers)  # type: ignore[no-any-return]
        response_headers[f"x-amz-checksum-{algorithm.lower()}"] = sent
        return algorithm, sent

    S3Response._get_checksum = _get_checksum  # type: ignore[method-assign]


# --- DynamoDB stream -> Lambda ---------------------------------------------------------------
ENDPOINT_VARIABLE = "SPOTRAIN_LOCALCLOUD_ENDPOINT"
CA_BUNDLE_VARIABLE = "SPOTRAIN_LOCALCLOUD_CA_BUNDLE"
_STREAM_BATCH = 100
_workers: dict[str, Any] = {}
_workers_lock = threading.Lock()


_role_sessions: dict[str, dict[str, str]] = {}
_role_sessions_lock = threading.Lock()


def role_credentials(role_arn: str) -> dict[str, str]:
    """A session of role `role_arn`, as Lambda gives a function its execution role's: made
    once a role (its requests are judged by the role's policies, `authorization`)."""
    from moto.sts.models import sts_backends

    with _role_sessions_lock:
        if role_arn not in _role_sessions:
            account = role_arn.split(":")[4]
            session = sts_backends[account]["aws"].assume_role(
                region_name="us-east-1", role_session_name="local-lambda", role_arn=role_arn,
                policy="", duration=43200, external_id="",
            )  # fmt: skip
            _role_sessions[role_arn] = {
                "AWS_ACCESS_KEY_ID": session.access_key_id,
                "AWS_SECRET_ACCESS_KEY": session.secret_access_key,
                "AWS_SESSION_TOKEN": session.session_token,
            }
        return _role_sessions[role_arn]


def run_python_function(
    code: bytes, handler: str, environment: dict[str, str], region: str, event: dict[str, Any],
    timeout_s: float, role_arn: str | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a Python Lambda handler (`module.function`) from its zip, as Lambda would, against
    this local cloud: in a warm execution environment of the function when one is idle
    (`lambda_environments`), with a session of its execution role `role_arn` (else the cloud's
    default keys)."""
    keys = role_credentials(role_arn) if role_arn else {
        "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}  # fmt: skip
    env = {
        "PATH": os.environ.get("PATH", ""),
        **environment,
        **keys,
        "AWS_REGION": region, "AWS_DEFAULT_REGION": region,
        "AWS_ENDPOINT_URL": os.environ.get(ENDPOINT_VARIABLE, ""),
        "AWS_CA_BUNDLE": os.environ.get(CA_BUNDLE_VARIABLE, ""),
        "AWS_EC2_METADATA_DISABLED": "true",
    }  # fmt: skip
    return lambda_environments.invoke(code, handler, env, event, timeout_s)


def _stream_worker(function_arn: str, pending: queue.Queue[dict[str, Any]]) -> None:
    from moto.awslambda.utils import get_backend

    account, region = function_arn.split(":")[4], function_arn.split(":")[3]
    while True:
        records = [pending.get()]
        while len(records) < _STREAM_BATCH and not pending.empty():
            records.append(pending.get())
        function = get_backend(account, region).get_function(function_arn)
        try:
            done = run_python_function(
                function.code_bytes, function.handler, dict(function.environment_vars), region,
                {"Records": records}, float(function.timeout), function.role,
            )  # fmt: skip
            outcome = f"exit {done.returncode}: {done.stdout.strip()[-2000:]} {done.stderr[-2000:]}"
        except (subprocess.TimeoutExpired, OSError, zipfile.BadZipFile) as error:
            outcome = f"failed: {error}"
        print(f"local cloud: {function_arn} ran on {len(records)} stream record(s): {outcome}",
              flush=True)  # fmt: skip


def _install_dynamodb_stream_functions() -> None:
    from moto.awslambda.models import LambdaBackend
    from moto.core.utils import unix_time

    def send_dynamodb_items(
        self: LambdaBackend, function_arn: str, items: list[Any], source: str
    ) -> None:
        record = items[-1].to_json()  # the record just added; the stream keeps them all
        change = dict(record["dynamodb"])
        if isinstance(change.get("ApproximateCreationDateTime"), datetime.datetime):
            change["ApproximateCreationDateTime"] = unix_time(change["ApproximateCreationDateTime"])
        record = {**record, "dynamodb": change, "awsRegion": self.region_name,
                  "eventSourceARN": source}  # fmt: skip
        with _workers_lock:
            if function_arn not in _workers:
                pending: queue.Queue[dict[str, Any]] = queue.Queue()
                threading.Thread(target=_stream_worker, args=(function_arn, pending),
                                 daemon=True).start()  # fmt: skip
                _workers[function_arn] = pending
            _workers[function_arn].put(record)

    LambdaBackend.send_dynamodb_items = send_dynamodb_items  # type: ignore[assignment,method-assign]


def _install_python_function_invoke() -> None:
    """Invoke runs a Python function from its zip, as Lambda would (moto needs Docker for it):
    the payload is what the handler returned; a handler that raised or a run that failed is a
    function error with its output, and the log tail comes back as Lambda's does."""
    from moto.awslambda.models import LambdaFunction

    original = LambdaFunction.invoke

    def invoke(self: Any, body: Any, request_headers: Any, response_headers: Any) -> Any:
        if not str(self.run_time or "").startswith("python") or not self.code_bytes:
            return original(self, body, request_headers, response_headers)
        event = json.loads(body) if body else {}
        try:
            done = run_python_function(self.code_bytes, self.handler,
                                       dict(self.environment_vars), self.region, event,
                                       float(self.timeout), self.role)  # fmt: skip
        except subprocess.TimeoutExpired:
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps({"errorType": "Timeout",
                               "errorMessage": f"timed out after {self.timeout} s"})  # fmt: skip
        response_headers["x-amz-log-result"] = base64.b64encode(
            done.stderr[-4000:].encode()).decode()  # fmt: skip
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps({"errorType": "Failed", "errorMessage": done.stderr[-4000:]})
        return lines[-1]

    LambdaFunction.invoke = invoke  # type: ignore[method-assign]


def _install_autoscaling_markets() -> None:
    from moto.autoscaling.models import FakeAutoScalingGroup

    replace_instances = FakeAutoScalingGroup.replace_autoscaling_group_instances

    def replace_autoscaling_group_instances(
        self: FakeAutoScalingGroup, count_needed: int, propagated_tags: dict[str, str]
    ) -> None:
        before = len(self.instance_states)
        replace_instances(self, count_needed, propagated_tags)
        policy = self.mixed_instances_policy or {}
        overrides = policy.get("LaunchTemplate", {}).get("Overrides", [])
        distribution = policy.get("InstancesDistribution", {})
        base = int(distribution.get("OnDemandBaseCapacity", 0))
        above = int(distribution.get("OnDemandPercentageAboveBaseCapacity", 100))
        for state in self.instance_states[before:]:
            instance = state.instance
            if overrides and overrides[0].get("InstanceType"):
                instance.instance_type = overrides[0]["InstanceType"]
            if not policy:
                continue
            live = [s.instance for s in self.instance_states if s.instance.state != "terminated"]
            on_demand = sum(i.lifecycle != EC2_SPOT for i in live if i is not instance)
            beyond = max(0, len(live) - base)
            wanted_on_demand = base + (beyond * above + 99) // 100
            if on_demand >= wanted_on_demand:
                instance.lifecycle = EC2_SPOT
        _leave_out_spot_without_capacity(self, before)

    FakeAutoScalingGroup.replace_autoscaling_group_instances = replace_autoscaling_group_instances  # type: ignore[method-assign]
    _install_autoscaling_keeps_trying()


_SHORT_OF_SPOT: set[tuple[str, str]] = set()
"""(region, group) left short of desired capacity by a `spot_capacity_gone` fault."""


def _leave_out_spot_without_capacity(group: Any, first: int) -> None:
    """The machines launched from `group.instance_states[first]` on that are spot in a pool
    with no capacity (the fault) never started: terminated and out of the group."""
    gone = faults.current()
    failed = [s for s in group.instance_states[first:] if s.instance.lifecycle == EC2_SPOT
              and gone.spot_gone(group.region, s.instance.instance_type)]  # fmt: skip
    if not failed:
        _SHORT_OF_SPOT.discard((group.region, group.name))
        return
    group.autoscaling_backend.ec2_backend.terminate_instances([s.instance.id for s in failed])
    group.instance_states = [s for s in group.instance_states if s not in failed]
    _SHORT_OF_SPOT.add((group.region, group.name))


def _install_autoscaling_keeps_trying() -> None:
    """A group left short of spot by the fault launches again when it is next described, as
    Auto Scaling keeps trying until capacity returns (only such groups: moto fills a group
    only when its desired capacity changes)."""
    from moto.autoscaling.models import AutoScalingBackend

    describe = AutoScalingBackend.describe_auto_scaling_groups

    def describe_and_retry(self: AutoScalingBackend, *args: Any, **kwargs: Any) -> Any:
        for region, name in sorted(_SHORT_OF_SPOT):
            if region != self.region_name:
                continue
            _SHORT_OF_SPOT.discard((region, name))  # a launch that fails again puts it back
            if (group := self.autoscaling_groups.get(name)) is not None:
                group.set_desired_capacity(group.desired_capacity)
        return describe(self, *args, **kwargs)

    AutoScalingBackend.describe_auto_scaling_groups = describe_and_retry  # type: ignore[method-assign]


def _install_autoscaling_update_keeps_the_policy() -> None:
    """UpdateAutoScalingGroup changes only what it names; moto drops the group's mixed
    instances policy when a request names none (a scale by minimum and desired), and the
    group then launches instances of no type, in no market. The local cloud keeps it, as AWS
    does, so a group the handler starts or releases launches what it was deployed with."""
    from moto.autoscaling.models import FakeAutoScalingGroup

    update = FakeAutoScalingGroup.update

    def keep_the_policy(self: FakeAutoScalingGroup, *args: Any, **kwargs: Any) -> None:
        kept = self.mixed_instances_policy
        if (
            kept
            and kwargs.get("mixed_instances_policy") is None
            and not kwargs.get("launch_template")
        ):
            # As it was given (the template by id or by name: moto refuses both at once).
            spec = dict(kept["LaunchTemplate"]["LaunchTemplateSpecification"])
            if spec.get("LaunchTemplateId"):
                spec.pop("LaunchTemplateName", None)
            kwargs["mixed_instances_policy"] = {
                **kept, "LaunchTemplate": {**kept["LaunchTemplate"],
                                           "LaunchTemplateSpecification": spec},
            }  # fmt: skip
        update(self, *args, **kwargs)

    FakeAutoScalingGroup.update = keep_the_policy  # type: ignore[method-assign]


def _install_autoscaling_bounds() -> None:
    """Auto Scaling refuses a desired capacity outside the group's minimum and maximum (and a
    minimum above the maximum) when asked for one; moto takes any. The local cloud answers the
    two requests as AWS does (moto's own internal moves, such as a forced delete's scale to 0,
    are left alone), so what scales a group (the handler's holds, `spotrain fleet scale`, the
    runbooks) is tested against the real rules."""
    from moto.autoscaling.exceptions import ValidationError
    from moto.autoscaling.responses import AutoScalingResponse

    set_desired = AutoScalingResponse.set_desired_capacity
    update_group = AutoScalingResponse.update_auto_scaling_group

    def group_of(response: AutoScalingResponse) -> Any:
        name = response._get_param("AutoScalingGroupName")
        return response.autoscaling_backend.autoscaling_groups.get(name)

    def set_desired_capacity(self: AutoScalingResponse) -> Any:
        group, desired = group_of(self), self._get_int_param("DesiredCapacity")
        if group is not None and desired is not None:
            beyond = (
                ("above", "max", group.max_size) if desired > group.max_size
                else ("below", "min", group.min_size) if desired < group.min_size
                else None
            )  # fmt: skip
            if beyond is not None:
                side, bound, size = beyond
                raise ValidationError(
                    f"New SetDesiredCapacity value {desired} is {side} {bound} value {size} "
                    "for the AutoScalingGroup."
                )
        return set_desired(self)

    def update_auto_scaling_group(self: AutoScalingResponse) -> Any:
        group = group_of(self)
        if group is not None:
            low, high = self._get_int_param("MinSize"), self._get_int_param("MaxSize")
            low = group.min_size if low is None else low
            high = group.max_size if high is None else high
            desired = self._get_int_param("DesiredCapacity")
            if low > high:
                raise ValidationError(
                    f"Max bound, {high}, must be greater than or equal to min bound, {low}"
                )
            if desired is not None and not low <= desired <= high:
                raise ValidationError(f"Desired capacity:{desired} must be between the specified "
                                      f"min size:{low} and max size:{high}")  # fmt: skip
        return update_group(self)

    AutoScalingResponse.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]
    AutoScalingResponse.update_auto_scaling_group = update_auto_scaling_group  # type: ignore[method-assign]


def _install_backend_names_listed_once() -> None:
    """moto's server lists its package's folders on every request (a directory listing and a
    stat a service, under its dispatcher's lock) to tell whether a name is a backend's; the
    folders do not change while it serves, so they are listed once."""
    from moto import backends

    names = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: names


def _install_kms_key_pairs_made_on_first_use() -> None:
    """moto generates an RSA key pair for every KMS key it creates, symmetric ones included,
    for the signing calls only asymmetric keys answer: a tenth of the cloud's CPU while a
    deployment was applied. The pair is made when a call first needs it."""
    from moto.kms import models

    make = models.generate_private_key

    class MadeOnFirstUse:
        def __init__(self, key_spec: str) -> None:
            self._key_spec, self._made, self._lock = key_spec, None, threading.Lock()

        def __getattr__(self, name: str) -> Any:
            with self._lock:
                if self._made is None:
                    self._made = make(self._key_spec)
            return getattr(self._made, name)

    models.generate_private_key = MadeOnFirstUse  # type: ignore[assignment]


def install() -> None:
    """Patch moto in this process (idempotent)."""
    global _installed
    if _installed:
        return
    _install_budgets()
    _install_s3_replication()
    _install_s3_bucket_policy_conditions()
    _install_s3_checksums()
    authorization.install()
    _install_dynamodb_stream_functions()
    global_tables.install()
    _install_python_function_invoke()
    _install_autoscaling_update_keeps_the_policy()
    price_list.install()
    account_quotas.install()
    spot_placement.install()
    _install_autoscaling_markets()
    _install_autoscaling_bounds()
    _install_backend_names_listed_once()
    _install_kms_key_pairs_made_on_first_use()
    _installed = True
