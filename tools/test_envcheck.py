"""check-env and train on an environment that hangs, ends the process, raises, shares state across episodes, orders a
set by its hash, or whose demonstrator breaks a rule: each ends within its limit with one sentence, exit status 1 (2
for a class train refuses as a usage error), no traceback, and no run directory (tools/envcalls.py says how).
"""
import re
import time
from pathlib import Path

import pytest

import agentic_rl as A
from test_agentic_rl import TINY_FLAGS
from tools import envcalls
from tools.test_tools import own_env  # noqa: F401  (a working directory of its own, importable modules forgotten)

LIMIT_S = 0.5  # the limit per call here: a hanging environment costs half a second, not CALL_LIMIT_S

BROKEN = '''"""The lending desk, broken one way per class (tools/test_envcheck.py): a real file, as a fresh process needs."""
import time

from library import BOOKS, READERS, Librarian, LibraryEnv, LibraryState


class LoopingTool(LibraryEnv):
    def _tool_find(self, book):
        while True:
            pass


class SleepingReset(LibraryEnv):
    def reset(self, *, seed=None, options=None):
        time.sleep(60)


class ExitingTool(LibraryEnv):
    def _tool_check(self, shelf):
        raise SystemExit(0)


class InterruptedTool(LibraryEnv):
    def _tool_check(self, shelf):
        raise KeyboardInterrupt


class SleepingInit(LibraryEnv):
    def __init__(self, **kwargs):
        time.sleep(60)


class RaisingInit(LibraryEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        raise RuntimeError("no catalogue")


class RaisingEvaluator(LibraryEnv):
    evaluate_episode = staticmethod(lambda env: {}["verdict"])


LENT = []  # every episode's lendings, in one list: the second episode of a process is not a fresh one's


class SharedState(LibraryEnv):
    def new_state(self, task):
        return LibraryState(*task, lent=LENT)


class SetInObservation(LibraryEnv):
    max_obs_words = 20

    def prompt(self, task):
        return f"user : lend {task[1]} to {task[2]} " + " ".join(set(BOOKS + READERS))


class HugeObservation(LibraryEnv):
    def _tool_find(self, book):
        return " ".join([book] * 10**6), False


class ToTheFirstReader(Librarian):  # its habit: lend to ana, whoever asked
    def reset(self, first_obs):
        super().reset(first_obs)
        self.reader = "ana" if self.blind else self.reader


class DeniedDemonstrator(LibraryEnv):
    Demonstrator = ToTheFirstReader


class NotStatic(LibraryEnv):
    def permission_rule(self, task, executed, tool, args):
        return None
'''

CASES = {  # class -> (its sentence, whether train refuses it before the contract's episodes: a usage error, exit 2)
    "LoopingTool": (r"the call 'find \w+' did not return within 0.5 s, the limit on one call into the environment "
                    r"\(stopped at brk.py line \d+, in _tool_find\)", False),
    "SleepingReset": (r"reset\(seed=0, options=\{'split': 'train'\}\) did not return within 0.5 s.*\(stopped at "
                      r"brk.py line \d+, in reset\)", False),
    "ExitingTool": (r"the call 'check s\d' raised SystemExit: 0 \(brk.py line \d+, in _tool_check\): an environment "
                    "never ends the process", False),
    "InterruptedTool": (r"the call 'check s\d' raised KeyboardInterrupt: +\(brk.py line \d+, in _tool_check\)", False),
    "SleepingInit": (r"did not return within 0.5 s, the limit on one call into the environment \(stopped at brk.py "
                     r"line \d+, in __init__\)", True),
    "RaisingInit": (r"its constructor raised RuntimeError: no catalogue \(brk.py line \d+, in __init__\)", True),
    "RaisingEvaluator": (r"evaluate_episode raised KeyError: 'verdict' \(brk.py line \d+, in <lambda>\)", False),
    "SharedState": (r"seed \d's episode, played here after the whole check, differs from a fresh process's: task "
                    r"\d+.*: state is carried across episodes", False),
    "SetInObservation": (r"seed \d's episode differs between two fresh processes \(PYTHONHASHSEED=\d+ and \d+\): task "
                         r"\d+, turn 0: .*sort it", False),
    "HugeObservation": (r"an observation of '(\w+ ){11}\w+'\.\.\. \(1,000,002 words, [0-9,]+ characters\) is past the "
                        r"observation space", False),
    "DeniedDemonstrator": (r"with its habit the demonstrator's calls were denied \d+ times by the safety rule "
                           r"wrong_reader \(the first: 'lend \w+ s\d ana' in task \d+\): its habit must cost the outcome",
                           False),
    "NotStatic": (r"NotStatic.permission_rule\(self, task, executed, tool, args\) cannot be called as the host gate "
                  r"calls it, on the class: permission_rule\(task, executed, tool, args\); make it a @staticmethod",
                  True),
}


STOPPED = {"LoopingTool", "SleepingReset", "ExitingTool", "InterruptedTool", "SleepingInit", "RaisingInit",
           "HugeObservation", "NotStatic"}  # the check cannot go on after these: the rules after them are listed as not checked


def test_check_env_and_train_end_each_broken_environment_within_the_limit_with_its_sentence(own_env, monkeypatch,
                                                                                            capsys):
    monkeypatch.setattr(envcalls, "CALL_LIMIT_S", LIMIT_S)
    Path("brk.py").write_text(BROKEN)
    for name, (said, usage) in CASES.items():
        began = time.monotonic()
        with pytest.raises(SystemExit) as ended:
            A.main(["check-env", f"brk:{name}", "--episodes", "4"])
        out, err = capsys.readouterr()
        assert ended.value.code == 1 and re.search(said, out), f"check-env {name}: {out}"
        assert len(out.splitlines()) < 25 and "Traceback" not in out + err, name   # one line per rule, each short
        stopped = "not checked, the check stopped at its failure: " in out   # what it never reached is not "ok"
        assert stopped == (name in STOPPED) and stopped != ("ok    every word of every observation" in out), name
        began, run_dir = time.monotonic(), f"runs/{name}"
        with pytest.raises(SystemExit) as refused:
            A.main(["train", "--env", f"brk:{name}", "--run-dir", run_dir] + TINY_FLAGS[:2] + TINY_FLAGS[4:])
        out, err = capsys.readouterr()
        assert refused.value.code == 2 if usage else refused.value.code.startswith("agentic_rl.py train: error: "), name
        assert re.search(said, f"{refused.value.code} {err}") and "Traceback" not in out + err, f"train {name}: {err}"
        assert not Path(run_dir).exists(), f"{name}: refused before its run directory was made"
        assert time.monotonic() - began < LIMIT_S + 10, f"train {name}: within its limit (and a fresh process)"


def test_a_module_whose_import_never_ends_stops_check_env_and_train_within_the_limit(own_env, monkeypatch, capsys):
    monkeypatch.setattr(envcalls, "CALL_LIMIT_S", LIMIT_S)
    Path("hang.py").write_text("import time\n\ntime.sleep(60)\nfrom library import LibraryEnv as HangEnv\n")
    said = r"did not return within 0.5 s, the limit on one call into the environment \(stopped at hang.py line 3, in "
    for argv, code in [(["check-env", "hang:HangEnv"], 1), (["train", "--env", "hang:HangEnv", "--run-dir", "runs/h"], 2)]:
        began = time.monotonic()
        with pytest.raises(SystemExit) as ended:
            A.main(argv)
        err = capsys.readouterr().err
        assert ended.value.code == 2 if code == 2 else str(ended.value.code).startswith("agentic_rl.py check-env: error: ")
        assert re.search(said, f"{ended.value.code} {err}"), err       # exit 1: sys.exit with the sentence
        assert "Traceback" not in err and time.monotonic() - began < LIMIT_S + 5 and not Path("runs/h").exists()


def test_a_limit_ends_a_call_wherever_it_hangs_and_restores_the_alarm(monkeypatch):
    import signal
    before = signal.getsignal(signal.SIGALRM)
    with envcalls.call_limits(0.2):
        assert envcalls.limited("a quick call", sum, [1, 2]) == 3
        with pytest.raises(envcalls.Stop, match=r"a nap did not return within 0.2 s, .*test_envcheck.py line \d+, in naps"):
            envcalls.limited("a nap", naps)
        with pytest.raises(envcalls.Stop, match=r"a stubborn loop did not return within 0.2 s"):  # swallows one
            envcalls.limited("a stubborn loop", swallow_once)
        with pytest.raises(ZeroDivisionError):  # its own exceptions pass as they are
            envcalls.limited("a division", lambda: 1 / 0)
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    assert envcalls.limited("no limit in force", sum, [1]) == 1


def naps():
    while True:
        time.sleep(0.1)


def swallow_once():
    try:
        while True:
            pass
    except BaseException:  # an environment's own `except BaseException`: the alarm rings again (0.5 s, or the limit, later)
        while True:
            pass
