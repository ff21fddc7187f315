"""`spotrain run submit|list|status|logs|cancel|resume|retire ENV [RUN]`: an environment's runs,
each declared in the repository (`runs/<env>/<run>.toml`) with its own stack and groups (found
by the run tag); what `list` and `status` read is in `run_status`, `logs` in `run_logs`.

`submit` does by hand what merging the run's pull request does: it checks the run file, deploys
the run's stack (its groups start empty) and stores its training configuration, so the
interruption handler starts the run at its next check; with `--spot-history` it also stores a
run with a deadline's plan, as `deadline-plan` does (`run_plan`). `retire` destroys a run's
stack once no machine of it is in service; its checkpoints, catalog items and history stay.

A run pays only while it trains: `cancel` takes its groups to nothing at once (each machine
gets SIGTERM and publishes its emergency checkpoint before it goes) and marks it cancelled, so
the interruption handler keeps it there and no machine of it may start; `resume` puts back the
sizes it had and it continues from its head. Operator credentials: machines may read a run's
lifecycle, never write it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spotrain.cli import run_status, run_steering
from spotrain.cli.arguments import environment, figure_path, reach_fix, run_name
from spotrain.cli.output import json_text, say
from spotrain.cli.run_status import (
    Where,
    in_service,
    line,
    run_groups,
    status_of,
    where_of,
)
from spotrain.core.errors import SpotrainError, aws_errors


def _list(where: Where, args: argparse.Namespace) -> int:
    from spotrain.stacks.runs import load_runs

    deployed = run_groups(where)
    statuses = [status_of(where, run, groups) for run, groups in sorted(deployed.items())]
    # Declared in the repository, not deployed: not yet (nothing paid), or no longer (retired:
    # its ledger says what it cost).
    statuses += [run_status.undeployed(where, args.environment, r.name, r.max_spend_usd)
                 for r in load_runs(args.environment) if r.name not in deployed]  # fmt: skip
    if args.json:
        say(json_text([asdict(s) for s in statuses]))
    elif not statuses:
        say(f"no run has groups in environment {args.environment}")
    for status in [] if args.json else statuses:  # and where a run waits in the queue, why
        shown = status.phase == "declared" or status.queued is not None
        say(line(status) + (f": {status.why}" if shown else ""))
    return 0


def _status(where: Where, args: argparse.Namespace) -> int:
    figure_path(args.plot)  # a path it cannot write is refused before anything is read
    groups = run_groups(where, args.run).get(args.run, [])
    retired = None if groups else run_status.undeployed(where, args.environment, args.run, None)
    if retired is not None and retired.phase == "retired":
        return run_status.show(retired, args)
    groups = groups or run_steering.groups_of(where, args)
    shown = run_status.show(status_of(where, args.run, groups), args)
    if args.plot:
        from spotrain.cost import run_report

        checkpoints, _ = run_report.read_checkpoints(where.catalog, args.run)
        interruptions = run_report.read_interruptions(where.events, args.run)
        run_report.plot_progress(args.run, checkpoints, interruptions, Path(args.plot))
        if not args.json:
            say(f"figure: {args.plot}")
    return shown


def _declared(env_name: str, target: str, *, whole: bool = False) -> Any:
    """The run `target` names (a run of the environment, or its file), as the repository
    declares it; a file elsewhere is refused with where it belongs. `whole`: its training
    configuration and what it names of the environment checked too (the trainer's import)."""
    from pathlib import Path

    from spotrain.stacks.runs import RUN_FILE_SUFFIX, read_run, run_file, runs_dir

    path = Path(target) if target.endswith(RUN_FILE_SUFFIX) else run_file(env_name, target)
    expected = run_file(env_name, path.stem)
    if path.resolve() != expected.resolve():
        raise SpotrainError(f"{target} is not where the repository declares runs of "
                            f"{env_name}: move it to {expected} (and open a pull request: "
                            "merging deploys it, as submit does)")  # fmt: skip
    if not path.is_file():
        raise SpotrainError(f"{path} does not exist: declare the run there (see "
                            f"{runs_dir() / 'README.md'})")  # fmt: skip
    if not whole:
        return read_run(path, env_name)
    from spotrain.trainer.train import training_problems

    return read_run(path, env_name, training_problems, environment(env_name))


def _run_deployment(env_name: str, run: str, out: str) -> Any:
    """Terraform over the run's own stack, freshly synthesized from the repository."""
    from pathlib import Path

    from spotrain.core.resource_names import run_stack_part
    from spotrain.tools import deploy

    config = deploy.environment(env_name)
    endpoint = deploy.resolve_local_endpoint()
    if config.is_local:
        config = deploy.local_environment_ready(endpoint)
    deploy.synth(Path(out), local_endpoint=endpoint, only=config.name)
    return deploy.Deployment(config=config, outdir=Path(out), log=say,
                             only=config.stack_name(run_stack_part(run)))  # fmt: skip


def _submit(where: Where, args: argparse.Namespace) -> int:
    import json
    import tempfile
    from pathlib import Path

    from spotrain.cli.data import checked_configuration, store_configuration
    from spotrain.core import code_bundle
    from spotrain.trainer.entry_point import store_code
    from spotrain.trainer.storage import open_storage

    run = _declared(args.environment, args.run, whole=True)
    with aws_errors(f"environment {args.environment} is not deployed or not reachable",
                    reach_fix(args.environment)):  # fmt: skip
        where.events.load()
    given = None  # a plan's means: refused before anything is deployed or stored
    if args.spot_history or args.spot_seen_by:
        from spotrain.cli.run_plan import means

        given = means(where, run, args.spot_history or [], args.spot_seen_by or [])
    if run.image is not None:  # its machines must be able to pull it before any is billed
        from spotrain.cli.image import check_pushed

        with aws_errors(f"the registry of environment {args.environment}",
                        f"`spotrain deploy {args.environment}` deploys it"):  # fmt: skip
            check_pushed(args.environment, run.image)
    store = f"s3://{where.bucket}"
    storage = open_storage(store, kms_key_id=_primary_key(args.environment))
    document = run.training_document()
    code = None
    if run.entry_point is not None:  # its code: the repository that declares it, pinned
        code = code_bundle.pack(run.code_root)
        document["entry_point"]["code"] = code[1]
    with tempfile.TemporaryDirectory() as scratch:  # checked (its dataset too) before deploying
        path = Path(scratch) / f"{run.name}.json"
        # The machine's own fields are filled in by each machine's boot script.
        path.write_text(json.dumps({**document, "store": store,
                                    "work_dir": "/set/by/each/machine"}))  # fmt: skip
        checked = checked_configuration(path, [], store)
    if code is not None:  # stored once every check passed, before a machine can ask for it
        store_code(storage, run.name, *code)
    results = _run_deployment(args.environment, run.name, args.out).apply()
    outputs = {k: v for r in results for k, v in r.outputs.items()}
    # Submitting again stores no copy of the same configuration.
    stored = store_configuration(storage, checked, unless_newest=True)
    say(f"run {run.name} submitted to {args.environment}: its fleet {outputs['fleet_group']} "
        f"is deployed empty and its configuration stored as {store}/{stored.key}; the "
        "interruption handler starts it at its next capacity check. `spotrain run status "
        f"{args.environment} {run.name}` follows it")  # fmt: skip
    if given is not None:
        from spotrain.cli.run_plan import solve_and_store

        say(f"run {run.name}: " + solve_and_store(where, run, given))
    elif run.deadline is not None:
        say(f"run {run.name} has a deadline and no plan: outage fill decides spot or on-demand; "
            f"`spotrain run deadline-plan {args.environment} {run.name} --spot-history FILE...` "
            "(or --spot-seen-by RUN) gives it one (the Markov policy, bench/cost.md)")  # fmt: skip
    return 0


def _deadline_plan(where: Where, args: argparse.Namespace) -> int:
    from spotrain.cli.run_plan import deadline_plan_action

    return deadline_plan_action(where, args, _declared(args.environment, args.run))


def _retire(where: Where, args: argparse.Namespace) -> int:
    groups = run_groups(where, args.run).get(args.run, [])
    training = sum(in_service(g) for g in groups)
    if training:
        raise SpotrainError(f"run {args.run} has {training} machine(s) in service: `spotrain run "
                            f"cancel {args.environment} {args.run}` first (they checkpoint and "
                            "leave), then retire it")  # fmt: skip
    # The last check may be minutes old: its machines' time since is counted before their
    # stack (and the handler's knowledge of the run) goes.
    ledger = run_status.settle_spend(where, args.run)
    _run_deployment(args.environment, args.run, args.out).destroy()
    say(f"run {args.run} retired: its stack is destroyed; its spend ${ledger.spend_usd:,.2f} "
        f"(${ledger.on_demand_usd:,.2f} on on-demand prices) is counted to its machines' end; "
        "its checkpoints, catalog items and history stay (`spotrain checkpoints list` reads "
        "them)")  # fmt: skip
    return 0


def _primary_key(env_name: str) -> str:
    """The ARN of the environment's data key in its primary region: the checkpoint bucket
    takes writes that name its own key, by ARN."""
    config = environment(env_name)
    return _data_key_arn(config, config.primary_region)


def _data_key_arn(config: Any, region: str) -> str:
    """The ARN of the environment's data key in `region`, as KMS names it."""
    from spotrain.core import aws_clients
    from spotrain.core.resource_names import data_key_alias

    kms = aws_clients.client("kms", region)
    alias = f"alias/{data_key_alias(config.name, region)}"
    return str(kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"])


def _logs(where: Where, args: argparse.Namespace) -> int:
    from spotrain.cli import run_logs

    return run_logs.show(where, args, lambda: run_status.stopped(where, args.run))


def _env(where: Where, args: argparse.Namespace) -> int:
    """`run env`: the shell exports the runbooks start from, for one deployed run (the names
    follow from the environment's configuration; the keys' ARNs are read from KMS). A region
    that does not answer (an outage: where the region-down runbook starts) leaves its key
    empty, says so, and the rest is printed."""
    import shlex

    from spotrain.core import resource_names as names

    run = _declared(args.environment, args.run)
    config = environment(args.environment)
    # The replica the runbooks restore from: the first region after the one the commands
    # talk to (home).
    replica = next(r for r in config.region_names if r != where.region)
    keys = {region: _reachable_key(config, region) for region in (where.region, replica)}

    group = names.fleet_group(config.name, run.name)
    values = {
        "RUN": run.name, "STORE": f"s3://{where.bucket}", "CATALOG": where.catalog.name,
        "KMS_KEY": keys[where.region], "EVENTS": where.events.name,
        "AWS_DEFAULT_REGION": where.region, "AWS_REGION": where.region,
        "FLEET_GROUP": group, "ON_DEMAND_GROUP": names.on_demand_group(group),
        "BUDGET": names.environment_budget(config.name),
        "REPLICA_STORE": f"s3://{names.checkpoint_bucket(config.bucket_prefix, replica)}",
        "REPLICA_REGION": replica, "REPLICA_KMS_KEY": keys[replica],
    }  # fmt: skip
    print("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in values.items()))
    return 0


def _reachable_key(config: Any, region: str) -> str:
    """The data key's ARN in `region`, or "" (said on stderr) when the region does not answer:
    a region outage must not keep on-call from the exports of the regions that do."""
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrain.core.errors import does_not_answer

    try:
        return _data_key_arn(config, region)
    except (ClientError, BotoCoreError) as error:
        if not does_not_answer(error):
            raise  # it answered: a real refusal (credentials, a missing key) to fix
        print(
            f"{region} does not answer ({error}): its key is left empty; during a region "
            "outage work in the other region (runbooks/region-down.md)",
            file=sys.stderr,
        )
        return ""


def _play(where: Where, args: argparse.Namespace) -> int:
    """`run play local RUN`: the submitted run trained on this host by the machines its
    deployed groups launch (the local cloud only)."""
    from spotrain.localcloud import control
    from spotrain.tools import local_fleet

    if args.environment != "local":
        raise SpotrainError(f"`spotrain run play` boots the local cloud's machines on this host; "
                            f"environment {args.environment}'s machines are EC2's: follow them "
                            f"with `spotrain run logs {args.environment} {args.run} "
                            "--follow`")  # fmt: skip
    _declared(args.environment, args.run)
    work = control.state_dir().parent / "machines" / args.run
    codes = local_fleet.play(args.run, work=work, say=say)
    say(f"run {args.run}: every machine exited ({', '.join(f'{i} {c}' for i, c in codes.items())}"
        f"); boot logs in {work}; `spotrain run status local {args.run} --plot FILE.png` shows "
        "its progress")  # fmt: skip
    return 0


def _reclaim(where: Where, args: argparse.Namespace) -> int:
    """`run reclaim local RUN`: EC2's reclaim of one of the machines `run play` runs."""
    from spotrain.localcloud import control
    from spotrain.tools import local_fleet

    if args.environment != "local":
        raise SpotrainError("`spotrain run reclaim` rehearses a reclaim on the local cloud's "
                            "played machines; EC2 reclaims the others itself")  # fmt: skip
    work = control.state_dir().parent / "machines" / args.run
    local_fleet.reclaim(args.run, work=work, instance=args.machine, say=say)
    return 0


ACTIONS: dict[str, Callable[[Where, argparse.Namespace], int]] = {
    "submit": _submit, "list": _list, "status": _status, "logs": _logs,
    "cancel": run_steering.cancel, "resume": run_steering.resume, "retire": _retire, "env": _env,
    "play": _play, "reclaim": _reclaim, "deadline-plan": _deadline_plan,
}  # fmt: skip


def cmd_run(args: argparse.Namespace) -> int:
    if (args.action not in ("logs", "reclaim") and args.machine) or (
        args.action != "logs" and args.follow
    ):
        raise SpotrainError("--machine goes with `spotrain run logs` and `run reclaim`, "
                            "--follow with logs: `spotrain run logs "
                            f"{args.environment} RUN --follow`")  # fmt: skip
    if args.action not in ("submit", "deadline-plan") and (args.spot_history or
                                                           args.spot_seen_by):  # fmt: skip
        raise SpotrainError("--spot-history and --spot-seen-by go with `spotrain run "
                            f"deadline-plan` and `run submit`: `spotrain run deadline-plan "
                            f"{args.environment} RUN --spot-history FILE...`")  # fmt: skip
    if args.action != "status" and args.plot:
        raise SpotrainError("--plot goes with `spotrain run status`: `spotrain run status "
                            f"{args.environment} RUN --plot FILE.png`")  # fmt: skip
    if args.action != "list":
        if not args.run:
            raise SpotrainError(f"`spotrain run {args.action}` needs the run: "
                                f"`spotrain run {args.action} {args.environment} RUN`")  # fmt: skip
        if args.action != "submit":
            run_name(args.run, "RUN")
    with aws_errors(f"`spotrain run {args.action}`", reach_fix(args.environment)):
        where = where_of(args.environment,
                         from_a_region_that_answers=args.action in ("status", "list"))  # fmt: skip
        return ACTIONS[args.action](where, args)


def add_parsers(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="an environment's runs: submit, list, status, logs, cancel, resume, retire, env, "
        "play, reclaim, deadline-plan",
    )
    run.add_argument("action", choices=list(ACTIONS),
                     help="submit: deploy a run the repository declares and store its training "
                     "configuration; list: every run with its phase; status: one run's step "
                     "of its steps, loss, machines, spend, pace, ETA, deadline and policy, "
                     "head "
                     "checkpoint and last interruption; cancel: its machines checkpoint "
                     "and go, its groups stay at 0; resume: a cancelled run continues from its "
                     "head; logs: what its machines printed, gone ones included; retire: "
                     "destroy a stopped run's stack, keeping its checkpoints; env: the "
                     "exports the runbooks start from "
                     "(eval \"$(spotrain run env ENV RUN)\"); play: the local cloud's run, "
                     "trained on this host by the machines its groups launch; reclaim: EC2's "
                     "reclaim of a played spot machine, rehearsed; deadline-plan: solve and store "
                     "the plan a run with a deadline is decided by")  # fmt: skip
    run.add_argument("environment", help="the environment (stacks/environments.py)")
    run.add_argument("run", nargs="?", help="the run (every action but list); submit: the run "
                     "or its file, runs/ENV/RUN.toml")  # fmt: skip
    run.add_argument("--json", action="store_true", help="list, status: JSON for scripts")
    run.add_argument("--plot", metavar="FILE.png", help="status: the run's loss and steps per "
                     "hour over its steps, restarts and preemptions marked")  # fmt: skip
    run.add_argument("--out", default="cdktf.out", help="submit, retire: synthesis folder")
    run.add_argument("--machine", metavar="INSTANCE_ID",
                     help="logs: this machine's lines alone; reclaim: this machine (default: "
                     "the newest spot one)")  # fmt: skip
    run.add_argument(
        "--follow",
        action="store_true",
        help="logs: keep printing new lines until the run stops (or Ctrl-C)",
    )
    run.add_argument("--spot-history", action="append", metavar="FILE",
                     help="deadline-plan, submit: what the environment saw of spot before the "
                     "run, one trace per region (home first; the format `spotrain cost "
                     "simulate --trace` reads): the deadline plan's means")  # fmt: skip
    run.add_argument("--spot-seen-by", metavar="RUN", action="append",
                     help="deadline-plan, submit: or the means the checks of these runs of the "
                     "environment saw, together (runs with a deadline; the run itself, to "
                     "plan again)")  # fmt: skip
    run.set_defaults(handler=cmd_run)
