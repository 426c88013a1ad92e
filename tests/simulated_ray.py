"""A simulated Ray for launch tests: a stand-in ``ray`` CLI with Ray's job and node semantics.

Every call is logged as one JSON line to ``FAKE_RAY_LOG``; its state lives in ``FAKE_RAY_STATE``.

* ``ray start [--head] ... --block`` runs until SIGTERM and marks its node (GPUs from ``--num-gpus``)
  alive; ``ray status`` answers while a head is up (or ``FAKE_RAY_UP=1``).
* ``ray job submit --no-wait`` registers the job and returns (``FAKE_RAY_SUBMIT_ERROR``: ``created``
  fails the client after Ray took the job, ``lost`` before). The job then moves one entry of its
  attempt's timeline per ``ray job status`` call, as Ray's job moves on its own:
  ``PENDING``/``RUNNING`` entries may add a step record to the job's log (``step``) or write a
  checkpoint (``checkpoint``); the last entry repeats. Like slime, a SUCCEEDED job writes the last
  step's checkpoint (``--num-rollout`` - 1) into ``--save``.
* Timelines come from ``FAKE_RAY_SCENARIO`` (a JSON file: ``{"attempts": [[entry, ...], ...],
  "nodes": [[alive, gpus], ...]}``, the last of each repeated), else from the older knobs:
  ``FAKE_RAY_JOB_STATUS`` (one driver exit status per attempt, ``0`` = SUCCEEDED, else FAILED),
  ``FAKE_RAY_JOB_SECONDS`` and ``FAKE_RAY_CHECKPOINT_DIR`` (each failed attempt leaves checkpoint
  ``10 * attempt``).
* ``ray job status`` prints what Ray 2.x prints (``Job 'X' succeeded``, ``Job 'X' was stopped``,
  ``Job 'X' failed``, ``Status for job 'X': RUNNING``); ``ray job stop`` stops it;
  ``ray job logs [--follow]`` prints its log (``FAKE_RAY_JOB_LOG`` plus its step records); a timeline
  entry with ``"close_log": true`` makes a follower exit while the job runs.
* ``ray list nodes --format json`` lists the alive nodes (``state``, ``resources_total``) as Ray's
  state API does; ``nodes`` in the scenario overrides the answers, one per call.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

FAKE_RAY = r'''#!{python}
import fcntl, json, os, re, signal, sys, time

args = sys.argv[1:]
if args == ["--version"]:
    print("ray, version " + os.environ.get("FAKE_RAY_VERSION", "2.52.0"))
    sys.exit(0)
state_dir = os.environ["FAKE_RAY_STATE"]
jobs_dir = os.path.join(state_dir, "jobs")
os.makedirs(jobs_dir, exist_ok=True)
record = {{"args": args, "pid": os.getpid()}}
record["auth"] = {{name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}}
if args[:1] == ["start"]:
    record["env"] = {{name: os.environ.get(name) for name in ("SLIME_HOST_IP", "WANDB_API_KEY", "no_proxy")}}
if args[:2] == ["job", "submit"] and "--runtime-env" in args:
    path = args[args.index("--runtime-env") + 1]
    record["runtime_env"] = json.load(open(path))
    record["runtime_env_mode"] = oct(os.stat(path).st_mode & 0o777)
    record["env"] = {{"WANDB_API_KEY": os.environ.get("WANDB_API_KEY")}}


def log(entry):
    with open(os.environ["FAKE_RAY_LOG"], "a") as out:
        out.write(json.dumps(entry) + "\n")


def scenario():
    path = os.environ.get("FAKE_RAY_SCENARIO")
    return json.load(open(path)) if path else {{}}


class Locked:
    """One job file, read and written under a lock (status polls and stops race)."""

    def __init__(self, job_id):
        self.path = os.path.join(jobs_dir, job_id + ".json")

    def __enter__(self):
        self.lock = open(os.path.join(jobs_dir, ".lock"), "a")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.job = json.load(open(self.path)) if os.path.exists(self.path) else None
        return self

    def __exit__(self, *exc):
        if self.job is not None:
            with open(self.path + ".tmp", "w") as out:
                json.dump(self.job, out)
            os.replace(self.path + ".tmp", self.path)
        self.lock.close()


def timeline(attempt):
    attempts = scenario().get("attempts")
    if attempts:
        return attempts[min(attempt, len(attempts)) - 1]
    statuses = os.environ.get("FAKE_RAY_JOB_STATUS", "0").split(",")
    code = int(statuses[min(attempt, len(statuses)) - 1])
    end = {{"state": "SUCCEEDED"}} if code == 0 else {{"state": "FAILED", "message": "Job entrypoint command failed with exit code " + str(code)}}
    if code != 0 and os.environ.get("FAKE_RAY_CHECKPOINT_DIR"):
        end["checkpoint"] = attempt * 10
        end["checkpoint_dir"] = os.environ["FAKE_RAY_CHECKPOINT_DIR"]
    return [{{"state": "RUNNING", "seconds": float(os.environ.get("FAKE_RAY_JOB_SECONDS", "0"))}}, end]


def flag(entrypoint, name):
    return entrypoint[entrypoint.index(name) + 1] if name in entrypoint else None


def write_checkpoint(directory, iteration):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "latest_checkpointed_iteration.txt"), "w") as out:
        out.write(str(iteration))


def advance(job):
    """The job's next timeline entry (its state changes only while someone looks, like a clock)."""
    if job["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
        return
    entries = job["timeline"]
    if job["position"] >= len(entries) - 1:
        return  # the last entry repeats
    if time.time() - job["entered"] < entries[job["position"]].get("seconds", 0):
        return
    job["position"] += 1
    entry = entries[job["position"]]
    job["entered"] = time.time()
    job["state"] = entry["state"]
    job["message"] = entry.get("message", "")
    if "step" in entry:
        job["log"] += "strands_slime step %d: {{'rollout/strands/step/kept': 1.0}}\n" % entry["step"]
    if "checkpoint" in entry:
        write_checkpoint(entry.get("checkpoint_dir") or flag(job["entrypoint"], "--save"), entry["checkpoint"])
    if entry.get("close_log"):
        job["close_log"] = True
    if job["state"] == "SUCCEEDED" and flag(job["entrypoint"], "--save") and flag(job["entrypoint"], "--num-rollout"):
        write_checkpoint(flag(job["entrypoint"], "--save"), int(flag(job["entrypoint"], "--num-rollout")) - 1)


def job_id_arg():
    return args[-1]


def running_jobs():
    found = []
    for name in sorted(os.listdir(jobs_dir)):
        if name.endswith(".json"):
            job = json.load(open(os.path.join(jobs_dir, name)))
            if job["state"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
                found.append(job["id"])
    return found


head_marker = os.path.join(state_dir, "head")
if args[:2] == ["job", "submit"]:
    record["running_jobs"] = running_jobs()
log(record)
if args[:1] == ["status"]:
    sys.exit(0 if os.environ.get("FAKE_RAY_UP") == "1" or os.path.exists(head_marker) else 1)
if args[:1] == ["start"]:
    # `ray start --block`: this node's Ray runs until SIGTERM (then it stops its own processes).
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    is_head = "--head" in args
    marker = head_marker if is_head else os.path.join(state_dir, "node-" + args[args.index("--node-ip-address") + 1])
    with open(marker, "w") as out:
        out.write(args[args.index("--num-gpus") + 1])
    deadline = time.monotonic() + float(os.environ.get("FAKE_RAY_BLOCK_SECONDS", "120"))
    status = 0
    while not stopping and time.monotonic() < deadline:
        if not is_head and os.environ.get("FAKE_RAY_UP") != "1" and not os.path.exists(head_marker):
            status = 1  # the head went away
            break
        time.sleep(0.05)
    os.unlink(marker)
    log({{"event": "node-stopped", "pid": os.getpid(), "by_signal": bool(stopping)}})
    sys.exit(status)
if args[:2] == ["list", "nodes"]:
    answers = scenario().get("nodes")
    if answers:
        count_file = os.path.join(state_dir, "node-queries")
        count = int(open(count_file).read()) if os.path.exists(count_file) else 0
        open(count_file, "w").write(str(count + 1))
        alive, gpus = answers[min(count, len(answers) - 1)]
        nodes = [{{"node_id": str(i), "state": "ALIVE", "resources_total": {{"GPU": gpus / max(alive, 1)}}}} for i in range(alive)]
    else:
        names = [n for n in os.listdir(state_dir) if n == "head" or n.startswith("node-")]
        nodes = [{{"node_id": n, "state": "ALIVE", "resources_total": {{"GPU": float(open(os.path.join(state_dir, n)).read())}}}} for n in names]
        if not nodes and os.environ.get("FAKE_RAY_UP") == "1":  # a cluster this launch did not start
            nodes = [{{"node_id": "other", "state": "ALIVE", "resources_total": {{"GPU": float(os.environ.get("FAKE_GPUS", "8"))}}}}]
    print(json.dumps(nodes, indent=4))
    sys.exit(0)
if args[:2] == ["job", "submit"]:
    job_id = args[args.index("--submission-id") + 1]
    error = os.environ.get("FAKE_RAY_SUBMIT_ERROR", "")
    count_file = os.path.join(state_dir, "submits")
    attempt = (int(open(count_file).read()) if os.path.exists(count_file) else 0) + 1
    open(count_file, "w").write(str(attempt))
    if error != "lost" or attempt > 1:
        entries = timeline(attempt)
        with Locked(job_id) as locked:
            locked.job = {{"id": job_id, "attempt": attempt, "entrypoint": args[args.index("--") + 1:],
                          "timeline": [{{"state": "PENDING"}}] + entries, "position": 0, "state": "PENDING",
                          "entered": time.time(), "message": "", "log": "", "close_log": False}}
    if error and attempt == 1:
        print("requests.exceptions.ConnectionError: ('Connection aborted.', RemoteDisconnected())", file=sys.stderr)
        sys.exit(1)
    print("Job '%s' submitted successfully" % job_id)
    sys.exit(0)
if args[:2] == ["job", "status"]:
    job_id = job_id_arg()
    with Locked(job_id) as locked:
        if locked.job is None:
            print("RuntimeError: Job %s does not exist." % job_id, file=sys.stderr)
            sys.exit(1)
        advance(locked.job)
        job = dict(locked.job)
    state, message = job["state"], job["message"]
    if state == "SUCCEEDED":
        print("-" * 40 + "\nJob '%s' succeeded\n" % job_id + "-" * 40)
    elif state == "STOPPED":
        print("Job '%s' was stopped" % job_id)
    elif state == "FAILED":
        print("-" * 40 + "\nJob '%s' failed\n" % job_id + "-" * 40)
        print("Status message: " + (message or "Job entrypoint command failed"))
    else:
        print("Status for job '%s': %s" % (job_id, state))
        print("Status message: Job is currently running.")
    sys.exit(0)
if args[:2] == ["job", "stop"]:
    job_id = job_id_arg()
    with Locked(job_id) as locked:
        if locked.job is None:
            sys.exit(1)
        if locked.job["state"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
            locked.job["state"] = "STOPPED"
            locked.job["message"] = "Job was intentionally stopped."
            log({{"event": "job-stopped", "job_id": job_id}})
    print("Job '%s' was stopped" % job_id)
    sys.exit(0)
if args[:2] == ["job", "logs"]:
    job_id = job_id_arg()
    base = open(os.environ["FAKE_RAY_JOB_LOG"]).read() if os.environ.get("FAKE_RAY_JOB_LOG") else ""
    printed = 0
    while True:
        with Locked(job_id) as locked:
            job = dict(locked.job) if locked.job else None
        if job is None:
            print("Job %s does not exist." % job_id, file=sys.stderr)
            sys.exit(1)
        text = base + job["log"]
        sys.stdout.write(text[printed:])
        sys.stdout.flush()
        printed = len(text)
        if "--follow" not in args or job["state"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            sys.exit(0)
        if job["close_log"]:
            with Locked(job_id) as locked:
                locked.job["close_log"] = False
            sys.exit(0)  # the stream closed while the job runs: the client still exits 0
        time.sleep(0.02)
'''


def install_simulated_ray(bin_dir: Path) -> Path:
    """Write the simulated ``ray`` CLI into ``bin_dir``."""
    path = bin_dir / "ray"
    path.write_text(FAKE_RAY.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
