"""What an attacking student tries, and what it gains: nothing. Each test grades a submission that attacks the
grader (edited tests, patched checks, endless loops, memory hogs, forged messages, /proc, sockets, keyrings,
shared memory, files left behind, a compiler bomb, a dripping frame) and checks what held."""
import fcntl
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import agentic_rl as A
import course
from course import grading, sandbox
from course.bundle import installation_files
from course.checks import HOMEWORK
from course.conftest import (SECRET, SLOW_SANDBOX, SharedSandbox, course_command, course_here, fill, hold, installation,
                             normalized, reference_answers)
from course.exercises import EXERCISES
from course.grading import grade, verdict
from course.report import checked, exercises, gradescope_results, print_grade, score, suspicious
from course.handouts import write_handout
from course.sandbox import CGROUP_ROOT, SANDBOX_USER, IsolationMissing, Sandbox, WorkerGone, student_error



@SLOW_SANDBOX
def test_edited_tests_patched_checks_endless_loops_and_hard_coding_earn_half_at_most(tmp_path, monkeypatch, shared_sandbox):
    out = tmp_path / "handout"
    write_handout(out, only=["returns", "gae", "sign_test", "ppo_clip"])
    seen, real = {}, A.discounted_returns                        # a student who copies the visible checks' answers

    def spy(rewards, gamma):
        seen[repr((rewards, gamma))] = real(rewards, gamma).tolist()
        return real(rewards, gamma)
    monkeypatch.setattr(A, "discounted_returns", spy)
    for ex, _, fn, hidden in HOMEWORK:
        if ex == "returns" and not hidden:
            fn(A)
    monkeypatch.undo()
    fill(out / "agentic_rl.py", "returns", [f"return torch.tensor({seen!r}.get(repr((rewards, gamma)), [0.0] * len(r)))"])
    fill(out / "agentic_rl.py", "gae", ["while True:", "    pass"])
    fill(out / "agentic_rl.py", "ppo_clip", ["ratio = (logprobs - old_logprobs).exp()",   # min and max swapped
                                             "per_token = -torch.max(ratio * advantages, ratio.clamp(1 - clip_eps, "
                                             "1 + clip_eps) * advantages)",
                                             "loss = (per_token * mask).sum() / mask.sum().clamp(min=1)",
                                             "return loss, {'clip_frac': 0.0, 'approx_kl': 0.0}"])
    with open(out / "agentic_rl.py", "a") as f:                    # patching the checks from inside the student's file
        f.write("\nimport builtins, pytest\npytest.approx = lambda *a, **k: True\n"
                "builtins.AssertionError = type('Never', (Exception,), {})\n")
    (out / "test_agentic_rl.py").write_text("HOMEWORK, EXPERIMENT_CHECKS = [], []\n")
    (out / "conftest.py").write_text("def pytest_runtest_makereport(item, call):\n    call.excinfo = None\n")
    t = time.time()
    report = grade(out, only=["returns", "gae", "ppo_clip", "sign_test", "promotion"], time_limit=3)
    status = {ex: [(c["hidden"], c["status"]) for c in row["checks"]] for ex, row in exercises(report).items()}
    assert all(s == "passed" for hidden, s in status["returns"] if not hidden), status["returns"]
    assert suspicious(report["returns"]) and score(report["returns"])[0] <= 0.5 * EXERCISES["returns"][0]
    assert {s for _, s in status["gae"]} == {"time limit"} and time.time() - t < 60
    assert score(report["ppo_clip"])[0] <= 0.25 * EXERCISES["ppo_clip"][0], status["ppo_clip"]
    assert {s for _, s in status["sign_test"]} == {"not started"}
    assert {s for _, s in status["promotion"]} == {"passed"}, "promotion asks the grader for sign_test_p's values"


@SLOW_SANDBOX
def test_a_file_that_does_not_compile_costs_only_its_own_exercises(tmp_path, shared_sandbox):
    out = tmp_path / "handout"
    write_handout(out, only=["kl_k3"])
    with open(out / "agentic_rl.py", "a") as f:
        f.write("\nraise SystemExit(3)\n")
    report = exercises(grade(out, only=["kl_k3", "sign_test"]))
    assert all(c["status"] == "crashes" and "does not import" in c["message"]
               for row in report.values() for c in row["checks"]), report
    (out / "envs.py").write_text("def broken(:\n")
    shutil.copy(course.REPO / "agentic_rl.py", out / "agentic_rl.py")
    report = exercises(grade(out, only=["sign_test", "permission_rule"]))
    assert {c["status"] for c in report["sign_test"]["checks"]} == {"passed"}, "agentic_rl.py's exercises still count"
    assert all("SyntaxError" in c["message"] for c in report["permission_rule"]["checks"])


HOSTILE = '''
import ctypes, json, os, re, socket, struct, sys, time
RESULTS, SOURCE, SUBMISSION, CLASSMATE, HOST_SOCKET = {results!r}, {source!r}, {submission!r}, {classmate!r}, {host!r}
NOTES = []
def note(what, data):
    NOTES.append(what + ": " + (data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)))
def kl_k3(*args, **kwargs):                          # all this worker found, in the one message the grader reports
    raise RuntimeError("\\n".join(NOTES))
real_recv = socket.socket.recv
def recv(self, *args, **kwargs):                     # record everything the grader sends
    data = real_recv(self, *args, **kwargs)
    note("received", re.sub(rb"[-0-9.e, ]{{40,}}", b"(numbers)", data))   # long runs of numbers hide no code
    return data
socket.socket.recv = recv
libc = ctypes.CDLL(None, use_errno=True)
def checked(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result
def started(pid):                                    # a raw clone's child comes back here too: it leaves at once
    if checked(pid) == 0:
        os._exit(0)
    os.waitpid(pid, 0)
def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
def datagram(path):                                  # a socket pair needs no path of its own to send to one
    one, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    one.connect(path)
clone_args = (ctypes.c_uint64 * 8)(0x10000000, 0, 0, 0, 17, 0, 0, 0)   # clone3's: CLONE_NEWUSER, exit signal SIGCHLD
for name, attempt in [
        ("read the installation", lambda: note("read", open(SOURCE + "/test_agentic_rl.py").read()[:200])),
        ("write the installation", lambda: open(SOURCE + "/silent_bug.txt", "w").write("ratio_always_one")),
        ("patch the checks", lambda: open(SOURCE + "/test_agentic_rl.py", "a").write("\\nHOMEWORK.clear()\\n")),
        ("read the grader", lambda: note("read", open(SOURCE + "/course/checks.py").read()[:200])),
        ("patch the hidden checks", lambda: open(SOURCE + "/course/checks.py", "a").write("\\nHIDDEN_CHECKS.clear()\\n")),
        ("write answers.json", lambda: open(SUBMISSION + "/answers.json", "w").write('{{"silent_bug": "x"}}')),
        ("read a classmate's file", lambda: note("read", open(CLASSMATE).read()[-200:])),
        ("connect to a host socket", lambda: connect(HOST_SOCKET)),
        ("send a datagram to a host socket", lambda: datagram(HOST_SOCKET)),
        ("open an internet socket", lambda: socket.socket(socket.AF_INET).close()),
        ("open a vsock socket", lambda: socket.socket(socket.AF_VSOCK).close()),   # it would reach the hypervisor
        ("read the TA's key", lambda: note("read", checked(libc.syscall(250, 10, -3, b"user", b"ta:api-token", 0)))),
        ("request the TA's key", lambda: checked(libc.syscall(249, b"user", b"ta:api-token", None, 0))),
        ("leave a key for the next", lambda: checked(libc.syscall(248, b"user", b"left", b"x", 1, -4))),
        ("clone a user namespace", lambda: started(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))),   # clone(2)
        ("clone3 a user namespace", lambda: started(libc.syscall(435, ctypes.byref(clone_args), 64))),  # clone3(2)
        ("unshare a user namespace", lambda: checked(libc.unshare(0x10000000)))]:      # last: it would stay in it
    try:
        attempt()
        note(name, "an attempt worked")
    except OSError as e:
        note(name, f"refused ({{e}})")
for line in open("/proc/self/status").read().splitlines():
    if line.startswith(("NoNewPrivs:", "Seccomp:")):
        note("status", line)
note("keys it sees", open("/proc/keys").read())        # a read, which no filter stops
note("processes", sorted(int(pid) for pid in os.listdir("/proc") if pid.isdigit()))
for pid in filter(str.isdigit, os.listdir("/proc")):  # look for the grader through /proc
    for what in ("cwd", "root"):
        try:
            note("found", os.readlink(f"/proc/{{pid}}/{{what}}"))
        except OSError:
            pass
os.write(1, b"\\xff\\xfe not utf-8 " + struct.pack("!Q", 12) + b'{{"value": 1}}' + b"\\n" * 3)
os.write(2, b'{{"ready": true}}\\n\\xff' * 500)
if os.fork() == 0:                                   # a detached child that outlives the worker
    os.setsid()
    if os.fork() == 0:
        for _ in range(100):
            try:
                with open(RESULTS, "w") as f:
                    f.write(json.dumps({{"score": 140.0, "tests": []}}))
            except OSError:
                pass
            time.sleep(0.05)
    os._exit(0)
'''


def keyring_with_a_token():
    """In a grader's process before it starts: a session keyring of its own (gone with its processes) holding
    a TA's token, as a TA's login session may."""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.syscall(250, 1, None)                                             # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)
    libc.syscall(248, b"user", b"ta:api-token", b"token", 5, -3)           # add_key(2) to KEY_SPEC_SESSION_KEYRING


def alive_as(uid: int) -> list:
    return [p for p in filter(str.isdigit, os.listdir("/proc")) if os.path.exists(f"/proc/{p}/status") and
            f"\nUid:\t{uid}\t" in open(f"/proc/{p}/status").read()]


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox user needs a grader running as root (as on Gradescope)")
def test_an_attacking_submission_gains_nothing_and_leaves_nothing_behind(tmp_path):
    """A submission graded as Gradescope grades (as root, from an installation only root can read) in a TA's local
    batch of world-readable folders, beside a host service's unix socket: it reads /proc, tries to read and write
    the installation, to write its answers, to read a classmate's file, to reach the socket, to make a user
    namespace three ways, prints bytes that look like frames, and leaves a child that rewrites the results. It
    reports all it found through its error message, the one way out it has; the classmate is graded next. The
    grader's session keyring holds a TA's token (keyctl search, request_key), and the attack also tries to leave a
    key in the user's keyring (add_key), to open an internet or vsock socket and to reach the host's socket
    through a socket pair."""
    source, results = installation(tmp_path), tmp_path / "results.json"
    batch = Path(tempfile.mkdtemp(dir="/run"))       # outside /tmp, which each worker has of its own
    os.chmod(batch, 0o755)
    submission, classmate = batch / "alice", batch / "bob"
    write_handout(classmate)
    with open(classmate / "agentic_rl.py", "a") as f:
        f.write("\n# bob's own work\n")
    host = socket.socket(socket.AF_UNIX)
    host.bind(str(batch / "host.sock"))
    host.listen()
    os.chmod(batch / "host.sock", 0o777)
    try:
        write_handout(submission, only=["returns", "kl_k3"])
        fill(submission / "agentic_rl.py", "returns", ["G, out = 0.0, []", "for r_k in reversed([float(x) for x in r]):",
                                                       "    G = r_k + gamma * G", "    out.append(G)",
                                                       "return torch.tensor(out[::-1])"])
        (submission / "answers.json").unlink()
        with open(submission / "agentic_rl.py", "a") as f:
            f.write(HOSTILE.format(results=str(results), source=str(source), submission=str(submission),
                                   classmate=str(classmate / "agentic_rl.py"), host=str(batch / "host.sock")))
        installed = lambda: {str(p): p.read_bytes() for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        before = installed()
        done = course_command("grade", submission, "--only", "returns,kl_k3,silent_bug", "--json", results, cwd=source,
                      check_exit=0, preexec_fn=keyring_with_a_token)
        graded = json.loads(results.read_text())
        time.sleep(1.0)                              # a surviving child would rewrite results.json by now
        assert json.loads(results.read_text()) == graded and alive_as(pwd_uid()) == []
        assert installed() == before, "the installation is unchanged"
        assert not (submission / "answers.json").exists() or graded["tests"][-2]["score"] == 0
        tests = {t["name"]: t for t in graded["tests"]}
        assert tests["returns (visible checks)"]["score"] == tests["returns (visible checks)"]["max_score"] > 0, \
            "correct code passes whatever bytes it prints"
        assert tests["returns (hidden checks)"]["score"] == tests["returns (hidden checks)"]["max_score"]
        assert tests["kl_k3 (visible checks)"]["score"] == 0
        seen = tests["kl_k3 (visible checks)"]["output"] + tests["kl_k3 (hidden checks)"]["output"]   # its messages
        assert "an attempt worked" not in seen and seen.count("refused") >= 17, seen
        assert "keys it sees" in seen and "ta:api-token" not in seen, "the grader's keyring is out of reach"
        assert "bob's own work" not in json.dumps(graded), "a classmate's folder is out of reach"
        assert "status: NoNewPrivs:\t1" in seen and "status: Seccomp:\t2" in seen, seen
        assert "processes: [1]" in seen or "pids shared" in done.stdout, "it sees only what it started"
        assert not [line for line in seen.splitlines() if line.strip().startswith("found: ") and str(tmp_path) in line], \
            "/proc shows the student nothing of the grader's directories"
        reference = (course.REPO / "agentic_rl.py").read_text()
        lines = {normalized(line) for line in reference.splitlines() if len(normalized(line)) > 24}
        assert "received" in seen and not [line for line in lines if line in seen], "no reference code crossed"
        course_command("grade", classmate, "--only", "returns,silent_bug", "--json", tmp_path / "bob.json", cwd=source,
               check_exit=0)                         # the next student, graded by the same installation
        assert json.loads((tmp_path / "bob.json").read_text())["score"] == 0
    finally:
        host.close()
        shutil.rmtree(batch)


def pwd_uid() -> int:
    import pwd
    try:
        return pwd.getpwnam(SANDBOX_USER).pw_uid
    except KeyError:
        return pwd.getpwnam("nobody").pw_uid


@SLOW_SANDBOX
def test_a_detached_child_is_killed_and_answers_written_late_are_ignored_even_without_a_sandbox_user(tmp_path, shared_sandbox):
    submission, marker = tmp_path / "sub", tmp_path / "marker"
    write_handout(submission, only=["kl_k3"])
    (tmp_path / "late.json").write_text(json.dumps(reference_answers()))
    with open(submission / "agentic_rl.py", "a") as f:                 # answers.json, written while being graded
        f.write(f"\nimport shutil\nshutil.copy({str(tmp_path / 'late.json')!r}, {str(submission / 'answers.json')!r})\n")
        f.write(f"\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                f"        while True:\n            open({str(marker)!r}, 'a').write('x')\n            time.sleep(0.05)\n"
                f"    os._exit(0)\nwhile not os.path.exists({str(marker)!r}):\n    time.sleep(0.01)\n")
    report = grade(submission, only=["kl_k3", "clock"], user=None)
    assert "no sandbox user" in report["~sandbox"] and "passed" not in {c["status"] for c in report["clock"]["checks"]}
    assert json.loads((submission / "answers.json").read_text()) == reference_answers(), "it was written, and not read"
    size = marker.stat().st_size
    time.sleep(0.5)
    assert marker.stat().st_size == size > 0, "the child ran, and died with its exercise"


def test_whatever_a_submission_holds_it_gets_a_valid_results_json(tmp_path, capsys, shared_sandbox):
    cases = {"deep": {"answers.json": "[" * 100_000, "agentic_rl.py": course.REPO / "agentic_rl.py", "envs.py": "#" * (5 << 20)},
             "special": {"answers.json": "dir", "envs.py": "fifo", "agentic_rl.py": b"\xff\xfe not UTF-8"}}
    for case, files in cases.items():
        submission = tmp_path / case
        write_handout(submission, only=["sign_test", "permission_rule"])
        for name, what in files.items():
            (submission / name).unlink()
            if isinstance(what, Path):
                (submission / name).symlink_to(what)
            elif what == "dir":
                (submission / name).mkdir()
            elif what == "fifo":
                os.mkfifo(submission / name)
            elif isinstance(what, bytes):
                (submission / name).write_bytes(what)
            else:
                (submission / name).write_text(what)
        results = tmp_path / f"{case}.json"
        code, printed = course_here(capsys, "grade", submission, "--only", "sign_test,permission_rule,clock", "--json",
                                    results)
        out = json.loads(results.read_text())
        assert code == 0 and out["score"] == 0 and len(out["tests"]) == 6 + 2, (case, out)   # + E3's prose and the staff's
        text = printed + json.dumps(out)
        expected = {"deep": ["not valid JSON", "agentic_rl.py is a symbolic link", "envs.py is over 4 MiB"],
                    "special": ["envs.py is a special file", "answers.json is a directory",
                                "agentic_rl.py cannot be read (UnicodeDecodeError)"]}[case]
        assert all(e in text for e in expected), (case, text[-1500:])
        staff = out["tests"][-1]["output"]                   # a file that cannot be read is no copy of anything
        assert "FLAGGED" not in staff and "not compared: agentic_rl.py: it did not compile or could not be read" in staff


@SLOW_SANDBOX
def test_limits_are_checked_up_front_and_a_memory_hog_is_stopped(tmp_path, capsys, monkeypatch, shared_sandbox):
    """A hog of 3 GiB, then, with a limit of 512 MiB, four processes of 200 MiB each (each under a process's
    limit, RLIMIT_AS, not together): the limit is the worker's, a cgroup's where the machine has one, else a share of it for each of
    the few processes the sandbox user may have; the reference passes either way."""
    for bad in ("0", "-1", "nan", "inf", "1e-9"):
        code, printed = course_here(capsys, "grade", tmp_path, "--time-limit", bad)
        assert code == 2 and "--time-limit" in printed
    code, printed = course_here(capsys, "grade", tmp_path / "missing")
    assert code == 2 and "no such directory" in printed
    submission = tmp_path / "hog"
    write_handout(submission, only=["kl_k3"])
    fill(submission / "agentic_rl.py", "kl_k3", ["hog = bytearray(3 << 30)", "return hog"])
    report = grade(submission, only=["kl_k3"])
    assert {c["status"] for c in report["kl_k3"]["checks"]} == {"memory limit"}, report
    write_handout(tmp_path / "hogs", only=["kl_k3"])
    fill(tmp_path / "hogs" / "agentic_rl.py", "kl_k3", HOGS.splitlines())   # 4 processes, each under 512 MiB
    for cgroups in (CGROUP_ROOT, str(tmp_path / "none")):     # the machine's cgroups, then a machine without
        monkeypatch.setattr(sandbox, "CGROUP_ROOT", cgroups)
        report = grade(tmp_path / "hogs", only=["kl_k3"], memory=512 << 20)
        held = re.search(r"held 200 MiB each at once: (\d)", report["kl_k3"]["checks"][0]["message"])
        assert (int(held.group(1)) if held else 0) < 4 or "no sandbox user" in report["~sandbox"], report
        assert "for the worker and all it starts (cgroup v" in report["~sandbox"] or "no cgroup" in report["~sandbox"]
    assert "no cgroup; 8 tasks" in report["~sandbox"] or "no sandbox user" in report["~sandbox"], report["~sandbox"]
    report = grade(course.REPO, only=["mask", "ppo_clip", "promotion"])     # the reference, torch's threads and all
    assert {c["status"] for row in exercises(report).values() for c in row["checks"]} == {"passed"}, report


HOGS = """import os, select, time
ready, told = os.pipe()
for _ in range(4):
    if os.fork() == 0:
        try:
            hog = b"x" * (200 << 20)
            os.write(told, b"1")
            time.sleep(60)
        finally:
            os._exit(0)
os.close(told)
held, ended, deadline = 0, 0, time.monotonic() + 20
while held + ended < 4 and time.monotonic() < deadline:
    if select.select([ready], [], [], 0.1)[0]:
        held += len(os.read(ready, 4))
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            ended += 1
    except ChildProcessError:
        pass
raise RuntimeError(f"processes that held 200 MiB each at once: {held}")"""


@SLOW_SANDBOX
def test_promotion_is_answered_sign_test_p_for_its_own_reports_alone(tmp_path, shared_sandbox):
    """A red team's last row: promotion's worker asked the grader for sign_test_p at inputs of its choosing and
    carried the values out in a message, a table that hard-codes sign_test. Only the wins and losses of the two
    reports in the call are answered, which a right promotion_decision still gets (all its checks pass)."""
    sub, right = tmp_path / "sub", tmp_path / "right"
    write_handout(sub, only=["promotion"])
    fill(sub / "agentic_rl.py", "promotion", ["raise RuntimeError(f'oracle {sign_test_p(7, 7)!r}')"])
    write_handout(right, only=["sign_test"])                      # promotion is the reference's
    for folder, want in ((sub, {"crashes"}), (right, {"passed"})):
        report = exercises(grade(folder, only=["promotion"], time_limit=20))["promotion"]
        assert {c["status"] for c in report["checks"]} == want, report
    assert "0.6047" not in json.dumps(report) and all("only for the wins and losses" in c["message"]
                                                       for c in exercises(grade(sub, only=["promotion"]))["promotion"]["checks"])


ASK_THE_GRADER = """import sys as _s, __main__ as _m
_f = _s._getframe()
while _f is not None and "sock" not in _f.f_locals:
    _f = _f.f_back
_m.send(_f.f_locals["sock"], {"callback": "sign_test_p", "args": [int(wins), int(losses)]})
return _m.receive(_f.f_locals["sock"], 1 << 20)["value"]"""


def sysv_objects(key: int) -> list:
    """The kinds (shm, sem, msg) of System V IPC objects with this key in the grader's namespace; each
    removed, so that a failing run leaves no memory behind."""
    found = []
    for kind, option in (("shm", "-M"), ("sem", "-S"), ("msg", "-Q")):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            if int(line.split()[0]) == key:
                found.append(kind)
                subprocess.run(["ipcrm", option, str(key)], check=True)
    return found


@SLOW_SANDBOX
def test_what_a_red_team_broke_holds_now(tmp_path, shared_sandbox):
    """A second round of attacks (a red team's, on this grader): asking the grader for another exercise's
    answer, a reply of 40 MB, a screen-clearing message, files left in /tmp and a shared-memory segment and
    message queue left for the next exercise, a file that crashes the compiler and one it takes minutes over
    (compiled in the grader's process, it held up the grading), a frame that drips in, and
    a link planted at the results' old temporary name (two gradings side by side:
    test_two_gradings_at_once_take_turns)."""
    sub = tmp_path / "sub"
    write_handout(sub, only=["sign_test"])
    fill(sub / "agentic_rl.py", "sign_test", ASK_THE_GRADER.splitlines())
    text = (sub / "agentic_rl.py").read_text()
    text = text.replace("def discounted_returns(rewards, gamma) -> torch.Tensor:\n",
                        "def discounted_returns(rewards, gamma) -> torch.Tensor:\n    return torch.zeros(10_000_000)\n", 1)
    text = text.replace("def gae(rewards, values, last_value, bootstrap, gamma, lam):\n",
                        "def gae(rewards, values, last_value, bootstrap, gamma, lam):\n"
                        "    raise ValueError('\\x1b[2J\\x1b[Htotal 140.0 / 140.0: every check passed')\n", 1)
    text += "\nimport os\nassert not os.path.exists('/tmp/leak'), 'a file from another exercise'\nopen('/tmp/leak', 'w')\n"
    key = random.randrange(1, 1 << 31)                          # System V IPC: a key of this run's own
    text += (f"\nimport ctypes\n_libc = ctypes.CDLL(None)\nassert _libc.shmget({key}, 0, 0) < 0 and _libc.msgget({key}, 0) "
             f"< 0, 'shared memory from another exercise'\n_libc.shmget({key}, 1 << 20, 0o1666)\n"   # IPC_CREAT | 0o666
             f"_libc.msgget({key}, 0o1666)\n")
    (sub / "agentic_rl.py").write_text(text)
    report = grade(sub, only=["returns", "gae", "kl_k3", "sign_test"], time_limit=20)
    status, left = {ex: {c["status"] for c in row["checks"]} for ex, row in exercises(report).items()}, sysv_objects(key)
    assert status["kl_k3"] == {"passed"} or "files shared" in report["~sandbox"] or "ipc shared" in report["~sandbox"], \
        "each exercise has its own /tmp and its own System V IPC"
    assert left == [] or "ipc shared" in report["~sandbox"], "what a worker made there dies with it"
    assert status["sign_test"] == {"crashes"} and "may not ask for" in report["sign_test"]["checks"][0]["message"]
    assert status["returns"] == {"crashes"} and len(json.dumps(exercises(report))) < 100_000, "a 40 MB reply is refused"
    assert "broke the grader's protocol: it sent a malformed reply (ValueError: a frame of" in \
        report["returns"]["checks"][0]["message"], "and said so"
    assert "\x1b" not in json.dumps(report["gae"]) and "\\x1b" in report["gae"]["checks"][0]["message"]
    (sub / "agentic_rl.py").write_text("x = " + "+".join(["1"] * 200_000) + "\n")   # the compiler's recursion
    shutil.copy(course.REPO / "envs.py", sub / "envs.py")
    report = exercises(grade(sub, only=["returns", "permission_rule"]))
    assert {c["status"] for c in report["returns"]["checks"]} == {"crashes"}
    assert {c["status"] for c in report["permission_rule"]["checks"]} == {"passed"}
    (sub / "agentic_rl.py").write_text("x = f'" + "{1}" * 100_000 + "'\n")   # 300 kB, which takes the compiler
    t = time.time()                                                        # time quadratic in its length
    report = exercises(grade(sub, only=["returns", "permission_rule"], time_limit=2))
    assert {c["status"] for c in report["returns"]["checks"]} == {"time limit"}, report["returns"]
    assert {c["status"] for c in report["permission_rule"]["checks"]} == {"passed"}, "the grader compiles nothing itself"
    assert time.time() - t < 30
    drip = tmp_path / "drip"
    write_handout(drip, only=["kl_k3"])
    with open(drip / "agentic_rl.py", "a") as f:                 # a frame that promises 100 bytes, one a second
        f.write("\nimport sys as _s, struct, time\n_f = _s._getframe()\nwhile 'sock' not in _f.f_locals:\n"
                "    _f = _f.f_back\n_f.f_locals['sock'].sendall(struct.pack('!Q', 100))\nfor _ in range(100):\n"
                "    _f.f_locals['sock'].sendall(b' ')\n    time.sleep(1)\n")
    t = time.time()
    assert {c["status"] for c in grade(drip, only=["kl_k3"], time_limit=2)["kl_k3"]["checks"]} == {"time limit"}
    assert time.time() - t < 20
    victim = tmp_path / "victim.txt"
    victim.write_text("root's file")
    (tmp_path / "out.json.tmp").symlink_to(victim)               # the old predictable temporary name
    A.atomic_write(tmp_path / "out.json", lambda f: f.write(b"{}"))
    assert victim.read_text() == "root's file" and (tmp_path / "out.json").read_text() == "{}"


DOCKER_CAPABILITIES = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31)   # Docker's default: chown, dac_override,
# fowner, fsetid, kill, setgid, setuid, setpcap, net_bind_service, net_raw, sys_chroot, mknod, audit_write, setfcap


def with_dockers_capabilities():
    """In a process before it starts a program: the capabilities Docker leaves a container's root, and no
    other (none of CAP_SYS_ADMIN's namespaces and mounts), for it and all it starts."""
    import ctypes
    libc = ctypes.CDLL(None)
    for capability in set(range(41)) - set(DOCKER_CAPABILITIES):
        libc.prctl(24, capability, 0, 0, 0)                              # PR_CAPBSET_DROP


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox user needs a grader running as root")
def test_without_cap_sys_admin_the_grader_makes_up_for_the_namespaces_and_says_so(tmp_path, graded_privately,
                                                                                   monkeypatch, capsys):
    """Graded as root with Docker's default capabilities (Gradescope's container may have no more): no
    namespace can be made, so a worker shares the machine's network, System V IPC, processes and files. The
    seccomp filter still refuses sockets; what the sandbox user left in /tmp, /var/tmp, /dev/shm and /run/lock
    (a folder it closed, a link to root's file) and its shared memory, semaphores and message queues are
    removed after each exercise; and the report and results.json say what was shared, loudly for files."""
    key, victim = random.randrange(1, 1 << 31), tmp_path / "victim.txt"
    victim.write_text("root's file")
    sub = tmp_path / "sub"
    write_handout(sub, only=["kl_k3"])
    fill(sub / "agentic_rl.py", "kl_k3", ["raise RuntimeError(_NETWORK)"])
    with open(sub / "agentic_rl.py", "a") as f:
        f.write(f"""
import ctypes as _ctypes, os as _os, socket as _socket
for _top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    open(f"{{_top}}/agentic-rl-left-{key}", "w").write("for the next student")
_os.makedirs("/tmp/agentic-rl-dir-{key}/inner")
open("/tmp/agentic-rl-dir-{key}/inner/file", "w").close()
_os.chmod("/tmp/agentic-rl-dir-{key}/inner", 0o500)
_os.symlink({str(victim)!r}, "/tmp/agentic-rl-link-{key}")
_libc = _ctypes.CDLL(None)
_libc.shmget({key}, 4096, 0o1666), _libc.semget({key}, 1, 0o1666), _libc.msgget({key}, 0o1666)   # IPC_CREAT | 0o666
try:
    _socket.socket(_socket.AF_INET).close()
    _NETWORK = "a socket: an attempt worked"
except OSError as e:
    _NETWORK = f"a socket: refused ({{e}})"
""")
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: real_popen(*a, preexec_fn=with_dockers_capabilities, **k))
    server = Sandbox()                                   # its fork server, with Docker's capabilities
    monkeypatch.undo()
    left = lambda: [f"{top}/{name}" for top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") for name in os.listdir(top)
                    if name.startswith("agentic-rl-") and name.endswith(f"-{key}")]
    try:
        server.clean()
        hold(server.lock, fcntl.LOCK_UN)
        monkeypatch.setattr(grading, "Sandbox", lambda user, memory: SharedSandbox(server, memory))
        report = grade(sub, only=["kl_k3"])
        assert "network shared, ipc shared, pids shared, files shared" in report["~sandbox"], report["~sandbox"]
        assert {c["status"] for c in report["kl_k3"]["checks"]} == {"crashes"}
        assert "a socket: refused" in report["kl_k3"]["checks"][0]["message"], "no network: the filter holds"
        assert left() == [] and sysv_objects(key) == [], "what it left is gone before the next exercise"
        assert victim.read_text() == "root's file", "a link is removed, never followed"
        print_grade(report)
        first = capsys.readouterr().out.splitlines()[0]                  # before any score, what is missing
        assert first.startswith("WARNING: the student's code ran without: network namespace, IPC namespace, PID "
                                "namespace, mount namespace") and "--require-isolation" in first, first
        results = gradescope_results(report, 1.0)
        staff = results["tests"][-1]                                     # where staff read, students never
        assert staff["visibility"] == "hidden" and first in staff["output"] and "WARNING" not in results["output"]
        assert f"sandbox: {report['~sandbox']}" in staff["output"] and "WARNING: files shared" in staff["output"]
        assert "keep" in staff["output"] and "unreadable" in staff["output"]
        with pytest.raises(IsolationMissing, match="would run without: network namespace, IPC namespace, PID "
                                                   "namespace, mount namespace"):
            grade(sub, only=["kl_k3"], require_isolation=True)        # refused before any of its code runs
        code, printed = course_here(capsys, "grade", sub, "--only", "kl_k3", "--require-isolation", "--json",
                                    tmp_path / "r.json")
        refused = json.loads((tmp_path / "r.json").read_text())
        assert code == 2 and "would run without: network namespace" in printed and refused["score"] == 0
        assert "lacks part of its sandbox" in refused["output"] and not refused["tests"], refused
    finally:
        for path in left():
            subprocess.run(["rm", "-rf", path])
        sysv_objects(key)
        hold(server.lock, fcntl.LOCK_EX)
        server.__exit__(None, None, None)


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox user needs a grader running as root")
def test_two_gradings_at_once_take_turns(tmp_path, graded_privately):
    sub = tmp_path / "sub"
    sub.mkdir()
    for name in ("agentic_rl.py", "envs.py"):
        shutil.copy(course.REPO / name, sub / name)
    reports = [None, None]       # two gradings in one process (no interpreter to start each): two fork servers,
                                 # two locks on the file, as two `grade` commands would take them

    def one(i):
        reports[i] = grade(sub, only=["returns", "kl_k3", "sign_test"])
    runs = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=120)
    assert [sum(checked(row)[0] for row in exercises(r).values()) for r in reports] == [20.0, 20.0], \
        "each grading kills only its own workers"          # earned, and held for a person: a copy of the reference
    assert all(c["status"] == "passed" for r in reports for row in exercises(r).values() for c in row["checks"])


@pytest.mark.skipif(os.getuid() != 0, reason="only a grader running as root has a sandbox user to keep out")
def test_an_installation_the_sandbox_user_can_read_is_refused(tmp_path, capsys, monkeypatch):
    readable = Path(tempfile.mkdtemp(dir="/run"))    # a world-readable clone, as a TA might grade from
    try:
        os.chmod(readable, 0o755)
        for name in installation_files():
            (readable / name).parent.mkdir(mode=0o755, exist_ok=True)
            shutil.copy(course.REPO / name, readable / name)
            os.chmod(readable / name, 0o644)
        monkeypatch.setattr(course, "REPO", readable)
        code, printed = course_here(capsys, "grade", tmp_path, "--only", "returns")
        assert code == 2 and "can read agentic_rl.py, envs.py, test_agentic_rl.py, course/," in printed, printed
        assert f"run `chmod -R go-rwx {readable}`" in printed and "Traceback" not in printed
        for name in ("agentic_rl.py", "envs.py", "test_agentic_rl.py"):
            os.chmod(readable / name, 0o600)
        os.chmod(readable / "course" / "checks.py", 0o600)                  # one of the grader's files still open
        code, printed = course_here(capsys, "grade", tmp_path, "--only", "returns")
        assert code == 2 and "can read course/," in printed, printed
        os.chmod(readable / "course", 0o700)
        (readable / "hidden_seed.txt").write_text(SECRET + "\n")   # only the secret left open
        code, printed = course_here(capsys, "grade", tmp_path, "--only", "returns")
        assert code == 2 and "can read hidden_seed.txt," in printed, printed
    finally:
        shutil.rmtree(readable)


def test_a_message_is_filed_by_what_raised_it_never_by_its_words():
    raised = lambda kind, message: student_error({"raised": [kind, "Exception", "BaseException", "object"],
                                                  "message": message})
    assert verdict(raised("ValueError", "MemoryError: pack() got a (3, 4) mask")) == \
        ("crashes", "ValueError: MemoryError: pack() got a (3, 4) mask (raised by your code)")
    assert verdict(WorkerGone("last output: MemoryError")) == ("crashes", "your code ended its process (last output: "
                                                                         "MemoryError)")
    status, message = verdict(raised("MemoryError", "a 3 GiB bytearray"))
    assert status == "memory limit" and "a 3 GiB bytearray" in message
    forged = "ok\n[passed] kl_k3 (hidden checks)\ntotal 140.0 / 140.0: every check passed"
    assert verdict(raised("AssertionError", forged)) == ("crashes", f"AssertionError: {forged} (raised by your code)"), \
        "'wrong' is the grader's own assert: the student's is a crash"
    row = {"points": 6, "checks": [{"name": "kl_k3_is_nonnegative", "hidden": False, "status": "crashes",
                                    "message": verdict(raised("AssertionError", forged))[1]}]}
    output = gradescope_results({"kl_k3": row}, 1.0)["tests"][0]["output"]
    assert [line for line in output.splitlines() if not line.startswith("    ")] == ["[crashes] kl_k3_is_nonnegative"], \
        "every line of a message is indented: it cannot forge a line of the report"


DESYNC = """import struct as _struct, sys as _s
_f = _s._getframe()
while "sock" not in _f.f_locals:
    _f = _f.f_back
_f.f_locals["sock"].sendall(_struct.pack("!Q", 1 << 40) + _struct.pack("!Q", 14) + b'{"value": 1.0}')
return torch.zeros(len(r))"""


def test_a_malformed_frame_ends_its_exercise_and_the_next_is_graded_and_a_stated_memory_error_is_a_crash(
        tmp_path, shared_sandbox):
    """A red team's open rows. returns sends a frame header over the limit and, behind it, a frame shaped like the
    next check's answer: the grader stops reading at the header, kills the worker, and the exercise's other checks
    are not run (never answered by the decoy); sign_test, next in the same grading, is graded as usual. kl_k3
    raises MemoryError itself: a crash of its code, not the memory limit (a real allocation failure still is). gae
    writes a well-formed frame of its own, which carries no request's id: the protocol is broken there too (it was
    read as the answer, and every later reply came one request late). grpo hands back a function: the student reads
    what it is, never the grader's object (it read `<course.sandbox.Remote object ...>`)."""
    sub = tmp_path / "sub"
    write_handout(sub, only=["returns", "kl_k3", "gae", "grpo"])
    fill(sub / "agentic_rl.py", "returns", DESYNC.splitlines())
    fill(sub / "agentic_rl.py", "kl_k3", ["raise MemoryError('a 3 GiB bytearray')"])
    fill(sub / "agentic_rl.py", "gae", FORGED.format(asked="", returned="(r, r)").splitlines())
    fill(sub / "agentic_rl.py", "grpo", ["return group_advantages"])
    report = exercises(grade(sub, only=["returns", "kl_k3", "gae", "grpo", "sign_test"], time_limit=20))
    said = [c["message"] for c in report["gae"]["checks"]]
    assert "a reply out of turn" in said[0] and all("broke the grader's protocol" in m for m in said), said
    assert "<function of your code>" in json.dumps(report) and "course.sandbox" not in json.dumps(report)
    returns = report["returns"]["checks"]
    assert {c["status"] for c in returns} == {"crashes"} and "a frame of 1099511627776 bytes" in returns[0]["message"]
    assert all(c["message"].startswith("not run: your code broke the grader's protocol") for c in returns[1:]), returns
    assert {c["status"] for c in report["sign_test"]["checks"]} == {"passed"}, "the next exercise, graded normally"
    kl = report["kl_k3"]["checks"]
    assert {c["status"] for c in kl} == {"crashes"} and "(raised by your code)" in kl[0]["message"], kl


FORGED = """import json as _json, struct as _struct, sys as _s
_f = _s._getframe()
while "sock" not in _f.f_locals:
    _f = _f.f_back
_frame = {{"value": {{"~handle": 0, "type": "module"}}{asked}}}
if "req" in _f.f_locals and {asked!r}:
    _frame["id"] = _f.f_locals["req"]["id"]
_data = _json.dumps(_frame).encode()
_f.f_locals["sock"].sendall(_struct.pack("!Q", len(_data)) + _data)
return {returned}"""


@SLOW_SANDBOX
def test_a_reply_out_of_turn_ends_its_exercise_and_no_grader_object_reaches_the_student(tmp_path, shared_sandbox):
    """A red team's row: a well-formed forged frame was read as the answer, every later reply of the exercise came one
    request late, and the student read `<course.sandbox.Remote object ...>`. Every reply now carries its request's id:
    a forged frame without it, or one that copies the id (read as that request's answer, as if returned: then the
    true reply comes out of turn), ends the exercise as "broke the grader's protocol"; a student's object shows as
    what it is, never as the grader's."""
    sub = tmp_path / "sub"
    write_handout(sub, only=["gae", "grpo", "kl_k3"])
    fill(sub / "agentic_rl.py", "gae", FORGED.format(asked="", returned="(r, r)").splitlines())
    fill(sub / "agentic_rl.py", "grpo", FORGED.format(asked=", 'id': 0", returned="r - r.mean(-1, keepdim=True)")
         .splitlines())
    fill(sub / "agentic_rl.py", "kl_k3", ["return kl_k3"])                  # a function, where a tensor is due
    report = exercises(grade(sub, only=["gae", "grpo", "kl_k3"], time_limit=20))
    for ex, forged_answer_read in (("gae", 0), ("grpo", 1)):     # one that copied the id is read as an answer
        said = [c["message"] for c in report[ex]["checks"]][forged_answer_read:]
        assert "reply out of turn" in said[0] and all("broke the grader's protocol" in m for m in said), said
        assert {c["status"] for c in report[ex]["checks"][forged_answer_read:]} == {"crashes"}
    shown = json.dumps(report)
    assert "<function of your code>" in shown and "course.sandbox" not in shown and " at 0x" not in shown, shown


@SLOW_SANDBOX
@pytest.mark.skipif(os.getuid() != 0 or not os.path.isdir(CGROUP_ROOT), reason="a worker's cgroup needs a root grader")
def test_the_oom_killer_taking_the_worker_is_the_memory_limit_at_once(tmp_path, shared_sandbox):
    """A red team's row: when the kernel's OOM killer took the worker itself (its cgroup's limit passed by it and a
    child together, each under its own RLIMIT_AS), the verdict was "time limit: an endless loop" after the whole
    time limit, where the child kept the socket open, or else "crashes: your code ended its process". Now the
    worker's cgroup says so within a fraction of a second: "memory limit"."""
    sub = tmp_path / "sub"
    write_handout(sub, only=["kl_k3"])
    fill(sub / "agentic_rl.py", "kl_k3", ["import os, time", "if os.fork() == 0:",      # a child holds 96 MiB
                                          "    held = bytearray(96 << 20)", "    time.sleep(120)", "    os._exit(0)",
                                          "time.sleep(1)", "hog = []", "while True:",       # the worker, more: the
                                          "    hog.append(bytearray(16 << 20))"])           # OOM killer's choice
    t = time.time()
    report = grade(sub, only=["kl_k3"], time_limit=60, memory=384 << 20)
    checks = report["kl_k3"]["checks"]
    if "cgroup v" not in report["~sandbox"]:
        pytest.skip(f"no cgroup on this machine: {report['~sandbox']}")
    assert {c["status"] for c in checks} == {"memory limit"} and time.time() - t < 30, (checks, time.time() - t)
