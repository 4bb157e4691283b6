"""What grading reports: the points of each exercise (visible and hidden halves), the TA's printed summary, and
Gradescope's results.json, where what the course staff alone should read sits in a hidden test. An experiment's
points are never scored automatically (course/audit.py): contradicted, they are 0; pending, they go to a person with
the audit's evidence, never granted, never taken; so do a held exercise's (a near copy of the public reference). A
student reads "pending review", never what the audit saw."""
import textwrap

from course.sandbox import missing_isolation


def exercises(report: dict) -> dict:
    return {ex: row for ex, row in report.items() if not ex.startswith("~")}


def counted(row: dict) -> list:
    """The checks that count: one the grader could not make on this evidence ("not checked") costs nothing."""
    return [c for c in row["checks"] if c["status"] != "not checked"]


def checked(row: dict, hidden=None) -> tuple:
    """(points its checks earn, points possible) of an exercise (or of its hidden / visible checks): the visible
    checks share half its points and the hidden ones the other half, each counted check of a half alike, so
    hard-coding what the handout shows earns half at most."""
    halves = [[c for c in counted(row) if c["hidden"] == h] for h in (False, True)]
    earned = possible = 0.0
    for h, part in zip((False, True), halves):
        if part and hidden in (None, h):
            weight = row["points"] / sum(1 for half in halves if half)
            earned += weight * sum(c["status"] == "passed" for c in part) / len(part)
            possible += weight
    return earned, possible


def state(row: dict):
    """An experiment's audit: "contradicted" or "pending" (no automatic point: course/audit.py); a code exercise's:
    "pending" when its code is held for a person (a near copy of the public reference: row["held"]), else None."""
    return (row.get("audit") or {}).get("state") or ("pending" if row.get("held") else None)


def score(row: dict, hidden=None) -> tuple:
    """(points scored, points possible): what the checks earn (checked); an experiment is never verified
    automatically: contradicted (a record's demonstrations are not its settings') it scores 0, pending (every other
    case) it scores 0 here and pending_points says what a person is to grade, as for a code exercise held for a
    person (a near copy of the public reference)."""
    earned, possible = checked(row, hidden)
    return (earned if state(row) in (None, "verified") else 0.0), possible


def pending_points(row: dict, hidden=None) -> float:
    """The points its checks earn that a person is to grade: an experiment's not contradicted, a held exercise's."""
    return checked(row, hidden)[0] if state(row) == "pending" else 0.0


def audited(row: dict) -> str:
    """The TA's line on an experiment's audit (or a held exercise): its state, the points it leaves to a person, and
    what it saw."""
    pending = pending_points(row)
    saw = row["audit"]["saw"] if "audit" in row else [row["held"]]
    return f"{'audit' if 'audit' in row else 'held for a person'}: {state(row)}" + \
        (f" ({pending:g} points for a person to grade)" if pending else "") + \
        (f": the experiment scores 0 [{FORGED}]" if state(row) == "contradicted" else "") + \
        "".join(f"\n    {line}" for line in saw)


def suspicious(row: dict) -> bool:
    """Every visible check of a code exercise passes and a hidden one does not: hard-coded answers, for a TA to look
    at (an experiment's records are judged by its audit: FORGED)."""
    if "audit" in row:
        return False
    visible, hidden = ([c["status"] == "passed" for c in counted(row) if c["hidden"] == h] for h in (False, True))
    return bool(visible) and all(visible) and not all(hidden)


def unchecked(row: dict) -> bool:
    """A check the grader could not make on this evidence: a TA may want to look."""
    return any(c["status"] == "not checked" for c in row["checks"])


SUSPICIOUS = "visible checks pass, hidden checks fail: a TA should read this code (hard-coded answers?)"
FORGED = "record does not match a rerun: a number that does not drift is not its settings' (made up, copied or edited)"
NOT_CHECKED = "a check the grader could not make (runs with nothing to judge) is not checked (no points lost): a TA " \
              "may look"


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
    """What the workers ran without, first and loud; what they ran as (the grader's note); and what that shared."""
    note = report.get("~sandbox", "")
    missing = missing_isolation(note)
    return ([f"WARNING: the student's code ran without: {', '.join(missing)} (grade --require-isolation refuses to "
             "grade with less)"] if missing else []) + [f"sandbox: {note}"] + \
        ([FILES_SHARED] if "files shared" in note else []) + \
        ([NETWORK_SHARED] if "network shared" in note and "seccomp on" not in note else [])


def similarity_lines(report: dict) -> list:
    """How much of the submission's own code is the public reference's (and, in a class run, each classmate's):
    where a TA should read, never a score; what could not be compared, and a classmate's planted bug it carries."""
    return [f"similarity to {against}: {sim['share']:.2f} of {sim['fingerprints']} fingerprints of its own code"
            f"{' FLAGGED: a TA should read both side by side' if sim['flagged'] else ''} (" +
            ", ".join(f"{ex} {r['share']:.2f}" for ex, r in sim["exercises"].items() if r["fingerprints"]) + ")" +
            (f"; not found, so defined some other way (read it): {', '.join(sim['missing'])}" if sim["missing"] else "") +
            (f"; helpers holding that code: {', '.join(sim['helpers'])}" if sim["helpers"] else "") +
            (f"; not compared: {'; '.join(sim['not_compared'])}" if sim["not_compared"] else "") +
            (f"; {'; '.join(sim['too_large'])}" if sim.get("too_large") else "")
            for against, sim in report.get("~similarity", {}).items()
            if sim["fingerprints"] or sim["not_compared"] or sim.get("too_large") or sim["exercises"]] + \
        [f"FLAGGED: {line}" for line in carried(report)]


def carried(report: dict) -> list:
    """A silent bug planted in another student's handout, in this submission: it copied that classmate's file."""
    own = report.get("~bugs", {}).get("own")
    return [f"its agentic_rl.py carries the silent bug {bug!r}, planted in another student's handout (its own: "
            f"{own or 'none'}): a copy of a classmate's file" for bug in report.get("~bugs", {}).get("others", [])]


def staff_lines(report: dict) -> list:
    """What the course staff alone read: what held in the sandbox, what of the code is someone else's, and which
    exercises were graded where answers.json's list of them could not be used."""
    return sandbox_lines(report) + similarity_lines(report) + \
        ([f"exercises: {report['~handout']}"] if report.get("~handout") else [])


def print_grade(report: dict) -> bool:
    print("\n".join(staff_lines(report)))
    print(f"{'exercise':<16}{'points':>14}  {'checks':>8}  status")
    rows = exercises(report)
    for ex, row in rows.items():
        earned, possible = score(row)
        passed = sum(c["status"] == "passed" for c in row["checks"])
        worst = next((c for c in row["checks"] if c["status"] != "passed"), None)
        print(f"{ex:<16}{earned:>7.1f} / {possible:<5.1f} {passed:>3}/{len(row['checks']):<3}  "
              f"{'ok' if worst is None else worst['status'] + ': ' + worst['name']}" +
              (f"  [{SUSPICIOUS}]" if suspicious(row) else "") + (f"  [{NOT_CHECKED}]" if unchecked(row) else "") +
              (f"\n{textwrap.indent(audited(row), ' ' * 16)}" if checked(row)[0] and state(row) else ""))
    for ex, row in rows.items():
        for c in row["checks"]:
            if c["status"] not in ("passed", "not started"):
                print(f"\n[{ex}] {c['name']} ({'hidden' if c['hidden'] else 'visible'} check): {c['status']}\n"
                      f"{quoted(c['message'])}")
    for ex, row in rows.items():
        if "pending" in row:
            print(f"\n[{ex}] {prose(row)}; the answer:\n{quoted(row['pending']['answer'])}")
    earned, possible = (sum(score(row)[i] for row in rows.values()) for i in (0, 1))
    skipped = sum(c["status"] == "not checked" for row in rows.values() for c in row["checks"])
    review = sum(pending_points(row) for row in rows.values())
    read = sum(row["pending"]["points"] for row in rows.values() if "pending" in row)
    print(f"\ntotal {earned:.1f} / {possible:.1f}" + (f" (+ {review:g} points pending review)" if review else "") +
          (f" (+ {read} points read by a person)" if read else "") + ": " +
          ("some checks did not pass" if earned + review != possible else f"every check made passed; {skipped} not "
           "checked" if skipped else "every check passed"))
    return earned == possible


def prose(row: dict) -> str:
    """An answer's prose, for a person: its points are pending, never given by a keyword or a word count."""
    return f"{row['pending']['points']} points pending: the course staff read {row['pending']['field']} and grade it " \
           "by hand (Gradescope: a manual question); no automatic check gives them"


def verdict_for_the_student(row: dict) -> str:
    """What a student reads of an experiment's audit: "pending review" (or, contradicted, the record whose
    demonstrations are not its settings'), never what the audit tried; of a held exercise, "pending review"."""
    if state(row) == "contradicted":
        return "contradicted: " + "; ".join(row["audit"]["saw"]) + ": this experiment scores 0"
    return "pending review: the course staff check your records and grade these points by hand" if "audit" in row \
        else "pending review: the course staff read this exercise's code before its points count"


def gradescope_results(report: dict, seconds: float) -> dict:
    """Gradescope's results.json: one test per exercise and visibility, hidden checks shown after publishing (an
    experiment's and a held exercise's say that their points are pending review); a test per answer a person reads, with
    the answer quoted in full; and a hidden test for the staff alone (the sandbox, similarity, what the audit saw)."""
    tests = []
    for number, (ex, row) in enumerate(exercises(report).items(), start=1):
        for hidden in (False, True):
            part = [c for c in row["checks"] if c["hidden"] == hidden]
            if part:
                earned, possible = score(row, hidden)
                flag = (f"\n{SUSPICIOUS}" if hidden and suspicious(row) else "") + \
                    (f"\n{NOT_CHECKED}" if hidden and unchecked(row) else "") + \
                    (f"\n{verdict_for_the_student(row)}" if state(row) and checked(row, hidden)[0] else "")
                tests.append({"name": f"{ex} ({'hidden' if hidden else 'visible'} checks)",
                              "number": f"{number}.{int(hidden) + 1}", "score": round(earned, 2),
                              "max_score": round(possible, 2), "visibility": "after_published" if hidden else "visible",
                              "output": "\n".join(f"[{c['status']}] {c['name']}" + (f"\n{quoted(c['message'])}"
                                                                                    if c["message"] else "")
                                                   for c in part) + flag})
    tests += [{"name": f"{ex}: {row['pending']['field']} (read by the course staff)", "score": 0.0, "max_score": 0.0,
               "visibility": "visible", "output": f"{prose(row)}. The answer, in full:\n"
                                                  f"{quoted(row['pending']['answer'])}"}
              for ex, row in exercises(report).items() if "pending" in row]
    audits = [f"{ex}: {audited(row)}" for ex, row in exercises(report).items() if state(row) and checked(row)[0]]
    tests.append({"name": "for the course staff: the sandbox, code similarity and the audit", "score": 0.0,
                  "max_score": 0.0, "visibility": "hidden",
                  "output": "\n".join(staff_lines(report) + audits)})   # a student never sees it
    return {"score": round(sum(t["score"] for t in tests), 2), "execution_time": round(seconds, 1),
            "output": "agentic-rl homework: each exercise's visible checks, then its hidden ones",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def grader_failed(why: str, seconds: float) -> dict:
    """results.json when the grader itself fails: the student sees that it was not their code."""
    return {"score": 0.0, "execution_time": round(seconds, 1), "visibility": "visible", "stdout_visibility": "hidden",
            "output": f"The grader failed, not your submission ({why}); the course staff will regrade it.", "tests": []}
