"""The training script's help (``scripts/strands_qwen3_8b.sh --help``): its options and every environment
variable it reads, with the default. :mod:`strands_slime.launch.settings` reads and checks them.
"""

from __future__ import annotations

USAGE = """\
Usage: scripts/strands_qwen3_8b.sh [--pilot] [--dry-run] [--foreground] [-- EXTRA_TRAIN_PY_FLAGS...]

Train Qwen3-8B with slime + strands_slime. Run it on every node: rank 0 starts the Ray head and
submits train.py, other ranks join as Ray workers. Every check runs first, in the terminal; then
the launcher detaches (its own session, immune to a closed terminal) and logs to
$RUN_DIR/node$NODE_RANK/launch.log. On rank 0 it supervises the job from Ray's job state: after a crash
or a hang (WATCHDOG_MINUTES) it stops the job, waits for every node, resubmits from the latest
checkpoint (MAX_RESTARTS within RESTART_WINDOW_HOURS), and records what it does and why in
$RUN_DIR/node0/state.json. `kill -TERM <its PID>` stops the job and the Ray node
this launcher started, nothing else. Flags after `--` are appended to train.py's command line (the
last occurrence of a flag wins).

Options
  --pilot, PILOT=1       first thing to run on a new cluster (on every node, like the run): PILOT_STEPS
                         steps with eval off, measured; writes $PILOT_DIR/pilot.json and pilot.md
                         (step time split, GPU memory per role, SGLang headroom, tokens/s, keep,
                         truncation and abort rates, logprob gap) and projects the full run's time,
                         GPU-hours and disk. The run then checkpoints from the pilot's step time.
  --dry-run, DRY_RUN=1   print the checks' results and the resolved commands; start nothing
  --foreground           stay attached: Ctrl-C, SIGTERM or a closed terminal (SIGHUP) stop the job
  -h, --help             this text

Environment (default). Every path must be absolute and the same on every node.
  PRESET (1x8; 4x8 = four nodes of 8 GPUs, four times the episodes per rollout in four optimizer
  updates of the one-node 128 samples: NUM_NODES 4, ROLLOUT_BATCH_SIZE 64, GLOBAL_BATCH_SIZE 128,
  NUM_ROLLOUT 750; variables you set win)
  SLIME_DIR (/root/slime)  MEGATRON_DIR (/root/Megatron-LM)  STRANDS_SLIME_DIR (this repository)
  MODEL_DIR (/root/models)  HF_CHECKPOINT ($MODEL_DIR/Qwen3-8B)
  REF_LOAD ($MODEL_DIR/Qwen3-8B_torch_dist)  SAVE_DIR (/root/checkpoints/qwen3-8b-strands-slime;
  on a filesystem every node shares when NUM_NODES > 1: checkpoints, TensorBoard, the pilot)
  DATA_DIR (/root/data)  PROMPT_DATA ($DATA_DIR/dapo-math-17k.jsonl)
  EVAL_CONFIG ($STRANDS_SLIME_DIR/configs/eval_aime.yaml; empty: --eval-prompt-data aime $EVAL_DATA)
  EVAL_DATA ($DATA_DIR/aime-2024.jsonl, only with EVAL_CONFIG empty)
  ROLLOUT_CONFIG ($STRANDS_SLIME_DIR/configs/strands_math.yaml)
  NUM_NODES (1)  NODE_RANK (0)  MASTER_ADDR (127.0.0.1; the head's reachable address if NUM_NODES > 1)
  NODE_IP (this node's address: MASTER_ADDR on rank 0, else the source address towards MASTER_ADDR)
  GPUS_PER_NODE (8)  RAY_PORT (6379)  RAY_DASHBOARD_PORT (8265)  RAY_DASHBOARD_HOST (127.0.0.1)
  RAY_WAIT_TIMEOUT (900 s)  RAY_STOP_TIMEOUT (60 s)  RAY_POLL_INTERVAL (5 s)
  RAY_AUTH (auto: Ray token authentication when the installed Ray has it (>= 2.52); on; off)
  RAY_AUTH_TOKEN_FILE ($SAVE_DIR/.ray-auth-token, mode 600, written by the head)
  RUN_DIR ($SAVE_DIR/run: logs and run state, this node's under node$NODE_RANK/)
  RAY_TEMP_DIR (/tmp/strands-slime-$UID-$RAY_PORT: Ray's sockets and own logs; keep it short)
  RAY_NODE_RESOURCES (unset; a JSON object of custom Ray resources this node offers, e.g.
  '{"rollout_cpu": 32}': its spare cores for the rollout's Ray episode workers and sandbox actors,
  see docs/training.md "CPU for the rollout")
  NUM_ROLLOUT (3000)  ROLLOUT_BATCH_SIZE (16)  OVER_SAMPLING_BATCH_SIZE (2 x ROLLOUT_BATCH_SIZE)
  N_SAMPLES_PER_PROMPT (8)  GLOBAL_BATCH_SIZE (128)  DYNAMIC_SAMPLING (1: drop zero-std groups)
  PARTIAL_ROLLOUT (1: episodes the over-sampling abort cuts off resume next step instead of being
  thrown away)  MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT (0)
  MAX_RESPONSE_LEN (32768, per episode: model and tool tokens)  ROLLOUT_TEMPERATURE (1.0)
  EVAL_INTERVAL (20; 0 disables eval)  N_SAMPLES_PER_EVAL_PROMPT and EVAL_MAX_RESPONSE_LEN (16 and
  16384; with EVAL_CONFIG set, the file's values win)
  SAVE_HOURS (2: most hours of steps a crash may lose)  SAVE_INTERVAL (steps; default: SAVE_HOURS
  of the pilot's p90 step time from PILOT_JSON, else of STEP_MINUTES, your estimate)
  KEEP_CHECKPOINTS (latest; all keeps every one)  CHECKPOINT_GB (115: one checkpoint's size)
  MAX_RESTARTS (5, within any RESTART_WINDOW_HOURS, 24)  MAX_RESTARTS_WITHOUT_PROGRESS (2)
  RESTART_BACKOFF (60 s, doubling while restarts bring no new checkpoint, up to RESTART_BACKOFF_MAX, 1800 s)
  WATCHDOG_MINUTES (180: no new step, rollout or checkpoint for that long stops the job; 0 = off)
  RAY_STATUS_TIMEOUT (300 s: how long Ray may fail to report the job's state before it counts as lost)
  PILOT_STEPS (8)  PILOT_DIR ($SAVE_DIR/pilot)  PILOT_JSON ($PILOT_DIR/pilot.json)
  PILOT_KEEP_CHECKPOINT (0)  GPU_HOUR_PRICE (unset: the pilot projects GPU-hours, no cost)
  RUN_HOURS (unset: the pilot also gives the NUM_ROLLOUT that fits these wall-clock hours)
  TP_SIZE (2)  MAX_TOKENS_PER_GPU (18432)  ROLLOUT_GPUS_PER_ENGINE (2)
  SGLANG_MEM_FRACTION (0.7)  ROUTER_POLICY (manual)  ROUTER_ASSIGNMENT_MODE (min_load)
  LR (1e-6)  KL_LOSS_COEF (0; > 0 adds --use-kl-loss)  ENTROPY_COEF (0)
  OFF_POLICY_CORRECTION (tis | rollout-logprobs | none)
  WANDB_API_KEY, WANDB_KEY or WANDB_API_KEY_FILE (a file only you can read) (unset: no W&B)
  WANDB_PROJECT (strands-slime)  WANDB_GROUP (qwen3-8b-strands-math)
  SANDBOX_HOST_NETWORK (0; 1 = accept a node where the sandbox cannot isolate model code from the
  network, see docs/training.md "Sandbox isolation"; the preflight refuses such a node otherwise)
  KILL_STALE (0; 1 = first stop a launch of this script, and the Ray node it started, that is
  still running on this node from RUN_DIR's PID files)
  REUSE_RAY (0; 1 = submit to a Ray cluster that is already running instead of refusing)
  KEEP_RAY (0; 1 = leave the Ray node this script started running when it exits)
  HAS_NVLINK (auto-detected with nvidia-smi)
"""
