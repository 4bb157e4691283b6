"""The audit: records of the experiments trained again here, with the reference (and the handout's bug, where the
record was made with it), and compared with what the student handed in."""
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import agentic_rl as A
import course
from course.exercises import mean_of
from course.handouts import plant
from course.ids import SECRET_ENV
from course.lesson import (CLOCK_SETTINGS, E3_RUN, E8_RUNS, clock_numbers_are_your_runs_own_records, run_record,
                           silent_bug_answer_carries_the_runs_before_and_after_the_fix)


AUDIT_SECONDS = 600.0   # an audit's seconds per grading (grade's and the bundle's default): about one E3 and one E8
                        # run trained again on 2 cores
RERUN_TOLERANCE = 0.1   # the lesson's numbers (dev successes, mean training success) of a record trained again: see
                        # the README's drift table (1, 2 and 4 threads) for what an honest rerun moves
RECORD_CHECKS = {"clock": clock_numbers_are_your_runs_own_records.__name__,     # an experiment's runs are audited once
                 "silent_bug": silent_bug_answer_carries_the_runs_before_and_after_the_fix.__name__}  # these pass


def rerun(settings: dict, seconds: float, bug=None, threads: int = 1) -> dict:
    """Train again here, within `seconds`, with the reference (and `bug` planted, as in the student's
    handout), these settings (the seed and the flags the experiment asks for, which record_of has found
    in the record; every other setting at its default) and the record's thread count (torch's sums, and so
    every number after the warm start, depend on it: README); the new run's record."""
    flags = [part for name, value in settings.items() for part in
             [f"--{name.replace('_', '-')}"] + ([] if isinstance(value, bool) else [str(value)])]
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}      # the reference's training needs no secret
    with tempfile.TemporaryDirectory() as folder:
        script = course.REPO / "agentic_rl.py"
        if bug:
            script = Path(folder) / "agentic_rl.py"
            script.write_text(plant((course.REPO / "agentic_rl.py").read_text(), bug))
            shutil.copy(course.REPO / "envs.py", Path(folder) / "envs.py")
        threaded = f"import runpy, sys, torch; torch.set_num_threads({int(threads)}); sys.argv[0] = {str(script)!r}; " \
                   f"sys.path.insert(0, {str(script.parent)!r}); runpy.run_path({str(script)!r}, run_name='__main__')"
        subprocess.run([sys.executable, "-c", threaded, "train", *flags, "--device", "cpu", "--run-dir", f"{folder}/run"],
                       capture_output=True, timeout=seconds, check=True, cwd=folder, env=env)
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


def demonstrations_check(ex: str, runs: list) -> dict:
    """Every record of an experiment against the demonstrations of its own settings: a record copied from another
    seed's run, edited to other settings, or made up carries another number. Drift 0, so one that differs fails."""
    differ = []
    for where, record, settings, _ in runs:
        warm = json.dumps({k: v for k, v in settings.items() if k not in ("algo", "bootstrap_budget")}, sort_keys=True)
        mine, theirs = record["summary"].get("demonstrator_success"), demonstrator_success(warm)
        differ += [f"{where} (seed {settings['seed']}): demonstrator success {mine!r} in the record, {theirs} for its "
                   "settings"] if mine != theirs else []
    return {"name": f"every_{ex}_record_has_the_demonstrations_of_its_own_settings", "hidden": True, "audit": True,
            "records": len(runs), "reproduced": len(runs) - len(differ), "status": "wrong" if differ else "passed",
            "message": "; ".join(differ) + ": did not come from a run with its settings" if differ else ""}


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


def rerun_check(where: str, record: dict, settings: dict, bug, seconds: float) -> dict:
    """One record trained again: passed when the rerun's candidate dev success and mean training success are
    each within RERUN_TOLERANCE of the record's; "not checked" when the grader cannot finish the rerun."""
    check = {"name": f"rerun_of_{re.sub(r'[^0-9a-z]+', '_', where).strip('_')}_reproduces_its_record", "hidden": True,
             "rerun": True}
    threads, cores = record["summary"].get("threads"), os.cpu_count() or 1   # never more threads than cores: a record
    try:                                                                       # claiming 256 would only slow the rerun
        again = rerun(settings, seconds, bug, threads if type(threads) is int and 1 <= threads <= cores else cores)
    except Exception as e:                              # the grader's time or machine, never the student's doing
        return {**check, "status": "not checked", "message": f"the grader could not finish this rerun "
                f"({type(e).__name__}): not checked, no points lost; a TA may give --rerun more seconds"}
    read = lambda r: (r["summary"]["warm_start"]["dev_success"], r["summary"]["candidate"]["dev_success"],
                      mean_of(r["metrics"], "success"))
    try:                                                # record_of has checked these numbers: this is a last guard
        differ = [f"{what} {mine:.3f} in the record, {theirs:.3f} trained again here" for what, mine, theirs in
                  zip(("warm start dev success", "candidate dev success", "mean training success"), read(record),
                      read(again)) if not abs(mine - theirs) <= RERUN_TOLERANCE]      # NaN never passes
    except (KeyError, TypeError, ValueError) as e:
        differ = [f"its numbers cannot be compared ({type(e).__name__})"]
    exact = [r["summary"]["warm_start"].get("sft_loss") for r in (record, again)] + \
        [[m.get("grad_norm") for m in r["metrics"]] for r in (record, again)]
    same = not differ and exact[0] == exact[1] and exact[2] == exact[3]   # the same machine and thread count alone
    return {**check, "status": "wrong" if differ else "passed", "reproduced": int(not differ), "exact": same,
            "message": f"{where} (seed {settings['seed']}): {'; '.join(differ)} (tolerance {RERUN_TOLERANCE}): did not "
                       "reproduce" if differ else f"{where}: " + ("reproduced bit for bit (its SFT loss and every gradient "
                       "norm)" if same else "reproduced within the tolerance (not bit for bit: another machine or "
                       "thread count)")}


def audit(report: dict, answers: dict, key: dict, seconds: float) -> None:
    """grade --rerun SECONDS: each experiment whose records pass their checks has every record's demonstrations
    recomputed (demonstrations_check), then an equal share of the seconds: one of its runs, chosen at random, is
    trained again, then more in random order while what is left of the share is at least what the last one took.
    Each is a hidden check of its experiment; one that fails zeroes the experiment (report.score)."""
    shares = [ex for ex, check in RECORD_CHECKS.items() if ex in report and
              any(c["name"] == check and c["status"] == "passed" for c in report[ex]["checks"])]
    for ex in shares:
        runs, deadline, last = audited_runs(ex, answers, key), time.monotonic() + seconds / len(shares), 0.0
        report[ex]["checks"].append(demonstrations_check(ex, runs))
        for n, (where, record, settings, bug) in enumerate(random.sample(runs, len(runs))):
            left = deadline - time.monotonic()
            if n and left < last:
                break
            started = time.monotonic()
            report[ex]["checks"].append(rerun_check(where, record, settings, bug, left))
            last = time.monotonic() - started
