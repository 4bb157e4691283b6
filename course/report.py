"""What grading reports: the points of each exercise (visible and hidden halves), the TA's printed summary, and
Gradescope's results.json, where what the course staff alone should read sits in a hidden test."""
import textwrap

from course.sandbox import missing_isolation


def exercises(report: dict) -> dict:
    return {ex: row for ex, row in report.items() if not ex.startswith("~")}


def counted(row: dict) -> list:
    """The checks that count: a rerun the grader could not finish ("not checked") costs the student nothing."""
    return [c for c in row["checks"] if c["status"] != "not checked"]


def score(row: dict, hidden=None) -> tuple:
    """(points earned, points possible) of an exercise (or of its hidden / visible checks): the
    visible checks share half its points and the hidden ones the other half, each counted check of a
    half alike, so hard-coding what the handout shows earns half at most. A record that the audit could not
    reproduce zeroes its experiment: its numbers did not come from the runs they claim."""
    halves = [[c for c in counted(row) if c["hidden"] == h] for h in (False, True)]
    earned = possible = 0.0
    for h, part in zip((False, True), halves):
        if part and hidden in (None, h):
            weight = row["points"] / sum(1 for half in halves if half)
            earned += weight * sum(c["status"] == "passed" for c in part) / len(part)
            possible += weight
    return (0.0 if failed_audit(row) else earned), possible


def failed_audit(row: dict) -> bool:
    """A record whose demonstrations are not its settings' (drift 0: README): the experiment scores 0."""
    return any(c.get("audit") and c["status"] == "wrong" for c in row["checks"])


def audited(row: dict) -> str:
    """The TA's line on an experiment's audit: how many records were checked, how many reproduced."""
    demos = [c for c in row["checks"] if c.get("audit")]
    runs = [c for c in row["checks"] if c.get("rerun") and c["status"] != "not checked"]
    return (f"audit: {sum(c['records'] for c in demos)} records' demonstrations recomputed, "
            f"{sum(c['reproduced'] for c in demos)} reproduced; {len(runs)} runs trained again, "
            f"{sum(c['reproduced'] for c in runs)} reproduced ({sum(c['exact'] for c in runs)} bit for bit)" +
            (": a record did not reproduce its demonstrations, the experiment scores 0" if failed_audit(row) else ""))


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
    """What the workers ran without, first and loud; what they ran as (the grader's note); and what that shared."""
    note = report.get("~sandbox", "")
    missing = missing_isolation(note)
    return ([f"WARNING: the student's code ran without: {', '.join(missing)} (grade --require-isolation refuses to "
             "grade with less)"] if missing else []) + [f"sandbox: {note}"] + \
        ([FILES_SHARED] if "files shared" in note else []) + \
        ([NETWORK_SHARED] if "network shared" in note and "seccomp on" not in note else [])


def similarity_lines(report: dict) -> list:
    """How much of the submission's own code is the public reference's (and, in a class run, each classmate's):
    where a TA should read, never a score."""
    return [f"similarity to {against}: {sim['share']:.2f} of {sim['fingerprints']} fingerprints of its own code"
            f"{' FLAGGED: a TA should read both side by side' if sim['flagged'] else ''} (" +
            ", ".join(f"{ex} {r['share']:.2f}" for ex, r in sim["exercises"].items() if r["fingerprints"]) + ")" +
            (f"; not found, so defined some other way (read it): {', '.join(sim['missing'])}" if sim["missing"] else "") +
            (f"; helpers holding that code: {', '.join(sim['helpers'])}" if sim["helpers"] else "")
            for against, sim in report.get("~similarity", {}).items() if sim["fingerprints"]]


def staff_lines(report: dict) -> list:
    """What the course staff alone read: what held in the sandbox, and what of the code is someone else's."""
    return sandbox_lines(report) + similarity_lines(report)


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
              (f"\n{'':<16}{audited(row)}" if any(c.get("audit") or c.get("rerun") for c in row["checks"]) else ""))
    for ex, row in rows.items():
        for c in row["checks"]:
            if c["status"] not in ("passed", "not started"):
                print(f"\n[{ex}] {c['name']} ({'hidden' if c['hidden'] else 'visible'} check): {c['status']}\n"
                      f"{quoted(c['message'])}")
    for ex, row in rows.items():
        if "pending" in row:
            print(f"\n[{ex}] {pending(row)}; the answer:\n{quoted(row['pending']['answer'])}")
    earned, possible = (sum(score(row)[i] for row in rows.values()) for i in (0, 1))
    skipped = sum(c["status"] == "not checked" for row in rows.values() for c in row["checks"])
    waiting = sum(row["pending"]["points"] for row in rows.values() if "pending" in row)
    print(f"\ntotal {earned:.1f} / {possible:.1f}" + (f" (+ {waiting} points read by a person)" if waiting else "") +
          ": " + ("some checks did not pass" if earned != possible else f"every check made passed; {skipped} not "
                  "checked" if skipped else "every check passed"))
    return earned == possible


def pending(row: dict) -> str:
    """An answer's prose, for a person: its points are pending, never given by a keyword or a word count."""
    return f"{row['pending']['points']} points pending: the course staff read {row['pending']['field']} and grade it " \
           "by hand (Gradescope: a manual question); no automatic check gives them"


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
    tests += [{"name": f"{ex}: {row['pending']['field']} (read by the course staff)", "score": 0.0, "max_score": 0.0,
               "visibility": "visible", "output": pending(row)} for ex, row in exercises(report).items()
              if "pending" in row]
    tests.append({"name": "for the course staff: the sandbox and code similarity", "score": 0.0, "max_score": 0.0,
                  "visibility": "hidden", "output": "\n".join(staff_lines(report))})   # a student never sees it
    return {"score": round(sum(t["score"] for t in tests), 2), "execution_time": round(seconds, 1),
            "output": "agentic-rl homework: each exercise's visible checks, then its hidden ones",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def grader_failed(why: str, seconds: float) -> dict:
    """results.json when the grader itself fails: the student sees that it was not their code."""
    return {"score": 0.0, "execution_time": round(seconds, 1), "visibility": "visible", "stdout_visibility": "hidden",
            "output": f"The grader failed, not your submission ({why}); the course staff will regrade it.", "tests": []}
