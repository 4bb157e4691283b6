"""The visible homework checks, as the grader runs them. They are written once, in test_agentic_rl.py, where a
student reads and runs them (`python -m pytest -q -m homework`); this module compiles that file's blocks
between `# BEGIN HOMEWORK CHECKS` and `# END HOMEWORK CHECKS` (what the checks build on, and the checks), and
nothing else of it: no test and no fixture runs here, and the lesson's files never import the course. Every
other line is left blank, so a message or a traceback names the file's own line numbers."""
import course

MARKER = "HOMEWORK CHECKS"


def blocks(text: str) -> str:
    """The marked blocks of a file, every other line blank."""
    kept, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip().startswith((f"# BEGIN {MARKER}", f"# END {MARKER}")):
            inside = line.strip().startswith(f"# BEGIN {MARKER}")
            line = "\n"
        kept.append(line if inside else "\n")
    if inside:
        raise ValueError(f"test_agentic_rl.py: a '# BEGIN {MARKER}' block is never closed")
    return "".join(kept)


SOURCE = course.REPO / "test_agentic_rl.py"
exec(compile(blocks(SOURCE.read_text()), str(SOURCE), "exec"), globals())   # HOMEWORK, check, same, run_record, ...
