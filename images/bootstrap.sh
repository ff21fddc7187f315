#!/bin/bash
# Starts training on boot (run by spotrain-trainer.service). The launch template's user data
# wrote the run's coordinates to /etc/spotrain/run.env; this script reads the instance's own
# facts from the metadata service (IMDSv2 only), fetches the run's newest training
# configuration from the checkpoint bucket (`spotrain config put` stores it there), then runs
# `spotrain train` in the baked container with every machine-specific setting passed as --set
# overrides of that configuration. A restarted machine runs the same command and resumes from
# the catalog.
#
# Settings (run.env or the environment):
#   SPOTRAIN_RUN, SPOTRAIN_REGION, SPOTRAIN_BUCKET, SPOTRAIN_CATALOG_TABLE, SPOTRAIN_KMS_KEY_ID
#                                 required: the run and where its checkpoints go
#   SPOTRAIN_EVENTS_TABLE         the run's fleet state: a run held after repeated crashes does
#                                 not start, and each exit is accounted (crash or preemption)
#   SPOTRAIN_CONFIG               a training configuration file to use instead of the run's
#                                 newest stored one (default: fetched from the bucket)
#   SPOTRAIN_NNODES               machines in the run: N or MIN:MAX (default 1; the user data
#                                 gives the fleet's sizes)
#   SPOTRAIN_RDZV_ENDPOINT        HOST:PORT of the rendezvous; default: the run's coordinator
#                                 from the fleet state (an on-demand machine claims the role,
#                                 the others wait for it up to SPOTRAIN_COORDINATOR_WAIT s)
#   SPOTRAIN_RDZV_PORT            port the coordinator hosts the rendezvous on (default 29400)
#   SPOTRAIN_RDZV_LAST_CALL       seconds the rendezvous waits for more machines once the
#                                 fewest it needs have come (default 30)
#   SPOTRAIN_WORK_DIR             fast local disk for shards before upload (default /mnt/spotrain)
#   SPOTRAIN_IMAGE                the image the run pins, REPOSITORY@sha256:DIGEST (the launch
#                                 template writes it); pulled from the environment's registry
#                                 when the machine image does not carry it. Default: the one
#                                 baked in (spotrain.pkr.hcl)
#   SPOTRAIN_CONTAINER_RUNTIME    docker (default) or none (run spotrain from PATH)
#   SPOTRAIN_EFA_DEVICES          where the machine's EFA devices are (default /dev/infiniband):
#                                 each is handed to the container, with libfabric's EFA
#                                 provider selected for NCCL
#   SPOTRAIN_IMDS_ENDPOINT        metadata service (default http://169.254.169.254)
#   SPOTRAIN_RUN_ENV              the settings file (default /etc/spotrain/run.env)
#   SPOTRAIN_LOG_GROUP            CloudWatch log group for this script's and the trainer's
#                                 output, a stream per instance (default: the journal only)
set -euo pipefail

RUN_ENV=${SPOTRAIN_RUN_ENV:-/etc/spotrain/run.env}
if [[ -f "$RUN_ENV" ]]; then
  set -a
  # shellcheck source=/dev/null
  source "$RUN_ENV"
  set +a
fi

IMDS=${SPOTRAIN_IMDS_ENDPOINT:-http://169.254.169.254}
CONFIG=${SPOTRAIN_CONFIG:-}
NNODES=${SPOTRAIN_NNODES:-1}
WORK_DIR=${SPOTRAIN_WORK_DIR:-/mnt/spotrain}
# The trainer's own: a move checked at boot (fleet may-start) leaves the checkpoint there for it.
TRAINER_WORK_DIR=$WORK_DIR/work
RUNTIME=${SPOTRAIN_CONTAINER_RUNTIME:-docker}
BAKED_IMAGE=spotrain-trainer:baked # core.image_reference.BAKED_IMAGE
IMAGE=${SPOTRAIN_IMAGE:-$BAKED_IMAGE}

fail() {
  echo "spotrain bootstrap: $*" >&2
  exit 2
}

missing=()
for name in SPOTRAIN_RUN SPOTRAIN_REGION SPOTRAIN_BUCKET SPOTRAIN_CATALOG_TABLE SPOTRAIN_KMS_KEY_ID; do
  [[ -n "${!name:-}" ]] || missing+=("$name")
done
if ((${#missing[@]})); then
  fail "missing ${missing[*]}: the launch template's user data writes them to $RUN_ENV (redeploy the run's stack, <env>-run-<run>)"
fi
[[ -z "$CONFIG" || -f "$CONFIG" ]] || fail "training configuration $CONFIG (SPOTRAIN_CONFIG) not found"
if [[ "$NNODES" != "1" && -z "${SPOTRAIN_RDZV_ENDPOINT:-}" && -z "${SPOTRAIN_EVENTS_TABLE:-}" ]]; then
  fail "SPOTRAIN_NNODES=$NNODES needs SPOTRAIN_RDZV_ENDPOINT=HOST:PORT or the run's fleet state (SPOTRAIN_EVENTS_TABLE) to find the coordinator"
fi

# IMDSv2: a session token first; the instance refuses token-less reads (http_tokens=required).
token=$(curl -sf -X PUT "$IMDS/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300") ||
  fail "metadata service $IMDS unreachable: is this an EC2 instance with IMDS enabled?"
metadata() { curl -sf -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"; }
instance_id=$(metadata instance-id)
instance_type=$(metadata instance-type)
zone=$(metadata placement/availability-zone)
lifecycle=$(metadata instance-life-cycle || echo on-demand)
address=$(metadata local-ipv4)

mkdir -p "$WORK_DIR"
export AWS_REGION=$SPOTRAIN_REGION AWS_DEFAULT_REGION=$SPOTRAIN_REGION
if [[ -z "$CONFIG" ]]; then
  CONFIG=$WORK_DIR/train.json
  fetch_config=1
fi
# The machine's EFA devices (the launch template attaches EFA interfaces on types that take
# them): the container gets each, locked memory for its queues, and NCCL uses them through
# libfabric's EFA provider (the image carries the aws-ofi-nccl plugin).
efa=()
for device in "${SPOTRAIN_EFA_DEVICES:-/dev/infiniband}"/uverbs*; do
  [[ -e "$device" ]] && efa+=(--device "$device")
done
((${#efa[@]} == 0)) || efa+=(--ulimit memlock=-1:-1 -e FI_PROVIDER=efa)
# spotrain, in the baked container or from PATH.
# The command that runs spotrain ARGS here, in `to_run`: in the baked container or from PATH.
spotrain_command() {
  case "$RUNTIME" in
    docker)
      # Host networking: the ranks rendezvous across machines and IMDS stays one hop away
      # (the launch template's hop limit is 1).
      mounts=(-v "$WORK_DIR:$WORK_DIR")
      [[ "$CONFIG" == "$WORK_DIR"/* ]] || mounts+=(-v "$CONFIG:$CONFIG:ro")
      # DeepSpeed compiles the ops a run's memory options need (CPU Adam, async I/O) for this
      # machine's CPU at first use; on the work disk they outlive the container. Docker's
      # client passes a SIGTERM it gets to the container's init, which passes it to spotrain.
      to_run=(docker run --rm -i --gpus all --network host --ipc host --init
        --stop-signal SIGTERM --stop-timeout 110 "${efa[@]}"
        -e AWS_REGION -e AWS_DEFAULT_REGION -e TORCH_EXTENSIONS_DIR="$WORK_DIR/torch_extensions"
        "${mounts[@]}"
        "$IMAGE" "$@")
      ;;
    none)
      to_run=("$@")
      ;;
    *)
      fail "SPOTRAIN_CONTAINER_RUNTIME=$RUNTIME: use docker or none"
      ;;
  esac
}
spotrain_run() {
  spotrain_command "$@"
  "${to_run[@]}"
}

# The image the run pins, pulled unless the machine image carries it (Docker's ECR credential
# helper logs in with the instance role, through the registry's endpoints). A machine that
# cannot pull it trains nothing: it reports the failure with the baked image's spotrain and
# counts as a crash before its first step, so its group replaces it and a run whose image
# cannot be had anywhere is held after a few crashes.
status=0
failure=
if [[ "$RUNTIME" == docker && "$IMAGE" != "$BAKED_IMAGE" ]] &&
  ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "spotrain bootstrap: pulling the run's image $IMAGE"
  if ! pulled=$(docker pull --quiet "$IMAGE" 2>&1); then
    failure="its image $IMAGE could not be pulled (${pulled//$'\n'/ }): is it in the environment's registry? \`spotrain image build\` pushes it"
    IMAGE=$BAKED_IMAGE
    status=2
  fi
fi

# From here on everything printed, the trainer's output included, also goes to the run's log
# group (a stream per machine): a reclaimed machine's output outlives it. The journal keeps its
# copy. On exit the shipper gets the end of its input, sends the rest and is waited for; if it
# cannot run, `cat` keeps the output flowing to the journal (shipping never stops training).
if [[ -n "${SPOTRAIN_LOG_GROUP:-}" ]]; then
  exec > >(spotrain_run spotrain logs ship --group "$SPOTRAIN_LOG_GROUP" --stream "$instance_id" --echo || cat) 2>&1
  shipper=$!
  trap 'exec >&- 2>&-; wait "$shipper" || true' EXIT
fi
echo "spotrain bootstrap: $instance_id ($instance_type in $zone, $lifecycle) joins run $SPOTRAIN_RUN"
[[ -z "$failure" ]] || echo "spotrain bootstrap: $instance_id cannot train: $failure" >&2

# The machine is being stopped (a spot reclaim, `spotrain run cancel`, a scale-in): the service
# manager sends SIGTERM to this script alone (KillMode=mixed), which passes it on once to the
# processes it started (its process group: torchrun, or Docker's client, which passes it into
# the container; the log shipper ignores it). torchrun passes it to each rank alone (the ranks
# run in sessions of their own, with their DataLoader workers), and every rank publishes its
# emergency checkpoint while its helpers go on serving it. This script stays to the end, so
# the exit is accounted as a stop, not a crash, and a coordinator gives up its role for the
# run's next machine.
asked_to_stop=
child= # the long step running now (stoppable)
on_stop() {
  asked_to_stop=1
  echo "spotrain bootstrap: $instance_id is asked to stop (SIGTERM); its trainer publishes its emergency checkpoint"
  [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true
}
trap on_stop TERM
# Runs spotrain ARGS as a long step a stop reaches: its process is this script's child, waited
# for (a trapped signal interrupts `wait`, where a command in the foreground would hold the
# trap back until it ended). A machine asked to stop starts no new step.
stoppable() {
  [[ -z "$asked_to_stop" ]] || return 143
  spotrain_command "$@"
  "${to_run[@]}" &
  child=$!
  local code=0
  wait "$child" || code=$?
  while kill -0 "$child" 2>/dev/null; do # the wait was interrupted by the stop: wait on
    code=0
    wait "$child" || code=$?
  done
  child=
  return "$code"
}

# Crash accounting in the run's fleet state: a run held after repeated crashes does not start
# (no restart loop on any machine); an exit of a machine being interrupted is a preemption.
fleet=()
if [[ -n "${SPOTRAIN_EVENTS_TABLE:-}" ]]; then
  fleet=(spotrain fleet --events-table "$SPOTRAIN_EVENTS_TABLE" --run "$SPOTRAIN_RUN")
  # A move this region's handler ordered (the run's region stopped answering) is claimed here
  # first: the run's next epoch, from its newest checkpoint whose every piece replicated.
  ((status)) || stoppable "${fleet[@]}" may-start --instance "$instance_id" \
    --store "s3://$SPOTRAIN_BUCKET" --catalog-table "$SPOTRAIN_CATALOG_TABLE" \
    --kms-key-id "$SPOTRAIN_KMS_KEY_ID" --work-dir "$TRAINER_WORK_DIR" || exit 3
fi
# Several machines meet at the run's coordinator: the first on-demand machine claims the role
# (and renews it while it runs); the others, spot ones included, wait for it.
heartbeat=
rdzv_host=  # with SPOTRAIN_RDZV_ENDPOINT given, torch decides from the endpoint's address
if ((status == 0)) && [[ "$NNODES" != "1" && -z "${SPOTRAIN_RDZV_ENDPOINT:-}" ]]; then
  rdzv_host=--no-rdzv-host
  port=${SPOTRAIN_RDZV_PORT:-29400}
  claim=("${fleet[@]}" coordinator --claim --instance "$instance_id" --address "$address" --port "$port")
  if [[ "$lifecycle" != "spot" ]] && SPOTRAIN_RDZV_ENDPOINT=$(spotrain_run "${claim[@]}"); then
    echo "spotrain bootstrap: $instance_id coordinates run $SPOTRAIN_RUN at $SPOTRAIN_RDZV_ENDPOINT"
    rdzv_host=--rdzv-host
    # Renewed in the background; stopped between renewals (a signal ends `wait` at once but
    # lets a renewal finish), so none lands after the role is given up. Its pause goes with it:
    # left behind, the service would not end until the pause did (up to a period, billed).
    (
      trap 'kill "$pause" 2>/dev/null; exit 0' TERM
      while true; do
        sleep "${SPOTRAIN_COORDINATOR_HEARTBEAT:-60}" &
        pause=$!
        wait "$pause" || true
        spotrain_run "${claim[@]}" >/dev/null || exit
      done
    ) &
    heartbeat=$!
  else
    stoppable "${fleet[@]}" coordinator --wait "${SPOTRAIN_COORDINATOR_WAIT:-600}" \
      >"$WORK_DIR/coordinator" || exit 2
    SPOTRAIN_RDZV_ENDPOINT=$(<"$WORK_DIR/coordinator")
    echo "spotrain bootstrap: run $SPOTRAIN_RUN meets at $SPOTRAIN_RDZV_ENDPOINT"
  fi
fi

train=(spotrain train "$CONFIG"
  --set "run=$SPOTRAIN_RUN"
  --set "store=s3://$SPOTRAIN_BUCKET"
  --set "catalog_table=$SPOTRAIN_CATALOG_TABLE"
  --set "kms_key_id=$SPOTRAIN_KMS_KEY_ID"
  --set "work_dir=$TRAINER_WORK_DIR"
  --set "spot_notice_endpoint=$IMDS"
  --nnodes "$NNODES")
if [[ "$NNODES" != "1" ]]; then
  train+=(--rdzv-endpoint "$SPOTRAIN_RDZV_ENDPOINT" --rdzv-id "$SPOTRAIN_RUN"
    --rdzv-last-call "${SPOTRAIN_RDZV_LAST_CALL:-30}")
  [[ -z "$rdzv_host" ]] || train+=("$rdzv_host")
fi
if [[ -n "${SPOTRAIN_NPROC_PER_NODE:-}" ]]; then
  train+=(--nproc-per-node "$SPOTRAIN_NPROC_PER_NODE")
fi

first_step=$WORK_DIR/work/.spotrain-first-step # membership.FIRST_STEP_MARKER: a step was trained
failure_note=$WORK_DIR/work/.spotrain-failure  # membership.FAILURE_NOTE: why it could not train
rm -f "$first_step" "$failure_note"            # this start has trained nothing yet
if ((status == 0)) && [[ -n "${fetch_config:-}" ]]; then
  stoppable spotrain config get --store "s3://$SPOTRAIN_BUCKET" --run "$SPOTRAIN_RUN" \
    --to "$CONFIG" || status=$?
fi
((status)) || stoppable "${train[@]}" || status=$?
if [[ -n "$heartbeat" ]]; then
  kill "$heartbeat" 2>/dev/null || true
  wait "$heartbeat" 2>/dev/null || true
  spotrain_run "${fleet[@]}" coordinator --release --instance "$instance_id" || true
fi
if ((${#fleet[@]})); then
  # A machine that got its own spot notice says so: whatever its trainer's exit, it was
  # reclaimed, not a crash (the handler's event may come later, or not at all).
  exit_facts=()
  if token=$(curl -sf -X PUT "$IMDS/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60") &&
    notice=$(metadata spot/instance-action); then
    exit_facts=(--spot-notice "$notice" --pool "$instance_type#$zone")
  fi
  [[ -z "$asked_to_stop" ]] || exit_facts+=(--asked-to-stop)
  if [[ -s "$failure_note" ]]; then
    exit_facts+=(--reason "$(head -c 1000 "$failure_note")")
  elif [[ -n "$failure" ]]; then
    exit_facts+=(--reason "$failure")
  fi
  verdict=0
  spotrain_run "${fleet[@]}" exit --instance "$instance_id" --code "$status" "${exit_facts[@]}" || verdict=$?
  if ((verdict == 5)) && [[ ! -e "$first_step" ]]; then
    # The trainer crashed before it trained a step: this machine
    # may be what is wrong, so its group replaces it instead of it idling, billed. A run that
    # crashes everywhere is held after a few crashes and its groups go to 0.
    spotrain_run "${fleet[@]}" unhealthy --instance "$instance_id" \
      --reason "${failure:-trainer exited $status before its first step}" || true
  fi
  ((verdict == 3)) && status=3
fi
exit "$status"
