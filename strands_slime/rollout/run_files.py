"""The files of one offline rollout's output directory (``--out``), and how a new run may use them.

Results are never overwritten unasked: a directory that holds samples is continued (``--resume``),
started over (``--overwrite``) or refused, and nothing is created or deleted before the run has passed
its checks and found its server. One run at a time writes a directory: it holds ``.rollout.lock`` (an
``flock``, dropped when the process dies, so a killed run leaves no lock). The files: docs/rollout.md,
the offline rollout's output table.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

SAMPLES = "samples.jsonl"
AGENT_SAMPLES = "agent_samples.jsonl"
"""The further samples of episodes that return several (other agents' segments, fan-out segments), one
line each as in ``samples.jsonl`` (``group_index`` and ``sample_index`` name their episode), appended
as each episode finishes; ``samples.jsonl`` keeps each episode's first sample, which the summary counts."""
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
REPORT = "report.html"
LOG = "rollout.log"
FAILED_ATTEMPTS = "failed_attempts.jsonl"
SETTINGS = "run_settings.json"
"""The settings that give the samples their meaning (sampling, rollout config, tokenizer) and the dataset's
size, written when a run starts: ``--resume`` compares them."""
LOCK = ".rollout.lock"
"""Held (``flock``) by the run writing the directory; it names that run (pid, host, start)."""
_LOCK_TRIES = 5
"""Attempts to take the lock, :data:`_LOCK_RETRY_S` apart: another run's :func:`refuse_if_in_use` holds it
shared for an instant."""
_LOCK_RETRY_S = 0.02
RUN_FILES = (SAMPLES, SUMMARY_JSON, SUMMARY_MD, REPORT, LOG, FAILED_ATTEMPTS, SETTINGS)
"""What a run writes; ``--overwrite`` deletes exactly these (a ``wandb/`` folder or the user's own
files stay)."""


class RunDirError(ValueError):
    """The output directory cannot be used as asked (shown as one ``error:`` line)."""


class SamplesFileError(ValueError):
    """A line of ``samples.jsonl`` other than a torn last one is not a JSON object."""


def check_writable(out: Path) -> None:
    """Refuse an ``--out`` that cannot hold the run's files, before anything expensive runs.

    Creates nothing: a missing directory is judged by its nearest existing ancestor, where a file is
    created and removed at once (``os.access`` says yes to root on a read-only mount's siblings).

    Raises:
        RunDirError: ``out`` is a file, sits below a file, or its nearest existing folder is not writable.
    """
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is a file, not a directory")
    existing = out
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirError(f"--out {out} cannot be created: {existing} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = "in it" if existing == out else f"in {existing}"
        raise RunDirError(
            f"--out {out} is not writable: cannot create files {where} ({exc.strerror})"
        ) from exc


def refuse_if_in_use(out: Path) -> None:
    """Refuse an ``--out`` another run is writing now (checked before anything starts; the run takes the
    lock itself when it opens the directory).

    Raises:
        RunDirError: a live run holds ``out/.rollout.lock``; the message names it.
    """
    try:
        handle = (out / LOCK).open("rb")
    except OSError:  # no lock file (or no directory): nobody writes there
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(_in_use(out, handle.read().decode(errors="replace"))) from None
        fcntl.flock(handle, fcntl.LOCK_UN)


def _in_use(out: Path, holder: str) -> str:
    return (
        f"--out {out} is in use by another rollout ({holder.strip() or 'a process starting now'}): "
        "wait for it to end, or pick another --out"
    )


def count_samples(out: Path) -> int:
    """The lines of ``out/samples.jsonl`` (0 when there is none)."""
    path = out / SAMPLES
    if not path.is_file():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def refuse_earlier_results(out: Path) -> None:
    """Without ``--resume`` or ``--overwrite``, a directory holding samples is not written into.

    Raises:
        RunDirError: ``out/samples.jsonl`` holds samples; the message names the three ways on.
    """
    count = count_samples(out)
    if count:
        raise RunDirError(
            f"{out} already holds {count} sample{'s' if count != 1 else ''} of an earlier run: --resume "
            "continues it (and runs its failed samples again), --overwrite deletes them and starts over, "
            "or pick another --out"
        )


class SampleLines:
    """The records of a ``samples.jsonl``, read one at a time with their line numbers.

    Each record is written with its newline in one call, so a last line without one (or one that is not
    JSON) was cut short by a kill mid-write: it is no sample and is skipped; ``torn`` says so and
    ``good_bytes`` is where the whole lines end.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.torn = False
        self.good_bytes = 0

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(line number, record)``.

        Raises:
            SamplesFileError: a line before the last is not JSON, or a line is not a JSON object.
        """
        self.torn, self.good_bytes = False, 0
        with self.path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.endswith(b"\n"):
                    self.torn = True
                    return
                if not line.strip():
                    self.good_bytes += len(line)
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    if handle.read(1):  # not the last line: the file is damaged, not just torn
                        raise SamplesFileError(f"{self.path}:{number}: not JSON ({exc})") from exc
                    self.torn = True
                    return
                if not isinstance(record, dict):
                    raise SamplesFileError(
                        f"{self.path}:{number}: not a sample record (a JSON {type(record).__name__})"
                    )
                self.good_bytes += len(line)
                yield number, record

    def cut_torn_tail(self) -> None:
        """Drop a torn last line from the file (after a full iteration), so appending goes on cleanly."""
        if self.torn:
            with self.path.open("r+b") as handle:
                handle.truncate(self.good_bytes)
            self.torn = False


class RunDir:
    """One run's use of its output directory: created when the episodes start, left as it was when
    the run saved nothing."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.samples = out / SAMPLES
        self._created_dirs: list[Path] = []  # the folders this run made, deepest first
        self._created: list[Path] = []
        self._lock: int | None = None  # the descriptor holding .rollout.lock

    def open_for_run(
        self, *, overwrite: bool, retry_lines: set[int] | None = None, lines: SampleLines | None = None
    ) -> TextIO:
        """Create the directory if needed and lock it (:meth:`lock`), apply ``--overwrite`` (delete the
        run files) or a resume's reading of ``samples.jsonl`` (``lines``: its torn tail is cut;
        ``retry_lines`` move to ``failed_attempts.jsonl``), and open ``samples.jsonl`` for appending.

        Raises:
            RunDirError: another run holds the lock.
        """
        self.lock()
        if overwrite:
            for name in RUN_FILES:
                (self.out / name).unlink(missing_ok=True)
        if lines is not None:
            lines.cut_torn_tail()
        if retry_lines:
            self._move_lines(retry_lines)
        for name in (SAMPLES, LOG, SETTINGS):
            if not (self.out / name).exists():
                self._created.append(self.out / name)
        return self.samples.open("a", encoding="utf-8")

    def recorded_settings(self) -> dict[str, Any] | None:
        """The settings an earlier run recorded (``run_settings.json``, else those in ``summary.json`` of a
        run made before that file existed); None when neither is readable."""
        for name in (SETTINGS, SUMMARY_JSON):
            try:
                recorded = json.loads((self.out / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(recorded, dict):
                continue
            if name == SUMMARY_JSON:
                options = recorded.get("options") or {}
                recorded = {
                    **options,
                    "config": recorded.get("config"),
                    "tokenizer": recorded.get("tokenizer"),
                    "prompts": recorded.get("prompts"),
                }
            return recorded
        return None

    def record_settings(self, settings: dict[str, Any]) -> None:
        """Write ``run_settings.json`` (replacing an earlier run's: a resume checked they agree)."""
        (self.out / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")

    def lock(self) -> None:
        """Hold ``.rollout.lock`` (creating the directory, as :meth:`open_for_run` would) until
        :meth:`release`, writing who holds it for a refused run's message.

        Raises:
            RunDirError: another live run holds it.
        """
        if self._lock is not None:
            return
        missing = self.out
        while not missing.exists():
            self._created_dirs.append(missing)
            missing = missing.parent
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / LOCK
        for attempt in range(_LOCK_TRIES):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace")
                os.close(fd)
                if attempt + 1 == _LOCK_TRIES:
                    raise RunDirError(_in_use(self.out, holder)) from None
                time.sleep(_LOCK_RETRY_S)
                continue
            try:
                same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:  # the last holder removed it as we opened it
                same_file = False
            if not same_file:
                os.close(fd)
                continue
            since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode(), 0)
            self._lock = fd
            return
        raise RunDirError(_in_use(self.out, ""))

    def release(self) -> None:
        """Let the directory's lock go (and remove its file): another run may write here now."""
        if self._lock is None:
            return
        (self.out / LOCK).unlink(missing_ok=True)
        os.close(self._lock)  # closing drops the flock
        self._lock = None

    def _move_lines(self, numbers: set[int]) -> None:
        """Append the given lines to ``failed_attempts.jsonl``, then replace ``samples.jsonl`` by the
        rest (a crash in between leaves the lines in both files: nothing is lost)."""
        kept = self.samples.with_name(SAMPLES + ".partial")
        with (
            self.samples.open("rb") as source,
            (self.out / FAILED_ATTEMPTS).open("ab") as archive,
            kept.open("wb") as rest,
        ):
            for number, line in enumerate(source, 1):
                (archive if number in numbers else rest).write(line)
            archive.flush()
            os.fsync(archive.fileno())
        kept.replace(self.samples)

    def discard_if_unused(self) -> bool:
        """When the run saved no sample, remove the files it created (and the folders it made, while
        nothing else is in them). Returns whether it did."""
        if count_samples(self.out):
            return False
        self.release()
        for path in self._created:
            path.unlink(missing_ok=True)
        for folder in self._created_dirs:
            try:
                folder.rmdir()
            except OSError:  # something else was put there meanwhile
                break
        return True
