"""Sandbox zygote: a pre-started interpreter that forks one isolated worker per execution.

Run as ``python -I -S _zygote.py <socket-fd> <parent-pid>`` by ``strands_slime.sandbox``; it only
uses the standard library until the parent's ``init`` message names the site directories and the
modules to preload. Messages are JSON over SOCK_SEQPACKET sockets; descriptors travel with
SCM_RIGHTS.

parent -> zygote  ``init`` (configuration), ``spawn`` (a worker is needed now), ``started`` (worker
                  ``pid`` runs execution ``id``: start its wall-clock deadline), ``kill``,
                  ``shutdown``.
zygote -> parent  ``preloading`` (module being imported), ``ready`` (capabilities) or ``fatal``,
                  ``worker`` (+ the request socket of a new, fully prepared worker),
                  ``worker_gone`` (an unused worker died), ``done`` (an execution's process was
                  reaped and everything it left behind killed).
parent -> worker  one request (+ code memfd, stdout, stderr and status pipes), sent directly.
worker -> parent  the output pipes, then one JSON status line (exit code, CPU) just before exiting.

Process tree, isolation and cleanup of leftovers: docs/sandbox.md, "Design" (2. and 5.).
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import gc
import heapq
import json
import math
import os
import resource
import selectors
import signal
import socket
import sys
import tempfile
import time
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

UID_BLOCK_SIZE = 1024
UID_BLOCK_COUNT = 64
MAX_MESSAGE = 1 << 16
EXIT_SETUP_FAILED = 125
MAX_SETUP_FAILURES = 8
CODE_FILENAME = "<code>"
#: Run by idle pre-forked workers so that the copy-on-write page faults of compiling, running,
#: printing and formatting a traceback are paid before a request arrives, not while it waits.
WARM_UP_CODE = (
    "import math\nvalues = [math.sqrt(i) for i in range(4)]\nprint(values, {'sum': sum(values)})\n"
    "try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    print(repr(exc))\nvalues\n"
)
WARM_UP_ERROR_CODE = "def broken():\n    raise ValueError('warm-up')\nbroken()\n"
#: Run once by the zygote after preloading (when ``zygote_warm_up`` is not set): the first call of
#: many sympy functions imports and initialises more of sympy (factor ~40 ms, simplify ~150 ms);
#: paying that here means no execution pays it again.
DEFAULT_ZYGOTE_WARM_UP = {
    "sympy": (
        "import sympy\n"
        "x, y = sympy.symbols('x y')\n"
        "sympy.factor(x**4 - 1); sympy.expand((x + y)**3); sympy.solve([x + y - 3, x - y - 1], [x, y])\n"
        "sympy.solve(x**2 - 5*x + 6, x); sympy.simplify(sympy.sin(x)**2 + sympy.cos(x)**2)\n"
        "sympy.integrate(x * sympy.exp(x), x); sympy.diff(sympy.sin(x) * x, x); sympy.limit(sympy.sin(x) / x, x, 0)\n"
        "sympy.nsimplify(0.5); sympy.Rational(3, 4) + sympy.Rational(1, 6); sympy.sqrt(8); sympy.N(sympy.pi, 20)\n"
        "sympy.isprime(97); sympy.factorint(360); sympy.binomial(10, 3); sympy.Matrix([[1, 2], [3, 4]]).det()\n"
        "sympy.summation(x, (x, 1, 10)); sympy.latex(x**2); str(sympy.Poly(x**2 + 1, x))\n"
    ),
    "numpy": (
        "import numpy\n"
        "a = numpy.arange(6.0).reshape(2, 3); a @ a.T; numpy.linalg.solve([[2.0, 1.0], [1.0, 3.0]], [1.0, 2.0])\n"
        "numpy.linalg.eig(numpy.eye(2)); numpy.fft.fft(a[0]); numpy.random.default_rng(0).random(3)\n"
        "numpy.array2string(a); repr(a)\n"
    ),
}
#: Imported by the zygote so that workers never import them after dropping privileges.
WORKER_MODULES = ("ast", "atexit", "builtins", "io", "linecache", "random", "threading", "traceback", "types")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


def _max_fd() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard if 0 < hard < 1 << 20 else 1 << 20


def _close_fds_except(*keep: int) -> None:
    """Close every descriptor >= 3 except ``keep`` (close_range under the hood)."""
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())


def _reachable_by_others(path: str) -> bool:
    """Whether a uid without privileges can list ``path`` (mode bits only; ACLs are ignored)."""
    import stat

    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
        if not (mode & stat.S_IROTH and mode & stat.S_IXOTH):
            return False
        parent = os.path.dirname(path)
        while parent and parent != path:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            path, parent = parent, os.path.dirname(parent)
    except OSError:
        return False
    return True


def _vm_size_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _probe_in_child(action: Any) -> str | None:
    """Run ``action`` in a throw-away child; return None when it worked, else the error text."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            action()
            os._exit(0)
        except BaseException as exc:
            try:
                os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:500])
            finally:
                os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        message = reader.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return message or f"probe exited with status {status}"


class Zygote:
    """The pre-started interpreter: sets up isolation once, forks workers, enforces deadlines, reaps."""

    def __init__(self, control: socket.socket, parent_pid: int) -> None:
        self.control = control
        self.parent_pid = parent_pid
        self.pid = os.getpid()
        self.config: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.uid_mode = False
        self.free_uids: list[int] = []
        self.uid_lock: int | None = None
        self.workdir_root = ""
        self.nonroot_nproc: int | None = None
        self.offered: dict[int, dict[str, Any]] = {}  # forked, handed to the parent, no request yet
        self.active: dict[int, dict[str, Any]] = {}  # running a request
        self.pid_by_id: dict[int, int] = {}
        self.deadlines: list[tuple[float, int, int]] = []
        self.shutting_down = False
        self.path_fds: dict[str, int] = {}
        self.spawn_requests = 0
        self.setup_failures = 0
        self.unclaimed: dict[int, tuple[int, resource.struct_rusage, float]] = {}

    # ------------------------------------------------------------------ start-up
    def start(self) -> None:
        """Read ``init``, set up paths, isolation and preloads, then report ``ready`` (or ``fatal``)."""
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.parent_pid:
            os._exit(1)
        data, _ = self._recv(blocking=True)
        if data is None:
            os._exit(0)
        self.config = data["config"]
        if self.config["nice"]:
            os.nice(self.config["nice"])
        try:
            self._set_up_paths()
            self._set_up_isolation()
            preload = self._preload()
        except Exception as exc:
            self._send({"op": "fatal", "message": f"{type(exc).__name__}: {exc}"})
            os._exit(1)
        self._warm_up(preload["preloaded"])
        if self.uid_mode:
            self._route_imports_through_descriptors()
        gc.collect()
        gc.freeze()
        self._send(
            {
                "op": "ready",
                "pid": self.pid,
                "capabilities": self.capabilities,
                "warnings": self.warnings,
                **preload,
            }
        )

    def _set_up_paths(self) -> None:
        import site

        for directory in self.config["site_dirs"]:
            if os.path.isdir(directory):
                site.addsitedir(directory)
        for directory in self.config["extra_python_path"]:
            if directory not in sys.path:
                sys.path.append(directory)
        for name in WORKER_MODULES:
            __import__(name)
        # Import directories the unprivileged uid cannot reach (an interpreter under a 0700 /root,
        # as with pyenv or conda) stay importable through descriptors opened here while still root:
        # workers put /proc/self/fd/N on sys.path instead.
        for entry in sys.path:
            if entry and os.path.isdir(entry) and not _reachable_by_others(entry):
                self.path_fds[entry] = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)

    def _warm_up(self, preloaded: list[str]) -> None:
        """Run the warm-up code in the zygote itself, so forks inherit its lazy imports and caches."""
        configured = self.config.get("zygote_warm_up")
        if configured is None:
            snippets = [DEFAULT_ZYGOTE_WARM_UP[name] for name in preloaded if name in DEFAULT_ZYGOTE_WARM_UP]
        else:
            snippets = [configured] if configured else []
        for snippet in snippets:
            try:
                exec(compile(snippet, "<zygote warm-up>", "exec"), {"__name__": "__warm_up__"})
            except Exception as exc:
                self.warnings.append(f"zygote warm-up failed: {type(exc).__name__}: {exc}")

    def _route_imports_through_descriptors(self) -> None:
        """Point sys.path and package __path__ entries the worker uid cannot reach at /proc/self/fd/N.

        Done once here: the descriptors are inherited, so the same paths work in every worker.
        """
        if not self.path_fds:
            return
        prefixes = sorted(((path, f"/proc/self/fd/{fd}") for path, fd in self.path_fds.items()), reverse=True)

        def route(entry: str) -> str:
            for original, routed in prefixes:
                if entry == original or entry.startswith(original + os.sep):
                    return routed + entry[len(original) :]
            return entry

        sys.path[:] = [route(entry) for entry in sys.path]
        for module in list(sys.modules.values()):
            package_path = getattr(module, "__path__", None)
            if isinstance(package_path, list):
                package_path[:] = [
                    route(entry) if isinstance(entry, str) else entry for entry in package_path
                ]
        sys.path_importer_cache.clear()

    def _requirement_missing(self, feature: str, reason: str) -> None:
        message = f"{feature} unavailable: {reason}"
        if self.config["strict"]:
            raise RuntimeError(message)
        self.warnings.append(message)

    def _set_up_isolation(self) -> None:
        cfg = self.config
        caps = self.capabilities
        caps["root"] = os.geteuid() == 0
        try:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            caps["subreaper"] = True
        except OSError as exc:
            caps["subreaper"] = False
            self.warnings.append(f"child subreaper unavailable ({exc}); double-forked orphans may survive")
        caps["proc_children"] = os.path.exists(f"/proc/self/task/{self.pid}/children")

        caps["uid_drop"] = False
        if cfg["drop_privileges"] and caps["root"]:
            self._acquire_uid_block()
        elif cfg["drop_privileges"]:
            caps["uid_drop_reason"] = "not running as root"
        if not caps["uid_drop"] and not caps["root"]:
            # RLIMIT_NPROC counts every process of the uid: cap the whole sandbox instead.
            self.nonroot_nproc = self._count_own_tasks() + cfg["max_processes"] * cfg["max_concurrency"] + 64

        caps["mount_namespace"] = False
        caps["ipc_namespace"] = False
        if cfg["private_tmp"]:
            self._set_up_mount_namespace()
        if not caps["mount_namespace"]:
            root = cfg["workdir_root"] or tempfile.gettempdir()
            self.workdir_root = tempfile.mkdtemp(prefix=f"strands-slime-sandbox-{self.pid}-", dir=root)
            os.chmod(self.workdir_root, 0o711)

        caps["network"] = "host"
        if cfg["network"] == "per_call":
            error = _probe_in_child(lambda: _unshare(CLONE_NEWNET))
            if error is None:
                caps["network"] = "per_call"
            else:
                self._requirement_missing("network namespace", error)
        elif cfg["network"] == "shared":
            try:
                _unshare(CLONE_NEWNET)
                caps["network"] = "shared"
            except OSError as exc:
                self._requirement_missing("network namespace", str(exc))

    def _acquire_uid_block(self) -> None:
        cfg = self.config
        lock_dir = "/run/strands-slime-sandbox"
        try:
            os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        except OSError:
            lock_dir = os.path.join(tempfile.gettempdir(), "strands-slime-sandbox-uids")
            os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        for block in range(UID_BLOCK_COUNT):
            first = cfg["uid_base"] + block * UID_BLOCK_SIZE
            if first + UID_BLOCK_SIZE > 2**31 - 1:
                break
            fd = os.open(os.path.join(lock_dir, f"uids-{first}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            uids = list(range(first, first + UID_BLOCK_SIZE))

            def switch_uid(uid: int = first) -> None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

            error = _probe_in_child(switch_uid)
            if error is not None:
                os.close(fd)
                self._requirement_missing("per-execution uid", error)
                return
            self.uid_lock = fd
            self.free_uids = uids
            self.uid_mode = True
            self.capabilities["uid_drop"] = True
            self.capabilities["uid_range"] = [first, first + UID_BLOCK_SIZE - 1]
            for uid in uids:  # leftovers of a crashed zygote that held this block
                self._kill_uid(uid)
            return
        self._requirement_missing("per-execution uid", f"all {UID_BLOCK_COUNT} uid blocks are in use")

    def _set_up_mount_namespace(self) -> None:
        caps = self.capabilities
        try:
            _unshare(CLONE_NEWNS)
            _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
        except OSError as exc:
            self._requirement_missing("mount namespace", str(exc))
            return
        # World-writable directories other than /tmp and /dev/shm (which each worker replaces with
        # a private tmpfs) become read-only for every execution.
        for path in ("/var/tmp", "/run/lock", "/var/lock"):
            if os.path.isdir(path) and not os.path.islink(path):
                try:
                    _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
                except OSError as exc:
                    self.warnings.append(f"could not hide {path}: {exc}")
        # Accelerators: training owns them. Their device nodes become /dev/null for every execution.
        import glob

        hidden = []
        for path in sorted({*glob.glob("/dev/nvidia*"), *glob.glob("/dev/dri/*"), "/dev/kfd"}):
            if os.path.exists(path) and not os.path.isdir(path):
                try:
                    _mount("/dev/null", path, None, MS_BIND, None)
                    hidden.append(path)
                except OSError as exc:
                    self.warnings.append(f"could not hide {path}: {exc}")
        caps["hidden_devices"] = hidden
        error = _probe_in_child(lambda: self._mount_private_tmp())
        if error is not None:
            self._requirement_missing("private tmpfs", error)
            return
        caps["mount_namespace"] = True
        caps["ipc_namespace"] = _probe_in_child(lambda: _unshare(CLONE_NEWIPC)) is None

    def _mount_private_tmp(self) -> None:
        _unshare(CLONE_NEWNS | (CLONE_NEWIPC if self.capabilities.get("ipc_namespace") else 0))
        size = f"size={self.config['workdir_size_mb']}m,mode=0700"
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
        if os.path.isdir("/dev/shm"):
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, size)

    def _count_own_tasks(self) -> int:
        uid = os.getuid()
        count = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        count += len(os.listdir(f"/proc/{entry}/task"))
                except OSError:
                    continue
        return count

    def _preload(self) -> dict[str, Any]:
        loaded: list[str] = []
        missing: list[str] = []
        failed: dict[str, str] = {}
        for name in self.config["preload_modules"]:
            self._send({"op": "preloading", "module": name})  # names the culprit if this crashes us
            try:
                __import__(name)
                loaded.append(name)
            except ImportError as exc:
                if exc.name is not None and name.startswith(exc.name):
                    missing.append(name)
                else:
                    failed[name] = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                failed[name] = f"{type(exc).__name__}: {exc}"
        return {"preloaded": loaded, "missing": missing, "failed": failed}

    # ------------------------------------------------------------------ messaging
    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.control.sendall(json.dumps(message).encode())
        except OSError:
            self._shutdown_now()

    def _recv(self, blocking: bool) -> tuple[Any, list[int]]:
        """One message and the descriptors that came with it; (None, []) on EOF."""
        flags = 0 if blocking else socket.MSG_DONTWAIT
        fds = array.array("i")
        data, ancillary, _, _ = self.control.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(8 * fds.itemsize), flags)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        return json.loads(data), list(fds)

    # ------------------------------------------------------------------ serving
    def serve(self) -> None:
        """Handle the parent's messages, child exits and deadlines until shutdown; never returns."""
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self._shutdown_now())
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ, "control")
        selector.register(wake_read, selectors.EVENT_READ, "children")
        while True:
            want_worker = self._wants_pool_worker()
            timeout = 0.0 if want_worker else self._next_timeout()
            events = selector.select(timeout)
            for key, _ in events:
                if key.data == "control":
                    self._handle_control()
                else:
                    try:
                        while os.read(wake_read, 4096):
                            pass
                    except BlockingIOError:
                        pass
            self._reap()
            self._expire_deadlines()
            if self.shutting_down and not self.active:
                self._shutdown_now()
            while self.spawn_requests and self._can_fork():
                self.spawn_requests -= 1
                self._offer_worker(warm_up=False)
            if not events and want_worker:
                self._offer_worker(warm_up=True)

    def _wants_pool_worker(self) -> bool:
        return (
            not self.shutting_down
            and len(self.offered) < self.config["prefork"]
            and self._can_fork()
            and self.setup_failures < MAX_SETUP_FAILURES
        )

    def _can_fork(self) -> bool:
        return not self.uid_mode or bool(self.free_uids)

    def _next_timeout(self) -> float | None:
        while self.deadlines:
            deadline, pid, call_id = self.deadlines[0]
            call = self.active.get(pid)
            if call is None or call["id"] != call_id:
                heapq.heappop(self.deadlines)
                continue
            return max(0.0, deadline - time.monotonic())
        return None

    def _handle_control(self) -> None:
        while True:
            try:
                message, fds = self._recv(blocking=False)
            except BlockingIOError:
                return
            except OSError:
                self._begin_shutdown()
                return
            for fd in fds:  # the parent sends descriptors to workers, never to the zygote
                os.close(fd)
            if message is None:
                self._begin_shutdown()
                return
            op = message.get("op")
            if op == "started":
                self._on_started(message)
            elif op == "spawn":
                self.spawn_requests += 1
            elif op == "kill":
                pid = self.pid_by_id.get(message["id"])
                if pid is not None:
                    self.active[pid]["killed"] = message.get("reason", "killed")
                    self._kill_execution(pid)
            elif op == "shutdown":
                self._begin_shutdown()
                return

    def _begin_shutdown(self) -> None:
        self.shutting_down = True
        for pid in list(self.active):
            self.active[pid].setdefault("killed", "shutdown")
            self._kill_execution(pid)
        for pid in list(self.offered):
            self._kill_execution(pid)

    def _shutdown_now(self) -> None:
        for pid in list(self.active) + list(self.offered):
            self._kill_execution(pid)
        if self.workdir_root:
            import shutil

            shutil.rmtree(self.workdir_root, ignore_errors=True)
        os._exit(0)

    # ------------------------------------------------------------------ workers
    def _offer_worker(self, warm_up: bool) -> None:
        """Fork a worker and hand its request socket to the parent, which sends it one request."""
        uid = self.free_uids.pop(0) if self.uid_mode else None
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError as exc:
            parent_end.close()
            child_end.close()
            if uid is not None:
                self.free_uids.append(uid)
            self.warnings.append(f"fork failed: {exc}")
            self.setup_failures += 1
            return
        if pid == 0:
            parent_end.close()
            _Worker(self, child_end, uid, warm_up).run()  # never returns
        child_end.close()
        self.offered[pid] = {"uid": uid}
        message = json.dumps({"op": "worker", "pid": pid}).encode()
        try:
            self.control.sendmsg(
                [message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [parent_end.fileno()]))]
            )
        except OSError:
            self._shutdown_now()
        finally:
            parent_end.close()

    def _on_started(self, message: dict[str, Any]) -> None:
        pid = message["pid"]
        call_id = message["id"]
        worker = self.offered.pop(pid, None)
        if worker is None:
            late = self.unclaimed.pop(pid, None)
            now = time.monotonic()
            for stale in [p for p, (_, _, at) in self.unclaimed.items() if now - at > 60]:
                del self.unclaimed[stale]
            if late is None:
                self._send(
                    {"op": "done", "id": call_id, "setup_error": "the worker exited before the request"}
                )
            else:  # it ran and exited before this message was read
                self.setup_failures = 0
                self._send(self._done_message(call_id, late[0], late[1], None, 0.0))
            return
        now = time.monotonic()
        self.active[pid] = {"id": call_id, "uid": worker["uid"], "started": now}
        self.pid_by_id[call_id] = pid
        heapq.heappush(self.deadlines, (now + float(message["timeout_s"]), pid, call_id))

    def _kill_execution(self, pid: int) -> None:
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        record = self.active.get(pid) or self.offered.get(pid) or {}
        if record.get("uid") is not None:
            self._kill_uid(record["uid"])

    def _kill_uid(self, uid: int) -> None:
        """SIGKILL every process whose real uid is ``uid`` (kill(-1) under that uid, twice)."""
        os.setresuid(uid, uid, 0)
        try:
            for _ in range(2):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os.setresuid(0, 0, 0)
            # The kernel clears the parent-death signal on every change of the effective uid.
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.parent_pid:  # the parent died while it was cleared: what the signal does
            os.kill(os.getpid(), signal.SIGKILL)

    def _reap(self) -> None:
        reaped_stray = False
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in self.active:
                self._finish(pid, status, usage)
                reaped_stray = True
            elif pid in self.offered:
                # Usually a worker that died idle; kept a while in case its "started" is late.
                self._release(pid, self.offered.pop(pid))
                self.unclaimed[pid] = (status, usage, time.monotonic())
                failed = os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_SETUP_FAILED
                self.setup_failures = self.setup_failures + 1 if failed else 0
                self._send({"op": "worker_gone", "pid": pid})
                if self.setup_failures >= MAX_SETUP_FAILURES:
                    self._send({"op": "fatal", "message": f"{self.setup_failures} workers failed to set up"})
                    self._shutdown_now()
            else:
                reaped_stray = True
        if reaped_stray and not self.uid_mode:
            self._kill_stray_children()

    def _release(self, pid: int, record: dict[str, Any]) -> None:
        """Kill what the worker left behind and give its uid and working directory back."""
        if record["uid"] is not None:
            self._kill_uid(record["uid"])
            self.free_uids.append(record["uid"])
        if self.workdir_root:
            import shutil

            shutil.rmtree(os.path.join(self.workdir_root, f"run-{pid}"), ignore_errors=True)

    def _finish(self, pid: int, status: int, usage: resource.struct_rusage) -> None:
        call = self.active.pop(pid)
        self.pid_by_id.pop(call["id"], None)
        self._release(pid, call)
        self.setup_failures = 0
        self._send(
            self._done_message(
                call["id"], status, usage, call.get("killed"), time.monotonic() - call["started"]
            )
        )

    @staticmethod
    def _done_message(
        call_id: int, status: int, usage: resource.struct_rusage, killed: str | None, wall_s: float
    ) -> dict[str, Any]:
        result: dict[str, Any] = {
            "op": "done",
            "id": call_id,
            "wall_s": wall_s,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_kb": usage.ru_maxrss,
            "killed": killed,
        }
        if os.WIFSIGNALED(status):
            result["signal"] = os.WTERMSIG(status)
        else:
            result["exit_code"] = os.WEXITSTATUS(status)
        return result

    def _kill_stray_children(self) -> None:
        """Kill children of the zygote that are neither live nor offered workers: orphans."""
        known = set(self.active) | set(self.offered)
        for pid in self._direct_children():
            if pid not in known:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _direct_children(self) -> list[int]:
        if self.capabilities.get("proc_children"):
            with open(f"/proc/self/task/{self.pid}/children", "rb") as handle:
                return [int(pid) for pid in handle.read().split()]
        children = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as handle:
                        fields = handle.read().rsplit(b")", 1)[1].split()
                    if int(fields[1]) == self.pid:
                        children.append(int(entry))
                except (OSError, IndexError, ValueError):
                    continue
        return children

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, pid, call_id = heapq.heappop(self.deadlines)
            call = self.active.get(pid)
            if call is not None and call["id"] == call_id:
                call.setdefault("killed", "timeout")
                self._kill_execution(pid)


class _Worker:
    """One forked process: isolates itself and drops privileges, then runs exactly one request.

    Everything that does not depend on the request happens before it arrives (while the worker
    waits in the parent's pool), so a request only costs a recvmsg, a few dup2s and the code.
    """

    def __init__(self, zygote: Zygote, sock: socket.socket, uid: int | None, warm_up: bool) -> None:
        self.zygote = zygote
        self.sock = sock
        self.uid = uid
        self.config = zygote.config
        self.warm_up = warm_up

    def run(self) -> None:
        """Prepare, wait for the one request, run it and exit (never returns)."""
        try:
            self._prepare()
        except BaseException as exc:
            _report_setup_error(exc)
            os._exit(EXIT_SETUP_FAILED)
        request, fds = self._receive()
        try:
            code, status_fd = self._apply(request, fds)
        except BaseException as exc:
            _write_status(fds[3] if len(fds) == 4 else -1, {"setup_error": f"{type(exc).__name__}: {exc}"})
            os._exit(EXIT_SETUP_FAILED)
        os._exit(_execute(code, self.config["print_last_expression"], status_fd))

    def _prepare(self) -> None:
        cfg = self.config
        caps = self.zygote.capabilities
        uid = self.uid
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        _close_fds_except(2, self.sock.fileno(), *self.zygote.path_fds.values())
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.zygote.pid:
            os._exit(EXIT_SETUP_FAILED)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if caps["network"] == "per_call":
            _unshare(CLONE_NEWNET)
        if caps["mount_namespace"]:
            self.zygote._mount_private_tmp()
            workdir = "/tmp"
            if uid is not None:
                os.chown("/tmp", uid, uid)
                if os.path.isdir("/dev/shm"):
                    os.chown("/dev/shm", uid, uid)
        else:
            workdir = os.path.join(self.zygote.workdir_root, f"run-{os.getpid()}")
            os.mkdir(workdir, 0o700)
            if uid is not None:
                os.chown(workdir, uid, uid)
        os.chdir(workdir)

        memory = _vm_size_bytes() + cfg["memory_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        file_size = cfg["max_file_size_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["max_open_files"], cfg["max_open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_processes"], cfg["max_processes"]))
        elif self.zygote.nonroot_nproc is not None:
            limit = self.zygote.nonroot_nproc
            resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))

        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "PWD": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "HIP_VISIBLE_DEVICES": "",
        }
        environment.update(cfg["env"])
        os.environ.clear()
        os.environ.update(environment)

        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _prctl(PR_SET_DUMPABLE, 1)  # else /proc/self stays root-owned and unreadable to us
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the credential change above
        if os.getppid() != self.zygote.pid:
            os._exit(EXIT_SETUP_FAILED)
        # Standard streams: /dev/null until the request's pipes are dup2'ed over fds 1 and 2.
        null_in = os.open(os.devnull, os.O_RDONLY)
        null_out = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null_in, 0)
        os.dup2(null_out, 1)
        os.dup2(null_out, 2)
        os.close(null_in)
        os.close(null_out)
        _install_standard_streams()
        _reseed_random_generators()
        if self.warm_up:
            for snippet in (WARM_UP_CODE, WARM_UP_ERROR_CODE):
                _execute(snippet, cfg["print_last_expression"])
            _install_standard_streams()

    def _receive(self) -> tuple[dict[str, Any], list[int]]:
        fds = array.array("i")
        try:
            data, ancillary, _, _ = self.sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * fds.itemsize))
        except OSError:
            os._exit(0)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        if not data:  # the parent closed the socket without sending a request
            os._exit(0)
        return json.loads(data), list(fds)

    def _apply(self, request: dict[str, Any], fds: list[int]) -> tuple[str, int]:
        if len(fds) != 4:
            raise RuntimeError(f"the request carried {len(fds)} descriptors, expected 4")
        code_fd, stdout_fd, stderr_fd, status_fd = fds
        # The status descriptor goes to the highest allowed number, out of the way of user code.
        status_target = self.config["max_open_files"] - 1
        os.dup2(status_fd, status_target, inheritable=False)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        code = _read_all(code_fd).decode("utf-8", errors="surrogatepass")
        for fd in (code_fd, stdout_fd, stderr_fd, status_fd):
            if fd > 2 and fd != status_target:
                os.close(fd)
        self.sock.close()
        cpu = max(1, math.ceil(request["cpu_s"]))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        return code, status_target


def _report_setup_error(exc: BaseException) -> None:
    """Tell the zygote's stderr (the parent's) why a worker could not prepare."""
    try:
        os.write(2, f"strands_slime sandbox worker setup failed: {type(exc).__name__}: {exc}\n".encode())
    except OSError:
        pass


def _write_status(fd: int, status: dict[str, Any]) -> None:
    try:
        os.write(fd, json.dumps(status).encode() + b"\n")
    except OSError:
        pass


def _install_standard_streams() -> None:
    import io

    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout, sys.stderr = (
        io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        for fd in (1, 2)
    )


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _reseed_random_generators() -> None:
    """Forked children share the zygote's RNG state; give each execution its own."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed(int.from_bytes(os.urandom(4), "little"))


def _execute(code: str, print_last_expression: bool, status_fd: int | None = None) -> int:
    """Run ``code`` as ``__main__``; return the process exit code. Runs as the unprivileged user.

    On a normal finish the exit code and resource usage go to ``status_fd`` and the output pipes are
    closed before exiting, so the caller has the result without waiting for the process teardown.
    """
    import ast
    import builtins
    import linecache
    import threading
    import traceback
    import types

    sys.argv = [""]
    if "" not in sys.path:
        sys.path.insert(0, "")
    linecache.cache[CODE_FILENAME] = (len(code), None, code.splitlines(True), CODE_FILENAME)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main

    exit_code = 0
    try:
        tree = ast.parse(code, CODE_FILENAME)
        last_expression = None
        if print_last_expression and tree.body and isinstance(tree.body[-1], ast.Expr):
            last_expression = ast.Expression(tree.body.pop().value)
        exec(compile(tree, CODE_FILENAME, "exec"), main.__dict__)
        if last_expression is not None:
            value = eval(compile(last_expression, CODE_FILENAME, "eval"), main.__dict__)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        exit_code = _system_exit_code(exc)
    except BaseException as exc:
        exit_code = 1
        _print_user_traceback(exc, traceback)
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        import atexit

        atexit._run_exitfuncs()
    except BaseException as exc:
        exit_code = exit_code or 1
        _print_user_traceback(exc, traceback)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            exit_code = exit_code or 1
    if status_fd is None:
        return exit_code
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    status = {
        "exit_code": exit_code,
        "cpu_s": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
        "max_rss_kb": max(own.ru_maxrss, children.ru_maxrss),
    }
    _write_status(status_fd, status)
    for fd in (1, 2, status_fd):
        try:
            os.close(fd)
        except OSError:
            pass
    return exit_code


def _system_exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:
        print(exc.code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _print_user_traceback(exc: BaseException, traceback: Any) -> None:
    """Print the traceback without the sandbox's own frames (they start every chain)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CODE_FILENAME:
        tb = tb.tb_next
    try:
        traceback.print_exception(type(exc), exc, tb)
    except BaseException:
        pass


def main() -> None:
    """Entry point: ``python -I -S _zygote.py <socket-fd> <parent-pid>``."""
    control = socket.socket(fileno=int(sys.argv[1]))
    zygote = Zygote(control, int(sys.argv[2]))
    zygote.start()
    zygote.serve()


if __name__ == "__main__":
    main()
