"""How much of a submitted solution is someone else's: winnowed fingerprints of normalized tokens, the method of
MOSS (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document fingerprinting", SIGMOD 2003), on
Python's own tokenize, so that the course needs nothing more. Names become one symbol and numbers and strings
another, so renaming variables or reformatting hides nothing; each run of K tokens is hashed, and of every WINDOW
consecutive hashes the smallest is kept: any run of K + WINDOW - 1 tokens that two texts share leaves at least one
fingerprint in both. What the handout gives (the signature, the docstring, the checks before the blank) is left
out of both sides, as MOSS leaves out a base file. It changes no score: it says where a TA should read."""
import ast
import functools
import hashlib
import html
import io
import keyword
import tokenize

import course
from course.handouts import function_spans, handout_text, solution_regions

K, WINDOW = 16, 4         # tokens per hashed run; runs per window (a shared run of 19 tokens is always found)
FLAG = 0.6                # share of a submission's own fingerprints found in the other: at or above it, a TA reads
FLAG_EXERCISE = 0.75      # one exercise's share that flags it alone (measured, README: copies 0.85-1.00 of the whole,
SHORTEST = 25             # fresh solutions 0.05-0.37; one function: copies up to 1.00, fresh ones up to 0.58); a
                          # solution with fewer fingerprints is not judged alone (returns' loop has 17: any right answer
                          # is that loop), it still counts in the whole's share


def normalized_tokens(source: str) -> list:
    """(symbol, line) for each token that carries code: a name (not a keyword, not an attribute after a dot) is
    V, a number N, a string S; operators and keywords stay; comments, blank lines and indentation go."""
    out, after_dot = [], False
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.ENCODING}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in skip:
                continue
            text = tok.string
            if tok.type == tokenize.NAME and not keyword.iskeyword(text) and not after_dot:
                text = "V"
            elif tok.type == tokenize.NUMBER:
                text = "N"
            elif tok.type == tokenize.STRING or tok.type not in (tokenize.NAME, tokenize.OP):
                text = "S"                             # f-string parts too (Python 3.12 splits them)
            out.append((text, tok.start[0]))
            after_dot = text == "."
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass                                           # what tokenized before the error still counts
    return out


def fingerprints(source: str) -> dict:
    """hash -> the lines of source that each of its K-token runs covers (winnowing: the smallest hash of every
    WINDOW consecutive runs, the rightmost on a tie)."""
    toks = normalized_tokens(source)
    runs = [(int.from_bytes(hashlib.blake2b(" ".join(t for t, _ in toks[i:i + K]).encode(), digest_size=8).digest(),
                            "big"), {line for _, line in toks[i:i + K]}) for i in range(len(toks) - K + 1)]
    kept = {}
    for start in range(max(1, len(runs) - WINDOW + 1)):
        window = runs[start:start + WINDOW]
        if window:
            h, lines = min(reversed(window), key=lambda run: run[0])
            kept.setdefault(h, set()).update(lines)
    return {h: sorted(lines) for h, lines in kept.items()}   # plain data: a report is JSON


def own_fingerprints(source: str, given: str) -> dict:
    """The fingerprints of source that the given text (the handout's) does not have: what its author wrote; each
    with the lines it covers, less those the given text holds word for word (for the page's marks)."""
    base, given_lines = fingerprints(given), {line.strip() for line in given.splitlines()}
    lines = source.splitlines()
    return {h: [n for n in at if lines[n - 1].strip() not in given_lines]
            for h, at in fingerprints(source).items() if h not in base}


@functools.cache
def solution_functions() -> dict:
    """exercise -> (file, the function that holds its blank: the innermost around its marker in the reference)."""
    found = {}
    for name in ("agentic_rl.py", "envs.py"):
        text = (course.REPO / name).read_text()
        spans = function_spans(text)
        for ex, (first, _) in solution_regions(text, name).items():
            around = [q for q, (a, b) in spans.items() if a <= first + 1 <= b]
            found[ex] = (name, min(around, key=lambda q: spans[q][1] - spans[q][0]))
    return found


@functools.lru_cache(maxsize=32)
def normalized_module(text: str) -> tuple:
    """(qualname -> each function's source, the whole module's source), as ast.unparse writes them: brackets,
    layout and comments normalized away, and statements that do nothing dropped (a constant alone, pass, a
    constant put in a name nothing reads: the filler that would break a copy's runs). Every function counts, those inside an if, try, with or loop block at
    module or class level too (a definition there is as callable as any); the last of a name wins, as at run
    time. Parsed once per text: a file that took its worker long to compile is never parsed again per exercise.
    ({}, '') for a text that does not parse."""
    try:
        tree = ast.parse(text)
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for node in ast.walk(tree):                  # statements that do nothing: a constant alone, pass, a constant
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For,
                                 ast.While, ast.With, ast.Try, ast.ExceptHandler)):   # put in a name nothing reads
                for part in ("body", "orelse", "finalbody"):
                    body = getattr(node, part, None)
                    if body:
                        kept = [b for b in body if not (isinstance(b, ast.Pass) or isinstance(b, ast.Expr) and
                                isinstance(b.value, ast.Constant) or isinstance(b, ast.Assign) and
                                isinstance(b.value, ast.Constant) and all(isinstance(t, ast.Name) and t.id not in
                                                                          loaded for t in b.targets))]
                        setattr(node, part, kept or [ast.Pass()])
        found = {}

        def visit(body, prefix):
            for node in body:
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + ".")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[prefix + node.name] = ast.unparse(node) + "\n"
                else:                          # blocks: if/else, try/except/finally, with, for, while
                    for part in ("body", "orelse", "finalbody", "handlers"):
                        visit(getattr(node, part, []), prefix)
        visit(tree.body, "")
        return found, ast.unparse(tree) + "\n"
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}, ""


def function_text(text: str, qualname: str) -> str:
    """That function's source in a file's text, normalized (normalized_module); '' where there is none."""
    return normalized_module(text)[0].get(qualname, "")


def own_code(files: dict, exercises) -> dict:
    """exercise -> (its function's text, the fingerprints of what its author wrote there), "~file NAME" -> the same
    for each whole file, and "~def NAME QUALNAME" for every other function its author wrote or changed, from files (name -> text, or None for one that did not
    compile in its worker: never parsed here): the handout's version of each is the base left out (the handout of
    these exercises: the reference's other solutions were given to the student)."""
    out, blanked = {}, tuple(sorted(exercises))
    for ex in exercises:
        name, qualname = solution_functions()[ex]
        text = function_text(files.get(name) or "", qualname)
        out[ex] = (text, own_fingerprints(text, function_text(handout_text(name, blanked), qualname)))
    graded = {solution_functions()[ex][1] for ex in exercises}
    for name in dict.fromkeys(solution_functions()[ex][0] for ex in exercises):
        functions, whole = normalized_module(files.get(name) or "")
        given_functions, given = normalized_module(handout_text(name, blanked))
        out[f"~file {name}"] = (whole, own_fingerprints(whole, given))
        for qualname, text in functions.items():     # every other function its author wrote or changed: a helper
            if qualname not in graded and text != given_functions.get(qualname):
                out[f"~def {name} {qualname}"] = (text, own_fingerprints(text, given))
    return out


def reference_code(exercises) -> dict:
    """own_code of the public reference: what a copy of it would share."""
    return own_code({name: (course.REPO / name).read_text() for name in ("agentic_rl.py", "envs.py")}, exercises)


def similarity(mine: dict, theirs: dict) -> dict:
    """How much of one submission's own code (own_code) is in another's (or the reference's): the share of its whole
    files' own fingerprints (helpers included), and per exercise. Flagged at FLAG or more of the whole, at
    FLAG_EXERCISE of one judged exercise or one helper, or where a graded function cannot be found (defined some
    other way)."""
    rows = {ex: {**compare(mine[ex][1], theirs[ex][1]), "mine": mine[ex][0], "theirs": theirs[ex][0]}
            for ex in mine if ex in theirs and not ex.startswith("~")}
    files = [compare(mine[f][1], theirs[f][1]) for f in mine if f.startswith("~") and f in theirs]
    total = sum(r["fingerprints"] for r in files)
    share = sum(r["shared"] for r in files) / total if total else 0.0
    missing = [ex for ex, r in rows.items() if not r["mine"] and r["theirs"]]
    helpers = {key.split()[-1]: compare(mine[key][1], theirs[f"~file {key.split()[1]}"][1]) for key in mine
               if key.startswith("~def") and f"~file {key.split()[1]}" in theirs}
    copied = [name for name, r in helpers.items() if r["flagged"]]   # a helper that holds another's solution
    return {"share": round(share, 3), "fingerprints": total, "exercises": rows, "missing": missing, "helpers": copied,
            "flagged": (total >= SHORTEST and share >= FLAG) or any(r["flagged"] for r in rows.values()) or
            bool(missing) or bool(copied)}


def compare(mine: dict, theirs: dict) -> dict:
    """The share of `mine` (own_fingerprints) found in `theirs`, and the lines that match on each side; flagged at
    FLAG_EXERCISE or more, unless either side has fewer than SHORTEST fingerprints (too short to tell copying from a right
    answer)."""
    shared = mine.keys() & theirs.keys()
    share = len(shared) / len(mine) if mine else 0.0
    judged = min(len(mine), len(theirs)) >= SHORTEST
    return {"share": round(share, 3), "shared": len(shared), "fingerprints": len(mine), "judged": judged,
            "flagged": judged and share >= FLAG_EXERCISE,
            "lines": sorted({line for h in shared for line in mine[h]}),
            "their_lines": sorted({line for h in shared for line in theirs[h]})}


def side_by_side(title: str, rows: list) -> str:
    """A self-contained page (inline CSS, no script): for each compared pair, the two texts side by side with
    the matching lines marked. rows: dicts with name, exercise, against, share, fingerprints, flagged, mine and
    theirs (the texts), lines and their_lines (the matching lines; each text's first is 1). Every value is escaped."""
    def column(text, marked):
        return "".join(f'<div class="{"hit" if i in marked else "line"}"><span>{i}</span>{html.escape(line) or " "}'
                       f"</div>" for i, line in enumerate(text.splitlines(), start=1))
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
             "body{font:13px system-ui;margin:1.5em}table{border-collapse:collapse;width:100%;table-layout:fixed}"
             "td{vertical-align:top;width:50%;padding:0 .5em}pre{margin:0;font:12px ui-monospace,monospace}"
             ".hit{background:#fde68a}.line,.hit{white-space:pre-wrap;word-break:break-all;padding-left:3em;"
             "text-indent:-3em}span{color:#999;display:inline-block;width:3em;text-indent:0}"
             "h2{font-size:15px;margin-top:2em}.flag{color:#b91c1c}</style>",
             f"<h1>{html.escape(title)}</h1><p>Winnowed fingerprints of normalized tokens (names, numbers and strings "
             f"made alike; what the handout gives left out). A submission is flagged at {FLAG:.0%} or more of its own "
             f"fingerprints found in the other, or {FLAG_EXERCISE:.0%} of one exercise's: a place for a TA to read, "
             "never a score.</p>"]
    for r in rows:
        flag = '<b class="flag">flagged</b>' if r["flagged"] else "not flagged"
        parts.append(f"<h2>{html.escape(r['name'])}, {html.escape(r['exercise'])}, against {html.escape(r['against'])}: "
                     f"{r['share']:.0%} of "
                     f"{r['fingerprints']} fingerprints ({flag})</h2><table><tr><td><pre>"
                     f"{column(r['mine'], set(r['lines']))}</pre></td><td><pre>"
                     f"{column(r['theirs'], set(r['their_lines']))}</pre></td></tr></table>")
    return "".join(parts) + "\n"
