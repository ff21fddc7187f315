"""What each GPU instance type carries: its GPUs (model, count, memory), how many EFA
interfaces it takes, and the GPU's speed. One place for these facts: run files are checked
against them (one GPU kind per run), the fleet attaches EFA interfaces from them, and the
planner prices a mixed run at its slowest GPU.

The figures are AWS's (`aws ec2 describe-instance-types --instance-types T --query
'InstanceTypes[].[GpuInfo, NetworkInfo.EfaInfo, NetworkInfo.MaximumNetworkCards]'`) and
NVIDIA's datasheets (dense bf16 tensor TFLOPS per GPU; fp16 where the GPU has no bf16). A
type missing here is refused with the command that gives its figures, to add a row."""

from __future__ import annotations

from dataclasses import dataclass

from spotrain.core.capacity import ON_DEMAND, SPOT

GPU_TFLOPS: dict[str, float] = {
    "T4": 65.0,  # fp16
    "V100": 125.0,  # fp16
    "A10G": 125.0,  # the A10's datasheet figure (AWS's A10G has no public one)
    "L4": 121.0,
    "L40S": 362.0,
    "A100": 312.0,
    "H100": 989.0,
    "H200": 989.0,
    "B200": 2250.0,
}
"""Dense bf16 tensor TFLOPS per GPU (datasheet): what a mixed run is priced by."""


@dataclass(frozen=True)
class GpuMachine:
    """One instance type's GPUs and fast network."""

    gpu: str
    """The GPU model (a key of GPU_TFLOPS)."""
    gpus: int
    """GPUs per machine."""
    gpu_memory_gib: int
    """Memory per GPU."""
    efa_interfaces: int = 0
    """EFA interfaces the type takes (one per network card that supports EFA); 0: none."""

    @property
    def tflops(self) -> float:
        """Dense bf16 TFLOPS of one GPU."""
        return GPU_TFLOPS[self.gpu]

    @property
    def kind(self) -> str:
        """What must agree across a run's types: `8 x H100 80 GiB`."""
        return f"{self.gpus} x {self.gpu} {self.gpu_memory_gib} GiB"


def _family(gpu: str, memory: int, sizes: dict[str, tuple[int, int]]) -> dict[str, GpuMachine]:
    """`sizes`: instance type -> (GPUs, EFA interfaces)."""
    return {t: GpuMachine(gpu, gpus, memory, efa) for t, (gpus, efa) in sizes.items()}


MACHINES: dict[str, GpuMachine] = {
    **_family("T4", 16, {"g4dn.xlarge": (1, 0), "g4dn.2xlarge": (1, 0), "g4dn.4xlarge": (1, 0),
                         "g4dn.8xlarge": (1, 1), "g4dn.16xlarge": (1, 1),
                         "g4dn.12xlarge": (4, 1), "g4dn.metal": (8, 1)}),
    **_family("A10G", 24, {"g5.xlarge": (1, 0), "g5.2xlarge": (1, 0), "g5.4xlarge": (1, 0),
                           "g5.8xlarge": (1, 1), "g5.16xlarge": (1, 1), "g5.12xlarge": (4, 1),
                           "g5.24xlarge": (4, 1), "g5.48xlarge": (8, 1)}),
    **_family("L4", 24, {"g6.xlarge": (1, 0), "g6.2xlarge": (1, 0), "g6.4xlarge": (1, 0),
                         "g6.8xlarge": (1, 1), "g6.16xlarge": (1, 1), "g6.12xlarge": (4, 1),
                         "g6.24xlarge": (4, 1), "g6.48xlarge": (8, 1)}),
    **_family("L40S", 48, {"g6e.xlarge": (1, 0), "g6e.2xlarge": (1, 0), "g6e.4xlarge": (1, 0),
                           "g6e.8xlarge": (1, 1), "g6e.16xlarge": (1, 1),
                           "g6e.12xlarge": (4, 1), "g6e.24xlarge": (4, 2),
                           "g6e.48xlarge": (8, 4)}),
    **_family("V100", 16, {"p3.2xlarge": (1, 0), "p3.8xlarge": (4, 0), "p3.16xlarge": (8, 0)}),
    **_family("V100", 32, {"p3dn.24xlarge": (8, 1)}),
    **_family("A100", 40, {"p4d.24xlarge": (8, 4)}),
    **_family("A100", 80, {"p4de.24xlarge": (8, 4)}),
    **_family("H100", 80, {"p5.48xlarge": (8, 32)}),
    **_family("H200", 141, {"p5e.48xlarge": (8, 32), "p5en.48xlarge": (8, 16)}),
    **_family("B200", 179, {"p6-b200.48xlarge": (8, 8)}),
}  # fmt: skip
"""The GPU instance types a run may name."""


def unknown_type_problem(instance_type: str) -> str:
    return (
        f"instance type {instance_type!r} is not a GPU type spotrain knows: use one of "
        f"spotrain/core/gpu_types.py, or add its row there from `aws ec2 describe-instance-types "
        f"--instance-types {instance_type}` (GpuInfo, NetworkInfo.EfaInfo)"
    )


def gpu_kind_problems(instance_types: tuple[str, ...], *, mixed_gpus: bool) -> list[str]:
    """Why these types cannot train one synchronous run together: unknown types; types whose
    GPUs per machine or GPU memory differ (a model that fits one may not fit the other); GPU
    models that differ, unless the run allows that mix (every step then runs at the slowest
    GPU)."""
    unknown = [unknown_type_problem(t) for t in instance_types if t not in MACHINES]
    if unknown:
        return unknown
    machines = {t: MACHINES[t] for t in instance_types}
    shapes = {(m.gpus, m.gpu_memory_gib) for m in machines.values()}
    listing = ", ".join(f"{t} ({m.kind})" for t, m in machines.items())
    if len(shapes) > 1:
        return [
            f"instance_types mix GPUs per machine or GPU memory: {listing}; every step runs on "
            "each machine, so keep types with the same GPUs and memory (a model that fits one "
            "may not fit another)"
        ]
    models = {m.gpu for m in machines.values()}
    if len(models) > 1 and not mixed_gpus:
        slowest = slowest_gpu(instance_types)
        return [
            f"instance_types mix GPU models: {listing}; keep one model, or set mixed_gpus = "
            f"true to allow the mix (every step then runs at the slowest GPU, {slowest}, and "
            "the plan prices it so)"
        ]
    return []


def slowest_gpu(instance_types: tuple[str, ...]) -> str:
    """The slowest GPU model among known types."""
    return min((MACHINES[t] for t in instance_types if t in MACHINES), key=lambda m: m.tflops).gpu


def mix_slowdown(instance_types: tuple[str, ...]) -> float:
    """How much longer a run's work takes on a mix than on its first (preferred) type alone:
    a synchronous step waits for the slowest GPU. 1.0 for one GPU model."""
    known = [MACHINES[t] for t in instance_types if t in MACHINES]
    if not known:
        return 1.0
    return known[0].tflops / min(m.tflops for m in known)


def efa_interfaces(instance_type: str) -> int:
    """EFA interfaces `instance_type` takes (0: none, or not a type known here)."""
    machine = MACHINES.get(instance_type)
    return machine.efa_interfaces if machine else 0


def efa_everywhere(instance_types: tuple[str, ...]) -> bool:
    """Whether every one of the types takes EFA."""
    return bool(instance_types) and all(efa_interfaces(t) > 0 for t in instance_types)


METAL_VCPUS = {"g4dn.metal": 96}
"""vCPUs of the bare-metal types (every other size's name says its vCPUs: 4 per xlarge)."""


def vcpus(instance_type: str) -> int:
    """The vCPUs of a GPU type, what AWS's instance quotas count: 4 per `xlarge` of its size
    (`g5.12xlarge`: 48, `p5.48xlarge`: 192), as AWS sizes every family here."""
    if instance_type in METAL_VCPUS:
        return METAL_VCPUS[instance_type]
    size = instance_type.rsplit(".", 1)[-1]
    units = size.removesuffix("xlarge")
    if size == units or not (units == "" or units.isdigit()):
        raise ValueError(unknown_type_problem(instance_type))
    return 4 * int(units or 1)


@dataclass(frozen=True)
class InstanceQuota:
    """One of AWS's per-region vCPU quotas for GPU machines (Service Quotas, service `ec2`)."""

    key: str
    """How an environment's ceilings name it: `<market>/<class>`, e.g. `spot/P5`."""
    code: str
    """The quota's code (`aws service-quotas get-service-quota --service-code ec2
    --quota-code CODE`)."""
    name: str


INSTANCE_QUOTAS: dict[str, InstanceQuota] = {q.key: q for q in (
    InstanceQuota(f"{SPOT}/G and VT", "L-3819A6DF", "All G and VT Spot Instance Requests"),
    InstanceQuota(f"{SPOT}/P", "L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    InstanceQuota(f"{SPOT}/P5", "L-C4BD4855", "All P5 Spot Instance Requests"),
    InstanceQuota(f"{ON_DEMAND}/G and VT", "L-DB2E81BA",
                  "Running On-Demand G and VT instances"),
    InstanceQuota(f"{ON_DEMAND}/P", "L-417A185B", "Running On-Demand P instances"),
)}  # fmt: skip
"""The quotas a run's machines count against, by market and instance class."""


def quota_key(instance_type: str, market: str) -> str:
    """The quota (`INSTANCE_QUOTAS`) a machine of `instance_type` in `market` (spot or
    on-demand) counts against."""
    family = instance_type.split(".", 1)[0]
    if family.startswith("g"):
        kind = "G and VT"
    elif market == SPOT and family.startswith(("p5", "p6")):
        # AWS counts P5 spot apart from the older P families; its table names no P6 quota
        # yet, so P6 is counted with P5 until it does.
        kind = "P5"
    else:
        kind = "P"
    return f"{market}/{kind}"
