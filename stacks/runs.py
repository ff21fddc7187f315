"""Runs: each declared in the repository as `runs/<environment>/<run>.toml`, one file per run.

An environment is the shared ground (network, buckets, tables, keys, budget, the interruption
handler); a run is what trains on it, with its own fleet (the `<env>-run-<run>` stack). A run
file says what the run trains (its training configuration, inline or the path to a JSON file
beside it), on which machines, for whom (`owner`, a cost-allocation tag on every resource of
the run), and within what spend and deadline. The file's name is the run's name.

`load_runs` reads every run of an environment and checks them as a whole: every problem of
every file is collected and raised once, as a `ConfigError` naming the file, the field and
the fix, before any stack is built.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import date, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from spotrain.core import resource_names as names
from spotrain.core.capacity import gang_timeout_problem
from spotrain.core.catalog_schema import RUN_TAG, run_name_problem
from spotrain.core.deadline_policy import RunDeadline
from spotrain.core.entry_point import EntryPoint
from spotrain.core.errors import (
    ConfigError,
    SpotrainError,
    json_kind,
    raise_if_problems,
    read_json,
    read_text,
)
from spotrain.core.global_batch import DEFAULT_MICRO_BATCH, global_batch_problems
from spotrain.core.gpu_types import MACHINES, efa_everywhere, efa_interfaces, gpu_kind_problems
from spotrain.core.image_reference import run_image_problems
from spotrain.core.validation import instance_type_problems, says_any, type_problems

if TYPE_CHECKING:
    from spotrain.stacks.config import EnvironmentConfig

CHECKOUT = Path(__file__).resolve().parent.parent
"""The repository's root: the code folder of the image the runs' machines boot (a run's
entry-point script is found from here)."""
RUNS_DIR = CHECKOUT / "runs"
"""Where the repository declares its runs: `runs/<environment>/<run>.toml`."""
RUNS_DIR_VARIABLE = "SPOTRAIN_RUNS_DIR"
"""Names another folder of run files (a test's, or a checkout's elsewhere)."""
RUN_FILE_SUFFIX = ".toml"

_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_TAG_KEY = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")
_TAG_VALUE = re.compile(r"^[\w.:/=+\-@ ]{1,256}$")
OWNER_TAG = "spotrain:owner"
"""With the run tag, the run's cost-allocation tags: the bill splits per run and per person."""


FLEET_NAME_LIMIT = 64
"""IAM role names (the fleet's instance role is named for it) take 64 characters."""


def _positive_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < math.inf


@dataclass(frozen=True, kw_only=True)
class PlannedRun:
    """What the run is expected to need: the pull-request estimate (`spotrain cost estimate`)
    prices it with the planner, so a change to the run shows what it does to its bill."""

    machine_hours: float
    """The run's size: machine-hours of compute without interruptions or checkpoints. The
    fleet's N machines do it in machine_hours / N hours (the estimate assumes the run scales
    with its machines), so a bigger fleet costs more per day and finishes sooner."""
    checkpoint_seconds: float = 60.0
    """Seconds training stalls per checkpoint (the run's metrics say, once it has run)."""
    interruptions_per_hour: float | None = None
    """Per instance: the team's assumption until the run has history (`spotrain cost plan
    --events-table` measures it); None: the Spot Instance Advisor band in the price book."""

    def problems(self) -> list[str]:
        found = []
        for name in ("machine_hours", "checkpoint_seconds"):
            if not _positive_number(getattr(self, name)):
                found.append(f"planned.{name} is {getattr(self, name)!r}: give a positive number")
        rate = self.interruptions_per_hour
        zero = isinstance(rate, int | float) and not isinstance(rate, bool) and rate == 0
        if not (rate is None or zero or _positive_number(rate)):
            found.append(
                f"planned.interruptions_per_hour is {rate!r}: give 0 or more per instance, "
                "or leave it out for the Advisor band"
            )
        return found


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of an environment: what it trains, on which machines, for whom, within what."""

    name: str
    """The run (the file's name): its prefix in the buckets, its catalog items, its tag."""
    environment: str
    """The environment it trains in (the folder its file is in)."""
    owner: str
    """Who the run is for (a team or a person, e.g. an e-mail address): the `spotrain:owner`
    cost-allocation tag on every resource of the run."""
    instance_types: tuple[str, ...]
    """GPU instance types the run's spot group may use, most preferred first (at least two)."""
    training: Mapping[str, Any] = field(default_factory=dict)
    """The built-in trainer's configuration `spotrain run submit` stores for the run's
    machines (its `run` field is the run's name). Empty when the run has an entry point."""
    entry_point: EntryPoint | None = None
    """Or the user's own training script the machines run (in the image), with its
    arguments; it reads the run's coordinates from the environment (`Checkpointer`)."""
    image: str | None = None
    """The image its machines train in, pinned by digest (`REPOSITORY@sha256:...` in the
    environment's registry, what `spotrain image build` prints): changing it changes the run's
    launch template, so it shows in the run's plan. None: the image baked into the machine
    image."""
    mixed_gpus: bool = False
    """Allow instance types with different GPU models (GPUs per machine and GPU memory must
    agree anyway): every synchronous step then runs at the slowest GPU, and the estimate
    prices the run so. False: one GPU model per run."""
    network: str | None = None
    """How its machines exchange gradients: "cluster" (EFA interfaces, as many as each type
    takes, and a cluster placement group: the fastest network, but spot capacity from one
    zone's racks only), "efa" (EFA in one zone without the placement group: more spot
    capacity, a slower path between racks) or "tcp" (no EFA: every zone of the environment).
    EFA traffic stays in one subnet, so an EFA run trains in one zone. None: "cluster" where
    every type takes EFA, else "tcp"."""
    zone: str | None = None
    """The zone an EFA run trains in; None: the environment's first."""
    min_size: int = 1
    """Fewest machines while the run trains (the on-demand coordinator counts)."""
    desired_size: int = 2
    """Machines the run starts with."""
    max_size: int = 4
    """Most machines."""
    on_demand_base_capacity: int = 1
    """On-demand machines kept before spot is used: the warm coordinator (at least 1)."""
    max_spend_usd: float | None = None
    """The run's spend cap in USD (machine time at its pools' prices): notices at 50, 80 and
    100%; at 100% the run is held and its groups go to 0, each machine checkpointing as it
    goes, until `spotrain fleet release --max-spend-usd N` raises it. None: no cap."""
    deadline: RunDeadline | None = None
    """When the run must be done: the interruption handler then chooses spot or on-demand by
    its progress and the spot its checks have seen (`spotrain.core.outage_fill`), or by its
    plan (`spotrain run deadline-plan`); None keeps the fixed on-demand fallback."""
    planned: PlannedRun | None = None
    """The run's expected work, priced in each pull request's plan comment; None: no
    estimate."""
    team: str = ""
    """The environment's team its GPUs and spend count against (`EnvironmentConfig.teams`:
    a share of GPUs and a monthly budget); "" where the environment names no teams."""
    priority: int = 0
    """Its place in the queue when runs wait for GPUs: higher first, then the earlier
    submitted."""
    gang_timeout_minutes: float | None = None
    """How long the machines its rendezvous needs (`min_size`) may take to come together
    before the ones that came are released rather than kept idle, billed (the run then waits
    and asks again). A gang of many large machines may need longer. None: the handler's, 15
    minutes."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """More cost-allocation tags on the run's resources (the environment's come too)."""
    source: str = ""
    """The file the run was read from (for messages)."""

    def __post_init__(self) -> None:
        subject = f"run {self.source or self.name!r}"
        raise_if_problems(subject, instance_type_problems(self))
        object.__setattr__(self, "instance_types", tuple(self.instance_types))
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))
        object.__setattr__(self, "training", MappingProxyType(dict(self.training)))
        raise_if_problems(subject, self._problems())

    @property
    def code_root(self) -> Path:
        """The repository that declares the run: the folder above its `runs/` (whose files
        `run submit` stores as the run's code)."""
        return Path(self.source).resolve().parents[2] if self.source else CHECKOUT

    @property
    def run_tags(self) -> dict[str, str]:
        """The run's own tags: its extra ones, then the run and its owner."""
        return {**self.tags, RUN_TAG: self.name, OWNER_TAG: self.owner}

    def training_document(self) -> dict[str, Any]:
        """The training configuration to store, named for this run: the built-in trainer's,
        or the entry point the machines start."""
        if self.entry_point is not None:
            return {"run": self.name, "entry_point": self.entry_point.document()}
        return {**self.training, "run": self.name}

    def _problems(self) -> list[str]:
        problems: list[str] = []
        if problem := run_name_problem(self.name):
            problems.append(f"the file's name: {problem} (the file's name is the run's)")
        fleet = names.fleet_group(self.environment, self.name)
        if len(fleet) > FLEET_NAME_LIMIT:
            problems.append(
                f"the run's name is too long for environment {self.environment!r}: its fleet "
                f"{fleet!r} must fit in {FLEET_NAME_LIMIT} characters (IAM role names); keep the "
                f"name to {len(self.name) - len(fleet) + FLEET_NAME_LIMIT} characters"
            )
        if not self.owner.strip() or not _TAG_VALUE.match(self.owner):
            problems.append(
                f"owner {self.owner!r} is not a tag value: name the team or person the run is "
                "for in 1-256 letters, digits, spaces or _.:/=+-@ (e.g. 'ml-platform@example.com')"
            )
        if len(self.instance_types) < 2:
            problems.append(
                f"instance_types has {len(self.instance_types)} entr(ies): list at least two "
                "GPU instance types (e.g. 'g5.xlarge', 'g6.xlarge') so spot can pick a pool"
            )
        for itype in self.instance_types:
            if not _INSTANCE_TYPE.match(itype):
                problems.append(
                    f"instance type {itype!r} is malformed: write it as family.size, "
                    "e.g. 'g5.xlarge'"
                )
        if len(set(self.instance_types)) != len(self.instance_types):
            problems.append("instance_types lists a type twice: list each type once")
        elif all(_INSTANCE_TYPE.match(t) for t in self.instance_types):
            problems += gpu_kind_problems(self.instance_types, mixed_gpus=self.mixed_gpus)
        if self.on_demand_base_capacity < 1:
            problems.append(
                f"on_demand_base_capacity is {self.on_demand_base_capacity}: keep at least 1 "
                "so the coordinator runs on on-demand capacity"
            )
        if not (0 <= self.min_size <= self.desired_size <= self.max_size):
            problems.append(
                f"sizes min_size={self.min_size} desired_size={self.desired_size} "
                f"max_size={self.max_size} are not ordered: need 0 <= min <= desired <= max"
            )
        if self.min_size < self.on_demand_base_capacity:
            problems.append(
                f"min_size {self.min_size} is below on_demand_base_capacity "
                f"{self.on_demand_base_capacity}: raise min_size so the coordinator is always "
                "kept"
            )
        if self.max_spend_usd is not None and not _positive_number(self.max_spend_usd):
            problems.append(
                f"max_spend_usd is {self.max_spend_usd!r}: give the run's cap as a positive "
                "amount in USD, or leave it out for no cap"
            )
        if problem := gang_timeout_problem(self.gang_timeout_minutes):
            problems.append(problem)
        if self.deadline is not None:
            problems += [
                p.replace("run_deadline.", "deadline.", 1) for p in self.deadline.problems()
            ]
        if self.planned is not None:
            problems += self.planned.problems()
        for key, value in self.tags.items():
            if not _TAG_KEY.match(key) or key.lower().startswith(("aws:", "spotrain:")):
                problems.append(
                    f"tag key {key!r} is not allowed: use 1-128 letters, digits, spaces or "
                    "_.:/=+-@ and do not start with 'aws:' or 'spotrain:'"
                )
            if len(value) > 256:
                problems.append(f"tag {key!r} has a value over 256 characters: shorten it")
        if (self.entry_point is None) == (not self.training):
            problems.append(
                "give the run's training as [training] (the built-in trainer's configuration) "
                "or as [entry_point] (your own script, e.g. script = 'examples/train_llama.py'), "
                "exactly one of them"
            )
        if self.entry_point is not None:
            entry_problems = self.entry_point.problems()
            problems += entry_problems
            script = self.entry_point.script
            if script and not entry_problems and not (self.code_root / script).is_file():
                problems.append(
                    f"entry_point.script {script} is not in the repository that declares the "
                    f"run ({self.code_root}): give the script's path from its root (the "
                    "folder above runs/)"
                )
        problems += self._network_problems() + self._batch_problems()
        if self.image is not None:
            problems += run_image_problems(self.image, self.environment)
        stored_run = self.training.get("run")
        if stored_run is not None and stored_run != self.name:
            problems.append(
                f"training.run is {stored_run!r}, but the file names run {self.name!r}: leave "
                "`run` out of the training configuration (the file's name is the run's)"
            )
        return problems

    @property
    def network_mode(self) -> str:
        """The network the run trains on: its `network`, or the default for its types."""
        if self.network is not None:
            return self.network
        return "cluster" if efa_everywhere(self.instance_types) else "tcp"

    def _batch_problems(self) -> list[str]:
        """The built-in trainer's global batch on every machine count the fleet may have (a
        script of the user's keeps its own batch)."""
        machine = next((MACHINES[t] for t in self.instance_types if t in MACHINES), None)
        micro, given = (
            self.training.get("micro_batch", DEFAULT_MICRO_BATCH),
            self.training.get("global_batch"),
        )
        if (self.entry_point is not None or machine is None or not isinstance(micro, int)
                or not isinstance(given, int | None) or micro < 1):  # fmt: skip
            return []  # nothing to check, or the training configuration's own problems
        found = global_batch_problems(
            micro_batch=micro, global_batch=given, ranks=machine.gpus,
            min_machines=self.min_size, max_machines=self.max_size,
        )  # fmt: skip
        return [f"training.{problem}" for problem in found]

    def _network_problems(self) -> list[str]:
        problems = []
        if self.network is not None and self.network not in NETWORKS:
            problems.append(f"network is {self.network!r}: use one of {', '.join(NETWORKS)}")
        elif self.network_mode != "tcp" and not efa_everywhere(self.instance_types):
            without = [t for t in self.instance_types if efa_interfaces(t) == 0]
            problems.append(
                f"network is {self.network_mode!r} but {', '.join(without)} take(s) no EFA: "
                'keep types that do, or set network = "tcp"'
            )
        if self.zone is not None and self.network_mode == "tcp":
            problems.append("zone is set but the run trains on tcp in every zone: leave zone "
                            'out, or use network = "cluster" or "efa"')  # fmt: skip
        return problems


NETWORKS = ("cluster", "efa", "tcp")
"""A run's network choices (RunConfig.network)."""


# --- reading run files -------------------------------------------------------------------------
_TABLES: dict[str, type] = {"deadline": RunDeadline, "planned": PlannedRun,
                            "entry_point": EntryPoint}  # fmt: skip
_FILE_FIELDS = tuple(f.name for f in fields(RunConfig) if f.name not in ("name", "environment",
                                                                          "source"))  # fmt: skip
_FIX = "fix the file (TOML: https://toml.io)"


def runs_dir() -> Path:
    """The folder of run files: `SPOTRAIN_RUNS_DIR` if set, else `runs/` in the working
    directory (the repository you work in: yours, or the platform's), else this checkout's."""
    named = os.environ.get(RUNS_DIR_VARIABLE)
    if named:
        return Path(named)
    here = Path.cwd() / "runs"
    return here if here.is_dir() else RUNS_DIR


def run_file(environment: str, run: str, directory: Path | None = None) -> Path:
    """Where the repository declares `run` of `environment`."""
    return (directory or runs_dir()) / environment / f"{run}{RUN_FILE_SUFFIX}"


TrainingCheck = Callable[[Mapping[str, Any]], list[str]]
"""Every problem of a run's built-in training configuration, each named as its field (the
trainer's own check: `spotrain.trainer.train.training_problems`, which this floor cannot
import)."""


def load_runs(
    environment: str,
    directory: Path | None = None,
    *,
    against: EnvironmentConfig | None = None,
    training_problems: TrainingCheck | None = None,
) -> tuple[RunConfig, ...]:
    """Every run the repository declares for `environment`, by name; every problem of every
    file at once: with `against`, what the environment must have for it (its team, its zone);
    with `training_problems`, its training configuration's own."""
    folder = (directory or runs_dir()) / environment
    paths = sorted(folder.glob(f"*{RUN_FILE_SUFFIX}")) if folder.is_dir() else []
    runs, problems = [], []
    for path in paths:
        try:
            runs.append(read_run(path, environment, training_problems, against))
        except ConfigError as error:
            problems += [f"{path.name}: {p}" for p in error.problems]
    raise_if_problems(f"the runs of environment {environment!r} ({folder})", problems)
    return tuple(runs)


def environment_problems(config: EnvironmentConfig, run: RunConfig) -> list[str]:
    """What `run` names that its environment does not have: a team, or the zone an EFA run
    trains in (one of home's)."""
    return team_problems(config, run.team) + zone_problems(config, run)


def zone_problems(config: EnvironmentConfig, run: RunConfig) -> list[str]:
    zones = config.region(config.primary_region).availability_zones
    if run.zone is not None and run.network_mode != "tcp" and run.zone not in zones:
        return [f"zone {run.zone!r} is not one of environment {config.name}'s: use one of "
                f"{', '.join(zones)}"]  # fmt: skip
    return []


def team_problems(config: EnvironmentConfig, team: str) -> list[str]:
    teams = [each.name for each in config.teams]
    if teams and team not in teams:
        return [f"team {team!r} is not one of environment {config.name}'s teams: set team to "
                f"one of {', '.join(teams)}"]  # fmt: skip
    return []


def read_run(
    path: Path,
    environment: str,
    training_problems: TrainingCheck | None = None,
    against: EnvironmentConfig | None = None,
) -> RunConfig:
    """The run declared in `path`, or a ConfigError listing every problem of the file (its
    training configuration's too, with `training_problems`, and what its environment lacks for
    it, with `against`)."""
    text = read_text(path, "run file", _FIX)
    subject = f"run file {path}"
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(subject, [f"it is not TOML ({error}): {_FIX}"]) from None
    problems = [
        f"{key} is not a field of a run: use {', '.join(_FILE_FIELDS)}"
        for key in document
        if key not in _FILE_FIELDS
    ]
    values: dict[str, Any] = {k: v for k, v in document.items() if k in _FILE_FIELDS}
    unusable = set()  # fields whose value cannot be checked further: missing or mistyped
    for key in ("owner", "instance_types"):
        if key not in values:
            unusable.add(key)
            problems.append(f"{key} is missing: every run names its {key.replace('_', ' ')}")
    if "training" not in values and "entry_point" not in values:
        unusable.add("training")
        problems.append("training is missing: give the run's [training] (the built-in trainer's "
                        "configuration) or its [entry_point] (your own script)")  # fmt: skip
    for key, kind in _TABLES.items():
        if key in values:
            table, found = _table(values[key], kind, key)
            problems += found
            values[key] = table
            unusable |= {key} if found else set()
    if isinstance(values.get("training"), str):
        values["training"], found = _training_file(path.parent / values["training"])
        problems += found
        unusable |= {"training"} if found else set()
    for key, value in values.items():
        found = type_problems(RunConfig, {key: value})
        problems += found
        unusable |= {key} if found else set()
    if training_problems is not None and isinstance(values.get("training"), Mapping):
        problems += [f"training.{p}" for p in training_problems(values["training"])]
    if against is not None and isinstance(values.get("team", ""), str):
        problems += team_problems(against, values.get("team", ""))
    # The values that are usable are checked as a whole, each unusable one standing in with a
    # value its own checks pass; what the checks then say of a stand-in (or through one) is
    # dropped.
    stand_ins = {key: _STAND_INS[key] for key in unusable if key in _STAND_INS}
    kept = {k: v for k, v in values.items() if k not in unusable}
    try:
        run = RunConfig(name=path.stem, environment=environment, source=str(path),
                        **{**kept, **stand_ins})  # fmt: skip
    except ConfigError as error:
        said = [_STAND_INS["owner"], *_STAND_IN_TYPES] if stand_ins else []
        problems += [p for p in error.problems
                     if not says_any(p, unusable) and not any(w in p for w in said)]  # fmt: skip
    else:
        problems += zone_problems(against, run) if against is not None and not unusable else []
    raise_if_problems(subject, list(dict.fromkeys(problems)))
    return run


_STAND_IN_TYPES = ("standin.one", "standin.two")
_STAND_INS: dict[str, Any] = {"owner": "stand-in", "instance_types": _STAND_IN_TYPES}
"""For each field a run must give, a value its own checks pass and no other check can judge
(types spotrain does not know): a file missing it is still checked for the rest."""


def _table(value: Any, kind: type, key: str) -> tuple[Any, list[str]]:
    names = [f.name for f in fields(kind)]
    if not isinstance(value, dict):
        return None, [
            f"{key} is {json_kind(value)}: make it a table ([{key}]) of {', '.join(names)}"
        ]
    unknown = [f"{key}.{k} is not a field of [{key}]: use {', '.join(names)}"
               for k in value if k not in names]  # fmt: skip
    required = [
        f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING
    ]
    absent = [k for k in required if k not in value]
    # TOML has its own times: a deadline's are taken as the ISO 8601 text they are written as.
    given = {k: v.isoformat().replace("+00:00", "Z") if isinstance(v, datetime | date) else v
             for k, v in value.items() if k in names}  # fmt: skip
    mistyped = [k for k in given if type_problems(kind, {k: given[k]})]
    problems = [*unknown, *(f"{key}.{k} is missing" for k in absent),
                *type_problems(kind, given, prefix=f"{key}.")]  # fmt: skip
    if not problems:
        return kind(**given), []
    # The fields given and typed right are still checked (the others stand in as None, or
    # their defaults); what that says of a field absent or mistyped is not said.
    unusable = [*absent, *mistyped]
    try:
        stand_in = kind(**{**{k: v for k, v in given.items() if k not in unusable},
                           **{k: None for k in unusable if k in required}})  # fmt: skip
    except (TypeError, ValueError):  # a table that checks itself as it is made: said above
        return None, problems
    said = [p.replace("run_deadline.", f"{key}.", 1) for p in stand_in.problems()]
    return None, problems + [
        p for p in said if not says_any(p, [f"{key}.{k}" for k in unusable] + unusable)
    ]


def _training_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The training configuration a run file names by path (relative to the run file)."""
    try:
        document = read_json(
            path,
            "training configuration",
            "give the path of a JSON file "
            "relative to the run file, or write it inline as [training]",
        )
    except SpotrainError as error:  # one problem in the list, beside the file's others
        return {}, [f"training: {error}"]
    if not isinstance(document, dict):
        return {}, [f"training: {path} holds {json_kind(document)}, not a training "
                    "configuration (an object)"]  # fmt: skip
    return document, []
