"""Grading: the submission read first, each exercise in a fresh worker (course/sandbox.py), every verdict reached
in the grader's process, the experiments against the student's own key, then the audit (course/audit.py)."""
import json
import math
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import course
from course.audit import audit
from course.checks import EXPERIMENT_CHECKS, HIDDEN, HOMEWORK, NotChecked
from course.exercises import (ANSWER_FIELDS, CALLBACKS, EXERCISE_FILE, EXERCISES, EXPERIMENTS, READ_BY_A_PERSON,
                              TIME_LIMIT, filled_in)
from course.handouts import answers_template, check_only, handout_text
from course.ids import answer_key, hidden_seed_of, installation_file, strong_secret
from course.lesson import CLOCK_SETTINGS
from course.sandbox import (MEMORY_LIMIT, SANDBOX_USER, GraderFailure, GradeTimeout, IsolationMissing, Remote,
                            Sandbox, Worker, WorkerGone, WorkerOutOfMemory, missing_isolation, student_error)
from course.similarity import SHORTEST, own_code_within, reference_code, similarity


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


def shape_problem(answers: dict, ex: str):
    """A sentence naming the field of answers.json that does not have the shape its handout gave it (and the fix), for
    an experiment (E3 "clock", E8 "silent_bug"); None when every field it is graded on has its shape. A wrong shape
    is the student's error, said in a sentence, never a crash of the grader's checks."""
    def kind(value):
        return {dict: "an object", list: "a list", str: "a text", bool: "true or false", type(None): "null"}.get(
            type(value), "a number")

    def wrong(field, value, shape):
        return f"answers.json's {field} is {kind(value)} ({json.dumps(value)[:80]}): it must be {shape}, as in the " \
               "answers.json your handout came with"
    listed = answers.get("exercises")
    if "handout" in answers and not isinstance(answers["handout"], str):
        return wrong('"handout"', answers["handout"], "the text your handout came with")
    if "exercises" in answers and not (isinstance(listed, list) and all(isinstance(e, str) for e in listed)):
        return wrong('"exercises"', listed, f"a list of exercise ids ({', '.join(EXERCISES)})")
    if "seeds" in answers and not (isinstance(answers["seeds"], list) and
                                   all(type(s) is int for s in answers["seeds"])):
        return wrong('"seeds"', answers["seeds"], "the list of three whole numbers your handout came with")
    if ex == "silent_bug":
        for field in ("silent_bug", "silent_bug_evidence"):
            if field in answers and not isinstance(answers[field], str):
                return wrong(f'"{field}"', answers[field], "a text")
        for field in ("silent_bug_runs", "silent_bug_fixed_runs"):
            runs = answers.get(field, [])
            if not (isinstance(runs, list) and all(isinstance(r, dict) for r in runs)):
                return wrong(f'"{field}"', runs, "a list of run records (run_record(RUN_DIR) makes one)")
        return None
    clock = answers.get("clock", {})
    if not isinstance(clock, dict):
        return wrong('"clock"', clock, "an object with the keys " + ", ".join(f'"{k}"' for k in answers_template()["clock"]))
    for setting in CLOCK_SETTINGS:
        numbers = clock.get(setting, [])
        if not (isinstance(numbers, list) and all(type(n) in (int, float) for n in numbers)):
            return wrong(f'"clock.{setting}"', numbers, "a list of three numbers (each run's candidate dev success)")
    if "why" in clock and not isinstance(clock["why"], str):
        return wrong('"clock.why"', clock["why"], "a text")
    runs = clock.get("runs", {})
    if not isinstance(runs, dict):
        return wrong('"clock.runs"', runs, "an object: each setting's list of run records")
    for setting, records in runs.items():
        if not (isinstance(records, list) and all(isinstance(r, dict) for r in records)):
            return wrong(f'"clock.runs.{str(setting)[:40]}"', records, "a list of run records (run_record(RUN_DIR) "
                                                                         "makes one)")
    return None


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
        except WorkerOutOfMemory as e:
            problems[name] = ("memory limit", f"compiling it passed the memory limit: {e}")
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
    files["envload.py"] = (course.REPO / "envload.py").read_text()  # imported by agentic_rl.py, never submitted
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
    if isinstance(e, WorkerOutOfMemory):
        return "memory limit", f"stopped at the memory limit: {e}"
    if isinstance(e, MemoryError) and getattr(e, "from_student", False) and not getattr(e, "stated", False):
        return "memory limit", f"stopped at the memory limit ({MEMORY_LIMIT >> 20} MiB more than torch itself): " \
                               f"{type(e).__name__}: {e}"
    if isinstance(e, WorkerGone):
        return "crashes", f"your code ended its process ({e})" if str(e).startswith("last output") else \
            f"your code broke the grader's protocol: {e}"
    if isinstance(e, GraderFailure):
        return "grader error", f"the grader failed here, not your code: {e}; tell the course staff"
    return "crashes", f"{type(e).__name__}: {e}" + (" (raised by your code)" if getattr(e, "from_student", 0) else "")


def run_check(check, *args, on_answers=False) -> tuple:
    """(status, message) of one check; the check runs here, in the grader's process. An experiment's check
    (on_answers) that trips on a value of answers.json's is the student's error, said in a sentence."""
    try:
        check(*args)
        return "passed", ""
    except NotChecked as e:
        return "not checked", f"{e}: not checked, no points lost; a TA may look"
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as e:
        if not on_answers:
            status, message = verdict(e)
            return status, printable(message)
        return "wrong", printable(f"answers.json holds a value of another shape than the one its handout gave it, or "
                                  f"a record edited by hand ({type(e).__name__}: {str(e)[:200]}): fill it in as the "
                                  "handout's answers.json shows, each record as run_record(RUN_DIR) writes it")
    except Exception as e:
        status, message = verdict(e)
        return status, printable(message)


def printable(text: str, limit=MAX_MESSAGE) -> str:
    """A message as the TA's terminal and results.json should show it: control characters escaped (no
    student can clear a screen or fake a total), at most `limit` characters (None: in full)."""
    text = "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in str(text))
    return text if limit is None or len(text) <= limit else text[:limit] + f" ... ({len(text) - limit} more characters)"


def grade_exercise(sandbox: Sandbox, ex: str, files, seconds: float, hung=None) -> dict:
    """One exercise: a fresh folder and a fresh worker, its checks within `seconds` together, then the
    worker and everything it started killed. hung: the files whose import did not finish within an earlier
    exercise's time limit in this grading (files -> that exercise): not imported again, so a student's endless
    loop at import costs one time limit, not one per exercise."""
    row, worker, trouble, folder = {"points": EXERCISES[ex][0], "checks": []}, None, None, None
    hung = {} if hung is None else hung
    key = None if isinstance(files, tuple) else tuple(sorted(files.items()))
    try:
        if isinstance(files, tuple):
            trouble = files
        elif key in hung:
            trouble = ("time limit", f"agentic_rl.py does not import: importing your files did not finish within the "
                                     f"time limit in {hung[key]}'s worker (an endless loop at import?): not run again")
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
                hung.update({key: ex} if isinstance(e, GradeTimeout) else {})
        for check_ex, name, check, hidden in HOMEWORK:
            if check_ex != ex:
                continue
            done = row["checks"]
            if trouble:
                status, message = trouble[0], printable(trouble[1])
            elif done and done[-1]["status"] in ("time limit", "memory limit"):
                status, message = done[-1]["status"], "not run: an earlier check of this exercise hit the limit"
            elif worker.broken:
                status, message = "crashes", printable(f"not run: your code broke the grader's protocol in an earlier "
                                                       f"check of this exercise ({worker.broken}); its worker was killed")
            else:
                status, message = run_check(check, Remote(worker, 0))
            done.append({"name": name, "hidden": hidden, "status": status, "message": message})
    finally:
        if worker is not None:
            worker.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return row


NEAR_COPY = 0.95   # a share of the public reference at or above it (the whole file's, or one exercise's with SHORTEST
                   # fingerprints or more) holds the code's points for a person (STAFF.md: fresh solutions reach 0.55)


def hold_near_copies(report: dict, graded: list):
    """A submission that is a near copy of the public reference keeps its points pending until a person decides: each
    exercise whose function is (or, the whole file near 1.00, every exercise) is held (row["held"], for the staff)."""
    sim = report["~similarity"]["the public reference"]
    whole = sim["fingerprints"] >= SHORTEST and sim["share"] >= NEAR_COPY
    for ex in graded:
        row = sim["exercises"].get(ex)
        alone = row is not None and row["fingerprints"] >= SHORTEST and row["share"] >= NEAR_COPY
        if (whole or alone) and ex in report:
            report[ex]["held"] = (f"its {ex} shares {row['share']:.2f} of {row['fingerprints']} fingerprints with the "
                                  "public reference" if alone else f"its own code shares {sim['share']:.2f} of "
                                  f"{sim['fingerprints']} fingerprints with the public reference") + \
                ": a near copy; its points wait for a person to decide (the similarity page shows both side by side)"


def handed_out(answers, key, secret) -> tuple:
    """(the exercises a handout holds, as its answers.json names them in "exercises", a note for the staff or ''):
    every exercise where it names none (a handout made before it did), where the list is not one of known exercise
    ids, or where the course's secret is in use and the handout id does not verify it (the id binds the list)."""
    listed = (answers or {}).get("exercises")
    if listed is None:
        return list(EXERCISES), ""
    if not (isinstance(listed, list) and listed and all(isinstance(ex, str) and ex in EXERCISES for ex in listed)):
        return list(EXERCISES), (f"answers.json's exercises {str(listed)[:200]!r} is not a list of exercise ids "
                                 f"({', '.join(EXERCISES)}): every exercise graded")
    if secret and not (key or {}).get("seeds"):
        return list(EXERCISES), ("answers.json's exercises are not verified by a handout id issued to this student: "
                                 "every exercise graded")
    return [ex for ex in EXERCISES if ex in listed], ""


def grade(directory=".", only=None, time_limit: float = TIME_LIMIT, silent_bug=None, hidden_seed=None,
          user=SANDBOX_USER, memory: int = MEMORY_LIMIT, rerun_seconds: float = 0.0, students=(),
          require_isolation: bool = False, full_rerun: bool = False) -> dict:
    """Grade a submission: its agentic_rl.py, envs.py and answers.json, read first; the exercises `only` names, or
    else those its handout holds (handed_out) and the experiments; each exercise in a fresh sandboxed worker within
    time_limit seconds, against this installation's checks; every verdict reached here; the experiments against
    the key of the student's handout (students: whom its id may be bound to), and audited with rerun_seconds
    (course/audit.py: their points contradicted or pending, with its evidence; rerun_seconds 0, pending; full_rerun:
    a drawn record's whole run too). A code exercise whose function is a near copy of the public reference is held
    for a person (row["held"]: pending). Returns
    {exercise: {"points", "checks": [{"name", "hidden", "status", "message"}]}, an experiment's with "audit" and
    its prose's "pending"} with "~sandbox" (what the workers ran as) once every process is gone, the similarity
    report ("~own", "~similarity") and "~bugs" (the silent bugs its agentic_rl.py carries that its handout had
    not)."""
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
    HIDDEN["seed"] = hidden_seed_of(secret, students)
    key = answer_key(answers, secret, students, silent_bug) if answers else None
    given, note = handed_out(answers, key, secret)
    report = {"~handout": note} if note and only is None else {}
    with Sandbox(user, memory) as sandbox:
        graded = [e for e in EXERCISES if (e in only if only is not None else e in given)]
        problems = compile_problems(sandbox, submission, time_limit) if graded else {}
        missing = missing_isolation(f"{sandbox.note}, {getattr(sandbox, 'isolation', 'no worker started')}")
        if require_isolation and missing:      # found by the compiler's worker, before any of the student's code runs
            raise IsolationMissing(f"--require-isolation: on this machine the student's code would run without: "
                                   f"{', '.join(missing)}; grade as root with CAP_SYS_ADMIN and cgroups (a container: "
                                   "--cap-add SYS_ADMIN), or leave out --require-isolation and read the warning")
        hung = {}
        for ex in graded:
            report[ex] = grade_exercise(sandbox, ex, files_for(ex, submission, problems), time_limit, hung)
    for ex in experiments:
        report[ex] = {"points": EXPERIMENTS[ex], "checks": [], "audit": {"state": "pending", "saw": [
            "not trained again: the audit was off (--rerun 0)" if not rerun_seconds else "not audited"]}}
        started = answers is not None and any(filled_in(answers.get(field)) for field in ANSWER_FIELDS[ex])
        shape = started and shape_problem(answers, ex)
        for check_ex, name, check, hidden in EXPERIMENT_CHECKS:
            if check_ex == ex:
                status, message = ("wrong", printable(shape)) if shape else run_check(check, answers, key, on_answers=True) \
                    if started else ("not started", answers_problem or
                                     f"answers.json: nothing is filled in for it yet ({', '.join(ANSWER_FIELDS[ex])})")
                report[ex]["checks"].append({"name": name, "hidden": hidden, "status": status, "message": message})
        if ex in READ_BY_A_PERSON:           # its prose, for a person to read: pending, whatever words it uses
            path, points = READ_BY_A_PERSON[ex]
            said = answers or {}
            for part in path:
                said = said.get(part) if isinstance(said, dict) else None
            report[ex]["pending"] = {"field": ".".join(path), "points": points,
                                     "answer": printable(str(said or "(empty)"), limit=None)}
    if rerun_seconds:
        audit(report, answers, key, rerun_seconds, full_rerun)
    report["~sandbox"] = f"{sandbox.note}, {getattr(sandbox, 'isolation', 'no worker started')}"
    unreadable = {name: f"it did not compile or could not be read ({problems[name][1][:200]})"
                  for name in ("agentic_rl.py", "envs.py") if problems.get(name)}     # never parsed here
    report["~own"] = own_code_within({name: submission[name][0] for name in ("agentic_rl.py", "envs.py")
                                      if name not in unreadable}, graded, unreadable)
    report["~similarity"] = {"the public reference": similarity(report["~own"], reference_code(tuple(sorted(graded))))}
    hold_near_copies(report, graded)
    knows_the_bug = key is not None and key.get("seeds") is not None and bool(secret or key["silent_bug"])
    report["~bugs"] = {"own": key and key["silent_bug"], "others": [b for b in report["~own"]["planted"]
                                                                    if b != key["silent_bug"]] if knows_the_bug else []}
    return report
