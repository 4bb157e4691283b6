"""What a teaching assistant sees on grading day: a handout that leaks nothing and round-trips, the bundle that
grades the reference fully and a blank at zero, each student's own seeds and bug, the secret's rules, the
experiments graded on the runs' own records, and the audit that trains them again."""
import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest

import agentic_rl as A
import course
import course.audit
import course.cli
from course import grading
from course.bundle import installation_files, write_autograder
from course.checks import EXPERIMENT_CHECKS, HIDDEN, HIDDEN_CHECKS, hidden_rng
from course.cli import main as course_main
from course.conftest import (SECRET, SLOW_SANDBOX, course_command, course_here, demonstrations_as_made_up, fill,
                             installation, normalized, reference_answers)
from course.exercises import EXERCISES, EXPERIMENTS, READ_BY_A_PERSON, SILENT_BUGS
from course.audit import AUDIT_SECONDS, rerun, rerun_check, warm_start_check
from course.grading import grade, run_check
from course.report import SUSPICIOUS, audited, exercises, gradescope_results, score, suspicious
from course.handouts import (HANDOUT_FILES, answers_template, function_spans, plant, solution_regions,
                             write_handout)
from course.ids import MAKE_A_SECRET, SECRET_ENV, answer_key, hidden_seed_of, issued_to, new_handout
from course.lesson import CLOCK_SETTINGS, README_SEEDS, run_record
from course.similarity import FLAG, SHORTEST, own_code, reference_code, similarity



@SLOW_SANDBOX
def test_a_fresh_handout_scores_zero_leaks_nothing_and_round_trips(tmp_path):
    out = tmp_path / "handout"
    assert sorted(write_handout(out)) == sorted(EXERCISES)     # graded at 0 in the autograder test below
    handout = {name: (out / name).read_text() for name in HANDOUT_FILES}
    assert "ANSWER -->" not in handout["README.md"]
    for secret in ("def course_main", "SILENT_BUGS", "def grade(", "REFERENCE", "hidden=True"):
        assert secret not in handout["test_agentic_rl.py"], f"the handout's tests carry the grader's {secret}"
    assert json.loads((out / "answers.json").read_text()) == answers_template()
    code = {name: text.splitlines() for name, text in handout.items()}
    everything = "\n".join(normalized(line) for lines in code.values() for line in lines
                           if "raise NotImplementedError(" not in line)          # the stubs state the formulas
    for name in ("agentic_rl.py", "envs.py"):
        reference = (course.REPO / name).read_text()
        ref_lines, out_lines = reference.splitlines(), handout[name].splitlines()
        compile(handout[name], name, "exec")                                  # the handout parses
        assert solution_regions(handout[name], name) == {}, "no solution marker is left"
        rebuilt, regions = list(out_lines), solution_regions(reference, name)
        for ex, (first, last) in sorted(regions.items(), key=lambda r: -r[1][0]):
            at = next(i for i, line in enumerate(rebuilt) if line.strip() == f"# TODO({ex}): replace this raise with your implementation")
            rebuilt[at:at + 2] = ref_lines[first:last + 1]
            for line in ref_lines[first + 1:last]:                            # no solution line survives anywhere
                if len(normalized(line)) >= 14 and not normalized(line).startswith(("with ", "for ")):  # not loop heads
                    assert normalized(line) not in everything, f"{ex}: solution line leaked: {line.strip()}"
        assert rebuilt == ref_lines, f"{name}: filling every blank must give back the reference exactly"
    tells = (("clamp(1 - ", "clip"), ("d.exp() ", "- d"), ("gamma * lam ", "* run"), ("r[k] + ", "gamma"))
    for tell in ("".join(pieces) for pieces in tells):                    # joined here, so this file does not match
        assert tell not in everything, f"tell-tale solution expression in the handout: {tell}"
    assert (out / ".ci" / "run").stat().st_mode & 0o111, "the CI script stays executable"
    again = subprocess.run([sys.executable, "agentic_rl.py", "homework", "--out", tmp_path / "h2"], cwd=out,
                           capture_output=True, text=True)
    assert again.returncode == 1 and "python -m course homework" in again.stderr, again.stderr
    assert not (out / "course").exists() and course_command("homework", "--out", tmp_path / "h3", cwd=out).returncode
    ours = {normalized(line) for p in (course.REPO / "course").glob("*.py") for line in p.read_text().splitlines()}
    ours -= {normalized(line) for name in HANDOUT_FILES for line in (course.REPO / name).read_text().splitlines()}
    theirs = {normalized(line) for lines in code.values() for line in lines}
    assert not [line for line in ours & theirs if len(line) >= 30], "a handout holds nothing of course/"
    planted = tmp_path / "planted"
    write_handout(planted, silent_bug="one_group_per_batch", hidden_seed=SECRET, student="Ana@uni.example")
    text = (planted / "agentic_rl.py").read_text()
    assert SILENT_BUGS["one_group_per_batch"][3] in text and "one_group_per_batch" not in text
    assert "SILENT BUG" not in (planted / "test_agentic_rl.py").read_text()
    answers = json.loads((planted / "answers.json").read_text())
    assert issued_to(answers["handout"], SECRET, ["ana@uni.example "]) == ("ana@uni.example ", "one_group_per_batch")
    assert issued_to(answers["handout"], "0" * 32, ["ana@uni.example"]) is None
    assert answer_key(answers, SECRET, ["ana@uni.example"], None)["seeds"] == answers["seeds"] and \
        not set(answers["seeds"]) & set(README_SEEDS), "the seeds the handout names are the grader's, not the README's"
    for bad, match in [(dict(out=out), "not empty"), (dict(out=course.REPO / "in-place"), "outside"),
                       (dict(out=tmp_path / "o", only=["nope"]), "unknown exercise"),
                       (dict(out=tmp_path / "file" / "x"), "--out")]:
        (tmp_path / "file").write_text("")
        with pytest.raises(ValueError, match=match):
            write_handout(**bad)


@SLOW_SANDBOX
def test_the_autograder_bundle_holds_a_copy_of_the_reference_for_a_person_a_fresh_handout_at_zero_and_fails_loudly(
        tmp_path):
    """The bundle grades as grade does: the public reference handed in passes every check, and its points wait for a
    person (a near copy of the public reference: pending review, the staff's hidden test says why); a blank handout
    scores 0; a grader that writes nothing fails loudly."""
    import zipfile
    bundle = tmp_path / "autograder.zip"
    write_autograder(bundle, silent_bug="ratio_always_one", hidden_seed=SECRET)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        assert set(z.namelist()) == {"setup.sh", "run_autograder", "silent_bug.txt", "hidden_seed.txt",
                                     *installation_files()} and "course/sandbox.py" in z.namelist()
        assert not [name for name in z.namelist() if "test_" in name and name != "test_agentic_rl.py"]
        setup = z.read("setup.sh").decode()
        assert "torch==2.13.0" in setup and "go-rwx" in setup and "useradd" in setup and "--break-system-packages\"" in setup
        z.extractall(root / "source")
    (root / "results").mkdir()
    (root / "submission_metadata.json").write_text(json.dumps({"users": [{"email": "ana@uni.example", "id": 1}]}))
    run = (root / "source" / "run_autograder").read_text().replace("/autograder/", f"{root}/")
    assert run.count("python3 -m course") == 1, "the script runs the grader with Gradescope's python3"
    run = run.replace("python3 -m course", f"{shlex.quote(sys.executable)} -m course")   # here: this test's
    reference, handout = root / "reference", root / "handout"
    reference.mkdir()
    for name in ("agentic_rl.py", "envs.py"):
        shutil.copy(course.REPO / name, reference / name)
    handout_id, seeds = new_handout(SECRET, "ana@uni.example", "ratio_always_one")      # the submitter's own
    (reference / "answers.json").write_text(json.dumps(reference_answers(seeds, handout_id)))
    write_handout(handout)
    scores = {}
    for name, submission in (("reference", reference), ("handout", handout)):
        done = subprocess.run(["bash", "-c", run.replace(f"{root}/submission ", f"{submission} ")], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        scores[name] = json.loads((root / "results" / "results.json").read_text())
        if "lacks part of its sandbox" in scores[name]["output"]:      # the bundle grades with --require-isolation
            pytest.skip("this machine gives the workers less than the whole sandbox: the bundle refused to grade")
    assert scores["reference"]["score"] == 0 and scores["handout"]["score"] == 0
    for name, results in scores.items():                             # Gradescope's results.json format
        assert set(results) >= {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests"}
        *graded, read_e8, read_e3, staff = results["tests"]   # then the prose a person reads, and the staff's
        assert len(graded) == 2 * (len(EXERCISES) + len(EXPERIMENTS)) and staff["visibility"] == "hidden"
        assert read_e3["name"] == "clock: clock.why (read by the course staff)" and read_e3["max_score"] == 0
        assert read_e8["name"] == "silent_bug: silent_bug (read by the course staff)" and read_e8["max_score"] == 0
        assert staff["max_score"] == 0 and "sandbox: " in staff["output"] and "sandbox" not in results["output"]
        assert ("similarity to the public reference: 1.00" in staff["output"]) == (name == "reference"), staff
        assert (f"held for a person: pending ({EXERCISES['gae'][0]:g} points" in staff["output"]) == \
            (name == "reference") and ("near copy" in staff["output"]) == (name == "reference"), staff
        for t in graded:
            experiment = t["name"].split()[0] in EXPERIMENTS
            assert set(t) >= {"name", "score", "max_score", "number", "output", "visibility"}
            assert t["visibility"] in ("visible", "after_published")
            assert t["score"] == 0 and (t["output"].count("[passed]") == t["output"].count("[") if name ==
                                        "reference" and not experiment else True), t
            assert "pending review" in t["output"] if name == "reference" else "pending" not in t["output"]
            assert t["max_score"] == pytest.approx(0.5 * dict(EXERCISES, **{k: (v,) for k, v in EXPERIMENTS.items()})[
                t["name"].split()[0]][0]), "visible and hidden checks carry half the points each"
    (root / "source" / "agentic_rl.py").write_text("import sys\nsys.exit(7)\n")   # a grader that writes nothing
    done = subprocess.run(["bash", "-c", run.replace(f"{root}/submission ", f"{handout} ")], capture_output=True, text=True)
    assert done.returncode == 1 and "wrote no results.json" in done.stderr
    write_autograder(tmp_path / "two.zip", only=["gae", "clock"])
    with zipfile.ZipFile(tmp_path / "two.zip") as z:
        assert "--only gae,clock" in z.read("run_autograder").decode() and "hidden_seed.txt" not in z.namelist()


@pytest.mark.parametrize("exercise, name, check_fn, hidden", HIDDEN_CHECKS, ids=[f"{c[0]}-{c[1]}" for c in HIDDEN_CHECKS])
def test_the_hidden_checks_pass_on_the_reference(exercise, name, check_fn, hidden):
    check_fn(A)                      # the public default's inputs here; a course's secret draws others when grading


def test_hidden_inputs_come_from_the_course_secret_and_the_student():
    """A red team's row: a hidden check's message, shown after publishing, carried inputs and expected values that
    were the same for every student; now each course's secret and each student draw inputs of their own."""
    draws = {}
    for secret, students in (("", ()), ("one", ()), ("two", ()), ("one", ["Ana@uni.example"]), ("one", ["bob"])):
        HIDDEN["seed"] = hidden_seed_of(secret, students)
        draws[secret, tuple(students)] = hidden_rng(41).integers(0, 10**9, size=4).tolist()
    HIDDEN["seed"] = 0
    assert len({tuple(d) for d in draws.values()}) == 5, "each course's secret and each student draw their own"
    assert hidden_seed_of("") == 0 and hidden_seed_of(None, ["ana"]) == 0
    assert hidden_seed_of("one", [" ana@UNI.example"]) == hidden_seed_of("one", ["ana@uni.example"])


def settings_of(record) -> dict:
    """A record's settings as the audit passes them to rerun(): the seed and those that differ from the defaults."""
    defaults = asdict(A.Config())
    return {k: v for k, v in record["summary"]["config"].items()
            if k in defaults and k not in ("run_dir", "device") and (k == "seed" or v != defaults[k])}


TINY_FLAGS = ["--device", "cpu", "--warm-start-episodes", "16", "--iterations", "1", "--tasks-per-iter", "2",
              "--group-size", "2", "--eval-episodes", "4", "--pass-k-tasks", "2", "--n-embd", "32", "--n-head", "2"]


@SLOW_SANDBOX
def test_a_rerun_reproduces_a_real_record_and_trains_the_code_of_the_records_handout(tmp_path, monkeypatch):
    """A real run, trained again for real with the reference on one thread: bit for bit when the record was made on
    one thread here; made on two (another grader's thread count), it is reproduced or drifts, and is never
    contradicted: its demonstrations are its settings' whatever the thread count."""
    from course.audit import contradictions
    threads = A.torch.get_num_threads()
    try:
        for n in (1, 2):
            A.torch.set_num_threads(n)
            A.main(["train", *TINY_FLAGS, "--run-dir", str(tmp_path / f"run{n}")])    # a real run, in this process
    finally:
        A.torch.set_num_threads(threads)
    one, two = run_record(tmp_path / "run1"), run_record(tmp_path / "run2")
    checked = rerun_check("clock.runs.value_zero[0]", one, settings_of(one), None, 300)
    assert checked["state"] == "reproduced" and "bit for bit" in checked["line"], checked
    assert "4 of 4 of its candidate's dev tasks end as in the record" in checked["line"], checked
    warm = warm_start_check("clock.runs.value_zero[0]", two, settings_of(two), None, 300)
    assert "4 of 4 of its incumbent's dev tasks end as in the record" in warm, warm
    assert rerun_check("clock.runs.value_zero[0]", two, settings_of(two), None, 300)["state"] in ("reproduced", "drifted")
    assert contradictions([(f"record {i}", r, settings_of(r), None) for i, r in enumerate((one, two))]) == [], \
        "the audit draws the warm start's episodes, the same at any thread count"
    trained = {}

    def train(argv, **kwargs):             # where a rerun with the handout's bug trains: what code, and a run
        trained["code"] = Path(re.search(r"run_path\('([^']+)'", argv[2]).group(1)).read_text()
        shutil.copytree(tmp_path / "run1", argv[argv.index("--run-dir") + 1])
    monkeypatch.setattr(subprocess, "run", train)
    rerun(settings_of(one), 300, bug="ratio_always_one")
    assert trained["code"] == plant((course.REPO / "agentic_rl.py").read_text(), "ratio_always_one") != \
        (course.REPO / "agentic_rl.py").read_text(), "a record made with the bug is trained again with the bug"


def answers_folder(tmp_path, answers, name="sub") -> Path:
    """A submission holding only answers.json (the experiments read nothing else)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "answers.json").write_text(json.dumps(answers))
    return folder


def trained_again(answers, bug, drift=0.0, differ=0):
    """A stand-in for rerun(), which trains for minutes: the record in `answers` made with the settings (and
    the bug) asked for, given back as a real rerun on this machine gives it, or with its warm start's SFT loss
    `drift` away and `differ` of its dev tasks' outcomes flipped (E8's fixed CodeRepair runs have the settings of
    E3's value_zero runs: here, the same records)."""
    made = {(json.dumps(settings_of(r), sort_keys=True), b): r for records, b in
            [(answers["silent_bug_runs"], bug), (answers["silent_bug_fixed_runs"], None),
             *[(records, None) for records in answers["clock"]["runs"].values()]] for r in records}

    def rerun(settings, seconds, bug=None, warm_start_only=False):
        record = json.loads(json.dumps(made[json.dumps(settings, sort_keys=True), bug]))
        record["summary"]["warm_start"]["sft_loss"] += drift
        outcomes = record["summary"]["reports"]["incumbent"]["dev"]["per_task"]
        outcomes[:differ] = [1 - x for x in outcomes[:differ]]
        return record
    return rerun


def cannot_finish(settings, seconds, bug=None, warm_start_only=False):
    raise subprocess.TimeoutExpired("train", seconds)


def test_no_automatic_point_for_an_experiment_a_forged_record_scores_0_and_the_staff_see_the_evidence(
        tmp_path, monkeypatch, shared_sandbox):
    """A red team's rows: records made up (the demonstrations computed, every other number guessed near
    the README's) scored every point, both experiments "verified": the four numbers a rerun compared are guessable. No
    automatic point rests on them now: an experiment is contradicted (a record's demonstrations are not its settings':
    0, the record named, "record does not match a rerun") or pending, for a person, with the evidence beside the
    record: the warm start of a drawn record trained again, each dev task's outcome against the record's. An honest
    record is never contradicted by drift (its SFT loss moved, the rerun cut off); a student reads "pending review"."""
    from course.report import FORGED, pending_points, state
    answers = reference_answers()
    submission = answers_folder(tmp_path, answers)
    monkeypatch.setattr(course.audit, "demonstrator_success", demonstrations_as_made_up)  # as if they were a run's

    def graded(rerun_with, seconds=60):
        monkeypatch.setattr(course.audit, "rerun", rerun_with)
        report = grade(submission, only=["clock", "silent_bug"], silent_bug="ratio_always_one", rerun_seconds=seconds)
        tests = gradescope_results(report, 1.0)["tests"]
        return exercises(report), [t for t in tests if t["visibility"] != "hidden"], tests[-1]["output"]
    for rerun_with, seconds, saw in ((cannot_finish, 0, "the audit was off"),
                                     (cannot_finish, 60, "was not trained again (TimeoutExpired"),
                                     (trained_again(answers, "ratio_always_one", drift=0.01), 60,
                                      "200 of 200 of its incumbent's dev tasks end as in the record"),
                                     (trained_again(answers, "ratio_always_one", differ=37), 60,
                                      "163 of 200 of its incumbent's dev tasks end as in the record (37 differ")):
        rows, student, staff = graded(rerun_with, seconds)
        for ex, row in rows.items():
            assert (state(row), score(row), pending_points(row)) == ("pending", (0, EXPERIMENTS[ex]), EXPERIMENTS[ex])
            assert saw in audited(row) and saw in staff and not suspicious(row), audited(row)
        told = json.dumps(student)
        assert told.count("pending review") == 4 and "trained again" not in told and "differ" not in told, told
        assert SUSPICIOUS not in told + staff and "hard-coded" not in told + staff and "verified" not in told
    monkeypatch.setattr(course.audit, "demonstrator_success", lambda warm: 0.5)   # no record's: a drift-0 number
    rows, student, staff = graded(trained_again(answers, "ratio_always_one"))
    for ex, row in rows.items():
        assert (state(row), score(row)[0], pending_points(row)) == ("contradicted", 0, 0), audited(row)
        assert FORGED in audited(row)
    assert "clock.runs.value_zero[0] (seed 0): demonstrator success" in audited(rows["clock"]) and \
        "silent_bug_runs[0] (seed 0)" in staff and "not a run with its settings" in json.dumps(student)
    untouched = exercises(grade(answers_folder(tmp_path, answers_template(), "untouched"), only=["clock", "silent_bug"]))
    assert {c["status"] for row in untouched.values() for c in row["checks"]} == {"not started"}, untouched


@SLOW_SANDBOX
def test_made_up_records_are_contradicted_under_the_default_audit_and_a_copied_one_is_refused(tmp_path, monkeypatch,
                                                                                              shared_sandbox):
    """A red team's rows. E3's twelve records and E8's twelve, made up on the student's own seeds with the lesson's
    numbers guessed right (a warm start of 0.52, 0.0 bootstrapped, E8's signature): with no audit their points are
    pending, never granted. The default audit recomputes each record's demonstrations (seconds, no training): a
    made-up record carries another demonstrator success, and its experiment is contradicted: 0. A real run copied
    into another seed's slot, its seed edited, is refused with no audit at all: two warm starts that differ never
    end with the same SFT loss."""
    from course.report import pending_points, state
    write_handout(tmp_path / "h", only=["kl_k3"], silent_bug="ratio_always_one", hidden_seed=SECRET,
                  student="ana@uni.example")
    issued = json.loads((tmp_path / "h" / "answers.json").read_text())
    made = reference_answers(issued["seeds"], issued["handout"], issued["exercises"])
    monkeypatch.setattr(course.audit, "rerun", cannot_finish)   # what training again would say is not needed here
    graded = lambda answers, name, seconds: exercises(grade(answers_folder(tmp_path, answers, name),
                                                            only=["clock", "silent_bug"], hidden_seed=SECRET,
                                                            students=["ana@uni.example"], rerun_seconds=seconds))
    assert [(score(row)[0], pending_points(row)) for row in graded(made, "no-audit", 0).values()] == [(0, 16), (0, 16)]
    for ex, row in graded(made, "audited", AUDIT_SECONDS).items():
        assert state(row) == "contradicted" and score(row) == (0, EXPERIMENTS[ex]), audited(row)
        assert "not a run with its settings" in audited(row)
    copied = reference_answers(issued["seeds"], issued["handout"], issued["exercises"])
    runs = copied["clock"]["runs"]["value_zero"]
    runs[1] = json.loads(json.dumps(runs[0]))                   # seed 0's run, handed in as seed 1's
    runs[1]["summary"]["config"]["seed"] = issued["seeds"][1]
    row = graded(copied, "copied", 0)["clock"]
    assert score(row)[0] == pending_points(row) == 0 and "one is a copy of the other's run" in json.dumps(row["checks"])


def test_each_student_has_their_own_seeds_and_bug_and_the_readmes_numbers_score_zero(tmp_path, capsys, monkeypatch,
                                                                                       shared_sandbox):
    write_handout(tmp_path / "alice", only=["kl_k3"], silent_bug="ratio_always_one", hidden_seed=SECRET,
                  student="alice@uni.example")
    issued = json.loads((tmp_path / "alice" / "answers.json").read_text())
    honest = reference_answers(issued["seeds"], issued["handout"], issued["exercises"])   # runs made with her seeds
    copied = reference_answers(README_SEEDS, issued["handout"], issued["exercises"])  # the README's: seeds 0, 1, 2
    forged = dict(honest, handout=issued["handout"][:-1] + ("0" if issued["handout"][-1] != "0" else "1"))

    from course.report import checked

    def total(name, answers, *students) -> float:    # what the checks earn (no audit: pending for a person)
        report = grade(answers_folder(tmp_path, answers, name), only=["clock", "silent_bug"], hidden_seed=SECRET,
                       students=students)
        return sum(checked(row)[0] for row in exercises(report).values())
    assert total("honest", honest, "Alice@uni.example") == sum(EXPERIMENTS.values())
    assert total("copied", copied, "alice@uni.example") == 0, "the README's records answer nobody's seeds"
    assert total("forged", forged, "alice@uni.example") == 0
    bobs_id, bobs_seeds = new_handout(SECRET, "bob@uni.example", "ratio_always_one")
    assert total("bobs_id", dict(honest, handout=bobs_id), "bob@uni.example") == 0, "her records answer his id's seeds"
    assert total("bobs_own", reference_answers(bobs_seeds, bobs_id), "bob@uni.example") == sum(EXPERIMENTS.values())
    monkeypatch.setenv(SECRET_ENV, SECRET)                  # bob hands in alice's id, bug and records
    code, printed = course_here(capsys, "grade", answers_folder(tmp_path, honest, "bob"), "--only", "clock,silent_bug",
                                "--student", "bob@uni.example", "--json", tmp_path / "bob.json")
    bob = json.loads((tmp_path / "bob.json").read_text())
    assert code == 0 and bob["score"] == 0 and "no handout id issued to you" in printed
    assert "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not" in printed
    with pytest.raises(ValueError, match="--student NAME"):
        total("nobody", honest)                             # an id, and nobody to check it against


def test_a_weak_secret_or_one_on_the_command_line_is_refused_saying_how_to_make_one(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    for argv in (["homework", "--autograder", tmp_path / "a.zip", "--hidden-seed", SECRET],
                 ["grade", tmp_path, "--hidden-seed", SECRET]):
        code, printed = course_here(capsys, *argv)
        assert code == 2 and SECRET_ENV in printed and SECRET not in printed, printed
    for weak in ("4242", "0" * 32, "42" * 16, "0123456789abcdef" * 2,        # short, or typed rather than drawn,
                 "0" * 25 + "1234567", "0123456789abcdeffedcba9876543210", "12345678" * 3 + "12345679"):  # a red team's
        monkeypatch.setenv(SECRET_ENV, weak)
        for argv in (["homework", "--autograder", tmp_path / "b.zip"], ["homework", "--out", tmp_path / "h", "--student",
                                                                        "ana"], ["grade", tmp_path]):
            code, printed = course_here(capsys, *argv)
            assert code == 2 and "128 bits" in printed and MAKE_A_SECRET in printed and weak not in printed, printed
    assert not (tmp_path / "b.zip").exists() and not (tmp_path / "h").exists()


def test_the_bundle_audits_the_experiments_by_default(tmp_path, capsys, monkeypatch):
    """Gradescope never passes flags of its own: the bundle's run_autograder carries the audit's seconds."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    course_main(["homework", "--autograder", str(tmp_path / "a.zip")])
    printed = capsys.readouterr().out
    import zipfile
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert f"--rerun {AUDIT_SECONDS:g}" in z.read("run_autograder").decode() and "timeout" in printed, printed
    code, printed = course_here(capsys, "homework", "--out", tmp_path / "h", "--student", "ana", "--rerun", "5")
    assert code == 2 and "--rerun" in printed and not (tmp_path / "h").exists(), printed


def test_homework_from_a_grading_installation_says_what_it_lacks(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(course, "REPO", installation(tmp_path))   # as the bundle's setup.sh lays it out
    code, printed = course_here(capsys, "homework", "--out", tmp_path / "handout")
    assert code == 2 and "README.md" in printed and "full copy of the course's repository" in printed, printed
    assert not (tmp_path / "handout").exists()


def test_an_explanation_is_read_by_a_person_and_never_scored_by_its_words(tmp_path, shared_sandbox):
    """A red team's row: a wrong clock.why that carries the words a keyword test looked for got full marks. Now an
    explanation earns nothing automatically, and an empty one loses nothing automatically: E3's records earn its
    autograded points, and the explanation's points stay pending, with its text, for a person to read."""
    from course.report import checked
    wrong, empty, long = reference_answers(), reference_answers(), reference_answers()
    wrong["clock"]["why"] = "the value V(s) of the turn budget makes the clock bootstrap the budget's turns"
    empty["clock"]["why"] = ""
    long["clock"]["why"] = "Running out of turns is an end worth 0. " * 150 + "\x1b[2J the last words"   # 6,000
    for name, answers in (("wrong", wrong), ("empty", empty), ("long", long)):
        report = grade(answers_folder(tmp_path, answers, name), only=["clock"])
        row = exercises(report)["clock"]
        assert checked(row) == (EXPERIMENTS["clock"], EXPERIMENTS["clock"]), row
        said = answers["clock"]["why"].replace("\x1b", "\\x1b") or "(empty)"
        assert row["pending"] == {"field": "clock.why", "points": READ_BY_A_PERSON["clock"][1], "answer": said}
        prose = gradescope_results(report, 1.0)["tests"][-2]        # where the staff read it, in Gradescope: in full
        assert prose["name"] == "clock: clock.why (read by the course staff)" and \
            prose["output"].endswith(textwrap.indent(said, "    ")) and "\x1b" not in prose["output"], prose


def test_the_readme_says_the_autograders_points_and_the_manual_questions_as_the_code_counts_them():
    """The course's total is the autograder's points plus the prose read by hand; the staff's document says how to
    set up the manual questions, with the numbers the code grades."""
    automatic = sum(points for points, _ in EXERCISES.values()) + sum(EXPERIMENTS.values())
    by_hand = {ex: points for ex, (_, points) in READ_BY_A_PERSON.items()}
    homework = " ".join((course.REPO / "course" / "STAFF.md").read_text().split())
    assert f"the autograder's {automatic} points plus {sum(by_hand.values())} read by hand: " \
           f"{automatic + sum(by_hand.values())}" in homework
    for ex, (path, points) in READ_BY_A_PERSON.items():
        assert f"manual question of {points} points for `{'.'.join(path)}`" in homework, ex


@SLOW_SANDBOX
def test_a_class_run_outlives_one_failed_grading_and_shows_folder_names_escaped(tmp_path, capsys, monkeypatch,
                                                                                shared_sandbox):
    """A red team's rows: one submission that crashed the grader lost the whole class's results, and a folder's
    name, which a student may choose, printed raw (a cleared screen, a forged total)."""
    forged = "mallory\x1b[2J\ntotal 136 of 136: every check passed"
    (tmp_path / "class").mkdir()
    for name in ("broken", forged):
        answers_folder(tmp_path / "class", reference_answers(), name)

    def grade_or_fail(folder, *args, **kwargs):             # the grader itself fails on one submission
        if Path(folder).name == "broken":
            raise RuntimeError("boom")
        return grading.grade(folder, *args, **kwargs)
    monkeypatch.setattr(course.cli, "grade", grade_or_fail)
    code, printed = course_here(capsys, "grade", tmp_path / "class", "--only", "clock", "--json", tmp_path / "out",
                                "--rerun", "0")
    assert code == 1 and "GRADER FAILED broken: RuntimeError('boom')" in printed and "\x1b" not in printed
    assert "=== 'mallory\\x1b[2J\\ntotal 136 of 136" in printed and "\ntotal 136 of 136" not in printed, printed
    failed = json.loads((tmp_path / "out" / "broken.json").read_text())
    assert "The grader failed, not your submission (RuntimeError)" in failed["output"] and "boom" not in failed["output"]
    assert len(list((tmp_path / "out").iterdir())) == 2


def test_a_class_run_loses_no_ones_results_and_tells_every_student_apart(tmp_path, capsys, monkeypatch,
                                                                         shared_sandbox):
    """A red team's rows: folders `x y` and `x_y` wrote one results file; a folder removed mid-run ended the run with
    no results for anyone; a folder whose name starts with a dot was skipped silently; `a\\nb` (a line break) and
    `a\\\\nb` printed alike and shared one similarity entry; results and the page were readable by every user."""
    clash, klass, out, page = tmp_path / "clash", tmp_path / "class", tmp_path / "out", tmp_path / "similarity.html"
    clash.mkdir(), klass.mkdir()
    for name in ("x y", "x_y"):
        answers_folder(clash, reference_answers(), name)
    code, printed = course_here(capsys, "grade", clash, "--only", "clock", "--json", tmp_path / "clash-out", "--rerun", "0")
    assert code == 2 and f"{clash / 'x y'} and {clash / 'x_y'}: two submissions whose results would be one file " \
                         "(x_y.json)" in printed, printed
    assert not (tmp_path / "clash-out").exists(), "refused before anything is graded"
    for name in ("a\nb", "a\\nb", "ana", "gone", ".late"):
        answers_folder(klass, reference_answers(), name)
    (klass / "notes.txt").write_text("")
    on_disk = []

    def grade_and_look(folder, *args, **kwargs):            # what is written before each grading; one folder vanishes
        on_disk.append(sorted(p.name for p in out.iterdir()))
        if Path(folder).name == "ana":
            shutil.rmtree(klass / "gone")
        return grading.grade(folder, *args, **kwargs)
    monkeypatch.setattr(course.cli, "grade", grade_and_look)
    code, printed = course_here(capsys, "grade", klass, "--only", "clock", "--json", out, "--html", page, "--rerun", "0")
    assert on_disk == [[], ["a_b.json"], ["a_b.json", "a_nb.json"], ["a_b.json", "a_nb.json", "ana.json"]], \
        "each student's results, written once graded"
    assert sorted(p.name for p in out.iterdir()) == ["a_b.json", "a_nb.json", "ana.json", "gone.json"]
    assert {oct(p.stat().st_mode & 0o777) for p in [*out.iterdir(), page]} == {"0o600"}
    assert "GRADER FAILED gone: the folder" in printed and "vanished" in printed and \
        "not your submission" in json.loads((out / "gone.json").read_text())["output"]
    assert "SKIPPED .late: a folder whose name starts with a dot" in printed and "SKIPPED notes.txt: not a folder" \
        in printed, printed
    assert "=== 'a\\nb' ===" in printed and "=== 'a\\\\nb' ===" in printed, printed
    index = page.read_text().split("</table>")[0]
    assert index.count("<tr><td>") == 3 * 3, index                      # every pair, each name apart from the other
    assert index.count("&#x27;a\\nb&#x27;</td>") == index.count("&#x27;a\\\\nb&#x27;</td>") == 3 + 2, index


def test_a_handout_names_the_exercises_it_holds_and_grade_grades_those(tmp_path):
    """A red team's row: a handout made with --only gae, graded without --only, scored the nine given pieces as
    solved. Its answers.json now names the exercises handed out, and grade grades those (--only says otherwise);
    with the course's secret the handout id binds the list, so an edited one does not verify."""
    from course.grading import handed_out
    write_handout(tmp_path / "gae", only=["gae"])
    answers = json.loads((tmp_path / "gae" / "answers.json").read_text())
    assert answers["exercises"] == ["gae"] and handed_out(answers, None, None) == (["gae"], "")
    assert handed_out({}, None, None) == (list(EXERCISES), ""), "a handout made before it named none: all of them"
    assert "not a list of exercise ids" in handed_out({"exercises": ["gae", "nope"]}, None, None)[1]
    write_handout(tmp_path / "ana", only=["gae", "kl_k3"], hidden_seed=SECRET, student="ana@uni.example")
    issued = json.loads((tmp_path / "ana" / "answers.json").read_text())
    key = answer_key(issued, SECRET, ["ana@uni.example"], None)
    assert key["seeds"] == issued["seeds"] and handed_out(issued, key, SECRET) == (["gae", "kl_k3"], "")
    edited = dict(issued, exercises=list(EXERCISES))                  # claiming the given pieces too
    key = answer_key(edited, SECRET, ["ana@uni.example"], None)
    assert key["seeds"] is None and "exercises" in key["why"]
    assert handed_out(edited, key, SECRET) == (list(EXERCISES), "answers.json's exercises are not verified by a "
                                               "handout id issued to this student: every exercise graded")


@SLOW_SANDBOX
def test_a_partial_handout_is_graded_on_its_own_exercises(tmp_path, shared_sandbox):
    write_handout(tmp_path / "gae", only=["gae"])
    report = grade(tmp_path / "gae")
    assert list(exercises(report)) == ["gae", *EXPERIMENTS] and score(report["gae"])[0] == 0, report.keys()


def test_mechanical_rewrites_are_undone_before_fingerprinting():
    """A red team's row: an ast rewriter (operators as operator.X(a, b), attribute reads as getattr(x, 'name')) took
    the public reference to a share of 0.01 at full marks. The report writes such equivalences one way first: the
    graded functions rewritten by the red team's rules, or by all four (augmented assignments and lambdas too),
    normalize to the very text of the originals (the whole reference: the slow test below)."""
    from course.similarity import normalized_module, solution_functions
    reference = (course.REPO / "agentic_rl.py").read_text()
    spans = function_spans(reference)
    source = "\n".join("".join(reference.splitlines(keepends=True)[spans[q][0] - 1:spans[q][1]]) for q in
                       [solution_functions()[ex][1] for ex in ("returns", "gae", "grpo", "ppo_clip", "kl_k3")]) + \
        "def scaled(x, k):\n    x = x * k\n    x.grad = None\n    return x.data\n\ndef double(x):\n    return 2 * x\n"
    for rules in (RED_TEAMS_RULES, ALL_RULES):
        copy = rewritten(source, rules)
        assert copy != source and "operator." in copy and "getattr(" in copy
        assert normalized_module(copy)[0] == normalized_module(source)[0], rules


@SLOW_SANDBOX
def test_a_mechanical_rewrite_of_the_whole_reference_is_flagged(capsys):
    """The public reference, both files rewritten whole (a red team's rules took it to 0.01; README: the shares):
    flagged, at a share of 0.9 or more, every exercise's too."""
    everything = tuple(sorted(EXERCISES))
    files = {name: (course.REPO / name).read_text() for name in ("agentic_rl.py", "envs.py")}
    for rules in (RED_TEAMS_RULES, ALL_RULES):
        sim = similarity(own_code({name: rewritten(text, rules) for name, text in files.items()}, everything),
                         reference_code(everything))
        with capsys.disabled():
            print(f"\n{'+'.join(rules)}: whole {sim['share']:.2f}; " +
                  ", ".join(f"{ex} {r['share']:.2f}" for ex, r in sim["exercises"].items()))
        assert sim["flagged"] and sim["share"] >= 0.9 and min(r["share"] for r in sim["exercises"].values()) >= 0.9


@SLOW_SANDBOX
def test_the_similarity_report_keeps_to_its_budget_and_grading_goes_on(tmp_path):
    """A red team's row: the report ran in the grader's process with no budget, and 400 three-line helpers took a
    12 s grading to 170 s. 400 now cost a few seconds; a submission past SIMILARITY_FUNCTIONS or SIMILARITY_TOKENS is
    "too large to compare whole", its exercises' functions compared alone, and flagged for the staff; one the report
    cannot finish within its seconds is flagged too; a file that did not compile or could not be read is "not
    compared"."""
    from course.similarity import SIMILARITY_FUNCTIONS, own_code_within
    everything = list(EXERCISES)
    files = {name: (course.REPO / name).read_text() for name in ("agentic_rl.py", "envs.py")}
    helpers = lambda n: files["agentic_rl.py"] + "".join(f"\n\ndef helper_{i}(x):\n    y = x + {i}\n    return y * 2\n"
                                                         for i in range(n))
    seconds = []
    for text in (files["agentic_rl.py"] + "\n", helpers(400)):
        t = time.monotonic()
        own = own_code_within({**files, "agentic_rl.py": text}, everything)
        seconds.append(time.monotonic() - t)
        assert not own["not_compared"] and similarity(own, reference_code(tuple(sorted(everything))))["flagged"]
    assert seconds[1] - seconds[0] < 10, seconds                      # measured: about 2 s more (README)
    own = own_code_within({**files, "agentic_rl.py": helpers(SIMILARITY_FUNCTIONS)}, everything)
    sim = similarity(own, reference_code(tuple(sorted(everything))))         # its exercises compared alone, flagged
    assert re.fullmatch(r"too large to compare whole: \d+ functions, \d+ tokens \(.*\): its exercises' functions "
                        r"compared alone; read it", own["too_large"]["agentic_rl.py"]) and not own["not_compared"]
    assert sim["flagged"] and sim["too_large"] and min(r["share"] for r in sim["exercises"].values()) == 1.0
    own = own_code_within({**files, "agentic_rl.py": helpers(400)}, everything, seconds=0.2)
    sim = similarity(own, reference_code(tuple(sorted(everything))))         # not done in time: the staff's to read
    assert re.fullmatch(r"too large to compare: \d+ functions, \d+ tokens \(.*\): read it", own["not_compared"]["agentic_rl.py"])
    assert sim["flagged"] and any(line.startswith("agentic_rl.py: too large") for line in sim["not_compared"])
    own = own_code_within({"envs.py": files["envs.py"]}, everything, {"agentic_rl.py": "SyntaxError: invalid syntax"})
    sim = similarity(own, reference_code(tuple(sorted(everything))))
    assert not sim["flagged"] and sim["not_compared"] == ["agentic_rl.py: SyntaxError: invalid syntax"] and \
        list(sim["exercises"]) == ["permission_rule"]


def test_the_similarity_page_opens_with_every_pair_by_its_highest_share():
    """A red team's row: a hand rewrite at 0.05 was missing from the page, which drew flagged pairs only."""
    from course.similarity import side_by_side
    pair = lambda name, share, exercises, flagged=False: {"name": name, "against": "the public reference",
                                                          "share": share, "fingerprints": 100, "flagged": flagged,
                                                          "exercises": exercises, "not_compared": []}
    pairs = [pair("hand <rewrite>", 0.05, {"gae": 0.05}), pair("copy-x", 0.62, {"gae": 1.0}, True),
             pair("gae-x", 0.3, {"gae": 0.8}, True), pair("unreadable-x", 0.0, {})]
    pairs[3]["not_compared"] = ["agentic_rl.py: it did not compile or could not be read (<script>)"]
    page = side_by_side("code <similarity>", pairs, [])
    index = page.split("</table>")[0]
    at = [index.index(name) for name in ("copy-x", "gae-x", "hand &lt;rewrite&gt;", "unreadable-x")]
    assert at == sorted(at) and index.count("<tr><td>") == 4, index
    assert "<script>" not in page and "&lt;script&gt;" in page and "<rewrite>" not in page


def test_a_classmates_planted_bug_in_a_submission_is_flagged():
    """A bug planted in another student's handout is a strong, free sign that a submission copied that file."""
    from course.report import carried
    from course.similarity import planted_bugs
    reference = (course.REPO / "agentic_rl.py").read_text()
    spans, lines = function_spans(reference), reference.splitlines(keepends=True)
    functions = "\n".join("".join(lines[spans[q][0] - 1:spans[q][1]]) for q in ("group_credit", "should_bootstrap"))
    assert planted_bugs(functions) == [] and planted_bugs(rewritten(functions.replace(
        SILENT_BUGS["one_group_per_batch"][2], SILENT_BUGS["one_group_per_batch"][3]))) == ["one_group_per_batch"]
    lines = carried({"~bugs": {"own": "ratio_always_one", "others": ["one_group_per_batch"]}})
    assert lines == ["its agentic_rl.py carries the silent bug 'one_group_per_batch', planted in another student's "
                     "handout (its own: ratio_always_one): a copy of a classmate's file"]


@SLOW_SANDBOX
def test_a_submission_carrying_a_classmates_planted_bug_is_flagged(tmp_path, shared_sandbox, capsys):
    sub = tmp_path / "bob"
    write_handout(sub, only=["kl_k3"], silent_bug="one_group_per_batch")       # a classmate's handout, bug and all
    fill(sub / "agentic_rl.py", "kl_k3", ["d = ref_logprobs - logprobs", "return d.exp() - d - 1"])
    code, printed = course_here(capsys, "grade", sub, "--only", "kl_k3", "--silent-bug", "ratio_always_one",
                                "--json", tmp_path / "bob.json")
    staff = json.loads((tmp_path / "bob.json").read_text())["tests"][-1]["output"]
    assert "FLAGGED: its agentic_rl.py carries the silent bug 'one_group_per_batch'" in staff and \
        "carries the silent bug 'one_group_per_batch'" in printed


def test_every_word_about_the_audit_states_its_rule(capsys):
    """A red team's row: grade --help and the audit's and score's docstrings said a record that does not reproduce
    zeroes its experiment, which the code never did; later they promised points a rerun verified, on numbers a guess
    matches. Each now states the rule: no automatic point, contradicted or pending, with the evidence for a person."""
    import course.report
    code, printed = course_here(capsys, "grade", "--help")
    words = " ".join(printed.split())
    assert code == 0 and "does not reproduce zeroes" not in words
    for said in (words, course.audit.__doc__, course.audit.audit.__doc__, course.report.__doc__,
                 course.report.score.__doc__):
        said = " ".join(said.split())
        assert all(word in said for word in ("automatic", "contradicted", "pending")), said
        assert "verified (scored)" not in said and "points are verified" not in said, said
    homework = " ".join(course_here(capsys, "homework", "--help")[1].split())
    assert "pending review" in homework and "verified" not in homework, homework


def test_experiments_are_graded_on_the_runs_own_records():
    key = {"silent_bug": "ratio_always_one", "seeds": README_SEEDS, "why": ""}
    run = lambda answers, key=key: {name: run_check(fn, answers, key) for _, name, fn, _ in EXPERIMENT_CHECKS}
    assert {s for s, _ in run(reference_answers()).values()} == {"passed"}
    renamed = dict(reference_answers(), silent_bug="one_group_per_batch")
    assert {s for s, _ in run(renamed).values()} == {"passed"}, "naming the bug earns nothing: the runs do"
    assert run(reference_answers(), dict(key, silent_bug="one_group_per_batch"))[
        "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not"][0] == "wrong"
    records = "clock_numbers_are_your_runs_own_records", "silent_bug_answer_carries_the_runs_before_and_after_the_fix"
    for change, failing, said in [
            (lambda a: a["clock"]["value_zero"].__setitem__(1, 0.9), records[0], "dev_success"),
            (lambda a: a["clock"]["runs"]["bootstrap_budget"][0]["summary"]["config"].update(bootstrap_budget=False),
             records[0], "bootstrap_budget"),
            (lambda a: a["clock"]["runs"]["value_zero"][2]["summary"]["config"].update(iterations=10), records[0],
             "iterations"),
            (lambda a: a["clock"]["runs"]["value_zero"][0]["summary"]["config"].update(eval_every="x"), records[0],
             "eval_every"),                                 # not a grader error in the audit: refused here, by name
            (lambda a: a["silent_bug_fixed_runs"][4]["summary"]["config"].update(eval_every=1), records[1],
             "eval_every"),                                 # legal, and a rerun would evaluate every iteration
            (lambda a: a["clock"]["runs"]["value_zero"][0]["metrics"][3].update(success=float("inf")), records[0],
             "finite numbers only"),                        # a red team's: a NaN mean passed every tolerance
            (lambda a: [m.pop("success") for m in a["clock"]["runs"]["value_zero"][1]["metrics"]], records[0],
             "success in [0, 1]"),                          # a red team's: it crashed the audit
            (lambda a: a["silent_bug_runs"][1]["summary"]["candidate"].update(dev_success="1.0"), records[1],
             "dev_success"),
            (lambda a: a.update(silent_bug_evidence="clip_frac and approx_kl stay where they should not be in every "
                                                    "single run that I made with this handout, which shows the bug"),
             records[1], "silent_bug_evidence"),
            (lambda a: a.update(silent_bug_evidence=a["silent_bug_evidence"].replace("exactly 0", "exactly 0.25")
                                .replace("seed 0, seed 1 and seed 2", "seeds A, B, C").replace("0.0015", "")),
             "silent_bug_evidence_quotes_the_runs_numbers", "quotes no value"),
            (lambda a: [m.update(clip_frac=0.002) for r in a["silent_bug_runs"] for m in r["metrics"]],
             "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not", "do not show"),
            (lambda a: [m.update(clip_frac=0.0, approx_kl=0.0) for r in a["silent_bug_fixed_runs"] for m in r["metrics"]],
             "silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not", "not fixed")]:
        answers = reference_answers()
        change(answers)
        verdicts = run(answers)
        assert verdicts[failing][0] == "wrong" and said in verdicts[failing][1], (failing, verdicts)
    sprayed = reference_answers()                    # a list of every value would match any run
    sprayed["silent_bug_evidence"] += " " + " ".join(f"{x / 100:.2f}" for x in range(101))
    assert run(sprayed)["silent_bug_evidence_quotes_the_runs_numbers"][0] == "wrong"
    effect = "clock_numbers_show_the_effect_the_reference_runs_show"

    def from_warm_start(answers, pairs, warm, dev=None):  # these (setting, seed) runs start from this warm start
        for setting, i in pairs:
            answers["clock"]["runs"][setting][i]["summary"]["warm_start"]["dev_success"] = warm
            if dev is not None:
                answers["clock"][setting][i] = answers["clock"]["runs"][setting][i]["summary"]["candidate"][
                    "dev_success"] = dev
        return answers
    stalled = from_warm_start(reference_answers(), [("value_zero", 0), ("bootstrap_budget", 0)], 0.125, 0.11)
    assert run(stalled)[effect][0] == "passed", "a seed whose warm start cannot repair says nothing about the clock"
    weak = reference_answers()
    for setting in CLOCK_SETTINGS:
        from_warm_start(weak, [(setting, i) for i in range(3)], 0.1, 0.1)
    assert run(weak)[effect][0] == "not checked" and score({"points": 20, "checks": [
        {"hidden": False, "status": "passed"}, {"hidden": True, "status": run(weak)[effect][0]}]}) == (20, 20)
    assert "differ in warm start" in run(from_warm_start(reference_answers(), [("value_zero", 1)], 0.4))[effect][1]
    stalled_fixed = reference_answers()                 # CodeRepair fixed runs that stall from a weak warm start
    for r in stalled_fixed["silent_bug_runs"][3:] + stalled_fixed["silent_bug_fixed_runs"][3:5]:
        [m.update(truncation_rate=0.6) for m in r["metrics"]]
    for r in stalled_fixed["silent_bug_fixed_runs"][3:5]:
        r["summary"]["warm_start"]["dev_success"] = 0.125
    bootstrapped = run(stalled_fixed, dict(key, silent_bug="budget_bootstrapped"))
    assert bootstrapped["silent_bug_runs_show_the_planted_bug_and_the_fixed_runs_do_not"][0] == "not checked"


FRESH = {  # written for this test, from the handout's stubs alone, by two students who never saw the reference
    "terse": {"returns": """g, G = 0.0, torch.zeros_like(r)
for k in reversed(range(len(r))):
    g = r[k] + gamma * g
    G[k] = g
return G""", "gae": """n = torch.cat([v[1:], torch.tensor([last_value if bootstrap else 0.0])])
d = r + gamma * n - v
a, A = 0.0, torch.zeros_like(r)
for k in reversed(range(len(r))):
    a = d[k] + gamma * lam * a
    A[k] = a
return A, A + v""", "grpo": """a = r - r.mean(-1, keepdim=True)
if std != "none":
    a = a / (r.std(-1, keepdim=True, unbiased=std == "unbiased") + eps)
return torch.where((r == r[..., :1]).all(-1, keepdim=True), torch.zeros_like(a), a)""",
                  "ppo_clip": """r = torch.exp(logprobs - old_logprobs)
l = -torch.min(r * advantages, torch.clamp(r, 1 - clip_eps, 1 + clip_eps) * advantages)
loss = (l * mask).sum() / n
with torch.no_grad():
    c = (((r - 1).abs() > clip_eps).float() * mask).sum() / n
    k = (((r - 1) - torch.log(r)) * mask).sum() / n
return loss, {"clip_frac": float(c), "approx_kl": float(k)}"""},
    "textbook": {"returns": """G = torch.zeros_like(r)
running = 0.0
for k in reversed(range(len(r))):
    running = r[k] + gamma * running
    G[k] = running
return G""", "gae": """K = len(r)
adv = torch.zeros_like(r)
next_v = last_value if bootstrap else 0.0
last_gae = 0.0
for k in reversed(range(K)):
    delta = r[k] + gamma * next_v - v[k]
    last_gae = delta + gamma * lam * last_gae
    adv[k] = last_gae
    next_v = v[k]
return adv, adv + v""", "grpo": """mean = r.mean(dim=-1, keepdim=True)
adv = r - mean
if std == "population":
    adv = adv / (r.std(dim=-1, unbiased=False, keepdim=True) + eps)
elif std == "unbiased":
    adv = adv / (r.std(dim=-1, unbiased=True, keepdim=True) + eps)
flat = (r == r[..., :1]).all(dim=-1, keepdim=True)
return torch.where(flat, torch.zeros_like(adv), adv)""", "ppo_clip": """ratio = torch.exp(logprobs - old_logprobs)
surr1 = ratio * advantages
surr2 = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
per_tok = -torch.min(surr1, surr2)
loss = (per_tok * mask).sum() / n
with torch.no_grad():
    clipped = ((ratio - 1).abs() > clip_eps).float()
    clip_frac = (clipped * mask).sum() / n
    approx_kl = (((ratio - 1) - (logprobs - old_logprobs)) * mask).sum() / n
return loss, {"clip_frac": float(clip_frac), "approx_kl": float(approx_kl)}"""}}


OPERATOR_NAMES = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
                  ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "and_", ast.BitOr: "or_",
                  ast.BitXor: "xor", ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt",
                  ast.GtE: "ge", ast.USub: "neg", ast.Invert: "invert"}
RED_TEAMS_RULES, ALL_RULES = ("operators", "attributes"), ("operators", "attributes", "augmented", "lambdas")


class Rewriter(ast.NodeTransformer):
    """A copier's mechanical rewrite, rule by rule: "operators" (a X b, a comparison of two, -a and ~a as
    operator.X calls), "attributes" (x.name read as getattr(x, 'name'), written as setattr), "augmented" (x = x X y
    as x X= y) and "lambdas" (a def whose body is one return as a name bound to a lambda): what the similarity
    report must see through (RED_TEAMS_RULES are a red team's 40-line rewriter's)."""

    def __init__(self, rules):
        self.rules = set(rules)

    def operator(self, op, *args):
        return ast.Call(ast.Attribute(ast.Name("operator", ast.Load()), OPERATOR_NAMES[type(op)], ast.Load()),
                        list(args), [])

    def visit_BinOp(self, node):
        self.generic_visit(node)
        return self.operator(node.op, node.left, node.right) if "operators" in self.rules else node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return self.operator(node.op, node.operand) if "operators" in self.rules and type(node.op) in OPERATOR_NAMES \
            else node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if "operators" in self.rules and len(node.ops) == 1 and type(node.ops[0]) in OPERATOR_NAMES:
            return self.operator(node.ops[0], node.left, node.comparators[0])
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if "attributes" in self.rules and isinstance(node.ctx, ast.Load):
            return ast.Call(ast.Name("getattr", ast.Load()), [node.value, ast.Constant(node.attr)], [])
        return node

    def visit_Assign(self, node):
        target, value = node.targets[0], node.value
        if "augmented" in self.rules and len(node.targets) == 1 and isinstance(target, ast.Name) and \
                isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name) and value.left.id == target.id:
            return self.visit(ast.AugAssign(target, value.op, value.right))
        self.generic_visit(node)
        if "attributes" in self.rules and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
            target = node.targets[0]
            return ast.Expr(ast.Call(ast.Name("setattr", ast.Load()), [target.value, ast.Constant(target.attr),
                                                                       node.value], []))
        return node

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        if "lambdas" in self.rules and len(node.body) == 1 and isinstance(node.body[0], ast.Return) and \
                node.body[0].value is not None and not node.decorator_list:
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]:
                if a is not None:
                    a.annotation = None                         # a lambda's arguments have none
            return ast.Assign([ast.Name(node.name, ast.Store())], ast.Lambda(node.args, node.body[0].value))
        return node


def rewritten(source: str, rules=ALL_RULES) -> str:
    """A source rewritten by these rules, `import operator` after its docstring and __future__ imports."""
    tree = Rewriter(rules).visit(ast.parse(source))
    at = next(i for i, node in enumerate(tree.body) if not (isinstance(node, ast.ImportFrom) and
                                                            node.module == "__future__" or
                                                            i == 0 and isinstance(node, ast.Expr)))
    tree.body.insert(at, ast.Import([ast.alias("operator")]))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def solution(ex: str) -> list:
    """The reference's lines for an exercise, between its markers, dedented: what a copier pastes."""
    lines = (course.REPO / "agentic_rl.py").read_text().splitlines()
    first, last = (next(i for i, line in enumerate(lines) if line.strip() == f"# {end} SOLUTION {ex}")
                   for end in ("BEGIN", "END"))
    return textwrap.dedent("\n".join(lines[first + 1:last])).splitlines()


def disguised(lines: list) -> list:
    """A copier's disguise, by tokens: every name the code assigns renamed, every other name in brackets, and a
    statement that does nothing after each line that ends one."""
    import ast
    import io
    import keyword
    import tokenize
    source = "\n".join(lines) + "\n"
    assigned = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    tokens, out = list(tokenize.generate_tokens(io.StringIO(source).readline)), []
    for i, tok in enumerate(tokens):
        before, after = tokens[i - 1].string if i else "", tokens[i + 1].string if i + 1 < len(tokens) else ""
        name = tok.type == tokenize.NAME and not keyword.iskeyword(tok.string) and before != "."
        if name and tok.string in assigned:
            out.append((tokenize.NAME, f"v{sorted(assigned).index(tok.string)}"))
        elif name and after != "=":
            out += [(tokenize.OP, "("), (tokenize.NAME, tok.string), (tokenize.OP, ")")]
        else:
            out.append((tok.type, tok.string))
    padded = []
    for line in tokenize.untokenize(out).splitlines():
        padded.append(line)
        if line.strip() and not line.rstrip().endswith((":", ",", "(")) and not line.strip().startswith(("return", "raise")):
            padded.append(line[:len(line) - len(line.lstrip())] + "_ = None")
    return padded


@SLOW_SANDBOX
def test_a_copy_of_the_reference_is_flagged_and_solutions_written_fresh_are_not(tmp_path, shared_sandbox, capsys):
    """The reference is public, so a copy of it scores every code point: grade says so to the staff alone. The
    reference's four solutions copied (disguised by renaming, brackets and do-nothing statements; nested in an `if
    True:`; moved into helpers the graded functions call): flagged; two students' fresh ones: not, against the
    reference or each other (README: five fresh students and the red team's copies, the shares measured)."""
    four, reference = ["returns", "gae", "grpo", "ppo_clip"], reference_code(("gae", "grpo", "ppo_clip", "returns"))
    arguments = {"returns": "r, gamma", "gae": "r, v, last_value, bootstrap, gamma, lam", "grpo": "r, std, eps",
                 "ppo_clip": "logprobs, old_logprobs, advantages, mask, clip_eps, n"}
    copies = {"disguised": ({ex: disguised(solution(ex)) for ex in four}, ""),
              "nested": ({ex: ["if True:"] + ["    " + line for line in solution(ex)] for ex in four}, ""),
              "helpers": ({ex: [f"return _{ex}({arguments[ex]})"] for ex in four},
                          "".join(f"\n\ndef _{ex}({arguments[ex]}):\n" + "".join(f"    {line}\n" for line in solution(ex))
                                  for ex in four))}
    for student, (code, helpers) in [*copies.items(), *((name, (code, "")) for name, code in FRESH.items())]:
        write_handout(tmp_path / student, only=four)
        for ex in four:
            fill(tmp_path / student / "agentic_rl.py", ex, code[ex] if isinstance(code[ex], list) else code[ex].splitlines())
        with open(tmp_path / student / "agentic_rl.py", "a") as f:
            f.write(helpers)
    own = {student: own_code({"agentic_rl.py": (tmp_path / student / "agentic_rl.py").read_text()}, four)
           for student in [*copies, *FRESH]}
    for student in copies:
        assert similarity(own[student], reference)["flagged"], student
    for student in FRESH:
        sim = similarity(own[student], reference)
        assert not sim["flagged"] and sim["share"] < FLAG and sim["fingerprints"] >= SHORTEST, (student, sim)
    assert not similarity(own["terse"], own["textbook"])["flagged"]
    code, printed = course_here(capsys, "grade", tmp_path / "disguised", tmp_path / "terse", "--only", ",".join(four),
                                "--json", tmp_path / "results", "--html", tmp_path / "similarity.html", "--rerun", "0")
    staff = json.loads((tmp_path / "results" / "disguised.json").read_text())["tests"][-1]
    assert staff["visibility"] == "hidden" and "similarity to the public reference: 1.00" in staff["output"]
    assert "FLAGGED disguised: 1.00 of its own code is the public reference's" in printed, printed
    assert "FLAGGED terse" not in printed and "similarity to disguised" in printed     # every pair compared
    page = (tmp_path / "similarity.html").read_text()
    index = page.split("</table>")[0]                                  # every pair first, flagged or not
    assert index.count("<tr><td>") == 4 and index.index("disguised") < index.index("terse"), index
    assert page.count("<h2") == 1 + 4 and "disguised, ppo_clip, against the public reference: 100%" in page
    assert "<script" not in page and "class=\"hit\"" in page
