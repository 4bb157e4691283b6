"""What the course's tests share: a course's secret, handouts filled in, records in a run's shape, the command
line as a TA runs it, and a fork server kept for the in-process gradings (starting one costs seconds)."""
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import agentic_rl as A
import course
from course import grading
from course.cli import main as course_main
from course.lesson import CLOCK_SETTINGS, E3_RUN, E8_RUNS, README_SEEDS
from course.bundle import installation_files
from course.handouts import HANDOUT_FILES
from course.sandbox import MEMORY_LIMIT, SANDBOX_USER, Sandbox


def normalized(line):
    return " ".join(line.split("#")[0].split())


def fill(path, exercise, code):
    """Write `code` (lines, at the stub's indentation) in place of the exercise's stub in a handout file."""
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith((f"raise NotImplementedError('{exercise}: ",
                                                                            f'raise NotImplementedError("{exercise}: ')))
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines[at:at + 1] = [indent + c + "\n" for c in code]
    path.write_text("".join(lines))


def made_up(seed, env, hide_clock) -> tuple:
    """(demonstrator success, SFT loss) that a made-up record carries for one warm start: distinct for each, as a
    run's would be, and never what the demonstrations of those settings give (the audit recomputes that)."""
    h = int(hashlib.sha256(f"{seed} {env} {hide_clock}".encode()).hexdigest()[:8], 16)   # 2**32 values: the SFT
    return 0.70 + (h % 500) / 10_000 + 1e-9, 0.045 + h / 2 ** 32 / 100   # losses of a handful of records never meet


def fake_record(seed, dev, metric=None, warm=0.52, **asked):
    """A run record in the shape a run writes it (summary.json's config, demonstrator success, warm start and its SFT
    loss, candidate and curve; one metrics.jsonl line per iteration) with the numbers given: the grader's tests
    cannot train for minutes."""
    config = asdict(A.Config(seed=seed, **asked))
    demonstrator, loss = made_up(seed, config["env"], config["hide_clock"])
    metrics = [{"success": 0.5, "clip_frac": 0.0015, "approx_kl": 0.0002, "zero_std_groups": 5, "truncation_rate": 0.01,
                "grad_norm": 0.5, **(metric or {})} for _ in range(config["iterations"])]
    card = lambda success: {"dev": {"task_ids": list(range(0, 400, 2)), "success": success,    # 200 dev tasks, the
                                    "per_task": [int(i < round(200 * success)) for i in range(200)]}}  # first solved
    return {"summary": {"config": config, "demonstrator_success": demonstrator, "candidate": {"dev_success": dev},
                        "warm_start": {"dev_success": warm, "sft_loss": loss},
                        "reports": {"incumbent": card(warm), "candidate": card(dev)},
                        "train_success_curve": [m["success"] for m in metrics]}, "metrics": metrics}


def demonstrations_as_made_up(warm_start_settings: str) -> float:
    """A stand-in for the audit's demonstrator_success (a second or two each): what fake_record made up."""
    config = asdict(A.Config(**json.loads(warm_start_settings)))
    return made_up(config["seed"], config["env"], config["hide_clock"])[0]


def reference_answers(seeds=README_SEEDS, handout=None, exercises=None) -> dict:
    """answers.json as the reference would write it, for a handout with ratio_always_one: the README's
    measured E3 numbers and E8's signature, in records of the runs' shape made with these seeds (the README's
    own, by default: the numbers a student could copy); with the handout's id and exercises where given."""
    clock = {"value_zero": [1.0, 1.0, 1.0], "bootstrap_budget": [0.0, 0.0, 0.0],
             "hidden_clock_value_zero": [1.0, 1.0, 1.0], "hidden_clock_bootstrap_budget": [1.0, 0.0, 0.62]}
    return {**({"handout": handout} if handout else {}), **({"exercises": exercises} if exercises else {}),
            "seeds": list(seeds),
            "silent_bug": "ratio_always_one: ppo_step_loss passed logprobs.detach() as the old log-probs; it now "
                          "passes the log-probs recorded when the episodes were sampled",
            "silent_bug_evidence": "clip_frac and approx_kl are exactly 0 in every iteration of seed 0, seed 1 and "
                                   "seed 2, while a healthy run logs a clip_frac near 0.0015: the ratio never leaves 1",
            "silent_bug_runs": [fake_record(seeds[i % 3], 1.0, {"clip_frac": 0.0, "approx_kl": 0.0} if i < 3 else None,
                                            **E8_RUNS[i // 3]) for i in range(6)],
            "silent_bug_fixed_runs": [fake_record(seeds[i % 3], 1.0, None, **E8_RUNS[i // 3]) for i in range(6)],
            "clock": {**clock, "runs": {k: [fake_record(seeds[s], v, **E3_RUN, **CLOCK_SETTINGS[k])
                                            for s, v in enumerate(vals)] for k, vals in clock.items()},
                      "why": "bootstrapping the task's own budget credits an episode that runs out of turns with V(s_K), "
                             "the value of a mid-repair state, so stalling costs nothing while a wrong commit costs its "
                             "0; the truncation rate climbs and the critic explains nothing. Valued 0, running out is an end"}}


SECRET = "5e0f4c1b9a7d2e836f1c0b4a9d8e7f26"   # a course's secret for these tests (the README says how to make one)


def course_command(*argv, cwd=course.REPO, check_exit=None, preexec_fn=None):
    """Run `python -m course ARGV` as a TA would, from a grading installation (preexec_fn: what the TA's
    session holds, set up in the process before it starts)."""
    done = subprocess.run([sys.executable, "-m", "course", *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                          preexec_fn=preexec_fn)
    assert check_exit is None or done.returncode == check_exit, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def course_here(capsys, *argv) -> tuple:
    """(exit code, what it printed) of `python -m course ARGV`, run in this process."""
    with pytest.raises(SystemExit) as done:
        course_main([str(a) for a in argv])
    printed = capsys.readouterr()
    return done.value.code, printed.out + printed.err


def installation(tmp_path) -> Path:
    """A grading installation as the bundle lays it out (readable by root only, as setup.sh leaves it)."""
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    copy_files(installation_files(), source)
    return source


def copy_files(names, folder: Path):
    """These files of this repository (course/ ones among them) into folder, at the same places."""
    for name in names:
        (folder / name).parent.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(course.REPO / name, folder / name)


def hold(lock, how):
    """Take (fcntl.LOCK_EX) or give back (LOCK_UN) the one-grading-at-a-time lock, where there is one (as root)."""
    if lock is not None:
        fcntl.flock(lock, how)


class SharedSandbox:
    """What `with Sandbox(user, memory) as sandbox:` gives grade(), from a fork server kept for the in-process
    gradings of this module: starting one costs seconds (a fresh interpreter importing torch), and these tests
    grade a dozen times. Each grading still gets a fresh worker per exercise, killed with everything it started
    (Worker.close), the same limits and sandbox user; as root it holds the one-grading-at-a-time lock while it
    grades, and on leaving it kills every process of the grading, as Sandbox.__exit__ does. A whole Sandbox's
    life (a server per grading, the lock taken at its start) is what the command-line tests below exercise."""

    def __init__(self, sandbox: Sandbox, memory: int):
        self.sandbox, self.memory = sandbox, memory

    def __enter__(self):
        hold(self.sandbox.lock, fcntl.LOCK_EX)
        self.sandbox.__dict__.pop("isolation", None)              # this grading's workers say what they ran as
        self.sandbox.memory = self.memory                         # each fork request carries it
        return self.sandbox

    def __exit__(self, *exc):
        try:
            self.sandbox.clean()
        finally:
            hold(self.sandbox.lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def private_installation(tmp_path_factory) -> Path:
    """A copy of this installation in a folder only root can enter: Sandbox refuses, as root, an installation
    the sandbox user could read, and this checkout may well be world-readable."""
    copy = tmp_path_factory.mktemp("installation")
    os.chmod(copy, 0o700)
    copy_files({*HANDOUT_FILES, *installation_files()}, copy)
    return copy


@pytest.fixture
def graded_privately(private_installation):
    """In this test the grader's installation (course.REPO) is private_installation; a patch of its own, which the
    test's monkeypatch.undo() leaves alone."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(course, "REPO", private_installation)
        yield private_installation


@pytest.fixture(scope="session")
def fork_servers():
    """user -> a Sandbox kept for the in-process gradings of the course's tests; closed (under the lock) at their end."""
    servers = {}
    yield servers
    for sandbox in servers.values():
        hold(sandbox.lock, fcntl.LOCK_EX)
        sandbox.__exit__(None, None, None)


# The slowest course tests (each grades whole submissions in workers, trains a real run, recomputes an audit's
# demonstrations or measures the similarity report on whole files) stay out of the default run; CI runs them:
# AGENTIC_RL_ALL_TESTS=1.
SLOW_SANDBOX = pytest.mark.skipif(os.environ.get("AGENTIC_RL_ALL_TESTS") != "1",
                                  reason="a slow sandbox test: AGENTIC_RL_ALL_TESTS=1 runs it, as .ci/run does")


@pytest.fixture
def shared_sandbox(fork_servers, graded_privately):
    """grade() in this test takes its fork server from fork_servers (see SharedSandbox) and grades from
    private_installation; a patch of its own, which the test's monkeypatch.undo() leaves alone."""
    real = Sandbox

    def sandbox(user=SANDBOX_USER, memory: int = MEMORY_LIMIT):
        if user not in fork_servers:
            fork_servers[user] = server = real(user, memory)
            server.clean()                  # answered once its imports are done: no test's time limit pays for them
            hold(server.lock, fcntl.LOCK_UN)                     # taken again for each grading
        return SharedSandbox(fork_servers[user], memory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grading, "Sandbox", sandbox)
        yield
