"""Properties of the synthesized JSON, construct by construct, and props validation."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import data_sources, load_stack, resources

from spotrain.constructs.catalog_table import CatalogTableProps, SecondaryIndex
from spotrain.constructs.encrypted_bucket import EncryptedBucketProps
from spotrain.constructs.encryption_key import EncryptionKeyProps
from spotrain.constructs.replicated_buckets import RegionalBucket, ReplicatedBucketsProps
from spotrain.core.errors import ConfigError, TerraformError
from spotrain.core.handler_settings import RUNS_PARAMETER_PATH_VARIABLE, HandlerSettings
from spotrain.core.image_reference import REGISTRY_PULL_ACTIONS
from spotrain.stacks.base import LOCAL_MAX_RETRIES

ACCOUNT = "123456789012"
"""The local cloud's account (moto's default)."""


def only(mapping: dict[str, Any]) -> Any:
    assert len(mapping) == 1, list(mapping)
    return next(iter(mapping.values()))


def at_home(mapping: dict[str, Any]) -> dict[str, Any]:
    """The resources of `mapping` in the environment's home region (the stack's default
    provider); a run's stack has its fleet in every region."""
    return {k: v for k, v in mapping.items() if v.get("provider", "aws") == "aws"}


def elsewhere(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if v.get("provider", "aws") != "aws"}


def statements(stack: dict[str, Any], reference: str) -> list[dict[str, Any]]:
    name = reference.split(".")[2]
    return data_sources(stack, "aws_iam_policy_document")[name]["statement"]


# --- storage --------------------------------------------------------------------------------
def test_real_environments_replicate_each_way_with_time_control_and_reencryption(
    synth_dir: Path,
) -> None:
    """Each region's bucket replicates to the other's, under the destination's key, each
    source through its own role and provider."""
    stack = load_stack(synth_dir, "dev-storage")
    buckets = resources(stack, "aws_s3_bucket")
    by_name = {f"${{aws_s3_bucket.{name}.arn}}": b["bucket"] for name, b in buckets.items()}
    key_of = {f"${{aws_kms_key.{name}.arn}}": name for name in resources(stack, "aws_kms_key")}
    routes = {}
    for replication in resources(stack, "aws_s3_bucket_replication_configuration").values():
        (rule,) = replication["rule"]
        destination = rule["destination"]
        assert destination["replication_time"] == {"status": "Enabled", "time": {"minutes": 15}}
        assert rule["source_selection_criteria"]["sse_kms_encrypted_objects"]["status"] == (
            "Enabled"
        )
        assert "lifecycle" not in replication  # no drift tolerance outside the local cloud
        source = by_name[replication["bucket"].replace(".id}", ".arn}")]
        routes[source] = (
            replication["provider"],
            by_name[destination["bucket"]],
            key_of[destination["encryption_configuration"]["replica_kms_key_id"]].split("_")[0],
        )
    assert routes == {
        "example-spotrain-dev-checkpoints-us-east-1": (
            "aws", "example-spotrain-dev-checkpoints-us-west-2", "ReplicaKey"),
        "example-spotrain-dev-checkpoints-us-west-2": (
            "aws.replica", "example-spotrain-dev-checkpoints-us-east-1", "PrimaryKey"),
    }  # fmt: skip


def test_local_cloud_tolerates_replication_drift_and_skips_time_control(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "local-storage")
    for replication in resources(stack, "aws_s3_bucket_replication_configuration").values():
        assert replication["lifecycle"] == {"ignore_changes": ["rule"]}
        assert "replication_time" not in replication["rule"][0]["destination"]


def test_every_region_has_its_bucket_key_and_network_under_its_own_provider(
    synth_dir: Path,
) -> None:
    stack = load_stack(synth_dir, "prod-storage")
    providers = {p.get("alias", "default"): p["region"] for p in stack["provider"]["aws"]}
    assert providers == {"default": "us-east-1", "replica": "us-west-2"}
    buckets = resources(stack, "aws_s3_bucket")
    replica = next(b for name, b in buckets.items() if "ReplicaBucket" in name)
    assert replica["bucket"] == "example-spotrain-prod-checkpoints-us-west-2"
    assert replica["provider"] == "aws.replica"
    assert replica["force_destroy"] is False
    for region in ("us-east-1", "us-west-2"):
        network = load_stack(synth_dir, "prod-network" + ("" if region == "us-east-1" else
                                                          f"-{region}"))  # fmt: skip
        [provider] = network["provider"]["aws"]
        assert (provider["region"], "alias" in provider) == (region, False)
        [vpc] = resources(network, "aws_vpc").values()
        assert vpc["cidr_block"] == ("10.40.0.0/16" if region == "us-east-1" else "10.41.0.0/16")
        zones = {s["availability_zone"] for s in resources(network, "aws_subnet").values()}
        assert zones == {f"{region}{z}" for z in "abcd"}


def test_the_image_registry_is_encrypted_immutable_and_scans_every_push(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "dev-storage")
    [(_, repository)] = at_home(resources(stack, "aws_ecr_repository")).items()
    # Each other region has its own (`spotrain image build` pushes to each), under its key.
    [(_, there)] = elsewhere(resources(stack, "aws_ecr_repository")).items()
    assert (there["name"], there["provider"]) == ("spotrain-dev/trainer", "aws.replica")
    assert there["encryption_configuration"][0]["kms_key"].startswith("${aws_kms_key.ReplicaKey")
    assert repository["name"] == "spotrain-dev/trainer"
    assert repository["image_tag_mutability"] == "IMMUTABLE"
    assert repository["image_scanning_configuration"] == {"scan_on_push": True}
    [encryption] = repository["encryption_configuration"]
    assert encryption["encryption_type"] == "KMS"
    assert encryption["kms_key"].startswith("${aws_kms_key.PrimaryKey")
    assert repository["force_delete"] is False
    [(_, lifecycle)] = at_home(resources(stack, "aws_ecr_lifecycle_policy")).items()
    [rule] = json.loads(lifecycle["policy"])["rules"]
    assert (rule["selection"]["tagStatus"], rule["action"]["type"]) == ("untagged", "expire")
    assert stack["output"]["image_repository"]["value"].startswith("${aws_ecr_repository.")


def test_checkpoint_bucket_policy_refuses_puts_without_its_kms_key(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "dev-storage")
    policy = next(
        p for name, p in resources(stack, "aws_s3_bucket_policy").items() if "Checkpoints" in name
    )
    sids = {s["sid"]: s for s in statements(stack, policy["policy"])}
    assert set(sids) == {"DenyInsecureTransport", "DenyPutWithoutSseKms", "DenyPutWithOtherKey",
                         "DenyOverwritableWrites"}  # fmt: skip
    assert sids["DenyPutWithoutSseKms"]["condition"][0]["values"] == ["aws:kms"]
    write_once = sids["DenyOverwritableWrites"]
    assert [r.rsplit("}", 1)[-1] for r in write_once["resources"]] == ["/runs/*"]
    assert {(c["test"], c["variable"], *c["values"]) for c in write_once["condition"]} == {
        ("Null", "s3:if-none-match", "true"), ("Bool", "s3:ObjectCreationOperation", "true"),
    }  # fmt: skip


def test_lifecycle_aborts_multipart_uploads_and_expires_old_versions(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "dev-storage")
    for lifecycle in resources(stack, "aws_s3_bucket_lifecycle_configuration").values():
        rules = {r["id"]: r for r in lifecycle["rule"]}
        abort = rules["abort-incomplete-multipart-uploads"]["abort_incomplete_multipart_upload"]
        assert abort == [{"days_after_initiation": 2}]
        expire = rules["expire-noncurrent-versions"]["noncurrent_version_expiration"]
        assert expire == [{"noncurrent_days": 30}]


def test_each_replication_role_reads_only_its_source_and_writes_only_replicas(
    synth_dir: Path,
) -> None:
    stack = load_stack(synth_dir, "dev-storage")
    buckets = {f"${{aws_s3_bucket.{name}.arn}}": b["bucket"].rsplit("-", 3)[-3:]
               for name, b in resources(stack, "aws_s3_bucket").items()}  # fmt: skip
    seen = {}
    for policy in resources(stack, "aws_iam_role_policy").values():
        by_sid = {s["sid"]: s for s in statements(stack, policy["policy"])}
        [read] = by_sid["ReadSourceVersions"]["resources"]
        [written] = by_sid["WriteReplicas"]["resources"]
        source, destination = ("-".join(buckets[arn.removesuffix("/*")]) for arn in (read, written))
        [decrypt_via] = by_sid["DecryptSourceObjects"]["condition"][0]["values"]
        [encrypt_via] = by_sid["EncryptReplicas"]["condition"][0]["values"]
        assert (decrypt_via, encrypt_via) == (f"s3.{source}.amazonaws.com",
                                              f"s3.{destination}.amazonaws.com")  # fmt: skip
        seen[source] = destination
    assert seen == {"us-east-1": "us-west-2", "us-west-2": "us-east-1"}


# --- catalog --------------------------------------------------------------------------------
@pytest.mark.parametrize("environment", ["prod", "local"])
def test_catalog_tables_are_global_with_encrypted_replicas(
    synth_dir: Path, environment: str
) -> None:
    """The local cloud plays global tables (replicas, lag, last writer wins), so the local
    environment's catalog is global as a real one's; only deletion protection differs."""
    tables = resources(load_stack(synth_dir, f"{environment}-catalog"), "aws_dynamodb_table")
    assert len(tables) == 2
    for table in tables.values():
        assert table["replica"][0]["region_name"] == "us-west-2"
        assert table["replica"][0]["kms_key_arn"]
        assert table["replica"][0]["point_in_time_recovery"] is True
        assert table["deletion_protection_enabled"] is (environment != "local")
        assert table["stream_view_type"] == "NEW_AND_OLD_IMAGES"


def test_catalog_key_design(synth_dir: Path) -> None:
    tables = {
        t["name"]: t
        for t in resources(load_stack(synth_dir, "dev-catalog"), "aws_dynamodb_table").values()
    }
    checkpoints, events = tables["spotrain-dev-checkpoints"], tables["spotrain-dev-events"]
    assert (checkpoints["hash_key"], checkpoints["range_key"]) == ("pk", "sk")
    assert checkpoints["global_secondary_index"] == [
        {"hash_key": "parent", "name": "lineage", "projection_type": "ALL", "range_key": "sk"}
    ]
    assert events["ttl"] == {"attribute_name": "expires_at", "enabled": True}
    assert events["global_secondary_index"][0]["name"] == "by-pool"


# --- a run's fleet --------------------------------------------------------------------------------
def test_fleet_is_spot_with_an_on_demand_coordinator_over_several_types(synth_dir: Path) -> None:
    groups = resources(load_stack(synth_dir, "prod-run-gpt-large"), "aws_autoscaling_group")
    group = next(g for g in groups.values() if g["name"] == "spotrain-prod-gpt-large-fleet")
    assert group["capacity_rebalance"] is True
    # Deployed empty (a run pays only while it trains); the handler owns its sizes after.
    assert (group["min_size"], group["desired_capacity"], group["max_size"]) == (0, 0, 4)
    assert group["lifecycle"] == {"ignore_changes": ["desired_capacity", "min_size"]}
    distribution = group["mixed_instances_policy"]["instances_distribution"]
    assert distribution == {
        "on_demand_allocation_strategy": "prioritized",
        "on_demand_base_capacity": 1,
        "on_demand_percentage_above_base_capacity": 0,
        "spot_allocation_strategy": "price-capacity-optimized",
    }
    overrides = group["mixed_instances_policy"]["launch_template"]["override"]
    assert [o["instance_type"] for o in overrides] == ["p5en.48xlarge", "p5e.48xlarge"]
    # A tcp run (dev's) takes every zone of the environment.
    dev = resources(load_stack(synth_dir, "dev-run-gpt-small"), "aws_autoscaling_group")
    assert all(len(g["vpc_zone_identifier"]) == 3 for g in dev.values())
    assert all("placement_group" not in g for g in dev.values())


def test_an_efa_run_attaches_every_interface_its_types_take_in_one_zones_placement_group(
    synth_dir: Path,
) -> None:
    """prod's run (p5en and p5e, 16 and 32 EFA interfaces): each type launches from its own
    template with one EFA interface per network card, the first also the machine's address,
    each in the fleet's security group; both groups keep to the first zone's subnet and one
    cluster placement group there; and the capacity-optimized choice stays across types."""
    from spotrain.core.gpu_types import efa_interfaces

    stack = load_stack(synth_dir, "prod-run-gpt-large")
    templates = at_home(resources(stack, "aws_launch_template"))
    by_name = {t["name"]: (n, t) for n, t in templates.items()}
    assert sorted(by_name) == ["spotrain-prod-gpt-large-fleet",
                               "spotrain-prod-gpt-large-fleet-p5e-48xlarge"]  # fmt: skip
    # The fleet in the other region is the same, named for its region (roles are global).
    assert sorted(t["name"] for t in elsewhere(resources(stack, "aws_launch_template")).values()
                  ) == ["spotrain-prod-gpt-large-fleet-us-west-2",
                        "spotrain-prod-gpt-large-fleet-us-west-2-p5e-48xlarge"]  # fmt: skip
    groups = at_home(resources(stack, "aws_autoscaling_group"))
    [placement] = at_home(resources(stack, "aws_placement_group")).values()
    assert placement["strategy"] == "cluster"
    for group in groups.values():
        assert len(group["vpc_zone_identifier"]) == 1
        assert "PrivateSubnet0" in group["vpc_zone_identifier"][0]  # the environment's first zone
        assert group["placement_group"].startswith("${aws_placement_group.")
        overrides = group["mixed_instances_policy"]["launch_template"]["override"]
        for override, name in zip(overrides, sorted(by_name), strict=True):
            key, template = by_name[name]
            spec = override["launch_template_specification"]["launch_template_id"]
            assert spec == f"${{aws_launch_template.{key}.id}}"
            interfaces = template["network_interfaces"]
            assert len(interfaces) == efa_interfaces(override["instance_type"])
            assert [(i["network_card_index"], i["device_index"], i["interface_type"])
                    for i in interfaces[:2]] == [(0, 0, "efa"), (1, 1, "efa-only")]  # fmt: skip
            assert all(i["security_groups"] == [interfaces[0]["security_groups"][0]]
                       and i["associate_public_ip_address"] == "false"
                       for i in interfaces)  # fmt: skip
            assert "vpc_security_group_ids" not in template  # they are on the interfaces


def test_on_demand_fallback_group_starts_empty_with_the_same_template(synth_dir: Path) -> None:
    groups = resources(load_stack(synth_dir, "prod-run-gpt-large"), "aws_autoscaling_group")
    spot = next(g for g in groups.values() if g["name"] == "spotrain-prod-gpt-large-fleet")
    fallback = next(g for g in groups.values() if g["name"].endswith("-fleet-on-demand"))
    assert (fallback["min_size"], fallback["desired_capacity"]) == (0, 0)
    assert fallback["max_size"] == spot["max_size"]
    distribution = fallback["mixed_instances_policy"]["instances_distribution"]
    assert distribution["on_demand_percentage_above_base_capacity"] == 100
    assert (
        fallback["mixed_instances_policy"]["launch_template"]
        == spot["mixed_instances_policy"]["launch_template"]
    )
    assert fallback["lifecycle"] == {"ignore_changes": ["desired_capacity", "min_size"]}


def test_launch_template_image_comes_from_the_image_parameter(synth_dir: Path) -> None:
    """Each region's fleet boots the image its region's parameter names (machine images are
    regional: the bake copies it to every region and writes each parameter)."""
    stack = load_stack(synth_dir, "dev-run-gpt-small")
    parameters = data_sources(stack, "aws_ssm_parameter")
    templates = resources(stack, "aws_launch_template")
    assert len(parameters) == len(templates) == 2
    for name, parameter in parameters.items():
        assert parameter["name"] == "/spotrain/dev/image-id"
        [template] = [t for t in templates.values()
                      if t.get("provider", "aws") == parameter.get("provider", "aws")]  # fmt: skip
        assert template["image_id"] == f"${{data.aws_ssm_parameter.{name}.insecure_value}}"
        assert "lifecycle" not in template


def test_no_stack_carries_an_unresolved_token(synth_dir: Path) -> None:
    """A value Python built from a token (encoding it, say) would reach Terraform as the
    token's placeholder text: every machine would boot with `${TfToken[...]}` settings."""
    for stack in sorted((synth_dir / "stacks").iterdir()):
        assert "TfToken[" not in (stack / "cdk.tf.json").read_text(), stack.name


def test_launch_template_user_data_is_encoded_by_terraform_from_deployed_names(
    synth_dir: Path,
) -> None:
    for env, run in (("local", "demo"), ("local", "second"), ("dev", "gpt-small"),
                     ("prod", "gpt-large")):  # fmt: skip
        for template in resources(
            load_stack(synth_dir, f"{env}-run-{run}"), "aws_launch_template"
        ).values():
            user_data = template["user_data"]
            assert user_data.startswith("${base64encode(format(")
            # Each region's machines: that region's bucket and key.
            label = "Primary" if template.get("provider", "aws") == "aws" else "Replica"
            for reference in (
                f"aws_s3_bucketCheckpoints_{label}Bucket",
                f"aws_kms_key{label}Key",
                "aws_dynamodb_tableCheckpoint",
                "aws_dynamodb_tableInterruptionEvents",
            ):
                assert reference in user_data, (env, reference)


def test_instance_role_is_scoped_to_the_run(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "dev-run-gpt-small")
    policy = next(
        p for name, p in resources(stack, "aws_iam_role_policy").items() if "RunScoped" in name
    )
    by_sid = {s["sid"]: s for s in statements(stack, policy["policy"])}
    assert all(
        r.endswith("/runs/gpt-small/*") for r in by_sid["ReadWriteRunCheckpoints"]["resources"]
    )
    leading_keys = by_sid["RunCatalogItems"]["condition"][0]
    assert leading_keys["variable"] == "dynamodb:LeadingKeys"
    assert leading_keys["values"] == ["RUN#gpt-small"]
    # S3 and DynamoDB grants hold only through the VPC's own endpoints: stolen credentials
    # are of no use outside it. (The endpoints are the network stack's, read from its state.)
    for sid, grant in by_sid.items():
        vpce = [c for c in grant.get("condition", []) if c["variable"] == "aws:SourceVpce"]
        if any(a.startswith(("s3:", "dynamodb:")) for a in grant["actions"]):
            [(test, values)] = [(c["test"], c["values"]) for c in vpce]
            assert test == "StringEquals" and len(values) == 2, sid
            assert {("S3GatewayEndpoint" in v, "DynamodbGatewayEndpoint" in v)
                    for v in values} == {(True, False), (False, True)}, sid  # fmt: skip
            assert all(v.startswith("${data.terraform_remote_state.") for v in values)
        elif sid in ("ReplaceItself", "ShipMachineLogs", "SessionManagerAgent"):
            # Other APIs only through the environment's interface endpoints.
            [used] = [c["values"] for c in vpce]
            assert used and all("Endpoint" in v and "Gateway" not in v for v in used), sid
        else:
            assert vpce == [], sid
    # Machines never delete: published history is removed only by operator commands.
    granted = {a for s in by_sid.values() for a in s["actions"]}
    deletes = {a for a in granted if "Delete" in a}
    assert deletes == {"ec2messages:DeleteMessage"}, granted  # Session Manager's own queue
    # Crash records only added, releases only read: a machine cannot release its own run.
    writes: dict[str, set[str]] = {"dynamodb:PutItem": set(), "dynamodb:UpdateItem": set()}
    for grant in by_sid.values():
        keys = [c["values"] for c in grant.get("condition", [])
                if c["variable"] == "dynamodb:LeadingKeys"]  # fmt: skip
        for action in set(writes) & set(grant["actions"]):
            writes[action].update(*keys)
    assert not any(
        key.startswith(("RELEASES#", "SPEND#", "CAPS#", "LIFECYCLE#", "DEADLINE_PLAN#", "HANDLER#"))
        for keys in writes.values()
        for key in keys
    ), writes  # nor its spend ledger, cap, lifecycle, deadline plan or the handler's state of it
    reading = by_sid["ReadRunSpendLifecycleAndState"]
    assert reading["actions"] == ["dynamodb:GetItem"]
    [leading] = [c for c in reading["condition"] if c["variable"] == "dynamodb:LeadingKeys"]
    assert leading["values"] == ["SPEND#gpt-small", "LIFECYCLE#gpt-small", "HANDLER#gpt-small"]
    assert writes["dynamodb:PutItem"] == {"RUN#gpt-small", "CRASHES#gpt-small"}
    assert "CRASHES#gpt-small" not in writes["dynamodb:UpdateItem"]
    # The data keys only through S3 and DynamoDB: a stolen credential cannot call KMS.
    [via] = by_sid["UseDataKeys"]["condition"]
    assert (via["test"], via["variable"]) == ("StringLike", "kms:ViaService")
    assert via["values"] == ["s3.*.amazonaws.com", "dynamodb.*.amazonaws.com"]


def test_the_fleets_reach_the_auto_scaling_api_only_to_report_their_own_health(
    synth_dir: Path,
) -> None:
    """Machines have no route to AWS APIs but S3 and DynamoDB: the environment's interface
    endpoints (one per service, shared by its runs) let a machine that cannot train tell its
    group, send its output to its run's log group, and on-call reach it with Session Manager;
    nothing else, and for the environment's fleets only."""
    stack = load_stack(synth_dir, "dev-network")
    interfaces = {e["service_name"].removeprefix("com.amazonaws.us-east-1."): e
                  for e in resources(stack, "aws_vpc_endpoint").values()
                  if e["vpc_endpoint_type"] == "Interface"}  # fmt: skip
    assert set(interfaces) == {"autoscaling", "logs", "ssm", "ssmmessages", "ec2messages",
                               "ecr.api", "ecr.dkr"}  # fmt: skip
    for endpoint in interfaces.values():
        assert endpoint["private_dns_enabled"] is True
        [group] = endpoint["security_group_ids"]
        assert group.startswith("${aws_security_group.Network_EndpointSecurityGroup")
    [endpoint_group] = resources(stack, "aws_security_group").values()
    assert endpoint_group["egress"] == []
    assert [(r["from_port"], r["to_port"], r["cidr_blocks"]) for r in endpoint_group["ingress"]
            ] == [(443, 443, ["10.40.0.0/16"])]  # fmt: skip
    [logs] = statements(stack, interfaces["logs"]["policy"])
    assert logs["actions"] == ["logs:CreateLogStream", "logs:PutLogEvents"]
    [streams] = logs["resources"]
    assert streams.endswith(":log-group:/spotrain/spotrain-dev-*:log-stream:*"), streams
    endpoint = interfaces["autoscaling"]
    [grant] = statements(stack, endpoint["policy"])
    assert grant["actions"] == ["autoscaling:SetInstanceHealth"]
    [groups] = grant["resources"]
    assert groups.endswith(":autoScalingGroup:*:autoScalingGroupName/spotrain-dev-*"), groups
    assert grant["condition"][0]["variable"] == "aws:PrincipalAccount"
    # The registry: logging in, and pulling the environment's own images only.
    [pulls] = statements(stack, interfaces["ecr.dkr"]["policy"])
    assert pulls["actions"] == list(REGISTRY_PULL_ACTIONS)
    [repository] = pulls["resources"]
    assert repository.startswith("arn:aws:ecr:us-east-1:")
    assert repository.endswith(":repository/spotrain-dev/trainer")
    [login] = statements(stack, interfaces["ecr.api"]["policy"])
    assert (login["actions"], login["resources"]) == (["ecr:GetAuthorizationToken"], ["*"])
    # A run's fleet reaches them over HTTPS, and its own members on every port: never
    # another run's machines.
    fleet = only(at_home(resources(load_stack(synth_dir, "dev-run-gpt-small"),
                                   "aws_security_group")))  # fmt: skip
    assert [r["self"] for r in fleet["ingress"]] == [True]
    to_endpoints = [r for r in fleet["egress"] if r.get("security_groups")]
    [(port, [target])] = [(r["from_port"], r["security_groups"]) for r in to_endpoints]
    assert port == 443 and "EndpointSecurityGroup" in target


def test_the_estimate_counts_the_interface_endpoints_every_region_deploys(
    synth_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The standing cost in each pull request's estimate counts what the networks are:
    each region's interface endpoints, one per service, billed in every zone it serves."""
    from spotrain import cli
    from spotrain.core import standing_cost

    assert cli.main(["cost", "estimate", "prod", "--json"]) == 0
    standing = {r["region"]: r for r in json.loads(capsys.readouterr().out)["standing"]}
    for region, stack in (("us-east-1", "prod-network"), ("us-west-2", "prod-network-us-west-2")):
        network = load_stack(synth_dir, stack)
        interfaces = [e for e in resources(network, "aws_vpc_endpoint").values()
                      if e["vpc_endpoint_type"] == "Interface"]  # fmt: skip
        zones = {len(e["subnet_ids"]) for e in interfaces}
        assert len(zones) == 1
        assert standing[region]["interface_endpoints"] == len(interfaces) * zones.pop()
        assert standing[region]["usd_per_hour"] == pytest.approx(
            standing[region]["interface_endpoints"] * standing_cost.ENDPOINT_USD_PER_ZONE_HOUR
            + standing_cost.KMS_KEY_USD_PER_MONTH / standing_cost.HOURS_PER_MONTH,
            abs=1e-4,
        )
    assert [r["home"] for r in standing.values()] == [True, False]


def test_the_vpc_endpoints_reach_only_the_environments_buckets_and_tables(
    synth_dir: Path,
) -> None:
    stack = load_stack(synth_dir, "dev-network")
    reachable = {}
    gateways = {
        n: e for n, e in resources(stack, "aws_vpc_endpoint").items()
        if e["vpc_endpoint_type"] == "Gateway"
    }  # fmt: skip
    for name, endpoint in gateways.items():
        grant, *layers = statements(stack, endpoint["policy"])
        reachable[endpoint["service_name"].rsplit(".", 1)[1]] = grant
        if layers:  # the registry's layers of a pull it signed, from AWS's own bucket
            [layer] = layers
            assert "S3Gateway" in name and layer["actions"] == ["s3:GetObject"]
            assert layer["resources"] == ["arn:aws:s3:::prod-us-east-1-starport-layer-bucket/*"]
        assert grant["principals"] == [{"type": "AWS", "identifiers": ["*"]}], name
        [account] = grant["condition"]  # principals of this account only
        assert account["variable"] == "aws:PrincipalAccount"
    assert sorted(reachable) == ["dynamodb", "s3"]
    s3 = reachable["s3"]
    assert s3["actions"] == ["s3:*"] and len(s3["resources"]) == 2
    assert s3["resources"][1] == s3["resources"][0] + "/*"  # one bucket, the primary's
    tables = reachable["dynamodb"]["resources"]
    assert len(tables) == 4 and all("*" not in t or t.endswith("/index/*") for t in tables)


def test_handler_role_touches_only_its_environments_runs_its_tag_and_its_services_keys(
    synth_dir: Path,
) -> None:
    stack = load_stack(synth_dir, "dev-interruptions")
    policy = only(
        {n: p for n, p in resources(stack, "aws_iam_role_policy").items() if "Handler" in n}
    )
    by_sid = {s["sid"]: s for s in statements(stack, policy["policy"])}
    [leading] = by_sid["RecordEventsAndFleetState"]["condition"]
    assert (leading["test"], leading["variable"]) == (
        "ForAllValues:StringLike", "dynamodb:LeadingKeys",
    )  # fmt: skip
    # Every run of the environment (its tables are its own), never a machine's crash records
    # or an operator's releases and caps.
    assert leading["values"] == [
        "EVENT#*", "RUN#*", "HANDLER#*", "SPEND#*", "LIFECYCLE#*", "FOREIGN#events",
    ]  # fmt: skip
    # Whether a run's configuration is stored (it then starts): run prefixes, listing only.
    listing = by_sid["ListRunConfiguration"]
    assert listing["actions"] == ["s3:ListBucket"]
    [prefix] = listing["condition"]
    assert (prefix["variable"], prefix["values"]) == ("s3:prefix", ["runs/*/config/*"])
    # And whether its final step is published (it then stops): the runs' catalog items only.
    [catalog] = by_sid["ReadRunProgress"]["condition"]
    assert catalog["values"] == ["RUN#*"]
    [releases] = by_sid["ReadRunCrashesAndReleases"]["condition"]
    assert releases["values"] == ["CRASHES#*", "RELEASES#*", "CAPS#*"]
    # The runs' deadline plans: reading only, operators store them.
    plans = by_sid["ReadRunDeadlinePlans"]
    assert plans["actions"] == ["dynamodb:GetItem"]
    assert [c["values"] for c in plans["condition"]] == [["DEADLINE_PLAN#*"]]
    # The runs declare themselves under the environment's path; the handler reads only that.
    declarations = by_sid["ReadRunDeclarations"]
    assert declarations["actions"] == ["ssm:GetParametersByPath"]
    [path] = declarations["resources"]
    assert path.endswith(":parameter/spotrain/dev/runs")
    # It scales and tags only what carries its environment's tag, named as its fleets are.
    scaling = by_sid["ScaleTheRunsGroups"]
    [groups] = scaling["resources"]
    assert groups.endswith(":autoScalingGroup:*:autoScalingGroupName/spotrain-dev-*")
    [tagged] = scaling["condition"]
    assert (tagged["variable"], tagged["values"]) == ("aws:ResourceTag/spotrain:environment",
                                                      ["dev"])  # fmt: skip
    pricing = by_sid["PriceTheRunsMachines"]
    assert pricing["actions"] == ["ec2:DescribeSpotPriceHistory", "pricing:GetProducts"]
    [namespace] = by_sid["PublishTheRunsSpend"]["condition"]
    assert (namespace["variable"], namespace["values"]) == ("cloudwatch:namespace", ["spotrain"])
    assert all("/index/" not in r for r in by_sid["RecordEventsAndFleetState"]["resources"])
    assert by_sid["CountInterruptionsByPool"]["actions"] == ["dynamodb:Query"]
    tagging = {c["variable"]: c for c in by_sid["TagTheRunsInstances"]["condition"]}
    assert tagging["aws:TagKeys"]["test"] == "ForAllValues:StringEquals"
    assert tagging["aws:TagKeys"]["values"] == ["spotrain:interruption"]
    assert tagging["aws:ResourceTag/spotrain:environment"]["values"] == ["dev"]
    [via] = by_sid["UseKey"]["condition"]
    assert via["variable"] == "kms:ViaService"
    assert sorted(via["values"]) == sorted(
        f"{s}.*.amazonaws.com" for s in ("dynamodb", "sqs", "sns", "lambda", "ssm")
    )


# --- budget ---------------------------------------------------------------------------------
def test_budget_alerts_at_50_80_100_actual_and_100_forecast(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "prod-budget")
    budget = only(resources(stack, "aws_budgets_budget"))
    found = sorted((n["notification_type"], n["threshold"]) for n in budget["notification"])
    assert found == [("ACTUAL", 50), ("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)]
    for notification in budget["notification"]:
        assert notification["subscriber_email_addresses"] == [
            "ml-platform-oncall@example.com",
            "finops@example.com",
        ]
    assert budget["limit_amount"] == "50000.00"
    assert budget["cost_filter"] == [
        {"name": "TagKeyValue", "values": ["user:spotrain:environment$prod"]}
    ]


def test_every_provider_tags_resources_for_cost_allocation(synth_dir: Path) -> None:
    for stack_dir in (synth_dir / "stacks").iterdir():
        stack = load_stack(synth_dir, stack_dir.name)
        for provider in stack["provider"]["aws"]:
            tags = provider["default_tags"][0]["tags"]
            assert tags["spotrain:environment"] == stack_dir.name.split("-")[0]


def test_the_local_provider_names_no_endpoint_and_accepts_the_local_account_alone(
    synth_dir: Path,
) -> None:
    for stack_dir in (synth_dir / "stacks").iterdir():
        for provider in load_stack(synth_dir, stack_dir.name)["provider"]["aws"]:
            assert "endpoints" not in provider, stack_dir.name  # each start would pay for it
            local = stack_dir.name.startswith("local-")
            assert provider.get("allowed_account_ids") == ([ACCOUNT] if local else None)
            assert provider.get("max_retries") == (LOCAL_MAX_RETRIES if local else None)


@pytest.mark.integration
def test_a_local_stack_reaches_the_local_cloud_by_its_environment_and_refuses_another_account(
    synth_dir: Path, local_cloud: Any, tmp_path: Path
) -> None:
    """The local stacks' provider finds the local cloud by AWS_ENDPOINT_URL (`spotrain deploy`
    and `spotrain local env` set it). Run with another account's credentials, as a shell
    holding a real account's would run it without that environment, it stops before it reads
    or changes anything."""
    from spotrain.localcloud import control
    from spotrain.tools import terraform

    [provider] = load_stack(synth_dir, "local-budget")["provider"]["aws"]
    folder = tmp_path / "stack"
    folder.mkdir()
    (folder / "main.tf.json").write_text(json.dumps({
        "provider": {"aws": [provider]},
        "data": {"aws_caller_identity": {"Caller": {}}},
        "output": {"account": {"value": "${data.aws_caller_identity.Caller.account_id}"}},
    }))  # fmt: skip
    environment = control.aws_environment(local_cloud.endpoint, "us-east-1")
    env = terraform.terraform_env(terraform.write_cli_config(tmp_path), environment)
    terraform.run(folder, ["init", "-input=false", "-no-color"], env, capture=True)
    plan = ["plan", "-input=false", "-no-color"]
    assert f'account = "{ACCOUNT}"' in terraform.run(folder, plan, env, capture=True).stdout
    other = control.client("sts", local_cloud.endpoint, "us-east-1").assume_role(
        RoleArn="arn:aws:iam::210987654321:role/someone", RoleSessionName="elsewhere"
    )["Credentials"]
    env |= {"AWS_ACCESS_KEY_ID": other["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": other["SecretAccessKey"],
            "AWS_SESSION_TOKEN": other["SessionToken"]}  # fmt: skip
    with pytest.raises(TerraformError, match="AWS account ID not allowed: 210987654321"):
        terraform.run(folder, plan, env, capture=True)


def test_state_backend_is_s3_with_native_locking(synth_dir: Path) -> None:
    backend = load_stack(synth_dir, "prod-run-gpt-large")["terraform"]["backend"]["s3"]
    assert backend["key"] == "spotrain/prod-run-gpt-large.tfstate"
    assert backend["use_lockfile"] is True
    assert backend["encrypt"] is True


# --- interruptions --------------------------------------------------------------------------
def test_rules_match_the_two_ec2_events_and_retry_into_a_dead_letter_queue(synth_dir: Path) -> None:
    stack = load_stack(synth_dir, "dev-interruptions")
    rules = resources(stack, "aws_cloudwatch_event_rule").values()
    patterns = sorted(
        json.loads(r["event_pattern"])["detail-type"][0] for r in rules if "event_pattern" in r
    )
    assert patterns == [
        "EC2 Instance Rebalance Recommendation",
        "EC2 Spot Instance Interruption Warning",
    ]
    assert [r["schedule_expression"] for r in rules if "schedule_expression" in r] == [
        "rate(5 minutes)"
    ]
    for target in resources(stack, "aws_cloudwatch_event_target").values():
        assert target["retry_policy"]["maximum_retry_attempts"] == 8
        assert target["dead_letter_config"]["arn"].startswith("${aws_sqs_queue.")
    function = only(resources(stack, "aws_lambda_function"))
    assert function["dead_letter_config"]["target_arn"].startswith("${aws_sqs_queue.")
    assert function["tracing_config"] == {"mode": "Active"}
    assert "lifecycle" not in function
    # EventBridge may put the rules' undelivered events on the queue, nothing else may send to
    # it, and only over TLS: the queue's own policy (a separate queue policy resource made
    # every deploy and destroy wait for the queue's attributes to settle twice).
    queue = only(resources(stack, "aws_sqs_queue"))
    assert "aws_sqs_queue_policy" not in stack["resource"]
    document = queue["policy"].removeprefix("${data.aws_iam_policy_document.").split(".")[0]
    allowed, denied = stack["data"]["aws_iam_policy_document"][document]["statement"]
    arn = "arn:aws:sqs:us-east-1:${data.aws_caller_identity.Caller.account_id}:" + queue["name"]
    assert allowed["principals"] == [{"identifiers": ["events.amazonaws.com"], "type": "Service"}]
    assert (allowed["actions"], allowed["resources"]) == (["sqs:SendMessage"], [arn])
    [(_, sources)] = [(c["variable"], c["values"]) for c in allowed["condition"]]
    assert sorted(sources) == sorted(
        f"${{aws_cloudwatch_event_rule.{name}.arn}}"
        for name in resources(stack, "aws_cloudwatch_event_rule")
    )
    assert (denied["effect"], denied["resources"]) == ("Deny", [arn])


def _upgrade_configurations(stack: dict[str, Any], endpoint: str) -> tuple[dict, dict, str]:
    """The handler stack's dead-letter queue as deployed before (a separate queue policy
    resource, imported) and now (its own policy, the stack's removed block), its other
    resources' references made literal; and the queue's name."""
    [(queue_id, queue)] = resources(stack, "aws_sqs_queue").items()
    document_id = queue["policy"].removeprefix("${data.aws_iam_policy_document.").split(".")[0]
    document = json.dumps(stack["data"]["aws_iam_policy_document"][document_id])
    for rule_id, rule in resources(stack, "aws_cloudwatch_event_rule").items():
        document = document.replace(
            f"${{aws_cloudwatch_event_rule.{rule_id}.arn}}",
            f"arn:aws:events:us-east-1:{ACCOUNT}:rule/{rule['name']}",
        )
    # The endpoint comes from the environment (AWS_ENDPOINT_URL), as for the stacks.
    provider = {
        "region": "us-east-1",
        "skip_credentials_validation": True,
        "skip_requesting_account_id": True,
        "skip_metadata_api_check": "true",
    }
    kept = {k: v for k, v in queue.items() if k not in ("//", "kms_master_key_id", "policy")}
    url = f"{endpoint}/{ACCOUNT}/{queue['name']}"
    [removed] = stack["removed"]
    policy_id = removed["from"].split(".")[1]
    common = {
        "provider": {"aws": [provider]},
        "data": {"aws_caller_identity": {"Caller": {}},
                 "aws_iam_policy_document": {document_id: json.loads(document)}},
    }  # fmt: skip
    before = {
        **common,
        "resource": {
            "aws_sqs_queue": {queue_id: kept},
            "aws_sqs_queue_policy": {
                policy_id: {
                    "queue_url": f"${{aws_sqs_queue.{queue_id}.url}}",
                    "policy": queue["policy"],
                }
            },
        },
        "import": [
            {"to": f"aws_sqs_queue.{queue_id}", "id": url},
            {"to": removed["from"], "id": url},
        ],
    }
    after = {
        **common,
        "resource": {"aws_sqs_queue": {queue_id: {**kept, "policy": queue["policy"]}}},
        "removed": stack["removed"],
    }
    return before, after, queue["name"]


@pytest.mark.integration
def test_an_environment_deployed_with_a_separate_queue_policy_keeps_it_on_upgrade(
    synth_dir: Path, local_cloud: Any, tmp_path: Path
) -> None:
    """Until the dead-letter queue carried its policy itself, a separate queue policy resource
    set it. Without the stack's removed block, the upgrade's apply would not update the queue
    (its policy already matches) and would destroy the policy resource, deleting the policy:
    the queue would take anyone's messages over plain HTTP until a second apply."""
    from spotrain.constructs.policy import policy_json
    from spotrain.localcloud import control
    from spotrain.tools import terraform

    stack = load_stack(synth_dir, "local-interruptions")
    before, after, name = _upgrade_configurations(stack, local_cloud.endpoint)
    environment = control.aws_environment(local_cloud.endpoint, "us-east-1")
    env = terraform.terraform_env(terraform.write_cli_config(tmp_path), environment)
    # The queue as the separate resource left it, made here: the provider waits 26 s after
    # setting a queue's policy, and importing it into the old configuration changes nothing.
    [document] = before["data"]["aws_iam_policy_document"].values()
    statements = document["statement"]
    sqs = control.client("sqs", local_cloud.endpoint, "us-east-1")
    attributes = {"MessageRetentionPeriod": "1209600", "MaximumMessageSize": "262144",
                  "Policy": policy_json(json.loads(json.dumps(statements).replace(
                      "${data.aws_caller_identity.Caller.account_id}", ACCOUNT)))}  # fmt: skip
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    folder = tmp_path / "stack"
    folder.mkdir()
    applies = []
    for configuration in (before, after):
        (folder / "main.tf.json").write_text(json.dumps(configuration))
        if configuration is before:
            terraform.run(folder, ["init", "-input=false"], env, capture=True)
        apply = ["apply", "-auto-approve", "-input=false", "-no-color"]
        applies.append(terraform.run(folder, apply, env, capture=True).stdout)
    assert "Resources: 2 imported, 0 added, 0 changed, 0 destroyed." in applies[0], applies[0]
    assert "Resources: 0 added, 0 changed, 0 destroyed." in applies[1], applies[1]
    assert f"{after['removed'][0]['from']} will no longer be managed by Terraform" in applies[1]
    kept = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {})
    assert "Policy" in kept, "the upgrade deleted the dead-letter queue's policy"
    statements = json.loads(kept["Policy"])["Statement"]
    assert sorted(s["Sid"] for s in statements) == [
        "DenyInsecureTransport",
        "EventBridgeDeadLetters",
    ]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_eventbridge_may_encrypt_the_rules_dead_letters_and_nothing_else(
    synth_dir: Path, env: str
) -> None:
    """The dead-letter queue is encrypted with the primary key: without a grant to
    events.amazonaws.com, scoped to the handler's rules, events that still fail after
    retries are lost."""
    import fnmatch

    storage = load_stack(synth_dir, f"{env}-storage")
    grants = {
        name.split("_")[0]: [
            s for s in statements(storage, key["policy"])
            if s.get("sid") == "EventBridgeDeadLetters"
        ]
        for name, key in resources(storage, "aws_kms_key").items()
    }  # fmt: skip
    assert grants["ReplicaKey"] == []  # the handler and its queue live in the primary region
    [grant] = grants["PrimaryKey"]
    assert grant["principals"] == [{"type": "Service", "identifiers": ["events.amazonaws.com"]}]
    assert sorted(grant["actions"]) == ["kms:Decrypt", "kms:GenerateDataKey"]
    [condition] = grant["condition"]
    assert (condition["test"], condition["variable"]) == ("ArnLike", "aws:SourceArn")
    [pattern] = condition["values"]
    account = "${data.aws_caller_identity.Caller.account_id}"
    interruptions = load_stack(synth_dir, f"{env}-interruptions")
    rules = [r["name"] for r in resources(interruptions, "aws_cloudwatch_event_rule").values()]
    assert len(rules) == 3
    for rule in rules:  # every rule of the handler, by the ARN EventBridge presents
        assert fnmatch.fnmatchcase(f"arn:aws:events:us-east-1:{account}:rule/{rule}", pattern)
    assert not fnmatch.fnmatchcase(f"arn:aws:events:us-east-1:{account}:rule/other", pattern)


def test_every_region_has_its_handler_scaling_and_tagging_only_that_regions_machines(
    synth_dir: Path,
) -> None:
    """EventBridge delivers a machine's warnings in its region, and a region that is down
    cannot act for another: each region has its handler, under its own provider and key,
    with the same function name (Lambda names are regional) and a role of its own (IAM names
    are global), scaling and tagging its region's groups and machines only. Home's alone
    watches the catalog's stream (every region's writes replicate there): one alarm a change."""
    handlers = {
        "us-east-1": load_stack(synth_dir, "dev-interruptions"),
        "us-west-2": load_stack(synth_dir, "dev-interruptions-us-west-2"),
    }
    for region, stack in handlers.items():
        [provider] = stack["provider"]["aws"]
        assert provider["region"] == region
        function = only(resources(stack, "aws_lambda_function"))
        assert function["function_name"] == "spotrain-dev-interruption-handler"
        role = only({n: r for n, r in resources(stack, "aws_iam_role").items() if "Handler" in n})
        assert role["name"] == "spotrain-dev-interruption-handler" + (
            "" if region == "us-east-1" else "-us-west-2")  # fmt: skip
        policy = only(
            {n: p for n, p in resources(stack, "aws_iam_role_policy").items() if "Handler" in n}
        )
        by_sid = {s["sid"]: s for s in statements(stack, policy["policy"])}
        [groups] = by_sid["ScaleTheRunsGroups"]["resources"]
        assert groups.startswith(f"arn:aws:autoscaling:{region}:")
        [instances] = by_sid["TagTheRunsInstances"]["resources"]
        assert instances.startswith(f"arn:aws:ec2:{region}:")
        tables = by_sid["RecordEventsAndFleetState"]["resources"]
        assert all(t.startswith(f"arn:aws:dynamodb:{region}:") for t in tables), tables
        watching = resources(stack, "aws_lambda_event_source_mapping")
        assert len(watching) == (region == "us-east-1"), watching
        assert ("ReadCatalogStream" in by_sid) == (region == "us-east-1")
    assert "ReplicaKey" in only(resources(handlers["us-west-2"], "aws_lambda_function"))[
        "kms_key_arn"]  # fmt: skip


def test_handler_is_told_its_environment_topic_and_queue_and_each_run_declares_itself(
    synth_dir: Path,
) -> None:
    stack = load_stack(synth_dir, "dev-interruptions")
    variables = only(resources(stack, "aws_lambda_function"))["environment"]["variables"]
    environment = variables[HandlerSettings.variable("environment")]
    assert (environment, variables[RUNS_PARAMETER_PATH_VARIABLE]) == ("dev", "/spotrain/dev/runs")
    assert not {"RUN_NAME", "CAPACITY_GROUPS", "MAX_SPEND_USD"} & set(variables)
    run = load_stack(synth_dir, "dev-run-gpt-small")
    # Declared to each region's handler, in that region, under that region's key.
    parameters = resources(run, "aws_ssm_parameter")
    parameter, there = parameters["HandlerDeclaration"], parameters["HandlerDeclarationReplica"]
    assert parameter["name"] == there["name"] == "/spotrain/dev/runs/gpt-small"
    assert parameter["type"] == "SecureString" and "PrimaryKey" in parameter["key_id"]
    assert "provider" not in parameter and there["provider"] == "aws.replica"
    assert "ReplicaKey" in there["key_id"] and there["value"] == parameter["value"]
    declared = json.loads(parameter["value"])
    assert (declared["run"], declared["max_spend_usd"], declared["run_deadline"]) == (
        "gpt-small", 1500.0, None)  # fmt: skip
    # Its groups in every region, each with the run's sizes (used where the run trains: home
    # until it moves), home's holding its data.
    assert [(g["name"], g["lifecycle"], g["region"], g["min_size"], g["desired"],
             g["holds_data"]) for g in declared["groups"]] == [
        ("spotrain-dev-gpt-small-fleet", "spot", "us-east-1", 1, 2, True),
        ("spotrain-dev-gpt-small-fleet-on-demand", "on-demand", "us-east-1", 0, 0, True),
        ("spotrain-dev-gpt-small-fleet-us-west-2", "spot", "us-west-2", 1, 2, False),
        ("spotrain-dev-gpt-small-fleet-us-west-2-on-demand", "on-demand", "us-west-2", 0, 0,
         False),
    ]  # fmt: skip
    assert variables[HandlerSettings.variable("alert_topic_arn")].startswith("${aws_sns_topic.")
    assert variables["DEAD_LETTER_QUEUE_URL"].startswith("${aws_sqs_queue.")
    # Every resource of the run carries the run and its owner: the bill splits by both.
    tags = run["provider"]["aws"][0]["default_tags"][0]["tags"]
    assert (tags["spotrain:run"], tags["spotrain:owner"], tags["cost-center"]) == (
        "gpt-small", "ml-platform@example.com", "research")  # fmt: skip
    [group] = [g for g in resources(run, "aws_autoscaling_group").values()
               if g["name"] == "spotrain-dev-gpt-small-fleet"]  # fmt: skip
    assert {t["key"]: t["value"] for t in group["tag"]}["spotrain:owner"] == (
        "ml-platform@example.com")  # fmt: skip


# --- props validation -----------------------------------------------------------------------
def bucket_props(**changes: Any) -> EncryptedBucketProps:
    base = {"bucket_name": "b-checkpoints", "account_id": "1", "kms_key_arn": "arn:key",
            "access_log_bucket": "logs"}  # fmt: skip
    return EncryptedBucketProps(**{**base, **changes})


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: bucket_props(kms_key_arn=None), "only an access-log bucket may use SSE-S3"),
        (lambda: bucket_props(receives_access_logs=True), "log delivery writes only SSE-S3"),
        (lambda: bucket_props(access_log_bucket=None), "name the log bucket"),
        (lambda: bucket_props(bucket_name="xy"), "3-63 characters"),
        (
            lambda: EncryptionKeyProps(
                alias="alias/x", description="d", account_id="1", region="r"
            ),
            "without the 'alias/' prefix",
        ),
        (
            lambda: EncryptionKeyProps(
                alias="x", description="d", account_id="1", region="r", deletion_window_days=3
            ),
            "KMS accepts 7 to 30",
        ),
        (
            lambda: CatalogTableProps(
                table_name="catalog",
                kms_key_arn="k",
                indexes=(SecondaryIndex(name="i", partition_key="a", sort_key="b"),) * 2,
            ),
            "give each index its own name",
        ),
        (
            lambda: ReplicatedBucketsProps(
                buckets=(
                    RegionalBucket(label="A", region="us-east-1", bucket=bucket_props()),
                    RegionalBucket(label="B", region="us-east-1", bucket=bucket_props()),
                ),
                role_name="r",
            ),
            "regions must differ",
        ),
    ],
)
def test_bad_props_fail_before_synthesis_with_a_fix(build: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        build()


def test_fleet_props_check_sizes_and_types() -> None:
    from spotrain.constructs.spot_fleet import SpotFleetProps

    base = dict(
        name="f", run_name="r", instance_types=("g5.xlarge", "g6.xlarge"), subnet_ids=["s"],
        vpc_id="v", image_parameter_name="/p", min_size=1, desired_size=2, max_size=4,
        on_demand_base_capacity=1, checkpoint_bucket_arn="a", replica_bucket_arns=("b",),
        checkpoint_bucket_name="n", catalog_table_arn="t", catalog_table_name="tn",
        data_kms_key_arns=("k",), region="us-east-1", tags={}, events_table_arn="e",
        log_kms_key_arn="k", log_retention_days=30,
        events_table_name="en", account_id="123456789012", vpc_endpoint_ids=("vpce-1",),
        autoscaling_endpoint_id="vpce-a", logs_endpoint_id="vpce-l",
        session_endpoint_ids=("vpce-s",), endpoint_security_group_id="sg-e",
    )  # fmt: skip
    SpotFleetProps(**base)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        SpotFleetProps(**{**base, "instance_types": ("g5.xlarge",), "desired_size": 9})  # type: ignore[arg-type]
    assert len(caught.value.problems) == 2
    assert dataclasses.is_dataclass(SpotFleetProps)


def test_a_run_with_a_deadline_gives_its_handler_the_deadline_and_its_progress_only(
    synth_dir: Path,
) -> None:
    from spotrain.stacks.runs import load_runs

    run = load_stack(synth_dir, "prod-run-gpt-large")
    declared = resources(run, "aws_ssm_parameter")["HandlerDeclaration"]["value"]
    deadline = json.loads(declared)["run_deadline"]
    assert deadline == dataclasses.asdict(load_runs("prod")[0].deadline)
    prod = load_stack(synth_dir, "prod-interruptions")
    variables = only(resources(prod, "aws_lambda_function"))["environment"]["variables"]
    # The catalog stack's checkpoint table, resolved by Terraform from that stack's outputs.
    assert variables[HandlerSettings.variable("checkpoints_table")].startswith(
        "${data.terraform_remote_state."
    )
    assert "CheckpointCatalog" in variables[HandlerSettings.variable("checkpoints_table")]
    policy = only(
        {n: p for n, p in resources(prod, "aws_iam_role_policy").items() if "Handler" in n}
    )
    by_sid = {s["sid"]: s for s in statements(prod, policy["policy"])}
    reading = by_sid["ReadRunProgress"]
    assert reading["actions"] == ["dynamodb:GetItem", "dynamodb:Query"]
    assert len(reading["resources"]) == 1 and "/index/" not in reading["resources"][0]
    [leading] = reading["condition"]
    assert (leading["variable"], leading["values"]) == ("dynamodb:LeadingKeys", ["RUN#*"])
    dev = load_stack(synth_dir, "dev-interruptions")
    assert (
        "RUN_DEADLINE"
        not in only(resources(dev, "aws_lambda_function"))["environment"]["variables"]
    )
    # Without a deadline the handler still reads the run's catalog items (whether its final
    # step is published), with the same grant.
    dev_policy = only(
        {n: p for n, p in resources(dev, "aws_iam_role_policy").items() if "Handler" in n}
    )
    dev_reading = {s["sid"]: s for s in statements(dev, dev_policy["policy"])}["ReadRunProgress"]
    assert dev_reading["actions"] == reading["actions"]


def test_each_stack_waits_for_the_stacks_it_depends_on_and_no_others(synth_dir: Path) -> None:
    """`spotrain deploy` applies a stack once the stacks it depends on are applied, and
    destroys it once the stacks that depend on it are destroyed."""
    from spotrain.tools.terraform import dependents, stack_dependencies, stacks_in_order

    manifest = json.loads((synth_dir / "manifest.json").read_text())["stacks"]
    waits_for = stack_dependencies(synth_dir, "local-*")
    assert list(waits_for) == stacks_in_order(synth_dir, "local-*")
    assert waits_for == {name: frozenset(manifest[name]["dependencies"]) for name in waits_for}
    # The run stacks need the network, not the interruption handler: they apply beside it.
    assert "local-interruptions" not in waits_for["local-run-demo"]
    assert dependents(waits_for)["local-interruptions"] == frozenset()
    assert dependents(waits_for)["local-storage"] == {
        f"local-{p}" for p in ("catalog", "interruptions", "interruptions-us-west-2", "network",
                               "network-us-west-2", "run-demo", "run-second")
    }  # fmt: skip
    assert stack_dependencies(synth_dir, "local-run-demo") == {"local-run-demo": frozenset()}


WAITS_FOR = {"storage": frozenset(), "budget": frozenset(), "catalog": frozenset({"storage"}),
             "handler": frozenset({"storage", "catalog"}),
             "network": frozenset({"storage", "catalog"}),
             "run": frozenset({"network"})}  # fmt: skip


def test_a_stack_starts_as_soon_as_what_it_waits_for_is_done() -> None:
    import threading
    import time

    from spotrain.tools.deploy import each_when_ready

    ended: dict[str, float] = {}
    started: dict[str, float] = {}
    run_started = threading.Event()
    inits: list[str] = []

    def apply(name: str) -> str:
        started[name] = time.monotonic()
        if name == "run":
            run_started.set()
        if name == "handler":  # a slow one: the run must not wait for it
            assert run_started.wait(timeout=20), "the run waited for a stack it does not need"
        time.sleep(0.05)
        ended[name] = time.monotonic()
        return f"applied {name}"

    results = each_when_ready(WAITS_FOR, apply, before=inits.append)
    assert results == {name: f"applied {name}" for name in WAITS_FOR}
    assert sorted(inits) == sorted(WAITS_FOR)
    for name, needs in WAITS_FOR.items():
        assert all(ended[need] <= started[name] for need in needs), name


def test_after_a_failure_nothing_new_starts_and_the_failure_is_raised() -> None:
    from spotrain.tools.deploy import each_when_ready

    started: list[str] = []

    def apply(name: str) -> None:
        started.append(name)
        if name == "catalog":
            raise RuntimeError("catalog failed")

    with pytest.raises(RuntimeError, match="catalog failed"):
        each_when_ready(WAITS_FOR, apply)
    assert sorted(started) == ["budget", "catalog", "storage"]


def test_stacks_that_wait_for_one_another_are_refused_before_any_starts() -> None:
    from graphlib import CycleError

    from spotrain.tools.deploy import each_when_ready

    started: list[str] = []
    with pytest.raises(CycleError):
        each_when_ready({**WAITS_FOR, "storage": frozenset({"run"})}, started.append)
    assert started == []


def test_terraform_validates_the_efa_runs_stack(synth_dir: Path, tmp_path: Path) -> None:
    """The provider itself accepts prod's EFA templates, overrides and placement group."""
    import shutil

    from spotrain.tools import terraform

    stack = tmp_path / "prod-run-gpt-large"
    shutil.copytree(synth_dir / "stacks" / "prod-run-gpt-large", stack)
    env = terraform.terraform_env(terraform.write_cli_config(tmp_path))
    terraform.run(stack, ["init", "-backend=false", "-input=false"], env, capture=True)
    checked = terraform.run(stack, ["validate", "-json"], env, capture=True)
    assert json.loads(checked.stdout)["valid"] is True, checked.stdout


def test_without_terraform_the_message_names_the_version_the_state_backend_needs(
    tmp_path: Path,
) -> None:
    """The stacks' S3 state locking (`use_lockfile`) is Terraform 1.10's: an older one fails at
    init, so the install hint names 1.10."""
    from spotrain.core.errors import TerraformError
    from spotrain.tools import terraform

    with pytest.raises(TerraformError, match=r"install Terraform 1\.10 or newer"):
        terraform.run(tmp_path, ["version"], {"PATH": str(tmp_path)})


@pytest.mark.parametrize(
    ("command", "answer", "named"),
    [("apply", '{"terraform_version": "1.9.8", "platform": "linux_amd64"}', "1.9.8"),
     ("plan_has_changes", '{"terraform_version": "1.9.8"}', "1.9.8"),
     ("destroy", '{"terraform_version": "1.9.8"}', "1.9.8"),
     ("apply", "Terraform v0.12.31", "Terraform v0.12.31")],
)  # fmt: skip
def test_a_terraform_too_old_for_the_stacks_is_refused_before_any_stack_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, answer: str, named: str
) -> None:
    """Terraform 1.9 would fail at every stack's init (S3 state locking is 1.10's): deploy,
    plan and destroy ask its version first and name the fix, having run nothing else. One
    too old to answer in JSON (before 0.13) is refused alike."""
    import stat

    from spotrain.core.errors import TerraformError
    from spotrain.tools import deploy

    called = tmp_path / "called"
    fake = tmp_path / "bin" / "terraform"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\necho '{answer}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    deployment = deploy.Deployment(deploy.environment("local"), outdir=tmp_path / "out")
    with pytest.raises(TerraformError) as refused:
        getattr(deployment, command)()
    assert str(refused.value) == (
        f"Terraform {named} is too old for these stacks: install Terraform 1.10 or newer (the "
        "state backend's S3 locking needs it), and try again"
    )
    assert called.read_text().splitlines() == ["version -json"]


def test_terraform_runs_with_spotrains_garbage_collection_unless_the_user_set_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Terraform and the provider processes it starts inherit GOGC (bench/terraform.md)."""
    from spotrain.tools import terraform

    cli_config = terraform.write_cli_config(tmp_path)
    monkeypatch.delenv("GOGC", raising=False)
    assert terraform.terraform_env(cli_config)["GOGC"] == terraform.GO_GC_PERCENT == "400"
    monkeypatch.setenv("GOGC", "150")
    assert terraform.terraform_env(cli_config)["GOGC"] == "150"


def test_a_stacks_resources_read_from_its_state_are_what_terraform_lists(tmp_path: Path) -> None:
    """`Deployment.describe` reads a stack's state once (`state pull`) instead of running `state
    list` and `output -json`: its addresses are Terraform's own, for every form an address
    takes (data sources, counted and keyed instances, modules, a resource with none left)."""
    import subprocess

    from spotrain.tools import terraform

    def resource(name: str, keys: list[object], **more: str) -> dict[str, object]:
        instances = [{"schema_version": 0, "attributes": {"id": f"{name}{i}"},
                      **({} if key is None else {"index_key": key})}
                     for i, key in enumerate(keys)]  # fmt: skip
        return {"mode": "managed", "type": "aws_sqs_queue", "name": name,
                "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
                "instances": instances, **more}  # fmt: skip

    state = {"version": 4, "terraform_version": "1.11.4", "serial": 1, "lineage": "l",
             "outputs": {"url": {"value": "u", "type": "string"}},
             "resources": [resource("plain", [None]), resource("counted", [0, 1, 10]),
                           resource("keyed", ['a "quoted" key', "é", "back\\slash"]),
                           resource("read", [None], mode="data", type="aws_region"),
                           resource("inner", [None], module='module.m["k"]'),
                           resource("gone", [])]}  # fmt: skip
    (tmp_path / "s.tfstate").write_text(json.dumps(state))
    listed = subprocess.run(
        ["terraform", "state", "list", "-state=s.tfstate"], cwd=tmp_path, capture_output=True,
        text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(listed) == 9
    assert sorted(terraform.state_addresses(state)) == sorted(listed)


def test_handler_props_name_a_name_too_long_for_lambda_or_iam_with_the_fix() -> None:
    from spotrain.constructs.interruption_handler.construct import InterruptionHandlerProps
    from spotrain.core.errors import SpotrainError

    with pytest.raises(SpotrainError) as refused:
        InterruptionHandlerProps(
            name="spotrain-" + "x" * 50, role_name="spotrain-" + "y" * 60,
            events_table_arn="arn", events_table_name="events", kms_key_arn="key",
            account_id="123456789012", region="us-west-2", environment="x",
            group_name_prefix="spotrain-x-", alert_emails=(), log_retention_days=30,
        )  # fmt: skip
    said = str(refused.value)
    assert "over 50 characters: Lambda names are limited" in said
    assert "over 64 characters, IAM's limit: give the environment a shorter name" in said


def test_destroy_reads_nothing_back_and_takes_each_stack_down_after_those_that_need_it(
    synth_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`spotrain destroy` runs `terraform destroy -refresh=false` once per stack (a refresh is
    a whole walk of the stack, a fifth of the local destroy's time: bench/terraform.md), each
    only once every stack that depends on it is gone."""
    import subprocess
    import threading

    from spotrain.tools import deploy, terraform

    calls: list[tuple[str, list[str]]] = []
    lock = threading.Lock()

    def run(stack_dir: Path, args: list[str], *_: object, **__: object) -> Any:
        with lock:
            calls.append((Path(stack_dir).name, list(args)))
        return subprocess.CompletedProcess(args, 0, stdout='{"terraform_version": "1.11.4"}')

    monkeypatch.setattr(terraform, "run", run)
    config = deploy.environment("local", local_endpoint="https://127.0.0.1:1")
    deploy.Deployment(config=config, outdir=synth_dir, log=lambda _: None).destroy()
    destroyed = [(stack, args) for stack, args in calls if args[0] == "destroy"]
    order = [stack for stack, _ in destroyed]
    waits_for = terraform.stack_dependencies(synth_dir, "local-*")
    assert sorted(order) == sorted(waits_for)
    for stack, args in destroyed:
        assert "-refresh=false" in args and "-auto-approve" in args, (stack, args)
    for stack, needs in waits_for.items():
        assert all(order.index(need) > order.index(stack) for need in needs), (stack, order)
