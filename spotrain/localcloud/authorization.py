"""Policy evaluation as IAM does it, for what the emulator leaves out: conditions.

moto judges bucket policies without their conditions (a TLS-only Deny refuses everything) and,
when it enforces identity policies (`INITIAL_NO_AUTH_ACTION_COUNT`, `/moto-api/reset-auth`),
treats every condition as failed, turning a conditioned Allow into an explicit Deny, and
checks every DynamoDB call against the resource `*` (so every table grant misses). Here:

- `verdict` judges one policy for one request: Action/NotAction, Resource/NotResource, the
  Principal of a resource policy, and conditions with AWS's rules for absent keys (negated
  operators and ...IfExists hold, Null tests absence) and for multivalued keys
  (ForAllValues holds for an empty set, ForAnyValue needs a match).
- `s3_context` and `dynamodb_requests` give the condition keys a request carries:
  aws:SecureTransport, aws:SourceVpce (see `faults.Faults.through_vpc_endpoints`),
  aws:PrincipalArn/aws:PrincipalAccount, s3:prefix, s3:if-none-match,
  s3:ObjectCreationOperation, the SSE-KMS headers, dynamodb:LeadingKeys. A DynamoDB
  transaction or batch is authorized item by item, as DynamoDB does (PutItem, UpdateItem, ...).
  `autoscaling_request` gives an Auto Scaling call the group it acts on, by ARN, and the
  group's tags (aws:ResourceTag/...), where moto names every Auto Scaling resource `*`;
  `ssm_requests` an SSM call its parameters' (or path's) ARNs, `logs_request` a CloudWatch
  Logs call its stream's or group's, `ec2_requests` an EC2 tagging call each resource's with
  its tags and the keys it sets (aws:TagKeys), an SNS publish its topic's, and
  `metrics_request` a CloudWatch metrics call the namespace it names (cloudwatch:namespace).
- `install()` makes moto's identity-policy check use them.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlparse

from spotrain.localcloud import faults

Context = Mapping[str, "str | list[str]"]
DENIED, PERMITTED, NEUTRAL = "DENIED", "PERMITTED", "NEUTRAL"
_NEGATED = ("StringNotEquals", "StringNotLike", "ArnNotEquals", "ArnNotLike")


def _as_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _value_matches(base: str, actual: str, expected: list[str]) -> bool:
    """A positive operator's test of one value (negation is applied by the caller)."""
    if base == "Bool":
        return actual.lower() in (value.lower() for value in expected)
    if base in ("StringEquals", "ArnEquals"):
        return actual in expected
    if base == "StringEqualsIgnoreCase":
        return actual.lower() in (value.lower() for value in expected)
    if base in ("StringLike", "ArnLike"):
        return any(fnmatch.fnmatchcase(actual, pattern) for pattern in expected)
    raise ValueError(f"operator {base} is not modelled")


def condition_holds(operator: str, key: str, expected: list[str], context: Context) -> bool:
    """One condition of a policy statement, as IAM evaluates it."""
    present = key in context
    values = _as_list(context[key]) if present else []
    if operator == "Null":
        return (not present) == (expected[0].lower() == "true")
    qualifier, _, operator = operator.rpartition(":")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    negated = base in _NEGATED
    positive = base.replace("Not", "", 1) if negated else base
    try:

        def matches(actual: str) -> bool:
            return _value_matches(positive, actual, expected) != negated

        if qualifier == "ForAllValues":
            return all(matches(actual) for actual in values)  # an empty set: holds
        if qualifier == "ForAnyValue":
            return any(matches(actual) for actual in values)
        if not present:
            return if_exists or negated
        return any(matches(actual) for actual in values)
    except ValueError:
        return False  # an operator we do not model never makes a statement apply


def _matches_any(patterns: Any, value: str) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in _as_list(patterns))


def _names(principal: Any, caller: str | None) -> bool:
    """Whether a resource policy's Principal covers the caller (None: anyone unknown)."""
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    named = _as_list(principal.get("AWS", []))
    return "*" in named or (caller is not None and caller in named)


def verdict(
    policy: Mapping[str, Any],
    action: str,
    resource: str,
    context: Context,
    *,
    resource_policy: bool = False,
    caller: str | None = None,
) -> str:
    """DENIED, PERMITTED or NEUTRAL: what one policy says of one request. A resource policy's
    statements apply to the principals they name (`caller`: the request's principal ARN, for
    an assumed role its role's ARN; statements for services never apply to a signed call)."""
    result = NEUTRAL
    statements = policy.get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        if resource_policy and not _names(statement.get("Principal"), caller):
            continue
        if "NotAction" in statement:
            if _matches_any(statement["NotAction"], action):
                continue
        elif not _matches_any(statement.get("Action", []), action):
            continue
        if "NotResource" in statement:
            if _matches_any(statement["NotResource"], resource):
                continue
        elif not _matches_any(statement.get("Resource", []), resource):
            continue
        conditions = statement.get("Condition", {})
        if not all(
            condition_holds(operator, key, _as_list(values), context)
            for operator, keys in conditions.items()
            for key, values in keys.items()
        ):
            continue
        if statement.get("Effect") == "Deny":
            return DENIED
        result = PERMITTED
    return result


# --- request contexts -----------------------------------------------------------------------
def through_endpoint(service: str, headers: Any = None) -> dict[str, str]:
    """aws:SourceVpce of a request to `service`: every caller's when a test plays all callers
    inside a VPC (`faults.Faults.through_vpc_endpoints`); else a machine's, when the request
    (its `headers`) is signed with the session of its instance role (`machine_endpoint`).
    Operators' and tests' own keys come from outside any VPC."""
    endpoint = faults.current().through_vpc_endpoints.get(service)
    if not endpoint and headers is not None:
        endpoint = machine_endpoint(service, headers)
    return {"aws:SourceVpce": endpoint} if endpoint else {}


_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/[^/]+/([a-z0-9-]+)/")


def machine_endpoint(service: str, headers: Any) -> str | None:
    """The VPC endpoint for `service` that a machine's request comes through: a request signed
    with a role session named for an instance (as EC2 names the sessions of an instance's
    role) of the request's region, in a VPC with an endpoint for the service, which its route
    tables and private DNS send the request through. None for any other caller. An instance
    Auto Scaling has terminated counts too: the emulator ends it at once, while a real one
    shuts down as its played machine does here, publishing its emergency checkpoint first."""
    from moto.ec2.models import ec2_backends
    from moto.sts.models import sts_backends

    signed = {str(k).lower(): v for k, v in dict(headers).items()}
    found = _CREDENTIAL.search(str(signed.get("authorization", "")))
    if not found or not signed.get("x-amz-security-token"):
        return None
    key, region = found.groups()
    for account, partitions in list(sts_backends.items()):
        session = next((role for role in partitions["aws"].assumed_roles
                        if role.access_key_id == key), None)  # fmt: skip
        if session is None:
            continue
        if not session.session_name.startswith("i-"):
            return None
        try:
            backend = ec2_backends[account][region]
            instance = backend.get_instance(session.session_name)
        except Exception:  # not an instance of this region: not inside its VPC
            return None
        wanted = f"com.amazonaws.{region}.{service}"
        return next((endpoint.id for endpoint in backend.vpc_end_points.values()
                     if endpoint.vpc_id == instance.vpc_id
                     and endpoint.service_name == wanted), None)  # fmt: skip
    return None


def s3_context(method: str, url: str, headers: Any) -> dict[str, str]:
    """The condition keys an S3 request carries."""
    given = headers
    headers = {str(name).lower(): value for name, value in dict(headers).items()}
    parsed = urlparse(url)
    query = parse_qs(parsed.query, keep_blank_values=True)
    context = {
        "aws:SecureTransport": "true" if url.startswith("https://") else "false",
        **through_endpoint("s3", given),
    }
    for header in ("x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id"):
        if headers.get(header):
            context[f"s3:{header}"] = headers[header]
    for header in ("if-none-match", "if-match"):
        if headers.get(header):
            context[f"s3:{header}"] = headers[header]
    if "prefix" in query:
        context["s3:prefix"] = query["prefix"][0]
    if method in ("PUT", "POST") and "tagging" not in query and "acl" not in query:
        # Whether the request creates an object (PutObject, CopyObject, the completion of a
        # multipart upload), not a step of one (CreateMultipartUpload, UploadPart).
        creates = (method == "PUT" and "uploadId" not in query) or (
            method == "POST" and "uploadId" in query
        )
        context["s3:ObjectCreationOperation"] = "true" if creates else "false"
    return context


_KEY_CONDITION = re.compile(r"(#?[A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)")
_ITEM_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                 "ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}  # fmt: skip


def _scalar(value: Mapping[str, Any]) -> str:
    ((kind, inner),) = value.items()
    return str(inner) if kind in ("S", "N", "B") else json.dumps(value, sort_keys=True)


def dynamodb_requests(
    action: str, body: Mapping[str, Any], table_arn: Any, hash_key: Any
) -> list[tuple[str, str, dict[str, list[str]]]]:
    """(action, resource, context) for each authorization a DynamoDB call needs.
    `table_arn(name)` and `hash_key(name)` describe a table (hash_key None: unknown table)."""

    def one(item_action: str, request: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
        name = str(request.get("TableName", ""))
        resource = table_arn(name)
        if request.get("IndexName"):
            resource += f"/index/{request['IndexName']}"
        partition = hash_key(name)
        leading: list[str] | None = None
        for field in ("Key", "Item"):
            if partition and partition in (request.get(field) or {}):
                leading = [_scalar(request[field][partition])]
        if item_action == "Query" and partition:
            names = request.get("ExpressionAttributeNames") or {}
            values = request.get("ExpressionAttributeValues") or {}
            for attribute, placeholder in _KEY_CONDITION.findall(
                str(request.get("KeyConditionExpression", ""))
            ):
                if names.get(attribute, attribute) == partition and placeholder in values:
                    leading = [_scalar(values[placeholder])]
        context: dict[str, Any] = {}
        if leading is not None:
            context["dynamodb:LeadingKeys"] = leading
        return f"dynamodb:{item_action}", resource, context

    if action in ("TransactWriteItems", "TransactGetItems"):
        requests = []
        for entry in body.get("TransactItems", []):
            ((kind, request),) = entry.items()
            requests.append(one(_ITEM_ACTIONS[kind], request))
        return requests
    if action in ("BatchGetItem", "BatchWriteItem"):
        requests = []
        for name, entries in (body.get("RequestItems") or {}).items():
            if action == "BatchGetItem":
                for key in entries.get("Keys", []):
                    requests.append(one("BatchGetItem", {"TableName": name, "Key": key}))
                continue
            for entry in entries:
                ((kind, request),) = entry.items()  # PutRequest | DeleteRequest
                requests.append(one("BatchWriteItem", {"TableName": name, **request}))
        return requests
    return [one(action, body)]


GROUP_ACTIONS = frozenset({
    "SetDesiredCapacity", "UpdateAutoScalingGroup", "SetInstanceHealth",
    "TerminateInstanceInAutoScalingGroup", "CompleteLifecycleAction",
    "RecordLifecycleActionHeartbeat", "DeleteAutoScalingGroup", "AttachInstances",
    "DetachInstances", "EnterStandby", "ExitStandby", "SuspendProcesses", "ResumeProcesses",
    "SetInstanceProtection", "StartInstanceRefresh", "CreateOrUpdateTags", "DeleteTags",
})  # fmt: skip
"""Auto Scaling actions on one group, which IAM authorizes against that group's ARN and tags
(the Service Authorization Reference); the rest (Describe...) support no resource: `*`."""


def autoscaling_request(action: str, params: Mapping[str, list[str]], groups: Any,
                        group_of_instance: Any) -> tuple[str, dict[str, str]]:  # fmt: skip
    """(resource, context) of an Auto Scaling call: the group it acts on, named in the call
    (AutoScalingGroupName) or by one of its instances (InstanceId), with aws:ResourceTag/...
    for each of the group's tags; `*` for a call on no group, or on none that exists.
    `groups`: the region's groups by name; `group_of_instance(instance_id)`: the name of the
    group an instance is in, or None."""
    if action not in GROUP_ACTIONS:
        return "*", {}
    name = (params.get("AutoScalingGroupName") or [None])[0]
    if name is None:
        instance = (params.get("InstanceId") or params.get("InstanceIds.member.1") or [None])[0]
        name = group_of_instance(instance) if instance else None
    group = groups.get(name) if name else None
    if group is None:
        return "*", {}
    # Auto Scaling answers to its own key for a resource's tags as well as the global one.
    context = {f"{prefix}:ResourceTag/{tag['Key']}": str(tag["Value"])
               for tag in group.tags for prefix in ("aws", "autoscaling")}  # fmt: skip
    return str(group.arn), context


def ssm_requests(action: str, body: Mapping[str, Any], region: str,
                 account: str) -> list[tuple[str, str]]:  # fmt: skip
    """(action, resource) for each authorization an SSM call needs: the parameter (or the
    path) it names, by ARN, one per name; `*` for a call that names none (Describe...)."""

    def arn(name: str) -> str:
        return (
            f"arn:aws:ssm:{region}:{account}:parameter{'' if name.startswith('/') else '/'}{name}"
        )

    names = [body["Path"]] if action == "GetParametersByPath" and "Path" in body else []
    names += [body["Name"]] if "Name" in body else list(body.get("Names") or [])
    return [(f"ssm:{action}", arn(str(n))) for n in names] or [(f"ssm:{action}", "*")]


_STREAM_ACTIONS = frozenset({"CreateLogStream", "PutLogEvents", "GetLogEvents",
                             "DeleteLogStream"})  # fmt: skip


def logs_request(action: str, body: Mapping[str, Any], region: str, account: str) -> str:
    """The resource a CloudWatch Logs call is judged against: a stream's ARN for a call on one
    stream, else its group's in the form with a trailing `:*` (the form the service's
    documentation says IAM policies use for every call but the tagging ones); `*` for a call
    that names no group. A grant on `log-group:NAME:*` so covers a group's streams, and one on
    `log-group:NAME` alone does not."""
    group = body.get("logGroupName")
    if not group:
        return "*"
    arn = f"arn:aws:logs:{region}:{account}:log-group:{group}"
    if action in _STREAM_ACTIONS and body.get("logStreamName"):
        return f"{arn}:log-stream:{body['logStreamName']}"
    return f"{arn}:*"


_EC2_RESOURCE_TYPES = {"i": "instance", "vol": "volume", "sg": "security-group",
                       "subnet": "subnet", "vpc": "vpc", "eni": "network-interface"}  # fmt: skip


def ec2_requests(action: str, params: Mapping[str, list[str]], region: str, account: str,
                 tags_of: Any) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """(resource, context) for each authorization an EC2 tagging call needs: one per resource
    it tags, by ARN, with that resource's tags (aws:ResourceTag/...), the keys it sets
    (aws:TagKeys) and their values (aws:RequestTag/...); `*` for every other call (those the
    handler makes support no resource). `tags_of(id)`: a resource's tags."""
    if action not in ("CreateTags", "DeleteTags"):
        return [("*", {})]
    tags = {}
    for name, values in params.items():
        found = re.fullmatch(r"Tag\.(\d+)\.Key", name)
        if found:
            tags[values[0]] = (params.get(f"Tag.{found.group(1)}.Value") or [""])[0]
    requests = []
    for name, values in sorted(params.items()):
        if not re.fullmatch(r"ResourceId\.\d+", name):
            continue
        resource_id = values[0]
        kind = _EC2_RESOURCE_TYPES.get(resource_id.split("-", 1)[0], "*")
        context: dict[str, Any] = {"aws:TagKeys": sorted(tags)}
        context.update({f"aws:ResourceTag/{k}": v for k, v in tags_of(resource_id).items()})
        context.update({f"aws:RequestTag/{k}": v for k, v in tags.items()})
        requests.append((f"arn:aws:ec2:{region}:{account}:{kind}/{resource_id}", context))
    return requests or [("*", {})]


def install() -> None:
    """Make moto's identity-policy check (when it enforces one) evaluate conditions, the
    resources a call acts on (DynamoDB tables and leading keys, Auto Scaling groups, SSM
    parameters, log streams, tagged instances, topics) with their condition keys, and the VPC
    endpoint a caller comes through."""
    from moto.core.exceptions import JsonRESTError
    from moto.dynamodb.models import dynamodb_backends
    from moto.iam.access_control import IAMPolicy, IAMRequestBase

    def check_action_permitted(self: IAMRequestBase, resource: str) -> None:
        if self._action == "sts:GetCallerIdentity":
            return  # always allowed, as in AWS
        key = self._access_key
        role = getattr(key, "_owner_role_name", None)
        caller = f"arn:aws:iam::{self.account_id}:role/{role}" if role else key.arn
        # The server answers HTTPS only.
        base = {"aws:PrincipalArn": caller, "aws:PrincipalAccount": self.account_id,
                "aws:SecureTransport": "true"}  # fmt: skip
        service, _, action = self._action.partition(":")
        if service != "s3":  # the VPC endpoint it came through; S3's context (below) has its own
            base.update(through_endpoint(service, self._headers))
        if service == "s3":
            url = f"https://local{self._path}"
            requests = [
                (self._action, resource, {**base, **s3_context(self._method, url, self._headers)})
            ]
        elif service == "dynamodb":
            backend = dynamodb_backends[self.account_id][self._region]

            def table_arn(name: str) -> str:
                return f"arn:aws:dynamodb:{self._region}:{self.account_id}:table/{name}"

            def hash_key(name: str) -> str | None:
                table = backend.tables.get(name)
                return table.hash_key_attr if table is not None else None

            body = json.loads(self._body or b"{}")
            requests = [
                (item_action, item_resource, {**base, **context})
                for item_action, item_resource, context in dynamodb_requests(
                    action, body, table_arn, hash_key
                )
            ]
        elif service == "autoscaling":
            from moto.autoscaling.models import autoscaling_backends

            groups = autoscaling_backends[self.account_id][self._region].autoscaling_groups
            params = _query_params(self._data)

            def group_of(instance_id: str) -> str | None:
                return next((name for name, group in groups.items()
                             if any(state.instance.id == instance_id
                                    for state in group.instance_states)), None)  # fmt: skip

            group_arn, tags = autoscaling_request(action, params, groups, group_of)
            requests = [(self._action, group_arn, {**base, **tags})]
        elif service == "logs":
            body = json.loads(self._body or b"{}")
            resource = logs_request(action, body, self._region, self.account_id)
            requests = [(self._action, resource, base)]
        elif service == "ec2":
            from moto.ec2.models import ec2_backends

            backend = ec2_backends[self.account_id][self._region]
            params = _query_params(self._data)
            requests = [
                (self._action, tagged, {**base, **context})
                for tagged, context in ec2_requests(
                    action, params, self._region, self.account_id,
                    lambda resource_id: backend.tags.get(resource_id) or {},
                )
            ]  # fmt: skip
        elif service == "sns":
            topic = (_query_params(self._data).get("TopicArn") or ["*"])[0]
            requests = [(self._action, topic if action == "Publish" else "*", base)]
        elif service == "sqs":
            url = _parameter(self._data, self._body, "QueueUrl")
            requests = [(self._action, sqs_queue_arn(url, self._region), base)]
        elif service == METRICS_SIGNING_NAME:
            namespace = _parameter(self._data, self._body, "Namespace")
            requests = [metrics_request(action, namespace, base)]
        elif service == "ssm":
            body = json.loads(self._body or b"{}")
            requests = [(ssm_action, parameter, base)
                        for ssm_action, parameter in ssm_requests(action, body, self._region,
                                                                  self.account_id)]  # fmt: skip
        else:
            requests = [(self._action, resource, base)]
        policies = [IAMPolicy(policy)._policy_json for policy in key.collect_policies()]
        for request_action, request_resource, context in requests:
            verdicts = {verdict(p, request_action, request_resource, context) for p in policies}
            if DENIED in verdicts or PERMITTED not in verdicts:
                if service in ("dynamodb", "ssm", "logs", "sqs", METRICS_SIGNING_NAME):  # JSON
                    query_compatible = service in ("sqs", METRICS_SIGNING_NAME)
                    raise JsonRESTError(
                        # These two keep their query protocol's code in JSON
                        # (awsQueryCompatible).
                        "AccessDenied" if query_compatible else "AccessDeniedException",
                        f"User: {key.arn} is not authorized to perform: {request_action} on "
                        f"resource: {request_resource}",
                    )
                self._raise_access_denied()
        if self._is_assuming_role_operation(resource) and not (
            self._check_role_trust_relationship(resource)
        ):
            self._raise_access_denied()

    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]
    _install_assumed_roles_judged()


def _query_params(data: Any) -> dict[str, list[str]]:
    """A query-protocol call's parameters, as the emulator parsed them from its body."""
    return {str(k): list(v) if isinstance(v, list) else [str(v)]
            for k, v in dict(data or {}).items()}  # fmt: skip


METRICS_SIGNING_NAME = "monitoring"
"""CloudWatch metrics' name in a request's signature, where IAM's actions say `cloudwatch`."""

ROLE_JUDGED_SERVICES = ("s3", "dynamodb", "autoscaling", "ssm", "logs", "ec2", "sns", "sqs",
                        METRICS_SIGNING_NAME)  # fmt: skip
"""What an assumed role's requests are judged for (by their signing name) while the cloud
serves everyone else as it does by default: the services whose resources and condition keys
`install` models (moto names most other services' resources `*`, which no grant scoped to an
ARN matches)."""


def _parameter(data: Any, body: Any, name: str) -> str | None:
    """A request's top-level parameter `name`: in its JSON body (boto3's protocol for SQS and
    CloudWatch metrics) or its query parameters (the older one)."""
    text = body.decode() if isinstance(body, bytes) else str(body or "")
    if text.lstrip().startswith("{"):
        found = json.loads(text).get(name)
        return None if found is None else str(found)
    return (_query_params(data).get(name) or [None])[0]


def metrics_request(action: str, namespace: str | None,
                    base: Context) -> tuple[str, str, Context]:  # fmt: skip
    """A CloudWatch metrics call as IAM judges it: its action under `cloudwatch`, on `*` (no
    metric has an ARN), with the namespace it names (`cloudwatch:namespace`: the condition
    that narrows `PutMetricData`), if any."""
    context = {**base, "cloudwatch:namespace": namespace} if namespace else dict(base)
    return f"cloudwatch:{action}", "*", context


def sqs_queue_arn(queue_url: str | None, region: str) -> str:
    """The ARN of the queue a request names by URL (`.../<account>/<name>`), as IAM judges
    SQS's actions; `*` for one that names none (ListQueues)."""
    if not queue_url:
        return "*"
    account, name = queue_url.rstrip("/").split("/")[-2:]
    return f"arn:aws:sqs:{region}:{account}:{name}"


def _install_assumed_roles_judged() -> None:
    """A request signed with an assumed role's session (a function running as its role) is
    judged by that role's policies for S3 and DynamoDB even when the cloud does not enforce
    identity policies (`control.enforce_identity_policies`): the deployed handler then does its
    work with exactly what its role grants, while operators' and tests' own keys, which are
    nobody's in the cloud's IAM, are served as before."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    original = ActionAuthenticatorMixin._authenticate_and_authorize_action

    def authenticate_and_authorize(self: Any, iam_request_cls: type, resource: str = "*") -> None:
        enforcing = ActionAuthenticatorMixin.request_count >= settings.INITIAL_NO_AUTH_ACTION_COUNT
        session = self.headers.get("X-Amz-Security-Token") or self.headers.get(
            "x-amz-security-token"
        )
        if enforcing or not session:
            return original(self, iam_request_cls, resource)  # type: ignore[no-any-return]
        parsed = urlparse(self.uri)
        request = iam_request_cls(
            account_id=self.current_account, method=self.method,
            path=self.raw_path + (f"?{parsed.query}" if parsed.query else ""), data=self.data,
            body=self.raw_body, headers=self.headers, action=self._get_action(),
        )  # fmt: skip
        if request._action.partition(":")[0] in ROLE_JUDGED_SERVICES:
            request.check_signature()
            request.check_action_permitted(resource)
        return None

    ActionAuthenticatorMixin._authenticate_and_authorize_action = authenticate_and_authorize  # type: ignore[method-assign]
