#!/usr/bin/env bash
# GRPO training of Qwen3-8B on DAPO-math with a Python tool: slime (Megatron + SGLang) driving the
# strands_slime agent rollout. Every path and size is an environment variable: see --help and
# docs/training.md. `python3 -m strands_slime.launch` (strands_slime/launch/) reads and checks the
# settings and inputs and builds every command; a dry run ends there. This script then runs the
# processes: Ray on this node (the head on rank 0, a worker elsewhere), detaching, signals and PID
# files, the job's supervisor on rank 0 and a worker's rejoining.
#
# The whole script is one block that ends in `exit`: bash reads all of it before running any of it,
# so changing this file (a `git pull`) while a launcher supervises a weeks-long job cannot change
# what that launcher runs (bash otherwise reads a script as it goes, at byte offsets).
# shellcheck disable=SC2153,SC2154  # the plan's variables, assigned by eval
{
set -euo pipefail

SCRIPT_NAME=$(basename -- "${BASH_SOURCE[0]}")
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
# shellcheck source=scripts/lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
STRANDS_SLIME_DIR="${STRANDS_SLIME_DIR:-$REPO_ROOT}"

strands_python() {
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"
}

# ---------------------------------------------------------------- the plan
# The launch's own Python comes from this checkout (from STRANDS_SLIME_DIR where this one has no
# package). It prints to the terminal and writes the plan, bash assignments, to fd 3; it exits 1
# with one `error:` line for a wrong setting or all the missing inputs, before anything starts.
USER_PYTHONPATH="${PYTHONPATH:-}"
exec 4>&1
plan=$(PYTHONPATH="$REPO_ROOT:$STRANDS_SLIME_DIR${USER_PYTHONPATH:+:$USER_PYTHONPATH}" python3 -m strands_slime.launch \
    --script "$SCRIPT_DIR/$SCRIPT_NAME" --pythonpath "$USER_PYTHONPATH" --plan-fd 3 "$@" 3>&1 1>&4) || exit
exec 4>&-
eval "$plan"
[[ "$LAUNCH" == run ]] || exit 0 # --help, --dry-run

# ---------------------------------------------------------------- processes this launch owns
# NODE_DIR ($RUN_DIR/node<rank>) holds this node's logs and, on rank 0, the run's state, and records
# the PIDs this launch started: the launcher itself, its `ray start --block` process, whose SIGTERM
# handler stops exactly the Ray processes of that node, and a pilot's GPU sampler. Nothing else on
# the machine is ever signalled.
LAUNCHER_PID_FILE="$NODE_DIR/launcher.pid"
RAY_PID_FILE="$NODE_DIR/ray-node.pid"
SAMPLER_PID_FILE="$NODE_DIR/gpu-sampler.pid"
RAY_LOG_FILE="$NODE_DIR/ray-node.log"
STATE_FILE="$NODE_DIR/state.json"
RAY_NODE_PID="" JOB_ID="" SUPERVISOR_PID="" SAMPLER_PID="" RUNTIME_ENV_FILE=""

# pid_alive PID PATTERN: PID runs and its command line contains PATTERN (guards against PID reuse;
# a zombie has an empty command line and counts as gone).
pid_alive() {
    local pid="$1" pattern="$2" cmdline
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
    [[ "$cmdline" == *"$pattern"* ]]
}

# stop_pid PID PATTERN WHAT [SECONDS [SIGNAL]]: SIGNAL (TERM), then SIGKILL after SECONDS (RAY_STOP_TIMEOUT).
stop_pid() {
    local pid="$1" pattern="$2" what="$3" deadline=$((SECONDS + ${4:-$RAY_STOP_TIMEOUT}))
    pid_alive "$pid" "$pattern" || return 0
    log "stopping $what (PID $pid)"
    kill "-${5:-TERM}" "$pid" 2>/dev/null || return 0
    while pid_alive "$pid" "$pattern"; do
        if ((SECONDS >= deadline)); then
            log "$what (PID $pid) still running after ${RAY_STOP_TIMEOUT}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            return 0
        fi
        nap 0.2
    done
}

recorded_pid() {
    local pid=""
    [[ -f "$1" ]] && read -r pid <"$1"
    printf '%s' "$pid"
}

# Refuse (or, with KILL_STALE=1 and stop=1, stop) what an earlier launch from NODE_DIR left running.
check_previous_launch() {
    local stop="$1" launcher ray_node
    launcher=$(recorded_pid "$LAUNCHER_PID_FILE")
    ray_node=$(recorded_pid "$RAY_PID_FILE")
    if [[ -n "$launcher" && "$launcher" != "$$" ]] && pid_alive "$launcher" "$SCRIPT_NAME"; then
        ((KILL_STALE)) ||
            die "a launch of this script is still running on this node (PID $launcher, RUN_DIR $RUN_DIR): kill -TERM $launcher, or set KILL_STALE=1"
        ((stop)) && stop_pid "$launcher" "$SCRIPT_NAME" "the earlier launch (KILL_STALE=1)"
    fi
    if [[ -n "$ray_node" ]] && pid_alive "$ray_node" "ray start"; then
        ((KILL_STALE)) ||
            die "the Ray node an earlier launch started is still running (PID $ray_node, RUN_DIR $RUN_DIR): kill -TERM $ray_node, or set KILL_STALE=1"
        ((stop)) && stop_pid "$ray_node" "ray start" "the earlier launch's Ray node (KILL_STALE=1)"
    fi
    return 0
}

# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
    local status=$?
    set +e # every step of the clean-up runs, whatever an earlier one returned
    trap - EXIT HUP INT TERM
    # The supervisor stops the job it submitted (and records why) before this launch stops its Ray
    # node; it gets the signal this launcher got, so that state.json names it.
    if [[ -n "$SUPERVISOR_PID" ]]; then
        stop_pid "$SUPERVISOR_PID" "launch.supervisor" "the job's supervisor" "$((2 * RAY_STATUS_TIMEOUT + 60))" \
            "$( ((status > 128)) && echo $((status - 128)) || echo 15)"
    fi
    if [[ -n "$SAMPLER_PID" ]]; then
        stop_pid "$SAMPLER_PID" "gpu_sampler" "the GPU sampler"
        rm -f -- "$SAMPLER_PID_FILE"
    fi
    if ((NODE_RANK == 0)); then
        reason="the launcher stopped (exit status $status)"
        ((status > 128)) && reason="the launcher stopped by signal $((status - 128)) (exit status $status)"
        [[ -f "$STATE_FILE" ]] && strands_python -m strands_slime.launch.supervisor mark-stopped \
            --state-file "$STATE_FILE" --reason "$reason"
        ((NUM_NODES > 1)) && [[ -f "$HEAD_MARKER" ]] && write_head_marker ended
    fi
    # The supervisor records the head it started again, if it had to.
    [[ -n "$RAY_NODE_PID" ]] && RAY_NODE_PID=$(recorded_pid "$RAY_PID_FILE")
    if [[ -n "$RAY_NODE_PID" ]] && ((KEEP_RAY)); then
        log "KEEP_RAY=1: the Ray node keeps running (PID $RAY_NODE_PID; stop it with kill -TERM $RAY_NODE_PID)"
    elif [[ -n "$RAY_NODE_PID" ]]; then
        stop_pid "$RAY_NODE_PID" "ray start" "the Ray node this launch started"
        rm -f -- "$RAY_PID_FILE"
    fi
    [[ -n "$RUNTIME_ENV_FILE" ]] && rm -f -- "$RUNTIME_ENV_FILE"
    [[ "$(recorded_pid "$LAUNCHER_PID_FILE")" == "$$" ]] && rm -f -- "$LAUNCHER_PID_FILE"
    exit "$status"
}

# poll_delay DEADLINE MAX: seconds to sleep before the next poll, never past the deadline.
poll_delay() {
    local remaining=$(($1 - SECONDS))
    if ((remaining < 1)); then echo 1; elif ((remaining < $2)); then echo "$remaining"; else echo "$2"; fi
}

# nap SECONDS: sleep in the background and wait, so a signal runs the trap at once.
nap() {
    sleep "$1" &
    wait "$!" || true
}

ray_is_up() {
    ray status --address "$MASTER_ADDR:$RAY_PORT" >/dev/null 2>&1
}

# Ray token authentication (RAY_AUTH_ENABLED, decided by the plan from the installed Ray): the head
# writes the token once into SAVE_DIR (mode 600; every node shares SAVE_DIR). RAY_AUTH_MODE and
# RAY_AUTH_TOKEN_PATH reach this node's Ray processes through the environment of `ray start`, like
# the W&B key, and are scrubbed from the sandbox's environment.
setup_ray_auth() {
    ((RAY_AUTH_ENABLED)) || return 0
    if [[ ! -s "$RAY_AUTH_TOKEN_FILE" ]]; then
        ((NODE_RANK == 0)) ||
            die "RAY_AUTH_TOKEN_FILE ($RAY_AUTH_TOKEN_FILE) is missing: the head writes it into SAVE_DIR, which every node must share"
        mkdir -p -- "$(dirname -- "$RAY_AUTH_TOKEN_FILE")"
        (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >"$RAY_AUTH_TOKEN_FILE")
    fi
    local mode
    mode=$(stat -c %a -- "$RAY_AUTH_TOKEN_FILE")
    (((8#$mode & 8#077) == 0)) ||
        die "RAY_AUTH_TOKEN_FILE ($RAY_AUTH_TOKEN_FILE) is readable by others (mode $mode); chmod 600 it"
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$RAY_AUTH_TOKEN_FILE"
    log "Ray token authentication on (Ray $RAY_VERSION, token in $RAY_AUTH_TOKEN_FILE)"
}

# run_preflight [--ray-version V] [--wandb-key-required]: this node's GPUs, Ray, W&B key, router
# options, writable shared folders and sandbox isolation (strands_slime.launch.preflight).
run_preflight() {
    local verdict
    verdict=$(strands_python -m strands_slime.launch.preflight "${PREFLIGHT_ARGS[@]}" "$@" 2>&1) || {
        printf '%s\n' "$verdict" | sed 's/^preflight error: /  - /' >&2
        die "preflight failed on rank $NODE_RANK ($NODE_IP): see the lines above"
    }
    log "$verdict"
}

# start_ray_node: `ray start ... --block` in its own session (terminal signals reach only this
# launcher, which decides what stops), with its own log (a node kept with KEEP_RAY=1 outlives this
# launcher and its terminal), recorded in RAY_PID_FILE.
start_ray_node() {
    print_cmd "${RAY_NODE_CMD[@]}" >&2
    setsid "${RAY_NODE_CMD[@]}" </dev/null >>"$RAY_LOG_FILE" 2>&1 &
    RAY_NODE_PID=$!
    printf '%s\n' "$RAY_NODE_PID" >"$RAY_PID_FILE"
}

# wait_until_head_is_up WHAT: poll the head until it answers; give up if our own `ray start` died.
wait_until_head_is_up() {
    local deadline=$((SECONDS + RAY_WAIT_TIMEOUT))
    until ray_is_up; do
        if [[ -n "$RAY_NODE_PID" ]] && ! pid_alive "$RAY_NODE_PID" "ray start"; then
            RAY_NODE_PID=""
            die "ray start exited before the head came up; see $RAY_LOG_FILE"
        fi
        ((SECONDS < deadline)) || die "no Ray head at $MASTER_ADDR:$RAY_PORT after ${RAY_WAIT_TIMEOUT}s; $1"
        log "waiting for the Ray head at $MASTER_ADDR:$RAY_PORT"
        nap "$(poll_delay "$deadline" "$RAY_POLL_INTERVAL")"
    done
}

# SAVE_DIR must be one directory for every node (Megatron's ranks write their shards of a
# checkpoint from every node). The head writes a marker naming itself, the time, whether its run
# goes on, its Ray version and whether it logs to W&B; a worker that does not see a fresh marker for
# the same head is looking at a different filesystem, and checks its own Ray and W&B key against it.
write_head_marker() {
    mkdir -p -- "$SAVE_DIR"
    printf '%s:%s %s %s %s %s\n' "$MASTER_ADDR" "$RAY_PORT" "$(date +%s)" "$1" "$RAY_VERSION" "$HAS_WANDB" \
        >"$HEAD_MARKER.tmp"
    mv -f -- "$HEAD_MARKER.tmp" "$HEAD_MARKER"
}

# read_head_marker: HEAD_STATE, HEAD_RAY_VERSION, HEAD_HAS_WANDB from the marker (empty if none).
read_head_marker() {
    HEAD_ADDRESS="" HEAD_WRITTEN=0 HEAD_STATE="" HEAD_RAY_VERSION="" HEAD_HAS_WANDB=0
    [[ -f "$HEAD_MARKER" ]] || return 0
    read -r HEAD_ADDRESS HEAD_WRITTEN HEAD_STATE HEAD_RAY_VERSION HEAD_HAS_WANDB <"$HEAD_MARKER" || true
    [[ "$HEAD_WRITTEN" =~ ^[0-9]+$ ]] || HEAD_WRITTEN=0
}

# wait_for_head_marker: a fresh marker of this run's head, whose run goes on, appears in SAVE_DIR
# within RAY_WAIT_TIMEOUT (the head writes it before it starts Ray, and before its auth token).
wait_for_head_marker() {
    local deadline=$((SECONDS + RAY_WAIT_TIMEOUT))
    while :; do
        read_head_marker
        if [[ "$HEAD_ADDRESS" == "$MASTER_ADDR:$RAY_PORT" && "$HEAD_STATE" == running ]] &&
            (($(date +%s) - HEAD_WRITTEN <= RAY_WAIT_TIMEOUT + 60)); then
            return 0
        fi
        ((SECONDS < deadline)) ||
            die "SAVE_DIR ($SAVE_DIR) is not shared with the head: no fresh $HEAD_MARKER from $MASTER_ADDR:$RAY_PORT here within ${RAY_WAIT_TIMEOUT}s (start rank 0 too); put SAVE_DIR on a filesystem every node mounts at the same path"
        log "waiting for the head's marker $HEAD_MARKER"
        nap "$(poll_delay "$deadline" "$RAY_POLL_INTERVAL")"
    done
}

# start_gpu_sampler: a pilot's nvidia-smi sampling on this node, into the shared PILOT_DIR.
start_gpu_sampler() {
    mkdir -p -- "$PILOT_DIR"
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" setsid "${SAMPLER_CMD[@]}" </dev/null \
        >>"$NODE_DIR/gpu-sampler.log" 2>&1 &
    SAMPLER_PID=$!
    printf '%s\n' "$SAMPLER_PID" >"$SAMPLER_PID_FILE"
}

# supervise: submit train.py and supervise it (strands_slime.launch.supervisor): Ray's job state, never
# the submit client's exit code; the old job stopped before any resubmit; the nodes waited for; a
# progress watchdog; restarts within a window. The run's state goes to STATE_FILE.
supervise() {
    RUNTIME_ENV_FILE=$(mktemp "$NODE_DIR/runtime-env.XXXXXX")
    printf '%s\n' "$RUNTIME_ENV" >"$RUNTIME_ENV_FILE"
    local cmd=("${SUPERVISOR_CMD[@]}" --runtime-env "$RUNTIME_ENV_FILE")
    if [[ -n "$RAY_NODE_PID" ]]; then # this launch started the head: the supervisor may start it again
        cmd+=(--head-command "$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${RAY_NODE_CMD[@]}")"
            --head-pid-file "$RAY_PID_FILE" --head-log "$RAY_LOG_FILE")
    fi
    log "supervising the job (dashboard: http://$RAY_DASHBOARD_HOST:$RAY_DASHBOARD_PORT; state: $STATE_FILE)"
    print_cmd "${SUBMIT_CMD[@]}" --runtime-env "$RUNTIME_ENV_FILE" -- "${TRAIN_CMD[@]}" >&2
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" "${cmd[@]}" -- "${TRAIN_CMD[@]}" </dev/null &
    SUPERVISOR_PID=$!
    # `wait` (not a foreground child) so a signal runs the trap at once.
    local status=0
    wait "$SUPERVISOR_PID" || status=$?
    SUPERVISOR_PID=""
    JOB_ID=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("job_id", ""))' "$STATE_FILE" 2>/dev/null || true)
    return "$status"
}

# analyze_pilot: measure what the pilot wrote and project the full run (pilot.json, pilot.md).
analyze_pilot() {
    local samples=("$PILOT_DIR"/gpu-node*.jsonl) status=0
    if [[ -n "$SAMPLER_PID" ]]; then
        stop_pid "$SAMPLER_PID" "gpu_sampler" "the GPU sampler"
        SAMPLER_PID=""
        rm -f -- "$SAMPLER_PID_FILE"
    fi
    [[ -e "${samples[0]}" ]] || samples=()
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" "${ANALYZE_CMD[@]}" --log "$NODE_DIR/job-$JOB_ID.log" \
        --gpu-samples "${samples[@]}" >&2 || status=$?
    if ((!PILOT_KEEP_CHECKPOINT)) && [[ -d "$CHECKPOINT_DIR" ]]; then
        log "removing the pilot's checkpoint ($CHECKPOINT_DIR; PILOT_KEEP_CHECKPOINT=1 keeps it)"
        rm -rf -- "$CHECKPOINT_DIR"
    fi
    log "pilot report: $PILOT_DIR/pilot.md; the run sizes its checkpoints from $PILOT_JSON"
    return "$status"
}

# A pilot starts in a fresh PILOT_DIR; an earlier pilot's folder is kept beside it, renamed.
fresh_pilot_dir() {
    if [[ -d "$PILOT_DIR" ]] && [[ -n "$(ls -A -- "$PILOT_DIR")" ]]; then
        local kept
        kept="$PILOT_DIR.$(date -r "$PILOT_DIR" +%Y%m%d-%H%M%S)"
        mv -- "$PILOT_DIR" "$kept"
        log "the earlier pilot's folder is now $kept"
    fi
    mkdir -p -- "$PILOT_DIR"
}

# ---------------------------------------------------------------- launch
(umask 077 && mkdir -p -- "$NODE_DIR")
[[ -O "$NODE_DIR" ]] || die "RUN_DIR ($NODE_DIR) belongs to another user; set RUN_DIR"
check_previous_launch 0
if ((NODE_RANK == 0 && !REUSE_RAY && !KILL_STALE)) && ray_is_up; then
    die "a Ray cluster is already running at $MASTER_ADDR:$RAY_PORT; use another RAY_PORT, or REUSE_RAY=1 to submit to it"
fi
# The head checks its own node now; a worker checks itself against the head's marker once it sees
# it (in the launcher that stays, after detaching).
((NODE_RANK > 0 || LAUNCH_CHECKED)) || run_preflight

if ((!FOREGROUND)); then
    env LAUNCH_CHECKED=1 setsid bash "$SCRIPT_DIR/$SCRIPT_NAME" "${DETACHED_ARGS[@]}" >>"$LOG_FILE" 2>&1 </dev/null &
    printf '%s\n' "$!" >"$LAUNCHER_PID_FILE"
    log "checks passed; the launch runs in the background as PID $!, in its own session"
    log "log:  tail -f $LOG_FILE"
    ((NODE_RANK == 0)) && log "state: $STATE_FILE"
    log "stop: kill -TERM $! (stops the job and the Ray node it started, nothing else)"
    exit 0
fi

trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
check_previous_launch 1
printf '%s\n' "$$" >"$LAUNCHER_PID_FILE"
if ((NODE_RANK == 0 && !REUSE_RAY && KILL_STALE)) && ray_is_up; then
    die "a Ray cluster this launch did not start is running at $MASTER_ADDR:$RAY_PORT; use another RAY_PORT, or REUSE_RAY=1 to submit to it"
fi

if ((NODE_RANK == 0)); then
    setup_ray_auth
    ((PILOT)) && fresh_pilot_dir
    ((NUM_NODES > 1)) && write_head_marker running
    if ((REUSE_RAY)) && ray_is_up; then
        log "REUSE_RAY=1: submitting to the running Ray cluster (it will be left running)"
        ((HAS_WANDB)) && log "REUSE_RAY=1: its Ray processes must already hold WANDB_API_KEY; this launch does not pass it"
    else
        start_ray_node
        wait_until_head_is_up "ray start did not bring it up"
    fi
    ((PILOT)) && start_gpu_sampler
    mkdir -p -- "$SAVE_DIR"
    status=0
    supervise || status=$?
    if ((PILOT)); then
        analyze_pilot || status=$((status == 0 ? 1 : status))
    fi
    exit "$status"
fi

log "rank $NODE_RANK of $NUM_NODES ($NODE_IP): joining the Ray head at $MASTER_ADDR:$RAY_PORT as a worker"
# A worker follows the head's run: it rejoins after its node exits while the head's marker says
# the run goes on (the head restarted it), and stops when the run is over.
joins=0
while :; do
    joins=$((joins + 1))
    if ((joins == 1)); then
        wait_for_head_marker
        setup_ray_auth
        wait_until_head_is_up "start rank 0 first"
        preflight_args=()
        [[ -n "$HEAD_RAY_VERSION" && "$HEAD_RAY_VERSION" != unknown ]] && preflight_args+=(--ray-version "$HEAD_RAY_VERSION")
        [[ "$HEAD_HAS_WANDB" == 1 ]] && preflight_args+=(--wandb-key-required)
        run_preflight "${preflight_args[@]}"
        ((PILOT)) && start_gpu_sampler
    else
        wait_until_head_is_up "the head did not come back"
    fi
    start_ray_node
    status=0
    wait "$RAY_NODE_PID" || status=$?
    RAY_NODE_PID=""
    rm -f -- "$RAY_PID_FILE"
    read_head_marker
    if [[ "$HEAD_STATE" != running ]]; then
        log "the Ray node exited (status $status) and the head's run is over (${HEAD_STATE:-no state}): this worker stops"
        [[ "$HEAD_STATE" == ended ]] && exit 0
        exit "$status"
    fi
    ((joins <= MAX_RESTARTS)) ||
        die "the Ray node exited $joins times while the head's run goes on (MAX_RESTARTS=$MAX_RESTARTS): this worker gives up"
    log "the Ray node exited (status $status) while the head's run goes on: rejoining"
    nap "$RAY_POLL_INTERVAL"
done
exit
}
