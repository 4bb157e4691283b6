"""The audit of the experiments' records (E3, E8). No automatic point for an experiment: a record's numbers that a
rerun can check are the ones a guess matches (the warm start's, recomputed by anyone in seconds; a candidate's
dev success of 1.000, all 200 dev tasks solved), and what a guess cannot match (the RL run's own curve) moves
with the thread count and the machine (README: staff document, course/STAFF.md). So an experiment's points are
- contradicted when a number that does not drift disagrees with a record: the demonstrator's success, recomputed
  here in a second or two for every record (numpy's generator and the environment's rules alone decide it): the
  experiment scores 0, and the TA's line names the record ("record does not match a rerun");
- pending otherwise, for a person, never granted and never taken: the staff grade them from the records and the
  audit's evidence, beside each record: the warm start of a record drawn at random from each experiment trained
  again here (seconds: the two experiments at once, one thread each), each of its dev tasks' outcome against the
  record's (measured: none moves between 1 and 2 threads), and its SFT loss; with full=True (grade --full-rerun,
  minutes) a record's whole run too, its numbers beside the record's.
An experiment is never "verified": no automatic point rests on evidence a guess can match."""
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import agentic_rl as A
import course
from course.exercises import mean_of
from course.handouts import plant
from course.ids import SECRET_ENV
from course.lesson import (CLOCK_SETTINGS, E3_RUN, E8_RUNS, clock_numbers_are_your_runs_own_records, run_record,
                           silent_bug_answer_carries_the_runs_before_and_after_the_fix)


AUDIT_SECONDS = 150.0   # the audit's seconds per grading (grade's and the bundle's default): every record's
                        # demonstrations, then one drawn warm start of each experiment trained again, at once, one
                        # thread each (STAFF.md: the seconds measured)
FULL_RERUN_SECONDS = 600.0   # grade --full-rerun: a drawn record's whole run trained again (STAFF.md: 97-315 s for one)
TOLERANCE = {"warm start dev success": 0.05, "warm start SFT loss": 0.005,   # how far a rerun may move each number:
             "candidate dev success": 0.1, "mean training success": 0.1}      # the drift measured between 1, 2 and 4
                        # threads (README's drift table: 0, 0.0015, 0 and 0.034), with room for a seed or a machine
RECORD_CHECKS = {"clock": clock_numbers_are_your_runs_own_records.__name__,     # an experiment whose records pass
                 "silent_bug": silent_bug_answer_carries_the_runs_before_and_after_the_fix.__name__}  # these is audited


def dies_with_us():
    """In a rerun's training process before it starts: killed when the grading that started it is (PR_SET_PDEATHSIG)."""
    import ctypes
    import signal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def rerun(settings: dict, seconds: float, bug=None, warm_start_only=False) -> dict:
    """Train again here, within `seconds`, with the reference (and `bug` planted, as in the student's
    handout), these settings (the seed and the flags the experiment asks for, which record_of has found
    in the record; every other setting at its default) on one thread; the new run's record. warm_start_only:
    no RL iteration (--iterations 0): the warm start and its report cards alone, as the whole run makes them."""
    flags = [part for name, value in settings.items() for part in
             [f"--{name.replace('_', '-')}"] + ([] if isinstance(value, bool) else [str(value)])]
    flags += ["--iterations", "0"] if warm_start_only else []
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}      # the reference's training needs no secret
    with tempfile.TemporaryDirectory() as folder:
        script = course.REPO / "agentic_rl.py"
        if bug:
            script = Path(folder) / "agentic_rl.py"
            script.write_text(plant((course.REPO / "agentic_rl.py").read_text(), bug))
            for name in ("envs.py", "envload.py", *(f"tools/{p.name}" for p in (course.REPO / "tools").glob("*.py"))):
                (Path(folder) / name).parent.mkdir(exist_ok=True)
                shutil.copy(course.REPO / name, Path(folder) / name)
        threaded = f"import runpy, sys, torch; torch.set_num_threads(1); sys.argv[0] = {str(script)!r}; " \
                   f"sys.path.insert(0, {str(script.parent)!r}); runpy.run_path({str(script)!r}, run_name='__main__')"
        subprocess.run([sys.executable, "-c", threaded, "train", *flags, "--device", "cpu", "--run-dir", f"{folder}/run"],
                       capture_output=True, timeout=seconds, check=True, cwd=folder, env=env, preexec_fn=dies_with_us)
        return run_record(f"{folder}/run")


@functools.lru_cache(maxsize=None)
def demonstrator_success(warm_start_settings: str) -> float:
    """The demonstrator's success on a run's warm-start episodes (settings as JSON), recomputed here in a second
    or two without training: numpy's generator and the environment's rules alone decide it, so any machine and
    thread count gives the record's own number (measured: the same at 1, 2 and 4 threads). The episodes are
    warm_start's: demonstration_episodes from the seed stream cfg.seed * 100_003 + 7."""
    cfg = A.validate_config(A.Config(**{**json.loads(warm_start_settings), "device": "cpu"}))
    episodes = A.demonstration_episodes(cfg, A.make_tokenizer(cfg.env), cfg.warm_start_episodes, cfg.seed * 100_003 + 7)
    return float(np.mean([ep.reward for ep in episodes]))


def contradictions(runs: list) -> list:
    """Every record of an experiment against the demonstrations of its own settings (drift 0): one that carries
    another number did not come from a run with its settings (made up, copied from another seed's run, edited)."""
    differ = []
    for where, record, settings, _ in runs:
        warm = json.dumps({k: v for k, v in settings.items() if k not in ("algo", "bootstrap_budget")}, sort_keys=True)
        mine, theirs = record["summary"].get("demonstrator_success"), demonstrator_success(warm)
        differ += [f"{where} (seed {settings['seed']}): demonstrator success {mine!r} in the record, {theirs} for its "
                   "settings: not a run with its settings"] if mine != theirs else []
    return differ


def checkable(settings: dict, bug) -> bool:
    """Whether a rerun can check a record of these settings: not one that bootstraps the task's own budget (with
    --bootstrap-budget, or the planted budget_bootstrapped on CodeRepair), which another thread count moves too far."""
    return not settings.get("bootstrap_budget") and not (bug == "budget_bootstrapped" and "env" in settings)


def audited_runs(ex: str, answers: dict, key: dict) -> list:
    """(where in answers.json, record, its settings, the bug its code had) of each run an audit may train
    again: E3's twelve (the reference), E8's six with the bug (the reference with the handout's bug planted,
    when the grader knows it) and six after the fix (the reference)."""
    seeds = key["seeds"]
    if ex == "clock":
        return [(f"clock.runs.{setting}[{i}]", answers["clock"]["runs"][setting][i], {**E3_RUN, **flags, "seed": seeds[i]},
                 None) for setting, flags in CLOCK_SETTINGS.items() for i in range(3)]
    parts = [("silent_bug_runs", key["silent_bug"])] if key["silent_bug"] else []   # their code needs the bug known
    parts.append(("silent_bug_fixed_runs", None))
    return [(f"{field}[{i}]", answers[field][i], {**E8_RUNS[i // 3], "seed": seeds[i % 3]}, bug)
            for field, bug in parts for i in range(6)]


def numbers(record: dict) -> dict:
    """What a rerun compares (TOLERANCE's numbers), read from a record."""
    summary = record["summary"]
    return {"warm start dev success": summary["warm_start"]["dev_success"],
            "warm start SFT loss": summary["warm_start"]["sft_loss"],
            "candidate dev success": summary["candidate"]["dev_success"],
            "mean training success": mean_of(record["metrics"], "success")}


def rerun_check(where: str, record: dict, settings: dict, bug, seconds: float) -> dict:
    """One record trained again on one thread: "reproduced" when every number is within its TOLERANCE of the
    record's, "drifted" when one is not, "unfinished" when the grader could not finish the rerun; with the TA's
    line saying what it saw (and whether it came back bit for bit: the same machine and thread count alone do)."""
    try:
        again = rerun(settings, seconds, bug)
    except Exception as e:                              # the grader's time or machine, never the student's doing
        return {"where": where, "state": "unfinished", "line": f"{where}: its rerun did not finish ({type(e).__name__}"
                f"{', after ' + format(seconds, 'g') + ' s' if isinstance(e, subprocess.TimeoutExpired) else ''})"}
    try:                                                # record_of has checked these numbers: this is a last guard
        mine, theirs = numbers(record), numbers(again)
        differ = [f"{what} {mine[what]:.4g} in the record, {theirs[what]:.4g} trained again (tolerance "
                  f"{TOLERANCE[what]})" for what in TOLERANCE if not abs(mine[what] - theirs[what]) <= TOLERANCE[what]]
    except (KeyError, TypeError, ValueError) as e:      # NaN never passes
        differ = [f"its numbers cannot be compared ({type(e).__name__})"]
    exact = not differ and mine["warm start SFT loss"] == theirs["warm start SFT loss"] and \
        [m.get("grad_norm") for m in record["metrics"]] == [m.get("grad_norm") for m in again["metrics"]]
    return {"where": where, "state": "drifted" if differ else "reproduced",
            "line": f"{where} (seed {settings['seed']}) trained again: " + ("; ".join(differ) + ": more than the drift "
                    "measured between thread counts" if differ else "reproduced " + ("bit for bit (its SFT loss and every "
                    "gradient norm)" if exact else "within the tolerances (not bit for bit: another machine or thread "
                    "count)")) + f"; {same_outcomes(record, again, 'candidate')}"}


def same_outcomes(record: dict, again: dict, who: str) -> str:
    """How many of a report card's dev tasks (reports.WHO.dev: task_ids, per_task 1/0) end in the rerun as in the
    record: the evidence a guess cannot match where a card is not all ones or all zeros."""
    try:
        mine, theirs = (r["summary"]["reports"][who]["dev"] for r in (record, again))
        if mine["task_ids"] != theirs["task_ids"] or len(mine["per_task"]) != len(theirs["per_task"]):
            return f"its {who}'s dev tasks are not those its settings evaluate"
        same = sum(a == b for a, b in zip(mine["per_task"], theirs["per_task"]))
        return f"{same} of {len(mine['per_task'])} of its {who}'s dev tasks end as in the record" + \
            (f" ({len(mine['per_task']) - same} differ: measured, none moves between 1 and 2 threads)"
             if same < len(mine["per_task"]) else "")
    except (KeyError, TypeError, AttributeError):
        return f"the record holds no per-task outcome of its {who} (summary.json's reports.{who}.dev, which a run " \
               "writes)"


def warm_start_check(where: str, record: dict, settings: dict, bug, seconds: float) -> str:
    """The staff's evidence beside one record: its warm start trained again here on one thread (no RL iteration),
    each dev task's outcome and the SFT loss against the record's. Never a point: a student who ran the warm start
    and guessed the rest matches it; a guess alone does not."""
    try:
        again = rerun(settings, seconds, bug, warm_start_only=True)
    except Exception as e:                              # the grader's time or machine, never the student's doing
        return f"{where}: its warm start was not trained again ({type(e).__name__}" + \
            (f", after {seconds:g} s)" if isinstance(e, subprocess.TimeoutExpired) else ")")
    try:
        loss = f"SFT loss {record['summary']['warm_start']['sft_loss']:.5g} in the record, " \
               f"{again['summary']['warm_start']['sft_loss']:.5g} again"
    except (KeyError, TypeError, ValueError):
        loss = "no SFT loss to compare"
    return f"{where} (seed {settings['seed']}): its warm start trained again here: " \
           f"{same_outcomes(record, again, 'incumbent')}; {loss}"


def audit(report: dict, answers: dict, key: dict, seconds: float, full: bool = False) -> None:
    """grade --rerun SECONDS: each experiment whose records pass their checks gets its audit, report[ex]["audit"]:
    {"state": "contradicted" or "pending", "saw": what the audit saw, line by line}. Every record's demonstrations
    are recomputed (contradictions: one that disagrees contradicts the experiment's points, which then score 0);
    otherwise its points are pending, for a person, never granted and never taken, with the evidence: the warm start
    of one record of each experiment, drawn at random, trained again here (warm_start_check), the experiments at once
    within `seconds`; with `full` (grade --full-rerun) a drawn record a rerun can check (checkable) trained whole again
    too (rerun_check), within FULL_RERUN_SECONDS. No experiment is verified: no automatic point."""
    audited = [ex for ex, check in RECORD_CHECKS.items() if ex in report and
               any(c["name"] == check and c["status"] == "passed" for c in report[ex]["checks"])]
    drawn, whole = {}, {}
    for ex in audited:
        runs = audited_runs(ex, answers, key)
        differ = contradictions(runs)
        report[ex]["audit"] = {"state": "contradicted", "saw": differ} if differ else \
            {"state": "pending", "saw": [f"{len(runs)} records' demonstrations recomputed: each is its settings'"]}
        if not differ:
            drawn[ex] = random.choice(runs)
            whole.update({ex: random.choice([run for run in runs if checkable(run[2], run[3])])} if full else {})
    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(max_workers=max(1, len(drawn))) as pool:   # each waits on its own training process
        warm = {ex: pool.submit(lambda run: warm_start_check(*run, max(1.0, deadline - time.monotonic())), run)
                for ex, run in drawn.items()}
        for ex, future in warm.items():
            report[ex]["audit"]["saw"].append(future.result())
        deadline = time.monotonic() + FULL_RERUN_SECONDS
        checked = {ex: pool.submit(lambda run: rerun_check(*run, max(1.0, deadline - time.monotonic())), run)
                   for ex, run in whole.items()}
        for ex, future in checked.items():
            report[ex]["audit"]["saw"].append(future.result()["line"])
