"""Grading: the submission read first, each exercise in a fresh worker (course/sandbox.py), every verdict reached
in the grader's process, the experiments against the student's own key, the audit that trains records again,
and the report: the TA's summary and Gradescope's results.json."""
import json
import math
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import course
from course.checks import EXPERIMENT_CHECKS, HIDDEN, HOMEWORK, NotChecked
from course.exercises import CALLBACKS, EXERCISE_FILE, EXERCISES, EXPERIMENTS, mean_of
from course.handouts import check_only, handout_text, plant
from course.ids import SECRET_ENV, answer_key, hidden_seed_of, installation_file, strong_secret
from course.lesson import (CLOCK_SETTINGS, E3_RUN, E8_RUNS, clock_numbers_are_your_runs_own_records, run_record,
                           silent_bug_answer_carries_the_runs_before_and_after_the_fix)
from course.sandbox import (MEMORY_LIMIT, SANDBOX_USER, GraderFailure, GradeTimeout, Remote, Sandbox, Worker,
                            WorkerGone, student_error)


MAX_MESSAGE = 4000


# ------------------------------------------------------------------------------------------------
# Grading: read the submission first, each exercise in a fresh worker, verdicts here, results last
# ------------------------------------------------------------------------------------------------
SUBMISSION_FILES, MAX_SUBMITTED_BYTES = ("agentic_rl.py", "envs.py", "answers.json"), 4 << 20


def read_submission(directory: Path) -> dict:
    """name -> (its text or None, a problem or None), read before any student code runs. A link, a
    directory, a FIFO or a device, a file over 4 MiB or not UTF-8 is refused by name, never opened
    by following it."""
    out = {}
    for name in SUBMISSION_FILES:
        try:
            kind = os.lstat(directory / name).st_mode
        except FileNotFoundError:
            out[name] = (None, f"{name} is missing")
            continue
        if not stat.S_ISREG(kind):
            what = "a symbolic link" if stat.S_ISLNK(kind) else "a directory" if stat.S_ISDIR(kind) else "a special file"
            out[name] = (None, f"{name} is {what}: submit a regular file")
            continue
        try:
            with os.fdopen(os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
                data = f.read(MAX_SUBMITTED_BYTES + 1)
            out[name] = (data.decode("utf-8"), None) if len(data) <= MAX_SUBMITTED_BYTES else \
                (None, f"{name} is over {MAX_SUBMITTED_BYTES >> 20} MiB")
        except (OSError, UnicodeDecodeError) as e:
            out[name] = (None, f"{name} cannot be read ({type(e).__name__})")
    return out


def parse_answers(text, problem) -> tuple:
    """(answers.json as a dict, None) or (None, why not)."""
    if problem:
        return None, problem
    try:
        answers = json.loads(text)
    except (ValueError, RecursionError) as e:
        return None, f"answers.json is not valid JSON ({type(e).__name__}: {str(e)[:200]})"
    return (answers, None) if isinstance(answers, dict) else (None, "answers.json must hold a JSON object")


def folder_with(files: dict, prefix: str) -> Path:
    """A fresh folder holding these files (name -> text): the worker can read them, not write them."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    for name, text in files.items():
        (folder / name).write_text(text)
        os.chmod(folder / name, 0o644)
    os.chmod(folder, 0o755)
    return folder


def compile_problems(sandbox: Sandbox, submission: dict, seconds: float) -> dict:
    """name -> None, or (status, why) for a submitted file that cannot be read or does not compile; each file
    compiled once per grading, in a worker of its own within `seconds`: the compiler's time and memory are
    the student's, never the grader's (a file of nested f-strings takes it time quadratic in its length)."""
    problems = {}
    for name in ("agentic_rl.py", "envs.py"):
        text, problem = submission[name]
        if problem:
            problems[name] = ("crashes", problem)
            continue
        folder, worker = folder_with({name: text}, "compile-"), None
        try:
            worker = Worker(sandbox, folder, [], time.monotonic() + seconds, compile_only=[name])
            found = (worker.ready.get("compiled") or {}).get(name, "no answer")
            if found is None:
                problems[name] = None
            elif not isinstance(found, dict) or not isinstance(found.get("raised"), list):
                raise GraderFailure(f"the compiler's worker answered {str(found)[:80]!r}")
            else:
                kind = "memory limit" if "MemoryError" in found["raised"] else "crashes"
                problems[name] = (kind, f"{found['raised'][0]}: {found.get('message', '')}")
        except GradeTimeout:
            problems[name] = ("time limit", f"compiling it took longer than the time limit ({seconds:g} s)")
        except WorkerGone as e:
            problems[name] = ("crashes", f"compiling it ended the compiler's process ({e})")
        except GraderFailure as e:
            problems[name] = verdict(e)
        finally:
            if worker is not None:
                worker.close()
            shutil.rmtree(folder, ignore_errors=True)
    return problems


def files_for(ex: str, submission: dict, problems: dict):
    """The two files an exercise's worker imports: the student's file holding the exercise, and their
    other file if it compiles, else the handout's (blanks only); or (status, why) the exercise cannot be
    graded. problems: what compile_problems found."""
    files = {}
    for name in ("agentic_rl.py", "envs.py"):
        if problems[name] and name == EXERCISE_FILE[ex]:
            return problems[name][0], f"{name} cannot be graded: {problems[name][1]}"
        files[name] = handout_text(name) if problems[name] else submission[name][0]
    return files


def verdict(e: Exception) -> tuple:
    """(status, message) for what a check raised, told apart by the kind of exception, never by the words
    of its message: a blank, a wrong value (the grader's own assert: an AssertionError the student's code raised
    is a crash like any other), a stop, or a crash; and the grader's own failure, which is never the student's."""
    if isinstance(e, NotImplementedError):
        return "not started", str(e)
    if isinstance(e, AssertionError) and not getattr(e, "from_student", False):
        return "wrong", str(e)
    if isinstance(e, GradeTimeout):
        return "time limit", "stopped at the time limit: an endless loop, or far too slow"
    if isinstance(e, MemoryError) and getattr(e, "from_student", False):
        return "memory limit", f"stopped at the memory limit ({MEMORY_LIMIT >> 20} MiB more than torch itself): " \
                               f"{type(e).__name__}: {e}"
    if isinstance(e, WorkerGone):
        return "crashes", f"your code ended its process ({e})" if str(e).startswith("last output") else \
            f"your code broke the grader's protocol: {e}"
    if isinstance(e, GraderFailure):
        return "grader error", f"the grader failed here, not your code: {e}; tell the course staff"
    return "crashes", f"{type(e).__name__}: {e}" + (" (raised by your code)" if getattr(e, "from_student", 0) else "")


def run_check(check, *args) -> tuple:
    """(status, message) of one check; the check runs here, in the grader's process."""
    try:
        check(*args)
        return "passed", ""
    except NotChecked as e:
        return "not checked", f"{e}: not checked, no points lost; a TA may look"
    except Exception as e:
        status, message = verdict(e)
        return status, printable(message)


def printable(text: str) -> str:
    """A message as the TA's terminal and results.json should show it: control characters escaped (no
    student can clear a screen or fake a total), at most MAX_MESSAGE characters."""
    text = "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f" ... ({len(text) - MAX_MESSAGE} more characters)"


def grade_exercise(sandbox: Sandbox, ex: str, files, seconds: float) -> dict:
    """One exercise: a fresh folder and a fresh worker, its checks within `seconds` together, then the
    worker and everything it started killed."""
    row, worker, trouble, folder = {"points": EXERCISES[ex][0], "checks": []}, None, None, None
    try:
        if isinstance(files, tuple):
            trouble = files
        else:
            folder = folder_with(files, f"grade-{ex}-")
            try:
                worker = Worker(sandbox, folder, CALLBACKS.get(ex, []), time.monotonic() + seconds)
                if "raised" in worker.ready:
                    raise student_error(worker.ready)
            except GraderFailure as e:
                trouble = verdict(e)
            except Exception as e:  # the student's files do not even import, or hang while importing
                status, message = verdict(e)
                trouble = (status, f"agentic_rl.py does not import: {message}")
        for check_ex, name, check, hidden in HOMEWORK:
            if check_ex != ex:
                continue
            done = row["checks"]
            if trouble:
                status, message = trouble[0], printable(trouble[1])
            elif done and done[-1]["status"] in ("time limit", "memory limit"):
                status, message = done[-1]["status"], "not run: an earlier check of this exercise hit the limit"
            else:
                status, message = run_check(check, Remote(worker, 0))
            done.append({"name": name, "hidden": hidden, "status": status, "message": message})
    finally:
        if worker is not None:
            worker.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return row


def grade(directory=".", only=None, time_limit: float = 60.0, silent_bug=None, hidden_seed=None,
          user=SANDBOX_USER, memory: int = MEMORY_LIMIT, rerun_seconds: float = 0.0, students=()) -> dict:
    """Grade a submission: its agentic_rl.py, envs.py and answers.json, read first; each exercise in
    a fresh sandboxed worker within time_limit seconds, against this installation's checks; every
    verdict reached here; the experiments against the key of the student's handout (students: whom its id
    may be bound to), and audited with rerun_seconds. Returns {exercise: {"points", "checks": [{"name",
    "hidden", "status", "message"}]}} with "~sandbox" (what the workers ran as) once every process is gone."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such directory; name the folder that holds the submission")
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and 1 <= time_limit <= 3600):
        raise ValueError(f"--time-limit {time_limit}: give the seconds per exercise, a number in [1, 3600]")
    check_only(only, [*EXERCISES, *EXPERIMENTS])
    secret = hidden_seed or installation_file("hidden_seed.txt")
    secret = secret and strong_secret(secret)
    submission = read_submission(directory)                    # everything, before any of its code runs
    answers, answers_problem = parse_answers(*submission["answers.json"])
    experiments = [ex for ex in EXPERIMENTS if only is None or ex in only]
    if secret and experiments and answers and isinstance(answers.get("handout"), str) and not students:
        raise ValueError("answers.json carries a handout id, which is bound to a student: say whose submission this "
                         "is (grade --student NAME, or --metadata with Gradescope's submission_metadata.json)")
    HIDDEN["seed"] = hidden_seed_of(secret)
    key = answer_key(answers, secret, students, silent_bug) if answers else None
    report = {}
    with Sandbox(user, memory) as sandbox:
        graded = [e for e in EXERCISES if only is None or e in only]
        problems = compile_problems(sandbox, submission, time_limit) if graded else {}
        for ex in graded:
            report[ex] = grade_exercise(sandbox, ex, files_for(ex, submission, problems), time_limit)
    for ex in experiments:
        report[ex] = {"points": EXPERIMENTS[ex], "checks": []}
        for check_ex, name, check, hidden in EXPERIMENT_CHECKS:
            if check_ex == ex:
                status, message = ("not started", answers_problem) if answers is None else run_check(check, answers, key)
                report[ex]["checks"].append({"name": name, "hidden": hidden, "status": status, "message": message})
    if rerun_seconds:
        audit(report, answers, key, rerun_seconds)
    report["~sandbox"] = f"{sandbox.note}, {getattr(sandbox, 'isolation', 'no worker started')}"
    return report


AUDIT_SECONDS = 600.0   # the bundle's audit per grading: about one E3 and one E8 run trained again on 2 cores
RERUN_TOLERANCE = 0.1   # dev success, and training success over the run: the same seed on the same machine gives the
                        # same numbers, another machine may differ by a few tasks, a made-up record by much more
RECORD_CHECKS = {"clock": clock_numbers_are_your_runs_own_records.__name__,     # an experiment's runs are audited once
                 "silent_bug": silent_bug_answer_carries_the_runs_before_and_after_the_fix.__name__}  # these pass


def rerun(settings: dict, seconds: float, bug=None) -> dict:
    """Train again here, within `seconds`, with the reference (and `bug` planted, as in the student's
    handout) and these settings (the seed and the flags the experiment asks for, which record_of has found
    in the record; every other setting at its default); the new run's record."""
    flags = [part for name, value in settings.items() for part in
             [f"--{name.replace('_', '-')}"] + ([] if isinstance(value, bool) else [str(value)])]
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}      # the reference's training needs no secret
    with tempfile.TemporaryDirectory() as folder:
        script = course.REPO / "agentic_rl.py"
        if bug:
            script = Path(folder) / "agentic_rl.py"
            script.write_text(plant((course.REPO / "agentic_rl.py").read_text(), bug))
            shutil.copy(course.REPO / "envs.py", Path(folder) / "envs.py")
        subprocess.run([sys.executable, str(script), "train", *flags, "--device", "cpu", "--run-dir", f"{folder}/run"],
                       capture_output=True, timeout=seconds, check=True, cwd=folder, env=env)
        return run_record(f"{folder}/run")


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
    check = {"name": f"rerun_of_{re.sub(r'[^0-9a-z]+', '_', where).strip('_')}_reproduces_its_record", "hidden": True}
    try:
        again = rerun(settings, seconds, bug)
    except Exception as e:                              # the grader's time or machine, never the student's doing
        return {**check, "status": "not checked", "message": f"the grader could not finish this rerun "
                f"({type(e).__name__}): not checked, no points lost; a TA may give --rerun more seconds"}
    read = lambda r: (r["summary"]["warm_start"]["dev_success"], r["summary"]["candidate"]["dev_success"],
                      mean_of(r["metrics"], "success"))
    differ = [f"{what} {mine:.3f} in the record, {theirs:.3f} trained again here" for what, mine, theirs in
              zip(("warm start dev success", "candidate dev success", "mean training success"), read(record), read(again))
              if abs(mine - theirs) > RERUN_TOLERANCE]
    return {**check, "status": "wrong" if differ else "passed", "message": f"{where} (seed {settings['seed']}): "
            f"{'; '.join(differ)} (tolerance {RERUN_TOLERANCE})" if differ else ""}


def audit(report: dict, answers: dict, key: dict, seconds: float) -> None:
    """grade --rerun SECONDS: each experiment whose records pass their checks gets an equal share of the
    seconds; one of its runs, chosen at random, is trained again, then more in random order while what is
    left of the share is at least what the last one took. Each rerun is a hidden check of its experiment."""
    shares = [ex for ex, check in RECORD_CHECKS.items() if ex in report and
              any(c["name"] == check and c["status"] == "passed" for c in report[ex]["checks"])]
    for ex in shares:
        runs, deadline, last = audited_runs(ex, answers, key), time.monotonic() + seconds / len(shares), 0.0
        for n, (where, record, settings, bug) in enumerate(random.sample(runs, len(runs))):
            left = deadline - time.monotonic()
            if n and left < last:
                break
            started = time.monotonic()
            report[ex]["checks"].append(rerun_check(where, record, settings, bug, left))
            last = time.monotonic() - started


def exercises(report: dict) -> dict:
    return {ex: row for ex, row in report.items() if not ex.startswith("~")}


def counted(row: dict) -> list:
    """The checks that count: a rerun the grader could not finish ("not checked") costs the student nothing."""
    return [c for c in row["checks"] if c["status"] != "not checked"]


def score(row: dict, hidden=None) -> tuple:
    """(points earned, points possible) of an exercise (or of its hidden / visible checks): the
    visible checks share half its points and the hidden ones the other half, each counted check of a
    half alike, so hard-coding what the handout shows earns half at most."""
    halves = [[c for c in counted(row) if c["hidden"] == h] for h in (False, True)]
    earned = possible = 0.0
    for h, part in zip((False, True), halves):
        if part and hidden in (None, h):
            weight = row["points"] / sum(1 for half in halves if half)
            earned += weight * sum(c["status"] == "passed" for c in part) / len(part)
            possible += weight
    return earned, possible


def suspicious(row: dict) -> bool:
    """Every visible check passes and a hidden one does not: hard-coded answers, for a TA to look at."""
    visible, hidden = ([c["status"] == "passed" for c in counted(row) if c["hidden"] == h] for h in (False, True))
    return bool(visible) and all(visible) and not all(hidden)


def unchecked(row: dict) -> bool:
    """A rerun of this experiment could not finish: a TA may want to run it."""
    return any(c["status"] == "not checked" for c in row["checks"])


SUSPICIOUS = "visible checks pass, hidden checks fail: a TA should read this code (hard-coded answers?)"
NOT_CHECKED = "a check the grader could not make (a rerun it could not finish, runs with nothing to judge) is not " \
              "checked (no points lost): a TA may look"


def quoted(message: str) -> str:
    """A check's message as the report shows it: every line indented, so that none (a student's words may be in
    it) can pass for a line of the report, such as "[passed] ..." or "total ..."."""
    return textwrap.indent(message, "    ", lambda line: True)


FILES_SHARED = ("WARNING: files shared: the student's code ran without a private root (the grader is not root, or "
                "lacks CAP_SYS_ADMIN, as in a container with Docker's default capabilities) and could read every file "
                "on this machine that others may read: keep other submissions, and anything else private, unreadable "
                "by others (chmod -R go-rwx) while grading")
NETWORK_SHARED = ("WARNING: network shared: the student's code ran with no network namespace and no seccomp filter, "
                  "and could reach the network and this machine's unix sockets")


def sandbox_lines(report: dict) -> list:
    """What the workers ran as (the grader's note), and a loud warning for what they shared with the machine."""
    note = report.get("~sandbox", "")
    return [f"sandbox: {note}"] + ([FILES_SHARED] if "files shared" in note else []) + \
        ([NETWORK_SHARED] if "network shared" in note and "seccomp on" not in note else [])


def print_grade(report: dict) -> bool:
    print("\n".join(sandbox_lines(report)))
    print(f"{'exercise':<16}{'points':>14}  {'checks':>8}  status")
    rows = exercises(report)
    for ex, row in rows.items():
        earned, possible = score(row)
        passed = sum(c["status"] == "passed" for c in row["checks"])
        worst = next((c for c in row["checks"] if c["status"] != "passed"), None)
        print(f"{ex:<16}{earned:>7.1f} / {possible:<5.1f} {passed:>3}/{len(row['checks']):<3}  "
              f"{'ok' if worst is None else worst['status'] + ': ' + worst['name']}" +
              (f"  [{SUSPICIOUS}]" if suspicious(row) else "") + (f"  [{NOT_CHECKED}]" if unchecked(row) else ""))
    for ex, row in rows.items():
        for c in row["checks"]:
            if c["status"] not in ("passed", "not started"):
                print(f"\n[{ex}] {c['name']} ({'hidden' if c['hidden'] else 'visible'} check): {c['status']}\n"
                      f"{quoted(c['message'])}")
    earned, possible = (sum(score(row)[i] for row in rows.values()) for i in (0, 1))
    skipped = sum(c["status"] == "not checked" for row in rows.values() for c in row["checks"])
    print(f"\ntotal {earned:.1f} / {possible:.1f}: " + ("some checks did not pass" if earned != possible else
                                                     f"every check made passed; {skipped} not checked" if skipped else
                                                     "every check passed"))
    return earned == possible


def gradescope_results(report: dict, seconds: float) -> dict:
    """Gradescope's results.json: one test per exercise and visibility; hidden checks show after publishing."""
    tests = []
    for number, (ex, row) in enumerate(exercises(report).items(), start=1):
        for hidden in (False, True):
            part = [c for c in row["checks"] if c["hidden"] == hidden]
            if part:
                earned, possible = score(row, hidden)
                flag = (f"\n{SUSPICIOUS}" if hidden and suspicious(row) else "") + \
                    (f"\n{NOT_CHECKED}" if hidden and unchecked(row) else "")
                tests.append({"name": f"{ex} ({'hidden' if hidden else 'visible'} checks)",
                              "number": f"{number}.{int(hidden) + 1}", "score": round(earned, 2),
                              "max_score": round(possible, 2), "visibility": "after_published" if hidden else "visible",
                              "output": "\n".join(f"[{c['status']}] {c['name']}" + (f"\n{quoted(c['message'])}"
                                                                                    if c["message"] else "")
                                                   for c in part) + flag})
    return {"score": round(sum(t["score"] for t in tests), 2), "execution_time": round(seconds, 1),
            "output": "\n".join(["agentic-rl homework: each exercise's visible checks, then its hidden ones",
                                 *sandbox_lines(report)]),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def grader_failed(why: str, seconds: float) -> dict:
    """results.json when the grader itself fails: the student sees that it was not their code."""
    return {"score": 0.0, "execution_time": round(seconds, 1), "visibility": "visible", "stdout_visibility": "hidden",
            "output": f"The grader failed, not your submission ({why}); the course staff will regrade it.", "tests": []}
