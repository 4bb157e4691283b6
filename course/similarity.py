"""How much of a submitted solution is someone else's: winnowed fingerprints of normalized tokens, the method of
MOSS (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document fingerprinting", SIGMOD 2003), on
Python's own ast and tokenize, so that the course needs nothing more. Each file is written back one way first
(canonical: operator.X(a, b) as a X b, getattr and setattr with a constant name as the attribute, a += b as
a = a + b, a name bound to a lambda as a def; then ast.unparse, which drops brackets, layout and comments). Names
become one symbol and numbers and strings another, so renaming variables or reformatting hides nothing; each run
of K tokens is hashed, and of every WINDOW consecutive hashes the smallest is kept: any run of K + WINDOW - 1
tokens that two texts share leaves at least one fingerprint in both. What the handout gives (the signature, the
docstring, the checks before the blank) is left out of both sides, as MOSS leaves out a base file. A submission
has a budget (SIMILARITY_FUNCTIONS, SIMILARITY_TOKENS, SIMILARITY_SECONDS): past it, and for a file that did not
compile or could not be read, it is "not compared", never a copy, and grading goes on. It changes no score: it
says where a TA should read."""
import ast
import collections
import copy
import functools
import hashlib
import html
import io
import keyword
import os
import pickle
import re
import select
import signal
import textwrap
import time
import tokenize

import course
from course.exercises import SILENT_BUGS
from course.handouts import function_spans, handout_text, solution_regions

K, WINDOW = 16, 4         # tokens per hashed run; runs per window (a shared run of 19 tokens is always found)
FLAG = 0.6                # share of a submission's own fingerprints found in the other: at or above it, a TA reads
FLAG_EXERCISE = 0.75      # one exercise's share that flags it alone (measured, README: copies 0.85-1.00 of the whole,
SHORTEST = 25             # fresh solutions 0.05-0.37; one function: copies up to 1.00, fresh ones up to 0.58); a
                          # solution with fewer fingerprints is not judged alone (returns' loop has 17: any right answer
                          # is that loop), it still counts in the whole's share
SIMILARITY_FUNCTIONS, SIMILARITY_TOKENS = 1_000, 150_000   # a submission's budget, both files together, counted by
                          # size() before anything is parsed (the reference: 201 functions, 52,487 tokens)
SIMILARITY_SECONDS = 20.0  # and its time, in a child process of its own: past it, "too large to compare"


# ------------------------------------------------------------------------------------------------
# One way to write it: mechanical equivalences undone before fingerprinting
# ------------------------------------------------------------------------------------------------
BINARY = {"add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "truediv": ast.Div, "floordiv": ast.FloorDiv, "mod": ast.Mod,
          "pow": ast.Pow, "matmul": ast.MatMult, "lshift": ast.LShift, "rshift": ast.RShift, "and_": ast.BitAnd,
          "or_": ast.BitOr, "xor": ast.BitXor}
COMPARE = {"eq": ast.Eq, "ne": ast.NotEq, "lt": ast.Lt, "le": ast.LtE, "gt": ast.Gt, "ge": ast.GtE, "is_": ast.Is,
           "is_not": ast.IsNot}
UNARY = {"neg": ast.USub, "pos": ast.UAdd, "invert": ast.Invert, "inv": ast.Invert, "not_": ast.Not}
OPERATIONS = {alias: op for table in (BINARY, COMPARE, UNARY) for name, op in table.items()
              for alias in (name, f"__{name.rstrip('_')}__") + ((f"i{name.rstrip('_')}", f"__i{name.rstrip('_')}__")
                                                               if table is BINARY else ())}


def operation(name: str, args: list):
    """The expression that operator.NAME(*args) (or args[0].NAME(*args[1:]), a dunder) computes, or None."""
    op = OPERATIONS.get(name)
    if name in ("getitem", "__getitem__") and len(args) == 2:
        return ast.Subscript(args[0], args[1], ast.Load())
    if name in ("contains", "__contains__") and len(args) == 2:
        return ast.Compare(args[1], [ast.In()], [args[0]])
    if op in BINARY.values() and len(args) == 2:
        return ast.BinOp(args[0], op(), args[1])
    if op in COMPARE.values() and len(args) == 2:
        return ast.Compare(args[0], [op()], [args[1]])
    if op in UNARY.values() and len(args) == 1:
        return ast.UnaryOp(op(), args[0])
    return None


def constant_name(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier()


class Canonical(ast.NodeTransformer):
    """Writes the mechanical equivalences one way, so that a rewriter that applies them hides nothing:
    operator.X(a, b) (however the module or the function was imported) and a.__X__(b) as a X b; getattr(x, 'n') as
    x.n and setattr(x, 'n', v) as x.n = v; a += b as a = a + b; f = lambda ...: e as def f(...): return e."""

    def __init__(self, tree):
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        self.modules = {a.asname or a.name for n in imports if isinstance(n, ast.Import) for a in n.names
                        if a.name == "operator"} | {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                                    and imported_operator(n.value) for t in n.targets
                                                    if isinstance(t, ast.Name)}     # op = __import__("operator")
        self.functions = {a.asname or a.name: a.name for n in imports if isinstance(n, ast.ImportFrom) and
                          n.module == "operator" for a in n.names}
        if "*" in self.functions:                      # from operator import *: every name of it
            self.functions.update({name: name for name in [*OPERATIONS, "getitem", "contains"]})
        self.helpers, self.depth = one_line_helpers(tree), 0    # def add(a, b): return a + b, the student's own
        self.torch = {a.asname or a.name for n in imports if isinstance(n, ast.Import) for a in n.names
                      if a.name == "torch"}

    def visit_Call(self, node):
        self.generic_visit(node)
        f, args = node.func, node.args
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.torch and args and \
                f.attr in tensor_methods() and not isinstance(args[0], ast.Starred):   # torch.exp(x) as x.exp()
            return ast.Call(ast.Attribute(args[0], f.attr, ast.Load()), args[1:], node.keywords)
        if node.keywords or any(isinstance(a, ast.Starred) for a in args):
            return node
        if isinstance(f, ast.Attribute) and imported_operator(f.value):     # __import__("operator").add(a, b)
            return ordered(operation(f.attr, args)) or node
        if isinstance(f, ast.Name) and f.id in self.helpers and len(args) == len(self.helpers[f.id][0]) and \
                self.depth < 4:                        # a helper that calls a helper, a few deep
            params, body = self.helpers[f.id]
            self.depth += 1
            try:
                return self.visit(Substitute(dict(zip(params, args))).visit(copy.deepcopy(body)))
            finally:
                self.depth -= 1
        if isinstance(f, ast.Name) and f.id == "getattr" and len(args) == 2 and constant_name(args[1]):
            return ast.Attribute(args[0], args[1].value, ast.Load())
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.modules:
            return ordered(operation(f.attr, args)) or node
        if isinstance(f, ast.Name) and f.id in self.functions:
            return ordered(operation(self.functions[f.id], args)) or node
        if isinstance(f, ast.Attribute) and f.attr.startswith("__"):
            return ordered(operation(f.attr, [f.value, *args])) or node
        return node

    def visit_Expr(self, node):
        self.generic_visit(node)
        c = node.value
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "setattr" and len(c.args) == 3 \
                and not c.keywords and constant_name(c.args[1]):
            return ast.Assign([ast.Attribute(c.args[0], c.args[1].value, ast.Store())], c.args[2])
        return node

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        read = copy.deepcopy(node.target)
        read.ctx = ast.Load()
        return ast.Assign([node.target], ordered(ast.BinOp(read, node.op, node.value)))

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Lambda):
            fn = ast.FunctionDef(name=node.targets[0].id, args=node.value.args, body=[ast.Return(node.value.body)],
                                 decorator_list=[], returns=None)
            fn.type_params = []                        # Python 3.12's field; unparse reads it there
            return fn
        return node


    def visit_BinOp(self, node):
        self.generic_visit(node)
        return ordered(node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        return ordered(node)


def ordered(node):
    """An operation whose operands are written one way: b + a as a + b (commutative operators, in the order of their
    shape, whatever the names), b > a as a < b, a == b as b == a; any other node as it is (None too)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, COMMUTATIVE):
        node.left, node.right = sorted((node.left, node.right), key=shape)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in MIRRORED:
        node.left, node.ops, node.comparators = node.comparators[0], [MIRRORED[type(node.ops[0])]()], [node.left]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Is,
                                                                                       ast.IsNot)):
        node.left, node.comparators[0] = sorted((node.left, node.comparators[0]), key=shape)
    return node


@functools.cache
def tensor_methods() -> frozenset:
    """What torch spells both ways, torch.NAME(x, ...) and x.NAME(...): the first is written as the second."""
    import torch
    return frozenset(n for n in dir(torch.Tensor) if not n.startswith("_") and callable(getattr(torch, n, None)))


COMMUTATIVE = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
MIRRORED = {ast.Gt: ast.Lt, ast.GtE: ast.LtE}


def shape(node) -> str:
    """An expression as its fingerprint sees it (names V, numbers N, strings S): the order of commutative operands
    is decided on it, so renaming a variable never reorders them."""
    if isinstance(node, ast.Name):
        return "V"
    if isinstance(node, ast.Constant):
        return "S" if isinstance(node.value, str) else "N"
    if isinstance(node, ast.Attribute):
        return f"{shape(node.value)}.{node.attr}"
    return type(node).__name__ + "(" + ",".join(shape(c) for c in ast.iter_child_nodes(node)
                                                if isinstance(c, ast.expr)) + ")"


def imported_operator(node) -> bool:
    """__import__("operator") or importlib.import_module("operator")."""
    return isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and \
        node.args[0].value == "operator" and (isinstance(node.func, ast.Name) and node.func.id == "__import__" or
                                              isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")


def one_line_helpers(tree) -> dict:
    """name -> (its parameters, the expression it returns) of each function defined once (a def, or a name bound to a
    lambda) whose body is one return of an expression, with plain positional parameters and no decorator: a call of
    it is written as that expression (def add(a, b): return a + b: add(x, y) as x + y), so a student's own operator
    helpers hide nothing. The definition stays (it may be an exercise's)."""
    found, seen = {}, collections.Counter()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name, a = node.name, node.args
            body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            returned = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
            plain = isinstance(node, ast.FunctionDef) and not node.decorator_list
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                isinstance(node.value, ast.Lambda):
            name, a, returned, plain = node.targets[0].id, node.value.args, node.value.body, True
        else:
            continue
        seen[name] += 1
        if plain and returned is not None and not (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults) \
                and not any(isinstance(n, (ast.Lambda, ast.comprehension, ast.NamedExpr, ast.Await, ast.Yield,
                                           ast.YieldFrom)) or isinstance(n, ast.Name) and n.id == name
                            for n in ast.walk(returned)):
            found[name] = ([p.arg for p in a.args], returned)
    lesson = lesson_functions()                        # the lesson's own functions stay calls on both sides: a
    return {name: helper for name, helper in found.items() if seen[name] == 1 and name not in lesson}  # filled blank
                                                       # would otherwise rewrite every function that calls it


@functools.cache
def lesson_functions() -> frozenset:
    """The names of the reference's module-level functions (and lambdas): never inlined as a student's helper."""
    names = set()
    for file in ("agentic_rl.py", "envs.py"):
        for node in ast.parse((course.REPO / file).read_text()).body:
            names.update([node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                         [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else [])
    return frozenset(names)


class Substitute(ast.NodeTransformer):
    """A helper's expression with its parameters replaced by the call's arguments."""

    def __init__(self, args: dict):
        self.args = args

    def visit_Name(self, node):
        return copy.deepcopy(self.args[node.id]) if node.id in self.args else node


def canonical(tree: ast.AST) -> ast.AST:
    return ast.fix_missing_locations(Canonical(tree).visit(tree))


def drop_statements_that_do_nothing(tree: ast.AST):
    """A constant alone (a docstring too), pass, a constant put in a name nothing reads, what follows a return, raise,
    break or continue, the body of `if False:` or `while False:`, and a function of the student's own that does
    nothing: the filler that would break a copy's runs or pad it past a budget."""
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    lesson = lesson_names()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For,
                             ast.While, ast.With, ast.Try, ast.ExceptHandler)):
            for part in ("body", "orelse", "finalbody"):
                body = getattr(node, part, None)
                if body:
                    kept = []
                    for b in body:
                        if isinstance(b, (ast.If, ast.While)) and isinstance(b.test, ast.Constant) and not b.test.value:
                            kept += b.orelse if isinstance(b, ast.If) else []      # never runs: its else does
                        elif not (isinstance(b, ast.Pass) or isinstance(b, ast.Expr) and
                                  isinstance(b.value, ast.Constant) or isinstance(b, ast.Assign) and
                                  isinstance(b.value, ast.Constant) and all(isinstance(t, ast.Name) and t.id not in
                                                                            loaded for t in b.targets) or
                                  isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name not in lesson and
                                  all(isinstance(s, ast.Pass) or isinstance(s, ast.Expr) and
                                      isinstance(s.value, ast.Constant) for s in b.body)):
                            kept.append(b)
                        if isinstance(b, (ast.Return, ast.Raise, ast.Break, ast.Continue)):
                            break                                                 # unreachable after it
                    setattr(node, part, kept or [ast.Pass()])


@functools.cache
def lesson_names() -> frozenset:
    """Every function name of the reference (methods too): a stub of the lesson's is never dropped as filler."""
    return frozenset(n.name for file in ("agentic_rl.py", "envs.py")
                     for n in ast.walk(ast.parse((course.REPO / file).read_text()))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


# ------------------------------------------------------------------------------------------------
# Fingerprints
# ------------------------------------------------------------------------------------------------
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


@functools.lru_cache(maxsize=64)
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


@functools.lru_cache(maxsize=64)
def given_lines(given: str) -> frozenset:
    return frozenset(line.strip() for line in given.splitlines())


def own_fingerprints(source: str, given: str) -> dict:
    """The fingerprints of source that the given text (the handout's) does not have: what its author wrote; each
    with the lines it covers, less those the given text holds word for word (for the page's marks). The given
    text's fingerprints are computed once (a file of 400 helpers compares each against the same handout)."""
    base, given_at, lines = fingerprints(given), given_lines(given), source.splitlines()
    return {h: [n for n in at if lines[n - 1].strip() not in given_at]
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
def normalized_module(text: str):
    """(qualname -> each function's source, the whole module's source), written one way (canonical, then
    ast.unparse), statements that do nothing dropped. Every function counts, those inside an if, try, with or loop
    block at module or class level too (a definition there is as callable as any); the last of a name wins, as at
    run time. Parsed once per text. None for a text that does not parse here."""
    try:
        tree = canonical(ast.parse(text))
        drop_statements_that_do_nothing(tree)
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
        return None


def function_text(text: str, qualname: str) -> str:
    """That function's source in a file's text, normalized (normalized_module); '' where there is none."""
    return (normalized_module(text) or ({}, ""))[0].get(qualname, "")


def size(text: str) -> tuple:
    """(functions, tokens) of a source, counted without parsing it: what the budget reads first."""
    return (len(re.findall(r"^[ \t]*(?:async[ \t]+)?def[ \t]", text, re.M)),
            len(re.findall(r"\w+|[^\w\s]", text)))


@functools.cache
def planted_lines() -> dict:
    """bug -> (its function, the lines planting it adds there, as normalized_module writes them); each bug planted
    as handouts.plant plants it, in its function's own lines (a module of their own)."""
    reference = (course.REPO / "agentic_rl.py").read_text()
    lines, spans, out = reference.splitlines(keepends=True), function_spans(reference), {}
    for bug, (_, function, written, planted, _) in SILENT_BUGS.items():
        first, last = spans[function]
        source = textwrap.dedent("".join(lines[first - 1:last]))
        before, after = (set(normalized_module(text)[0][function.split(".")[-1]].splitlines())
                         for text in (source, source.replace(written, planted)))
        out[bug] = (function, sorted(line.strip() for line in after - before))
    return out


def planted_bugs(text: str) -> list:
    """The silent bugs whose planted lines a file's functions carry (a handout's, or a copy of one)."""
    functions = (normalized_module(text) or ({}, ""))[0]
    return [bug for bug, (function, lines) in planted_lines().items()
            if lines and set(lines) <= {line.strip() for line in functions.get(function, "").splitlines()}]


def own_code(files: dict, exercises, unreadable=None) -> dict:
    """What a submission's author wrote, from files (name -> text): "exercises", ex -> (its function's text, the
    fingerprints of what its author wrote there); "files", name -> the same for each whole file; "helpers",
    "NAME QUALNAME" -> the same for every other function its author wrote or changed; "not_compared", name -> why
    (unreadable: name -> why, for a file that did not compile or could not be read: never parsed here; or the
    submission past its budget); "planted", the silent bugs its agentic_rl.py carries. The handout's version of each
    is the base left out (the handout of these exercises: the reference's other solutions were given)."""
    blanked, names = tuple(sorted(exercises)), dict.fromkeys(solution_functions()[ex][0] for ex in exercises)
    out = {"exercises": {}, "files": {}, "helpers": {}, "not_compared": dict(unreadable or {}), "planted": [],
           "too_large": {}}
    functions, tokens = (sum(size(files.get(n) or "")[i] for n in names if n not in out["not_compared"]) for i in (0, 1))
    for name in names:
        if name not in out["not_compared"] and (functions > SIMILARITY_FUNCTIONS or tokens > SIMILARITY_TOKENS):
            out["too_large"][name] = f"too large to compare whole: {functions} functions, {tokens} tokens (at most " \
                                     f"{SIMILARITY_FUNCTIONS} and {SIMILARITY_TOKENS}): its exercises' functions " \
                                     "compared alone; read it"
            exercises_alone(out, files.get(name) or "", name, exercises, blanked)
            continue
        module = None if name in out["not_compared"] else normalized_module(files.get(name) or "")
        if module is None:
            out["not_compared"].setdefault(name, "it does not parse here")
            continue
        (mine, whole), (given_functions, given) = module, normalized_module(handout_text(name, blanked))
        out["files"][name] = (whole, own_fingerprints(whole, given))
        graded = {solution_functions()[ex][1] for ex in exercises if solution_functions()[ex][0] == name}
        for ex in exercises:
            if solution_functions()[ex][0] == name:
                qualname = solution_functions()[ex][1]
                text = mine.get(qualname, "")
                out["exercises"][ex] = (text, own_fingerprints(text, given_functions.get(qualname, "")))
        for qualname, text in mine.items():     # every other function its author wrote or changed: a helper
            if qualname not in graded and text != given_functions.get(qualname):
                out["helpers"][f"{name} {qualname}"] = (text, own_fingerprints(text, given))
        if name == "agentic_rl.py":
            out["planted"] = planted_bugs(files.get(name) or "")
    return out


def function_source(text: str, qualname: str) -> str:
    """One function's source in a text, found by its def line and indentation without parsing the text (a method:
    under its class's line), dedented; the last definition of the name wins, as at run time; '' where there is none."""
    *owner, name = qualname.split(".")
    lines, found, in_class = text.splitlines(keepends=True), None, None
    for i, line in enumerate(lines):
        m = re.match(r"([ \t]*)(?:class[ \t]+(\w+)|(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\()", line)
        if m and m.group(2) is not None and not m.group(1):
            in_class = m.group(2)
        elif m and m.group(3) == name and (bool(m.group(1)) == bool(owner)) and (not owner or in_class == owner[0]):
            found = i
    if found is None:
        return ""
    indent, end = len(lines[found]) - len(lines[found].lstrip()), found + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return textwrap.dedent("".join(lines[found:end]))


def exercises_alone(out: dict, text: str, name: str, exercises, blanked):
    """own_code's exercises (and the planted bugs) of a file too large to compare whole: each exercise's function
    taken alone (function_source), normalized and fingerprinted against the handout's."""
    given_functions, _ = normalized_module(handout_text(name, blanked))
    imports = "".join(re.findall(r"^(?:import|from)[ \t].*\n", text, re.M))     # how its names were imported
    alone = lambda qualname: (normalized_module(imports + function_source(text, qualname)) or ({}, ""))[0].get(
        qualname.split(".")[-1], "")
    for ex in exercises:
        file, qualname = solution_functions()[ex]
        if file == name:
            mine = alone(qualname)
            out["exercises"][ex] = (mine, own_fingerprints(mine, given_functions.get(qualname, "")))
    if name == "agentic_rl.py":
        out["planted"] = [bug for bug, (function, lines) in planted_lines().items() if lines and set(lines) <= {
            line.strip() for line in alone(function).splitlines()}]


def own_code_within(files: dict, exercises, unreadable=None, seconds: float = SIMILARITY_SECONDS) -> dict:
    """own_code in a child process of the grader's, killed after `seconds`: a file the parser takes minutes over
    costs the grading `seconds` at most, and is then "too large to compare". What the child needs of the handout
    and the reference is computed here first, so that each grading's child inherits it."""
    if not exercises:
        return own_code({}, [], unreadable)
    blanked = tuple(sorted(exercises))
    for ex in exercises:
        name, qualname = solution_functions()[ex]
        given_functions, given = normalized_module(handout_text(name, blanked))
        fingerprints(given), given_lines(given), fingerprints(given_functions.get(qualname, ""))
    planted_lines()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child: the grader's own code, on the submitted text
        try:
            os.close(read)
            with os.fdopen(write, "wb") as f:
                f.write(pickle.dumps(own_code(files, exercises, unreadable)))
        finally:
            os._exit(0)
    os.close(write)
    data, deadline = bytearray(), time.monotonic() + seconds
    names = dict.fromkeys(solution_functions()[ex][0] for ex in exercises)
    none_of_it = lambda why, large=False: {**own_code({}, [], {}), "not_compared": {
        n: (unreadable or {}).get(n) or why for n in names}, "too_large": {n: why for n in names if large}}
    try:
        while select.select([read], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(read, 1 << 20)
            if not chunk:
                return pickle.loads(data) if data else none_of_it("the report's process ended without an answer")
            data += chunk
        os.kill(pid, signal.SIGKILL)
        functions, tokens = (sum(size(files.get(n) or "")[i] for n in names) for i in (0, 1))
        return none_of_it(f"too large to compare: {functions} functions, {tokens} tokens (not done within {seconds:g} "
                          "s): read it", large=True)
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@functools.cache
def reference_code(exercises: tuple) -> dict:
    """own_code of the public reference: what a copy of it would share."""
    return own_code({name: (course.REPO / name).read_text() for name in ("agentic_rl.py", "envs.py")}, exercises)


def similarity(mine: dict, theirs: dict) -> dict:
    """How much of one submission's own code (own_code) is in another's (or the reference's): the share of its whole
    files' own fingerprints (helpers included), and per exercise. Flagged at FLAG or more of the whole, at
    FLAG_EXERCISE of one judged exercise or one helper, or where a graded function cannot be found (defined some
    other way). A file either side could not compare is left out, and said: never a copy."""
    closed = set(mine["not_compared"]) | set(theirs["not_compared"])
    rows = {ex: {**compare(fps, theirs["exercises"][ex][1]), "mine": text, "theirs": theirs["exercises"][ex][0]}
            for ex, (text, fps) in mine["exercises"].items()
            if ex in theirs["exercises"] and solution_functions()[ex][0] not in closed}
    files = [compare(fps, theirs["files"][name][1]) for name, (_, fps) in mine["files"].items() if name in theirs["files"]]
    total = sum(r["fingerprints"] for r in files)
    share = sum(r["shared"] for r in files) / total if total else 0.0
    missing = [ex for ex, r in rows.items() if not r["mine"] and r["theirs"]]
    helpers = {key.split()[-1]: compare(fps, theirs["files"][key.split()[0]][1])
               for key, (_, fps) in mine["helpers"].items() if key.split()[0] in theirs["files"]}
    copied = [name for name, r in helpers.items() if r["flagged"]]   # a helper that holds another's solution
    skipped = [f"{name}: {why}" for name, why in mine["not_compared"].items()] + \
        [f"the other's {name}: {why}" for name, why in theirs["not_compared"].items() if name not in mine["not_compared"]]
    large = [f"{name}: {why}" for name, why in mine.get("too_large", {}).items() if name not in mine["not_compared"]]
    return {"share": round(share, 3), "fingerprints": total, "exercises": rows, "missing": missing, "helpers": copied,
            "not_compared": skipped, "too_large": large, "flagged": (total >= SHORTEST and share >= FLAG) or
            any(r["flagged"] for r in rows.values()) or bool(missing) or bool(copied) or
            bool(mine.get("too_large"))}     # a file padded past the budget is the staff's to read, never passed over


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


def side_by_side(title: str, pairs: list, rows: list, notes=()) -> str:
    """A self-contained page (inline CSS, no script). First an index of every compared pair, flagged or not, sorted
    by its highest share (the whole file's or one exercise's): pairs are dicts with name, against, share,
    fingerprints, flagged, exercises (exercise -> share) and not_compared (lines). Then, for each row, the two texts
    side by side with the matching lines marked: rows are dicts with name, exercise, against, share, fingerprints,
    flagged, mine and theirs (the texts), lines and their_lines (the matching lines; each text's first is 1). Every
    value is escaped. notes: lines shown first (who shares with whom, a classmate's planted bug carried)."""
    def column(text, marked):
        return "".join(f'<div class="{"hit" if i in marked else "line"}"><span>{i}</span>{html.escape(line) or " "}'
                       f"</div>" for i, line in enumerate(text.splitlines(), start=1))
    e = lambda value: html.escape(str(value))
    highest = lambda p: max([p["share"], *p["exercises"].values()])
    shown = {(r["name"], r["against"]) for r in rows}
    parts = [f"<!doctype html><meta charset='utf-8'><title>{e(title)}</title><style>"
             "body{font:13px system-ui;margin:1.5em}table{border-collapse:collapse;width:100%;table-layout:fixed}"
             "td{vertical-align:top;width:50%;padding:0 .5em}pre{margin:0;font:12px ui-monospace,monospace}"
             ".hit{background:#fde68a}.line,.hit{white-space:pre-wrap;word-break:break-all;padding-left:3em;"
             "text-indent:-3em}span{color:#999;display:inline-block;width:3em;text-indent:0}"
             "h2{font-size:15px;margin-top:2em}.flag{color:#b91c1c}table.index{table-layout:auto;margin:1em 0}"
             ".index td,.index th{width:auto;border-bottom:1px solid #ddd;padding:2px .6em;text-align:left}</style>",
             f"<h1>{e(title)}</h1><p>Winnowed fingerprints of normalized tokens (mechanical rewrites undone; names, "
             f"numbers and strings made alike; what the handout gives left out). A submission is flagged at {FLAG:.0%} "
             f"or more of its own fingerprints found in the other, or {FLAG_EXERCISE:.0%} of one exercise's: a place "
             "for a TA to read, never a score.</p>",
             *([f"<ul>{''.join(f'<li><b>{e(line)}</b></li>' for line in notes)}</ul>"] if notes else []),
             f"<h2>Every pair ({len(pairs)}), by its highest share</h2><table class='index'><tr><th>submission</th>"
             "<th>against</th><th>whole file</th><th>exercises</th><th>flagged</th><th>not compared</th></tr>"]
    ordered = sorted(pairs, key=lambda p: (-highest(p), p["name"], p["against"]))
    number = {(p["name"], p["against"]): i for i, p in enumerate(ordered)}
    for i, p in enumerate(ordered):
        flag = '<b class="flag">flagged</b>' if p["flagged"] else "no"
        name = f"<a href='#pair-{i}'>{e(p['name'])}</a>" if (p["name"], p["against"]) in shown else e(p["name"])
        parts.append(f"<tr><td>{name}</td><td>{e(p['against'])}</td><td>{p['share']:.2f} of {p['fingerprints']}</td>"
                     f"<td>{e(', '.join(f'{ex} {v:.2f}' for ex, v in p['exercises'].items()))}</td><td>{flag}</td>"
                     f"<td>{e('; '.join(p['not_compared']))}</td></tr>")
    parts.append("</table>")
    anchored = set()
    for r in rows:
        pair = (r["name"], r["against"])
        anchor = f" id='pair-{number[pair]}'" if pair in number and pair not in anchored else ""
        anchored.add(pair)
        flag = '<b class="flag">flagged</b>' if r["flagged"] else "not flagged"
        parts.append(f"<h2{anchor}>{e(r['name'])}, {e(r['exercise'])}, against {e(r['against'])}: {r['share']:.0%} of "
                     f"{r['fingerprints']} fingerprints ({flag})</h2><table><tr><td><pre>"
                     f"{column(r['mine'], set(r['lines']))}</pre></td><td><pre>"
                     f"{column(r['theirs'], set(r['their_lines']))}</pre></td></tr></table>")
    return "".join(parts) + "\n"
