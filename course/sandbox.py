"""The sandbox: a fork server that has imported torch and nothing of the course, one worker per exercise (a
session of its own, namespaces, a cgroup, the sandbox user, no new privileges, a seccomp filter), and frames
on a socket of its own between the worker and the grader; what crosses is inputs and plain values, never
reference code or expected values."""
import fcntl
import inspect
import json
import os
import select
import shutil
import socket
import stat
import struct
import sys
import threading
import time
import types
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
import torch

import agentic_rl as A
import course


MAX_REPLY_BYTES = 8 << 20           # a worker's reply; a check's message keeps MAX_MESSAGE characters of it
SANDBOX_USER = "agentic_rl_student"   # made by the bundle's setup.sh; as root elsewhere, `nobody` stands in
MEMORY_LIMIT = 2 << 30                # bytes a worker may add to what torch already maps (all its processes together)
WORKER_TASKS = 64                     # processes and threads of a worker and all it starts, where a cgroup holds them
TASKS_WITHOUT_CGROUP = 8              # else the sandbox user's cap on them; each process has MEMORY_LIMIT / 8
CGROUP_ROOT = "/sys/fs/cgroup"        # where the machine mounts its cgroups (v2, or v1's memory and pids)


def to_wire(x, handles: dict):
    """A value as plain JSON for the grader's pipe: tensors, tuples, dicts, dataclasses tagged; any other
    object (a store, a function, a module) stays where it is and travels as a handle to it."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        items = [to_wire(v, handles) for v in x]
        return items if type(x) is list else {"~tuple": items}
    if isinstance(x, dict):
        return {"~dict": [[to_wire(k, handles), to_wire(v, handles)] for k, v in x.items()]}
    if isinstance(x, torch.Tensor):
        return {"~tensor": x.detach().cpu().tolist(), "dtype": str(x.dtype).split(".")[-1]}
    if isinstance(x, (np.ndarray, np.generic)):
        return to_wire(x.tolist(), handles)
    if is_dataclass(x) and not isinstance(x, type):
        return {"~dataclass": type(x).__name__, "fields": {f.name: to_wire(getattr(x, f.name), handles) for f in fields(x)}}
    if hasattr(x, "_wire_handle"):                    # the grader passing back a handle it was given
        return {"~handle": x._wire_handle}
    key = next((k for k, v in handles.items() if v is x), len(handles))
    handles[key] = x
    return {"~handle": key, "type": type(x).__name__}


def from_wire(x, build, handle):
    """The inverse of to_wire; build(name, fields) makes a dataclass, handle(tag) resolves a handle."""
    if isinstance(x, list):
        return [from_wire(v, build, handle) for v in x]
    if not isinstance(x, dict):
        return x
    if "~tuple" in x:
        return tuple(from_wire(v, build, handle) for v in x["~tuple"])
    if "~dict" in x:
        return {from_wire(k, build, handle): from_wire(v, build, handle) for k, v in x["~dict"]}
    if "~tensor" in x:
        return torch.tensor(x["~tensor"], dtype=getattr(torch, x["dtype"]))
    if "~dataclass" in x:
        return build(x["~dataclass"], {k: from_wire(v, build, handle) for k, v in x["fields"].items()})
    return handle(x)


# ------------------------------------------------------------------------------------------------
# The sandbox: a fork server, one worker per exercise, frames on a socket of their own
# ------------------------------------------------------------------------------------------------
def send(sock, message):
    """One frame: 8 bytes of length, then the JSON. Nothing the student prints can look like one."""
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!Q", len(data)) + data)


def receive(sock, limit: int, deadline=None):
    """The next frame's message, or None when the other side is gone; with a deadline (time.monotonic),
    TimeoutError once it passes, however slowly the bytes drip in."""
    def recv(n):
        if deadline is not None:
            sock.settimeout(max(0.0, deadline - time.monotonic()) or 1e-6)
        return sock.recv(n)
    head = b""
    while len(head) < 8:
        chunk = recv(8 - len(head))
        if not chunk:
            return None
        head += chunk
    size, data = struct.unpack("!Q", head)[0], bytearray()
    if size > limit:
        raise ValueError(f"a frame of {size} bytes (at most {limit})")
    while len(data) < size:
        chunk = recv(min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def serve(sock, callbacks):
    """The student's side, in the worker: import their agentic_rl.py and envs.py (the folder holds
    nothing else), then answer requests: getattr / call / grad on a handle (0 = agentic_rl, 1 = envs)
    with a value or what their code raised, each reply carrying its request's id. It judges nothing and holds nothing of the reference: the
    pieces named in callbacks ask the grader for each value."""
    def raised(e, asked=None):
        send(sock, {"raised": [c.__name__ for c in type(e).__mro__], "message": f"{e}"[:4000],
                    "stated": raised_by_a_statement(e), "id": asked})
    try:
        import agentic_rl as student
        import envs as student_envs
    except BaseException as e:
        return raised(e)
    table = {0: student, 1: student_envs}

    def ask_grader(name, *args):
        send(sock, {"callback": name, "args": to_wire(list(args), table)})
        reply = receive(sock, 1 << 20) or {"error": "no answer"}
        if "value" not in reply:
            raise ValueError(f"{name}{args}: {reply['error']}")
        return from_wire(reply["value"], None, None)
    for name in callbacks:
        setattr(student, name, lambda *args, _name=name: ask_grader(_name, *args))
    build = lambda name, f: getattr(student if hasattr(student, name) else student_envs, name)(**f)
    send(sock, {"ready": True})
    while (req := receive(sock, 1 << 26)) is not None:
        try:
            args = from_wire(req.get("args", []), build, lambda tag: table[tag["~handle"]])
            kwargs = from_wire(req.get("kwargs", {"~dict": []}), build, lambda tag: table[tag["~handle"]])
            target = table[req.get("target", 0)]
            if req["op"] == "getattr":
                result = getattr(target, req["name"])
            elif req["op"] == "call":
                result = target(*args, **kwargs)
            else:                                      # grad: the loss and d loss / d args[wrt]
                args[req["wrt"]] = args[req["wrt"]].detach().clone().requires_grad_()
                result = target(*args, **kwargs)
                (result[0] if isinstance(result, tuple) else result).backward()
                result = (result, args[req["wrt"]].grad)
            send(sock, {"value": to_wire(result, table), "id": req.get("id")})
        except BaseException as e:                     # sys.exit too: it is an answer, not the end
            raised(e, req.get("id"))


def raised_by_a_statement(e: BaseException) -> bool:
    """Whether the student's code raised e itself (`raise MemoryError(...)`): the instruction its traceback ends on is
    a raise statement. A real allocation failure (the worker's memory limit) ends on the call that allocated."""
    import dis
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and dis.opname[tb.tb_frame.f_code.co_code[tb.tb_lasti]] == "RAISE_VARARGS"


def worker(sock, out_fd: int, req: dict):
    """One exercise's process, set up before any student code runs: a session of its own, output to the
    grader's drain, no other descriptor, an empty session keyring of its own (not the grader's); as root,
    namespaces of its own (isolate: no network, its own System V IPC, process ids and files) and then the
    sandbox user, with a cap on processes; always a memory limit, a clean environment, no new privileges and
    a seccomp filter (lock_down). As root, its cgroup (the fork server's make_cgroup) holds it before
    anything else: memory and tasks limited for all it starts together; without one, the sandbox user's
    cap on processes and threads is lower and each process's memory limit a share of the worker's. Then
    serve(), or compile_only()."""
    import ctypes
    import resource
    try:
        os.setsid()
        ctypes.CDLL(None).syscall(250, 1, None)       # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new, empty one
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.closerange(3, sock.fileno())
        os.closerange(sock.fileno() + 1, 1 << 16)
        os.chdir(req["folder"])
        for cgroup in req.get("cgroups", []):         # as root, first: all it starts is in the cgroup too
            with open(f"{cgroup}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        folder, isolation = req["folder"], "network shared, ipc shared, pids shared, files shared"
        memory, tasks = req["memory"], None           # the memory each process may add to what it maps now
        if os.getuid() == 0 and req["uid"] is not None:
            folder, isolation = isolate()
            tasks = req["tasks"] if req.get("cgroups") else req["tasks_without_cgroup"]
            memory //= 1 if req.get("cgroups") else tasks     # without a cgroup, tasks x memory is the worker's
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))   # the sandbox user's processes and threads
            os.setgroups([])
            os.setgid(req["gid"])
            os.setuid(req["uid"])
        torch.set_num_threads(min(torch.get_num_threads(), max(1, (tasks or 64) // 4)))  # its threads count as tasks
        mapped = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mapped + memory,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 26,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        sys.path.insert(0, folder)
        os.environ.clear()
        os.environ.update(HOME=folder, PATH="/usr/bin:/bin", TMPDIR="/tmp")
        limits = f"memory {req['memory'] >> 20} MiB and {req['tasks']} tasks for the worker and all it starts " \
                 f"({req['cgroup']})" if req.get("cgroups") else f"memory {memory >> 20} MiB a process (no cgroup" + \
                 (f"; {tasks} tasks of the sandbox user: {tasks * memory >> 20} MiB in all)" if tasks else ")")
        isolation += ", " + limits + ", " + lock_down()
        send(sock, {"sandbox": {"uid": os.getuid(), "isolation": isolation}})
    except BaseException as e:                         # the grader's failure, reported as such
        send(sock, {"setup_failed": f"{type(e).__name__}: {e}"})
        os._exit(0)
    try:
        compile_only(sock, req["compile"]) if req.get("compile") else serve(sock, req["callbacks"])
    finally:
        os._exit(0)


def compile_only(sock, names):
    """A worker's other errand: do these files of its folder compile? Compiled here, under the worker's limits
    (a file can take the compiler minutes or gigabytes), and never run. Answers name -> None, or what the
    compiler raised (the kinds of exception, the message)."""
    found = {}
    for name in names:
        try:
            with open(name, "rb") as f:
                compile(f.read(), name, "exec")
            found[name] = None
        except Exception as e:                # SyntaxError, and what a pathological file makes of the compiler
            found[name] = {"raised": [c.__name__ for c in type(e).__mro__], "message": f"{e}"[:300]}
    send(sock, {"compiled": found})


def isolate() -> tuple:
    """As root, in the worker, before it becomes the sandbox user: namespaces of its own for the network
    (none at all), System V IPC (a shared-memory segment, semaphore or message queue it makes dies with it,
    unseen by the next exercise or student), process ids (it is process 1 of its own: it can signal nothing
    else, and when it ends the kernel kills all it started) and mounts (private_root: its folder, the
    system's libraries and nothing else of the machine). One the platform refuses stays shared. Returns
    (its folder as it now sees it, what holds: the grader's note)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    network = libc.unshare(0x40000000) == 0                  # CLONE_NEWNET
    ipc = libc.unshare(0x08000000) == 0                      # CLONE_NEWIPC
    pids = libc.unshare(0x20000000) == 0                     # CLONE_NEWPID: it takes effect for the next child
    if pids and os.fork() != 0:
        os._exit(0)           # this process stays outside; its child, process 1 inside, goes on (the fork server reaps it)
    files = libc.unshare(0x20000) == 0 and \
        libc.mount(b"none", b"/", None, 0x44000, None) == 0 and private_root(libc, pids)  # NEWNS; / MS_REC|MS_PRIVATE
    said = lambda holds, word="private": word if holds else "shared"
    return ("/tmp/work" if files else os.getcwd(),
            f"network {said(network, 'none')}, ipc {said(ipc)}, pids {said(pids)}, files {said(files)}")


def private_root(libc, own_proc: bool) -> bool:
    """The worker's whole filesystem, built in a small tmpfs mounted over /tmp and made its root: /tmp,
    /var/tmp, /dev/shm and /run/lock, writable by all and gone with it; /tmp/work, the exercise's folder
    (the current directory: the grader's copy of the submitted files), read-only; /dev's null, zero, full,
    random and urandom; /proc (with own_proc a fresh one, which shows the worker's processes alone, else
    the machine's); and, read-only, the system's programs, libraries and /etc and Python's own files
    (system_paths), each directory on the way to them with the owner and mode it has on the machine.
    Nothing else of the machine is in it: no classmate's folder, no grading installation, no socket of
    the host's services. False, with nothing changed, where the platform allows no mount; an OSError
    where one fails midway."""
    import ctypes

    def mount(source, target, fstype=None, flags=0):
        if libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags, None):
            raise OSError(f"mount {source} on {target}: errno {ctypes.get_errno()}")

    def bind(source, target):                      # MS_BIND | MS_REC, then MS_REMOUNT | MS_BIND | RDONLY | NOSUID | NODEV
        mount(source, target, flags=0x1000 | 0x4000)
        kept = os.statvfs(target).f_flag & (0x8 | 0x400 | 0x800)   # NOEXEC, NOATIME, NODIRATIME: a container may lock them
        mount(None, target, flags=0x20 | 0x1000 | 0x1 | 0x2 | 0x4 | kept)
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=64m,mode=755"):
        return False
    os.umask(0o022)                                    # what is made here is 755, whatever the grader's umask
    for d in ("tmp", "var/tmp", "dev/shm", "run/lock"):
        os.makedirs(f"/tmp/{d}")
        os.chmod(f"/tmp/{d}", 0o1777)
    os.mkdir("/tmp/tmp/work")
    bind(".", "/tmp/tmp/work")
    for name in ("null", "zero", "full", "random", "urandom"):
        open(f"/tmp/dev/{name}", "x").close()
        mount(f"/dev/{name}", f"/tmp/dev/{name}", flags=0x1000)                  # MS_BIND: the device itself
    os.symlink("/proc/self/fd", "/tmp/dev/fd")
    os.mkdir("/tmp/proc")
    if not (own_proc and libc.mount(b"proc", b"/tmp/proc", b"proc", 0x2 | 0x4 | 0x8, None) == 0):  # NOSUID, NODEV, NOEXEC
        mount("/proc", "/tmp/proc", flags=0x1000 | 0x4000)                        # the machine's, where it has no other
    for path in system_paths():
        parts = path.split("/")
        for up in ("/".join(parts[:i]) for i in range(2, len(parts))):   # the directories on the way, as the machine has them
            if not os.path.exists(f"/tmp{up}"):
                info = os.stat(up)
                os.mkdir(f"/tmp{up}")
                os.chown(f"/tmp{up}", info.st_uid, info.st_gid)
                os.chmod(f"/tmp{up}", info.st_mode & 0o7777)
        os.mkdir(f"/tmp{path}")
        bind(path, f"/tmp{path}")
    os.chdir("/tmp")
    if os.uname().machine == "x86_64" and libc.syscall(155, b".", b".") == 0:  # pivot_root(".", "."): old root on top
        if libc.umount2(b".", 2):                      # MNT_DETACH: and gone from this namespace, the machine's files too
            raise OSError(f"detaching the machine's root: errno {ctypes.get_errno()}")
    elif libc.chroot(b"."):    # another machine, or a root pivot_root refuses: the machine's stays mounted, out of reach
        raise OSError(f"chroot: errno {ctypes.get_errno()}")    # of a process without privileges
    os.chdir("/tmp/work")
    return True


def system_paths() -> list:
    """What a worker's root keeps of the machine (read-only): the system's programs, libraries and /etc,
    and Python's own files (its prefixes and every folder on the fork server's sys.path); each once, not
    one inside another. Where Python's files live under a folder the sandbox user cannot enter (a pyenv
    under /root), it still cannot: the folders on the way keep their owners and modes."""
    wanted = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
              sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sys.path]
    kept = []
    for path in sorted({os.path.normpath(p) for p in wanted if os.path.isabs(p) and os.path.isdir(p)}):
        if path != "/" and not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def lock_down() -> str:
    """The last step before the student's code: no new privileges (a setuid program runs without its
    owner's rights) and, on x86_64, a seccomp filter (seccomp_program) that everything the worker starts
    inherits. Returns what holds, for the grader's note; where there is no filter (another machine, or the
    kernel refuses it) it says so, and what that leaves open."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0):                              # PR_SET_NO_NEW_PRIVS
        raise OSError(f"no_new_privs: errno {ctypes.get_errno()}")
    if os.uname().machine != "x86_64":
        return "no new privileges, seccomp off (its syscall numbers are x86_64's: new sockets and the user's keyrings allowed)"

    class Line(ctypes.Structure):                               # struct sock_filter
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):                            # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Line))]
    lines = [Line(*line) for line in seccomp_program()]
    program = Program(len(lines), (Line * len(lines))(*lines))
    # the worker has one thread here (a fork's child), so the filter covers the whole process
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0):         # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"no new privileges, seccomp off (errno {ctypes.get_errno()}: new sockets and the user's keyrings allowed)"
    return "no new privileges, seccomp on (no sockets, no keyrings)"


def seccomp_program() -> list:
    """The seccomp filter, as classic BPF lines (code, jump if true, jump if false, k) read by the kernel
    before each system call: no user namespace (unshare or clone with CLONE_NEWUSER: EPERM); no socket
    at all (socket, socketpair and connect: EPERM; the worker's socket to the grader exists and is connected
    already, a new one could reach the network where no namespace holds, a host's unix socket by its path,
    or the hypervisor over AF_VSOCK, which no network namespace holds); no kernel keyring (add_key,
    request_key, keyctl: EPERM; keyrings belong to a user, not to a namespace, so they would carry data from
    one exercise or student to the next, or reach the grader's); clone3 and io_uring_setup answer ENOSYS, as
    in Docker's default profile (glibc then falls back to clone, whose flags a filter can read; io_uring could
    open sockets past it), and so does any call of another ABI (32-bit int 0x80, x32), whose numbers differ."""
    load = lambda offset: (0x20, 0, 0, offset)          # BPF_LD | BPF_W | BPF_ABS: a 32-bit word of seccomp_data
    answer = lambda errno: (0x06, 0, 0, 0x50000 | errno)  # BPF_RET: SECCOMP_RET_ERRNO | errno
    allow = (0x06, 0, 0, 0x7FFF0000)                    # BPF_RET: SECCOMP_RET_ALLOW
    enosys, eperm = 38, 1
    program = [load(4), (0x15, 1, 0, 0xC000003E), answer(enosys),      # arch; BPF_JEQ AUDIT_ARCH_X86_64
               load(0), (0x35, 0, 1, 0x40000000), answer(enosys)]      # the call's number; BPF_JGE the x32 bit
    for number in (435, 425):                                          # clone3, io_uring_setup
        program += [(0x15, 0, 1, number), answer(enosys)]
    for number in (41, 53, 42,                                         # socket, socketpair, connect
                   248, 249, 250):                                     # add_key, request_key, keyctl
        program += [(0x15, 0, 1, number), answer(eperm)]
    for number in (272, 56):                                           # unshare, clone: BPF_JSET CLONE_NEWUSER
        program += [(0x15, 0, 4, number), load(16), (0x45, 0, 1, 0x10000000), answer(eperm), allow]  # arg 0's low word
    return program + [allow]


def below(root: int) -> list:
    """Every live process whose chain of parents reaches root, read from /proc."""
    parent = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, ppid = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            parent[int(name)] = int(ppid)
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid == frontier[-1]]
        frontier.pop()
        found += kids
        frontier += kids
    return found


def kill_all(uid) -> int:
    """Stop, then kill, every process below this server (an orphan comes back here: the server is
    its subreaper) and, as root, every process of the sandbox user; again until none is left; then, as
    root, remove what the sandbox user left (remove_leftovers). Returns how many processes it killed."""
    import signal
    killed = 0
    for _ in range(1000):
        while True:                                    # reap the dead
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if uid is not None and os.getuid() == 0:
            as_sandbox_user(uid, lambda: os.kill(-1, signal.SIGKILL))   # kill(-1) as that user: all its processes
        victims = below(os.getpid())
        if not victims:
            if uid is not None and os.getuid() == 0:
                as_sandbox_user(uid, lambda: (os.kill(-1, signal.SIGKILL), remove_leftovers()))
            return killed
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first, so none can fork in between
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        killed += len(victims)
        time.sleep(0.01)
    raise RuntimeError("processes keep appearing below the fork server")


def cgroup_parents(root: str) -> tuple:
    """("cgroup v2", [its folder] * 2) or ("cgroup v1", [memory's, pids']): where this process's workers' cgroups go."""
    own = {}                                          # controller -> the server's cgroup; "" is v2's
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        own.update((c, path.rstrip("/")) for c in controllers.split(","))
    if os.path.exists(f"{root}/cgroup.controllers"):
        return "cgroup v2", [f"{root}{own.get('', '')}"] * 2
    return "cgroup v1", [f"{root}/{c}{own.get(c, '')}" for c in ("memory", "pids")]


def make_cgroup(root: str, name: str, memory: int, tasks: int) -> tuple:
    """As root, a cgroup for one worker, under the fork server's own, where the machine has one to write to:
    cgroup v2 (one folder, where memory and pids can be enabled for it) or v1 (a folder in its memory and
    in its pids hierarchy). Its limits hold for the worker and all it starts together: `memory` bytes
    (swap included, where v1 counts it), `tasks` processes and threads; v2's OOM killer takes them all at once
    (memory.oom.group), so no process left behind holds the worker's socket open. Returns (its folders, "cgroup v1"
    or "cgroup v2"), or ([], None) where there is none, with nothing left behind."""
    version, parents = cgroup_parents(root)
    limits = {"memory.max": memory, "memory.swap.max": 0, "memory.oom.group": 1, "memory.limit_in_bytes": memory,
              "memory.memsw.limit_in_bytes": memory, "pids.max": tasks}
    made, written = [], set()
    try:
        if version == "cgroup v2" and not {"memory", "pids"} <= set(open(f"{parents[0]}/cgroup.subtree_control").read().split()):
            with open(f"{parents[0]}/cgroup.subtree_control", "w") as f:   # EBUSY where the server's has processes
                f.write("+memory +pids")
        for parent in dict.fromkeys(parents):
            os.mkdir(f"{parent}/{name}")
            made.append(f"{parent}/{name}")
            for file, value in limits.items():        # those this kind of folder has; memory's before memsw's
                if os.path.exists(f"{parent}/{name}/{file}"):
                    with open(f"{parent}/{name}/{file}", "w") as f:
                        f.write(str(value))
                    written.add(file)
        if "pids.max" not in written or not written & {"memory.max", "memory.limit_in_bytes"}:
            raise OSError("no memory or no pids controller")
        return made, version
    except OSError:
        remove_cgroups(made)
        return [], None


def remove_stale_cgroups(root: str):
    """As root, the cgroups a killed grading left (agentic-rl-SERVER-N, whose fork server is gone): their processes
    killed, the folders removed. Gradings as root take turns (a lock), so no live grading's is touched."""
    import glob
    import signal
    try:
        parents = set(cgroup_parents(root)[1])
    except (OSError, ValueError):
        return
    for folder in [f for parent in parents for f in glob.glob(f"{parent}/agentic-rl-*-*")]:
        server = folder.rsplit("/", 1)[1].split("-")[2]
        if not server.isdigit() or os.path.exists(f"/proc/{server}") and int(server) != os.getpid():
            continue
        for _ in range(100):
            try:
                pids = [int(p) for p in open(f"{folder}/cgroup.procs").read().split()]
            except OSError:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(0.01)
        remove_cgroups([folder])


def remove_cgroups(folders: list):
    """Remove a worker's cgroup once its processes are gone (a dying one may hold it for a moment)."""
    for folder in folders:
        for _ in range(100):
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def as_sandbox_user(uid, action):
    """Run action() in a child that has become the sandbox user (uid: its user and group ids): it can do
    only what that user may, to that user's processes and files."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid[1])
            os.setuid(uid[0])
            action()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def remove_leftovers():
    """As the sandbox user, once its processes are gone: remove what they left on the machine, which the next
    exercise or student would find wherever a worker had no namespaces of its own (no CAP_SYS_ADMIN): System V
    shared memory, semaphores and message queues (IPC_RMID: the kernel removes those this user owns or made,
    and refuses the others), and its files and folders in /tmp, /var/tmp, /dev/shm and /run/lock and in any
    folder there that every user may write to, without following a link."""
    import ctypes
    libc = ctypes.CDLL(None)
    removers = {"shm": lambda i: libc.shmctl(i, 0, None), "sem": lambda i: libc.semctl(i, 0, 0),   # IPC_RMID
                "msg": lambda i: libc.msgctl(i, 0, None)}
    for kind, remove in removers.items():
        try:
            for line in open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]:   # key, id, ...
                remove(int(line.split()[1]))
        except OSError:                               # a kernel without System V IPC
            pass

    def remove_own(folder):
        for entry in os.scandir(folder):
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid != os.getuid():
                    if entry.is_dir(follow_symlinks=False) and info.st_mode & 0o002:
                        remove_own(entry.path)        # another's folder, which every user may write to
                elif not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)             # a file, a link (not what it points to), a FIFO, a socket
                else:                                 # its folder: each folder in it opened again to its owner
                    os.chmod(entry.path, 0o700)       # (it may have closed them), then removed with all they hold
                    for inside, folders, _ in os.walk(entry.path):
                        for name in folders:
                            if not os.path.islink(os.path.join(inside, name)):
                                os.chmod(os.path.join(inside, name), 0o700)
                    shutil.rmtree(entry.path)
            except OSError:
                pass
    for top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        try:
            remove_own(top)
        except OSError:
            pass


def fork_server(control_fd: int):
    """A fresh interpreter that has imported torch, numpy, gymnasium and the standard library, and
    nothing of the course: it forks a worker per exercise (no torch import each time) and, asked to,
    kills every process below it. As root, each worker has a cgroup of its own (make_cgroup), removed once
    its processes are killed."""
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)           # PR_SET_CHILD_SUBREAPER: orphans are reparented here
    control = socket.socket(fileno=control_fd)
    cgroups, forks, uid = [], 0, None
    while (req := receive(control, 1 << 16)) is not None:
        if req["op"] == "fork":
            forks += 1
            uid = req["uid"]
            if os.getuid() == 0 and forks == 1:
                remove_stale_cgroups(req["cgroup_root"])
            if os.getuid() == 0:
                req["cgroups"], req["cgroup"] = make_cgroup(req["cgroup_root"], f"agentic-rl-{os.getpid()}-{forks}",
                                                            req["memory"], req["tasks"])
                cgroups += req["cgroups"]
            mine, theirs = socket.socketpair()
            out_r, out_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                control.close()
                mine.close()
                os.close(out_r)
                worker(theirs, out_w, req)
            theirs.close()
            os.close(out_w)
            socket.send_fds(control, [b"F"], [mine.fileno(), out_r])
            send(control, {"pid": pid, "cgroups": req.get("cgroups", [])})
            mine.close()
            os.close(out_r)
        else:
            killed = kill_all(req["uid"])
            remove_cgroups(cgroups)
            cgroups = []
            send(control, {"killed": killed})
    kill_all(uid)                                     # the grader closed the socket (or was killed): nothing of
    remove_cgroups(cgroups)                           # the grading is left behind, no process and no cgroup
    os._exit(0)


SERVER_IMPORTS = (  # with project_imports(): what a worker can import where the sandbox user cannot read Python's files
    "import argparse, bisect, collections, concurrent.futures, contextlib, copy, ctypes, dataclasses, decimal, enum, "
    "fractions, functools, hashlib, heapq, inspect, io, itertools, json, math, operator, os, pathlib, queue, random, re, "
    "resource, shutil, signal, socket, statistics, string, struct, sys, textwrap, threading, time, types, typing, warnings\n"
    "from dataclasses import fields, is_dataclass\nimport numpy as np, torch, torch.nn, torch.nn.functional, gymnasium, "
    "gymnasium.spaces, gymnasium.vector.utils, gymnasium.wrappers, tqdm, pytest")


def project_imports() -> str:
    """`import` lines for every module the project's own files import (their dependencies and the
    standard library modules they use): the fork server imports them before any worker exists."""
    import ast
    names = set()
    for name in ("agentic_rl.py", "envload.py", "envs.py"):  # what `import agentic_rl` imports
        for node in ast.walk(ast.parse((course.REPO / name).read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module)
    own = {"__future__", "agentic_rl", "envs", "envload", "tools"}  # the project's own modules, never imported here:
    # envload and the tools import envs or agentic_rl, which would then be the reference's in place of the student's
    return "\n".join(f"import {n}" for n in sorted(n for n in names if n.split(".")[0] not in own))


class GradeTimeout(Exception):
    pass


class WorkerGone(Exception):
    pass


class WorkerOutOfMemory(Exception):
    """The kernel's OOM killer took a process of the worker's cgroup: the student's code passed its memory limit."""


class IsolationMissing(Exception):
    """grade --require-isolation, on a machine where the workers would run with less than the whole sandbox."""


ISOLATION = (("network none", "network namespace"), ("ipc private", "IPC namespace"), ("pids private", "PID namespace"),
             ("files private", "mount namespace"), ("cgroup v", "cgroup"), ("seccomp on", "seccomp filter"))


def missing_isolation(note: str) -> list:
    """What a grading's workers ran without, read from the grader's note (the sandbox user, each namespace, the
    cgroup, the seccomp filter); nothing when no worker started (no code of the student's ran)."""
    if "no worker started" in note:
        return []
    return ["sandbox user"] * ("no sandbox user" in note) + [what for mark, what in ISOLATION if mark not in note]


class GraderFailure(Exception):
    """Something failed on the grader's side: the verdict says so and never blames the student."""


INSTALLED = ("agentic_rl.py", "envs.py", "test_agentic_rl.py", "course", "silent_bug.txt", "hidden_seed.txt")  # no student
# may read them: the reference, the checks that draw hidden inputs, the grader's own code, the course's secret


class Sandbox:
    """The fork server of one grading: its settings (the sandbox user as root, the memory limit) and
    the socket to it. As root it refuses (ValueError) an installation whose files the sandbox user
    could read. As a context manager it leaves no process behind."""

    def __init__(self, user=SANDBOX_USER, memory: int = MEMORY_LIMIT):
        import pwd
        import subprocess
        self.uid, self.memory, self.note = None, memory, "user"
        if os.getuid() == 0 and user:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                entry = pwd.getpwnam("nobody")         # a local grading run as root, without the bundle's user
            exposed = [name + "/" * (course.REPO / name).is_dir() for name in INSTALLED
                       if any(map(readable_by_others, files_of(course.REPO / name)))]
            if exposed:
                raise ValueError(f"{course.REPO}: the sandbox user ({entry.pw_name}) can read {', '.join(exposed)}, and with "
                                 f"them the reference, the hidden checks or the course's secret: run `chmod -R go-rwx "
                                 f"{course.REPO}` (the bundle's setup.sh does) and grade again")
            self.uid = (entry.pw_uid, entry.pw_gid)
            self.note += f" {entry.pw_name}"
        else:
            self.note += f" {os.getuid()} (no sandbox user: the student's code has the grader's rights)"
        self.lock = None
        if self.uid:   # kill_all kills every process of the sandbox user: one grading as root at a time
            self.lock = os.open("/run/agentic-rl-grade.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print("another grading runs as the sandbox user; waiting for it to finish", file=sys.stderr)
                fcntl.flock(self.lock, fcntl.LOCK_EX)
        ours, theirs = socket.socketpair()
        server = (send, receive, to_wire, from_wire, raised_by_a_statement, serve, worker, compile_only, isolate, private_root, system_paths,
                  lock_down, seccomp_program, below, kill_all, as_sandbox_user, remove_leftovers, cgroup_parents,
                  make_cgroup, remove_stale_cgroups, remove_cgroups, fork_server)
        code = "\n".join([SERVER_IMPORTS, project_imports(), *map(inspect.getsource, server),
                          f"fork_server({theirs.fileno()})"])
        env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith(("OMP_", "MKL_", "OPENBLAS_", "LC_", "LANG"))}
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", code], pass_fds=[theirs.fileno()], cwd="/", env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        theirs.close()
        self.control = ours

    def request(self, **message):
        try:
            send(self.control, message)
            if message["op"] == "fork":
                _, fds, _, _ = socket.recv_fds(self.control, 1, 2)
                return fds, receive(self.control, 1 << 12)
            return receive(self.control, 1 << 12)
        except (OSError, ValueError) as e:
            raise GraderFailure(f"the fork server failed ({e})") from None

    def clean(self):
        """Kill every process the submission started; an error if any could survive."""
        reply = self.request(op="clean", uid=self.uid)
        if reply is None:
            raise GraderFailure("the fork server is gone (without a sandbox user the student's code can kill it)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.clean()
        finally:
            self.control.close()
            self.proc.wait(timeout=30)
            if self.lock is not None:
                os.close(self.lock)                   # and with it the lock


def files_of(path: Path) -> list:
    """A file as [itself]; a folder as every file in it, at any depth; nothing where there is nothing."""
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []


def readable_by_others(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can reach and read this file."""
    parts = [path] + list(path.parents)
    return bool(os.stat(path).st_mode & stat.S_IROTH) and all(os.stat(p).st_mode & stat.S_IXOTH for p in parts[1:])


class Worker:
    """One exercise's student process and the socket to it; every reply has a deadline, every value the
    student's code asks of another exercise is answered here."""

    def __init__(self, sandbox: Sandbox, folder, callbacks, deadline: float, compile_only=()):
        """compile_only: names of files in folder that the worker only compiles (see compile_only); its
        answer is then self.ready."""
        self.sandbox, self.deadline, self.tail, self.callbacks = sandbox, deadline, bytearray(), callbacks
        self.allowed = set()  # the (wins, losses) whose sign_test_p this call may ask for (paired_outcomes)
        self.broken = ""      # why the protocol broke (then the worker is killed: nothing after it is read)
        self.asked = 0        # the id of the last request: its reply must carry it
        fds, reply = sandbox.request(op="fork", folder=str(folder), uid=sandbox.uid and sandbox.uid[0],
                                     gid=sandbox.uid and sandbox.uid[1], memory=sandbox.memory, callbacks=callbacks,
                                     compile=list(compile_only), cgroup_root=CGROUP_ROOT, tasks=WORKER_TASKS,
                                     tasks_without_cgroup=TASKS_WITHOUT_CGROUP)
        if len(fds) != 2 or not reply:
            raise GraderFailure("the fork server sent no worker")
        self.sock, self.out, self.cgroups = socket.socket(fileno=fds[0]), fds[1], reply.get("cgroups") or []
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        try:
            setup = self._receive()
            if "sandbox" not in setup:
                raise GraderFailure(f"the worker could not be set up ({setup.get('setup_failed', setup)})")
            sandbox.isolation = setup["sandbox"]["isolation"]
            self.ready = self._receive()
        except BaseException:
            self.close()
            raise

    def _drain(self):
        """What the student prints, as bytes (the last 2,000 kept for messages), read as fast as it comes."""
        while chunk := os.read(self.out, 1 << 16):
            self.tail = (self.tail + chunk)[-2000:]

    def printed(self) -> str:
        return self.tail.decode("utf-8", "replace").strip()[-600:]

    def _receive(self, asked=None) -> dict:
        """The worker's next reply (a callback it asks on the way is answered here); with `asked`, the reply
        must carry that request's id: one out of turn (a frame the student's code wrote, or the reply to a request
        a forged frame answered) breaks the protocol and ends the exercise."""
        while True:
            self._wait_for_a_frame()
            try:
                reply = receive(self.sock, MAX_REPLY_BYTES, self.deadline)
            except TimeoutError:
                if self.out_of_memory():                # the OOM killer took it while a frame came in
                    raise WorkerOutOfMemory(self.killed()) from None
                raise GradeTimeout() from None
            except (OSError, ValueError, RecursionError) as e:
                raise self.gone(f"it sent a malformed reply ({type(e).__name__}: {str(e)[:200]})") from None
            if reply is None:
                if self.out_of_memory():
                    raise WorkerOutOfMemory(self.killed())
                raise WorkerGone(f"last output: {self.printed() or '(none)'}")
            if not isinstance(reply, dict):
                raise self.gone("it sent a malformed reply")
            if "callback" not in reply:
                if asked is not None and reply.get("id") != asked:
                    raise self.gone(f"a reply out of turn: it carried request id {str(reply.get('id'))[:20]}, and "
                                    f"the grader waited for the reply to request {asked}")
                return reply
            if reply["callback"] not in self.callbacks:
                raise self.gone(f"it asked the grader for {str(reply['callback'])[:40]!r}, which this exercise "
                                "may not ask for")
            try:
                send(self.sock, {"value": reference_value(reply["callback"], reply.get("args"), self.allowed)})
            except (ValueError, TypeError) as e:
                send(self.sock, {"error": str(e)})

    def _wait_for_a_frame(self):
        """Until the worker's socket has something to read: its deadline passes first (GradeTimeout), or the kernel's
        OOM killer takes one of its processes (WorkerOutOfMemory, found within 0.2 s, even where a process it
        started keeps the socket open)."""
        while not select.select([self.sock], [], [], max(0.0, min(0.2, self.deadline - time.monotonic())))[0]:
            if self.out_of_memory():
                raise WorkerOutOfMemory(self.killed())
            if time.monotonic() >= self.deadline:
                if self.out_of_memory():
                    raise WorkerOutOfMemory(self.killed())
                raise GradeTimeout()

    def out_of_memory(self) -> bool:
        """Whether the kernel's OOM killer has taken a process of this worker's cgroup (its oom_kill count: v2's
        memory.events, v1's memory.oom_control); never, without a cgroup."""
        for folder in self.cgroups:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    with open(f"{folder}/{name}") as f:
                        if any(line.split()[:1] == ["oom_kill"] and int(line.split()[1]) > 0 for line in f):
                            return True
                except (OSError, ValueError, IndexError):
                    pass
        return False

    def killed(self) -> str:
        self.sandbox.clean()               # whatever of it is left
        return f"the kernel killed your code at the memory limit ({self.sandbox.memory >> 20} MiB for the worker and " \
               f"all it starts)"

    def value(self, **request):
        self.allowed = paired_outcomes(request.get("args")) if self.callbacks else set()  # sign_test_p's answers
        self.asked += 1
        try:
            self.sock.settimeout(max(1e-3, self.deadline - time.monotonic()))
            send(self.sock, {**request, "id": self.asked})
        except TimeoutError:
            if self.out_of_memory():
                raise WorkerOutOfMemory(self.killed()) from None
            raise GradeTimeout() from None
        except OSError:
            if self.out_of_memory():                    # the OOM killer took the worker: its socket is closed
                raise WorkerOutOfMemory(self.killed()) from None
            raise WorkerGone(f"last output: {self.printed() or '(none)'}") from None
        reply = self._receive(self.asked)
        if "raised" in reply:
            raise student_error(reply)
        try:
            return from_wire(reply["value"], lambda name, f: types.SimpleNamespace(**f),
                             lambda tag: Remote(self, tag["~handle"], tag.get("type")))
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise self.gone(f"it sent a malformed value ({type(e).__name__})") from None

    def gone(self, why: str) -> WorkerGone:
        """The protocol broke: kill the worker now (a frame read half, or one the student framed to look like the
        next reply, would be read as an answer), and say why; the exercise's remaining checks are not run."""
        self.broken = why
        self.sock.close()
        self.sandbox.clean()
        return WorkerGone(why)

    def close(self):
        self.sock.close()
        try:
            self.sandbox.clean()
        finally:
            self.drain.join(timeout=5)
            os.close(self.out)


def reference_value(name, args, allowed: set):
    """The one reference piece a worker may ask for (promotion calls sign_test_p): its value for the
    student's arguments, computed here; the code never crosses. Only for the wins and losses of the reports
    in the call being checked, per task solved, denied by a rule or following a note (what a right
    promotion_decision asks): any other answer could be carried out
    in a message, and a table of them hard-codes sign_test."""
    if name != "sign_test_p" or not (isinstance(args, list) and len(args) == 2 and
                                     all(type(x) is int and x >= 0 for x in args) and tuple(args) in allowed):
        raise ValueError("the grader answers sign_test_p(wins, losses) only for the wins and losses of the two "
                         "reports promotion_decision was given, nothing else")
    return A.sign_test_p(*args)


def paired_outcomes(wire) -> set:
    """(wins, losses) of every two equally long 1/0 per-task lists of the same kind that a request carries, both
    ways: per_task (success), each rule's list of denied_tasks, injection_tasks (the safety gates' new and gone)."""
    lists = {}

    def walk(x, within=""):
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for k, v in x.get("~dict", []):
                kind = f"{within}:{k}" if within else k
                if kind in ("per_task", "injection_tasks") or within == "denied_tasks":
                    if isinstance(v, list) and all(type(o) in (int, bool) for o in v):
                        lists.setdefault(kind, []).append(v)
                walk(v, k if k == "denied_tasks" else "")
            for k, v in x.items():
                if k != "~dict":
                    walk(v)
    walk(wire)
    return {(sum(a > b for a, b in zip(x, y)), sum(a < b for a, b in zip(x, y)))
            for same in lists.values() for x in same for y in same if len(x) == len(y)}


def student_error(reply: dict) -> Exception:
    """What the student's code raised, re-raised here as a subclass of the nearest built-in exception
    (so `except ValueError` still works) with the student's class name; never a SystemExit of ours."""
    import builtins
    names = [n for n in reply.get("raised", []) if isinstance(n, str) and n.isidentifier()] or ["Exception"]
    base = next((b for b in (getattr(builtins, n, None) for n in names)
                 if isinstance(b, type) and issubclass(b, Exception)), Exception)
    return type(names[0], (base,), {"from_student": True, "stated": reply.get("stated") is True})(
        str(reply.get("message", ""))[:4000])


class Remote:
    """A student's object as the grader sees it: attribute access and calls become requests to their
    process, and the answers come back as plain data (tensors, lists, namespaces), never their code."""

    def __init__(self, worker: Worker, handle: int, kind=None):
        self._worker, self._wire_handle, self._kind = worker, handle, kind

    def __repr__(self):              # what a check's message shows of it: never the grader's own object
        return f"<{str(self._kind or 'object')[:60]} of your code>"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._worker.value(op="getattr", target=self._wire_handle, name=name)

    def __call__(self, *args, **kwargs):
        return self._worker.value(op="call", target=self._wire_handle, args=to_wire(list(args), {}),
                                  kwargs=to_wire(kwargs, {}))

    def grad(self, wrt: int, *args, **kwargs):
        """(what the function returns, d loss / d args[wrt]), computed in the student's process."""
        return self._worker.value(op="grad", target=self._wire_handle, wrt=wrt, args=to_wire(list(args), {}),
                                  kwargs=to_wire(kwargs, {}))
