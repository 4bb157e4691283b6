"""Ids and the course's secret: a handout id binds one student (and the bug planted in their handout), and the
experiments' seeds are drawn for them; all from the course's secret, which nobody without it can forge or guess."""
import hashlib
import hmac
import json
import random
import re

import course
from course.exercises import EXERCISES, SILENT_BUGS
from course.lesson import README_SEEDS


SECRET_ENV = "AGENTIC_RL_HIDDEN_SEED"   # the course's secret: here, never on a command line, which every process reads
MAKE_A_SECRET = 'python -c "import secrets; print(secrets.token_hex(16))"'


def strong_secret(secret) -> str:
    """The course's secret, refused below 128 bits (32 hexadecimal digits): a short one (4242) is found from a
    single handout id by trying them all, and with it ids can be forged and hidden inputs computed."""
    secret = str(secret).strip()
    if not re.fullmatch(r"[0-9a-fA-F]{32,}", secret) or typed_secret(secret.lower()):
        raise ValueError(f"the course's secret holds fewer than 128 bits (it must be 32 or more hexadecimal digits, "
                         f"drawn at random, not a pattern; it has {len(secret)} characters): make one with "
                         f"{MAKE_A_SECRET} and put it in {SECRET_ENV} (a grading installation keeps it in "
                         "hidden_seed.txt, readable by root only)")
    return secret


def typed_secret(digits: str) -> bool:
    """A pattern someone typed, not drawn: fewer than 10 distinct digits, a period (42424242..., 0123...f0123...f),
    a palindrome, or 7 digits in a row that repeat or count up or down by one (0000000, 1234567, fedcba9). Drawn ones
    are refused rarely (measured: token_hex(16) 21 times in 300,000, token_hex(32) twice in 100,000): draw again."""
    steps = "".join({0: "=", 1: "+", 15: "-"}.get((int(b, 16) - int(a, 16)) % 16, ".") for a, b in zip(digits, digits[1:]))
    return (len(set(digits)) < 10 or digits == digits[::-1] or re.search(r"(=|\+|-)\1{5}", steps) is not None
            or any(digits == (digits[:p] * len(digits))[:len(digits)] for p in range(1, len(digits) // 2 + 1)))


def student_name(student) -> str:
    """A student as an id binds them: their name or email, case and spacing aside."""
    return " ".join(str(student).split()).casefold()


def mac(secret: str, *parts) -> bytes:
    """HMAC-SHA256 of these parts, keyed by the course's secret: without it nobody can compute one."""
    return hmac.new(secret.encode(), json.dumps(parts).encode(), hashlib.sha256).digest()


def handout_tag(secret: str, nonce: str, student: str, bug: str, exercises=None) -> str:
    """The handout id's tag: it names the student, the planted bug ('' for none) and the exercises handed out
    (answers.json's "exercises": every exercise, or none named, is a whole handout's tag) only to whoever holds the
    course's secret, and nobody without it can make one: an edited list no longer verifies."""
    named = isinstance(exercises, list) and all(isinstance(ex, str) for ex in exercises)    # else it never verifies
    whole = exercises is None or (named and sorted(exercises) == sorted(EXERCISES))
    return mac(secret, "handout", nonce, student_name(student), bug,
               *([] if whole else [sorted(exercises) if named else repr(exercises)])).hex()[:16]


def experiment_seeds(secret: str, nonce: str, student: str) -> list:
    """The three seeds of a student's experiments (E3, E8): distinct, in [3, 100000), drawn from the secret and
    the handout, so that no published number (the README measured 0, 1, 2) and no classmate's answers them."""
    seeds, draw = [], 0
    while len(seeds) < 3:
        seed = 3 + int.from_bytes(mac(secret, "seeds", nonce, student_name(student), draw)[:8], "big") % 99_997
        seeds += [] if seed in seeds else [seed]
        draw += 1
    return seeds


def new_handout(secret: str, student: str, bug, exercises=None) -> tuple:
    """(id, seeds) of a handout made for one student: 'nonce-tag', bound to them, to its planted bug and to the
    exercises it hands out."""
    nonce = f"{random.SystemRandom().getrandbits(48):012x}"
    return f"{nonce}-{handout_tag(secret, nonce, student, bug or '', exercises)}", experiment_seeds(secret, nonce, student)


def issued_to(handout, secret: str, students, exercises=None) -> tuple:
    """(student, planted bug or '') of the handout whose id a submission carries, if this course issued it to
    one of `students` with these exercises (answers.json's "exercises"); else None."""
    nonce, _, tag = str(handout).partition("-")
    return next(((s, bug) for s in students for bug in ("", *SILENT_BUGS)
                 if hmac.compare_digest(handout_tag(secret, nonce, s, bug, exercises), tag)), None)


def answer_key(answers: dict, secret, students, silent_bug) -> dict:
    """What the experiments are graded against: this student's seeds and the bug planted in their handout,
    read from its id with the course's secret and their name; "why" says what is missing when they cannot be
    known. Without a secret (practice, no ids) the seeds are the README's and the bug is the grader's flag."""
    if not secret:
        return {"seeds": README_SEEDS, "silent_bug": silent_bug or installation_file("silent_bug.txt"), "why": ""}
    handout = answers.get("handout")
    found = issued_to(handout, secret, students, answers.get("exercises")) if isinstance(handout, str) else None
    if found is None:
        return {"seeds": None, "silent_bug": None, "why": "answers.json carries no handout id issued to you by this "
                "course: keep the \"handout\" and \"exercises\" your answers.json came with (a classmate's id, or an "
                "edited one, does not verify; each student's experiments have seeds of their own)"}
    student, bug = found
    return {"seeds": experiment_seeds(secret, handout.partition("-")[0], student), "silent_bug": bug or None, "why": ""}


def hidden_seed_of(secret, students=()) -> int:
    """The hidden checks' inputs as a number, drawn from the course's secret and whose submission it is: each
    student (or Gradescope group) gets inputs of their own, so a hidden check's message, shown after publishing,
    answers no classmate's; 0 without a secret (the public default)."""
    key = "\n".join([str(secret), *sorted(student_name(s) for s in students)])
    return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16) if secret else 0


def installation_file(name: str):
    """A small file the bundle keeps beside the grader (silent_bug.txt, hidden_seed.txt), or None."""
    path = course.REPO / name
    return path.read_text().strip() if path.is_file() else None
