"""Calling an environment's own code from check-env and from train's require_contract (tools/envcheck.py), and the
command line's import of it (within_limit): each call under a time limit, and the demonstrator's first episodes
played again in a fresh process.

Why a limit per call, by a signal: a tool that loops or sleeps, or a reset that never returns, must end the check
with a sentence, not hang it. SIGALRM interrupts a Python loop or a sleep where it is, in this process, at the cost of
two setitimer calls per call (the check makes thousands), and its traceback names the line. What it cannot do: a
signal reaches the main thread alone (elsewhere, calls run without a limit), and C code that never returns to Python
(a regular expression that backtracks forever) is not interrupted. A child process per call would cover that, at
0.4 s a call; one child for the whole check could not name the call that hung.

Why a fresh process: state carried across episodes (a module-level or class-level list an environment appends to)
and an order that changes with PYTHONHASHSEED (a set of str in an observation) both make the same seed give another
episode, but only another process shows it. This module imports no torch, so that process starts in about 0.4 s:

    python -m tools.envcalls ENV LIMIT OUT SEED...    the demonstrator's episodes of SEEDs, in order, as JSON in OUT
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import gymnasium as gym

from envload import raised, resolve_env, where_in

CALL_LIMIT_S = 10.0  # the most one call into an environment's code may take here (reset, a tool, the evaluator, ...)
LIMIT = [None]       # the limit in force (call_limits sets it for the check), None: none


class Overtime(BaseException):
    """Raised by SIGALRM inside the call that ran past its limit."""


class Stop(BaseException):
    """The check ends here, with one sentence (rule, text): a call into the environment ran past its limit or tried
    to end the process (SystemExit, KeyboardInterrupt), or the environment cannot be played at all. What follows
    would only repeat it, at the limit's cost each time. A BaseException, like the SystemExit it may report, so that
    no `except Exception` on its way (the environment's own, or the checker's around each episode) swallows it."""

    def __init__(self, rule: str, text: str):
        super().__init__(text)
        self.rule, self.text = rule, text


def on_alarm(signum, frame):
    raise Overtime()


@contextmanager
def call_limits(seconds: float):
    """Within the block, limited() calls run under `seconds` each (in the main thread; elsewhere without a limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before, LIMIT[0] = signal.signal(signal.SIGALRM, on_alarm), seconds
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        LIMIT[0] = None


def limited(what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), a call into the environment (`what` names it: "reset(seed=3)", "the call 'find dune'"),
    under the limit in force -> its result. Past the limit, or on SystemExit or KeyboardInterrupt: Stop, naming the
    call, where it was and the limit. Its own exceptions pass as they are: the checker says what each one breaks.
    Within a limited call (a reset inside make_env...), the outer limit holds."""
    armed = LIMIT[0] is not None and threading.current_thread() is threading.main_thread() and \
        signal.getitimer(signal.ITIMER_REAL)[0] == 0
    if armed:  # and again every 0.5 s (or the limit), should the environment's own `except BaseException` swallow one
        signal.setitimer(signal.ITIMER_REAL, LIMIT[0], min(0.5, LIMIT[0]))
    try:
        try:
            return fn(*args, **kwargs)
        finally:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except Overtime as e:
        raise Stop("calls", f"{what} did not return within {LIMIT[0]:g} s, the limit on one call into the "
                            f"environment (stopped at {where_in(e.__traceback__, drop=1)}): make it return in time (a "
                            "loop that never ends? a sleep? tool_latency_ms simulates a slow tool)") from None
    except (SystemExit, KeyboardInterrupt) as e:
        raise Stop("calls", f"{what} raised {raised(e)}: an environment never ends the process; answer the call "
                            "(or raise an ordinary exception, which the check reports)") from None


def within_limit(what: str, fn, *args):
    """fn(*args) under CALL_LIMIT_S, a Stop said as a ValueError: for the command line, which imports the environment's
    module and makes one instance (validate_config) before any check of the contract runs."""
    with call_limits(CALL_LIMIT_S):
        try:
            return limited(what, fn, *args)
        except Stop as e:
            raise ValueError(e.text) from None


# --- The demonstrator's first episodes, as a fresh process plays them -------------------------------------------
def transcripts(env: str, seeds: list) -> dict:
    """The demonstrator without its habit on each seed's train task, played in this order, each call limited ->
    {seed: [task_id, [[call, observation, reward, terminated, truncated], ...], the verdict's repr]} (the first
    row's call is "": reset's observation). Built as make_env builds it with the default settings; no gate (a
    deterministic host adds nothing to compare), so a call a rule would deny is executed here."""
    spec, cls = resolve_env(env)
    out = {}
    for seed in seeds:
        made = limited("__init__", gym.make, spec, disable_env_checker=True)
        obs, info = limited(f"reset(seed={seed})", made.reset, seed=seed, options={"split": "train"})
        demo = limited("Demonstrator(0.0, seed)", cls.Demonstrator, 0.0, seed=seed)
        limited("Demonstrator.reset", demo.reset, obs)
        rows, done = [["", obs, 0.0, False, False]], False
        for _ in range(made.unwrapped.max_turns):
            text = limited("Demonstrator.act", demo.act, obs)
            obs, reward, terminated, truncated, _ = limited(f"the call {text!r}", made.step, text)
            rows.append([text, obs, reward, terminated, truncated])
            if terminated or truncated:
                break
        out[seed] = [info["task_id"], rows, repr(limited("evaluate_episode", cls.evaluate_episode, made))]
    return json.loads(json.dumps(out))  # as the child's file reads back: lists, str keys


def start_fresh(env: str, seeds: list, hash_seed: int):
    """Start `python -m tools.envcalls` on these seeds, with this PYTHONHASHSEED and this process's sys.path ->
    (process, its output file), or None where no fresh process could import the environment (a module with no file)."""
    module = sys.modules.get(env.rpartition(":")[0] or resolve_env(env)[1].__module__)  # the one --env imports
    if not getattr(module, "__file__", None):
        return None
    out = tempfile.NamedTemporaryFile(prefix="envcalls-", suffix=".json", delete=False)
    out.close()
    here = str(Path(__file__).resolve().parent.parent)  # this project first: a folder `tools` of yours is not ours
    child_env = {**os.environ, "PYTHONHASHSEED": str(hash_seed),
                 "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); import tools.envcalls as "
                             "c; c.main(sys.argv[1:])", env, str(LIMIT[0] or CALL_LIMIT_S), out.name, *map(str, seeds)],
                            env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, out.name


def finish_fresh(started, wait_s: float):
    """The transcripts a fresh process wrote -> dict, or a sentence saying why there are none."""
    proc, path = started
    try:
        _, err = proc.communicate(timeout=wait_s)
        text = Path(path).read_text()
        found = json.loads(text) if text else {"error": (err.decode(errors="replace").strip().splitlines()
                                                          or [f"exit status {proc.returncode}"])[-1][:300]}
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        found = {"error": f"it did not finish within {wait_s:g} s"}
    finally:
        Path(path).unlink(missing_ok=True)
    return found


def stop_fresh(started):
    """The check ended early: end the fresh process it started, and remove its file."""
    if started and started[0].poll() is None:
        started[0].kill()
        started[0].communicate()
    if started:
        Path(started[1]).unlink(missing_ok=True)


def main(argv):
    env, limit, out, seeds = argv[0], float(argv[1]), argv[2], [int(s) for s in argv[3:]]
    try:
        with call_limits(limit):
            found = transcripts(env, seeds)
    except Stop as e:
        found = {"error": e.text}
    except Exception as e:
        found = {"error": f"it raised {raised(e)}"}
    Path(out).write_text(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
