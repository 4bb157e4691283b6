"""Which environment an --env names, whether its class keeps the contract's letter, and the environment as configured.

An --env is a registered gymnasium id (the bundled AgenticRL/..., or one a module of yours registers: MODULE:ID
imports MODULE first, as gymnasium.make does) or MODULE:CLASS, a class in a module importable from the working
directory. Either way the learner relies on one thing: the class is an envs.TextToolEnv, whose docstring is the
environment contract. agentic_rl.py asks env_class() for it, class_failures() whether it keeps what can be read off
the class before anything runs, and make_env() for an instance built with the run's settings; `python agentic_rl.py
check-env` then checks the rest by playing (tools/envcheck.py). This module knows agentic_rl's Config only by the
names of its fields (it imports nothing of the learner).
A mistake is one sentence (a ValueError naming the value and the fix), never a traceback.

What is imported, and when: an --env you type imports its module as `import` would (from the working directory too).
A name read from a run's own file (a checkpoint, state.pt: eval, show, train --resume) is a name someone else may have
written: saved_env imports its module only from the working directory or this project's folder, and says which file
before anything of it runs; any other module (Python's own `antigravity` opens a browser when imported) is refused.
"""
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path

import gymnasium as gym

import envs


@functools.cache
def resolve_env(env: str) -> tuple:
    """--env -> (gymnasium EnvSpec, the TextToolEnv subclass it makes). env is a registered gymnasium id (the bundled
    AgenticRL/..., or one your module registers: MODULE:ID imports MODULE first, as gymnasium.make does) or
    MODULE:CLASS, a class in a module importable from the working directory. Anything else: one sentence."""
    module, _, name = env.rpartition(":")
    if module and (module.endswith(".py") or not all(part.isidentifier() for part in module.split("."))):
        raise ValueError(f"env={env!r}: {module!r} is not a module's name; write it as `import` takes it (no folder, "
                         f"no .py: {Path(module).stem.strip()}:{name.strip()}), from the folder that holds it")
    if module:
        found = getattr(import_env_module(module, env), name, None)
        if found is not None:
            cls = text_tool_class(found, env)
            return gym.envs.registration.EnvSpec(id=env, entry_point=cls), cls
    if (name or env) in gym.registry:
        spec = gym.spec(name or env)
        entry = spec.entry_point
        found = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        return spec, text_tool_class(found, env)
    if module:
        theirs = [k for k, v in vars(sys.modules[module]).items() if isinstance(v, type) and
                  issubclass(v, envs.TextToolEnv) and v.__module__ == module]
        raise ValueError(f"env={env!r}: module {module} has no class or registered id {name!r}; its TextToolEnv "
                         f"classes: {', '.join(theirs) or 'none'}")
    mine = sorted(k for k, v in gym.registry.items() if isinstance(v.entry_point, type) and
                  issubclass(v.entry_point, envs.TextToolEnv))
    head, dot, tail = env.rpartition(".")
    hint = f"; for class {tail} of module {head}, write {head}:{tail}" if dot and tail.isidentifier() else \
        f"; for a class of module {env}, write {env}:CLASS" if env.isidentifier() else ""
    raise ValueError(f"env={env!r}: no gymnasium id of that name{hint}; use a registered one ({', '.join(mine)}) or "
                     "MODULE:CLASS (your own: python agentic_rl.py new-env NAME copies library.py, one)")


def import_env_module(module: str, env: str):
    """Import the module an --env names, from the working directory too (a script's own folder is what Python adds)."""
    for attempt in range(2):
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            if not module.startswith(str(e.name)):  # the module itself was found: something it imports was not
                raise ValueError(f"env={env!r}: importing {module} failed: it imports {e.name}, which is not "
                                 "installed here") from None
            if attempt or os.getcwd() in sys.path:
                raise ValueError(f"env={env!r}: no module named {e.name!r} (working directory {os.getcwd()}): "
                                 f"run from the folder that holds {module.replace('.', '/')}.py, or add that "
                                 "folder to PYTHONPATH") from None
            sys.path.append(os.getcwd())
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # the module's own error (or exit): say where
            raise ValueError(f"env={env!r}: importing {module} failed: {raised(e)}") from None


HERE = Path(__file__).resolve().parent  # this project's folder: library.py and envs.py ship in it


def saved_env(env: str, what: str):
    """A run's file (`what`: a checkpoint or state.pt) names its environment `env`: before its module is imported, say
    which file it is, and refuse one outside the working directory and this project's folder (nothing of it runs).
    An --env the user typed is not checked here; a module this process already imported runs nothing new."""
    module = env.rpartition(":")[0]
    if not module or module in sys.modules or not all(part.isidentifier() for part in module.split(".")):
        return  # a registered id, a module already imported, or a name resolve_env refuses without importing
    top = module.split(".")[0]
    if top in sys.modules:
        spec = getattr(sys.modules[top], "__spec__", None)
    else:  # found as `import` would find it (the working directory last), without running it
        spec = importlib.util.find_spec(top) or importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        if spec is None:
            return  # nowhere to be found: resolve_env says so, and says where to run from
    file, inside = located(spec) if spec else (None, None)
    where = inside or file  # a package's folder, or a module's file: what sits in an allowed folder
    if where is None or where.parent not in (Path.cwd().resolve(), HERE):
        found = f"is {file}" if file else "is built into Python"
        raise ValueError(f"{what}: it names environment {env!r}, and module {top} {found}, outside the working "
                         f"directory ({Path.cwd()}) and this project's folder: a run's file may name only a module "
                         f"there; nothing was imported. Run from the folder that holds {top}.py, if you trust it")
    print(f"{what}: its environment {env} is module {module}, imported from {module_file(module, spec)}",
          file=sys.stderr)


def located(spec) -> tuple:
    """(the file a module spec names, the folder of its submodules): a module's .py and None; a package's __init__.py
    and its folder; a folder without __init__.py (a namespace package) twice; (None, None) if built into Python."""
    folders = [Path(f).resolve() for f in (spec.submodule_search_locations or [])]
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).resolve(), (folders[0] if folders else None)
    return (folders[0], folders[0]) if folders else (None, None)


def module_file(module: str, top_spec) -> Path:
    """The file of a dotted module inside the top-level package top_spec names, found by path alone (nothing of it
    runs); the deepest package's own file where a part cannot be found (importing will say why)."""
    file, folder = located(top_spec)
    for part in module.split(".")[1:]:
        spec = importlib.machinery.PathFinder.find_spec(part, [str(folder)]) if folder else None
        if spec is None:
            return file
        file, folder = located(spec)
    return file


def text_tool_class(found, env: str):
    """The class an --env names, if it is a TextToolEnv: what the learner relies on is that contract."""
    if isinstance(found, type) and issubclass(found, envs.TextToolEnv):
        return found
    what = "a gymnasium.Env but not an envs.TextToolEnv" if isinstance(found, type) and issubclass(found, gym.Env) \
        else f"not an environment class ({type(found).__name__})"
    label = found.__name__ if isinstance(found, type) else env.rpartition(":")[2]
    raise ValueError(f"env={env!r}: {label} is {what}: subclass envs.TextToolEnv, whose "
                     "docstring is the contract the learner relies on (python agentic_rl.py new-env NAME copies library.py, one)")


def env_class(env: str):
    """The environment class behind --env; it carries words, tool schema, demonstrator, evaluator (envs.TextToolEnv)."""
    return resolve_env(env)[1]


# --- The environment as configured: agentic_rl's Config (cfg) -> the constructor's keywords ---------------
ENV_FLAGS = {"injection_rate": "injection_rate", "legs": "legs", "code_verifier": "verifier", "code_bugs": "max_bugs"}
# Config fields that set a keyword of an environment's constructor (field -> keyword), passed when not the default

def env_keywords(cls) -> set:
    """The keywords an environment's constructor takes (all of ENV_FLAGS' if it takes **kwargs)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return set(ENV_FLAGS) if any(p.kind == p.VAR_KEYWORD for p in params) else \
        {f for f, kw in ENV_FLAGS.items() if kw in {p.name for p in params}}


def env_settings(cfg) -> list:
    """The ENV_FLAGS fields set away from their default: what make_env passes to the environment's constructor."""
    return [name for name in ENV_FLAGS if getattr(cfg, name) != getattr(type(cfg), name)]


def make_env(cfg):
    """The task as configured; a time_limit wraps it in gymnasium's TimeLimit: a cut from outside the task (CUTS)."""
    kwargs = {ENV_FLAGS[name]: getattr(cfg, name) for name in env_settings(cfg)}
    kwargs.update({"max_turns": cfg.max_turns} if cfg.max_turns else {})
    kwargs.update({"tool_latency_ms": cfg.tool_latency_ms} if cfg.tool_latency_ms else {})
    kwargs.update({"show_clock": False} if cfg.hide_clock else {})
    # gymnasium's passive checker would re-check every fresh env; check-env runs its full check_env instead
    try:
        env = gym.make(resolve_env(cfg.env)[0], disable_env_checker=True, **kwargs)
    except TypeError as e:
        raise ValueError(f"env={cfg.env!r}: its constructor refused {sorted(kwargs)} ({raised(e)}); a subclass's __init__ "
                         "takes TextToolEnv's keywords (max_turns, render_mode, tool_latency_ms, show_clock)") from None
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # the environment's own code: where, not a traceback
        raise ValueError(f"env={cfg.env!r}: its constructor raised {raised(e)}") from None
    return gym.wrappers.TimeLimit(env, cfg.time_limit) if cfg.time_limit else env


def class_failures(cls, host_rules: tuple = ()) -> list:
    """What TextToolEnv's docstring asks of the class itself -> [(rule, sentence naming the value and the fix)];
    host_rules: the gate's own rule names, which no safety rule may take."""
    out, name = [], cls.__name__
    for attr in ("env_version", "reward_version"):
        if not isinstance(getattr(cls, attr), str) or not getattr(cls, attr):
            out.append(("class", f"{name}.{attr} = {getattr(cls, attr)!r}: set a non-empty string (runs record it)"))
    schema, allowed = cls.tool_schema, cls.argument_words
    if not isinstance(schema, dict) or not schema or not isinstance(allowed, dict):
        return out + [("class", f"{name}.tool_schema = {schema!r}: map each tool to its argument kinds, and "
                                "argument_words each kind to its words ({'find': ('book',)}, {'book': ('dune',)})")]
    for tool, kinds in schema.items():
        if not callable(getattr(cls, f"_tool_{tool}", None)):
            out.append(("class", f"tool {tool!r} has no method _tool_{tool}(*args) -> (observation, terminated)"))
        out += [("class", f"tool {tool!r} takes a {kind!r}, which argument_words does not list") for kind in kinds
                if kind not in allowed]
    out += [("class", f"{name} does not write {method}(): TextToolEnv's docstring says what it returns")
            for method in ("make_task", "split_of", "new_state", "prompt", "host_view", "reward")
            if getattr(cls, method) is getattr(envs.TextToolEnv, method)]
    vocabulary = set(cls.words) if isinstance(cls.words, (tuple, list)) else set()
    spaced = [w for w in vocabulary if not isinstance(w, str) or w.split() != [w]]
    if spaced or not vocabulary:
        out.append(("vocabulary", f"{name}.words must be a tuple of single words (one word = one token); "
                                  f"{spaced[:3] or 'it is empty'}"))
    out += [("vocabulary", f"the call word {w!r} is not in {name}.words: add it (a policy cannot say a word it lacks)")
            for w in dict.fromkeys([*schema, *(w for ws in allowed.values() for w in ws)]) if w not in vocabulary]
    for attr, low, high in (("max_obs_words", 1, 200), ("warm_start_epochs", 1, 1000), ("max_turns", 2, envs.MAX_TURNS)):
        if type(getattr(cls, attr)) is not int or not low <= getattr(cls, attr) <= high:  # 200: 400 characters' words
            out.append(("class", f"{name}.{attr} = {getattr(cls, attr)!r}: set an int in [{low}, {high}]"))
    if type(cls.safety_ceiling) is not float or not 0 <= cls.safety_ceiling <= 1:
        out.append(("class", f"{name}.safety_ceiling = {cls.safety_ceiling!r}: set a float in [0, 1], the share of "
                             "dev tasks a candidate may be denied on by one safety rule (the release gates)"))
    rules = cls.safety_rules
    if not isinstance(rules, tuple) or not all(isinstance(r, str) and r.isidentifier() for r in rules) or \
            set(rules) & set(host_rules):
        out.append(("class", f"{name}.safety_rules = {rules!r}: a tuple of one-word rule names, none of the host's "
                             f"own {host_rules}"))
    try:  # the host gate calls it on the class: HostGate.authorize
        inspect.signature(cls.permission_rule).bind({}, [], "tool", [])
    except TypeError:
        out.append(("class", f"{name}.permission_rule{inspect.signature(cls.permission_rule)} cannot be called as the "
                             "host gate calls it, on the class: permission_rule(task, executed, tool, args); make it a "
                             "@staticmethod with those four parameters"))
    except ValueError:  # not callable, or no signature to read
        out.append(("class", f"{name}.permission_rule = {cls.permission_rule!r}: write a @staticmethod "
                             "permission_rule(task, executed, tool, args) -> a rule of safety_rules, or None"))
    if not (isinstance(cls.Demonstrator, type) and callable(getattr(cls.Demonstrator, "act", None))):
        out.append(("class", f"{name}.Demonstrator = {cls.Demonstrator!r}: set a class Demonstrator(habit, seed) with "
                             "reset(first_observation) and act(observation) -> action text: the warm start imitates it"))
    if not callable(cls.evaluate_episode):
        out.append(("class", f"{name}.evaluate_episode = {cls.evaluate_episode!r}: set staticmethod(env) -> "
                             "envs.Verdict, the independent evaluator that reads the final state"))
    return out


PYTHONS_OWN = tuple({str(Path(p).resolve()) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
# ^ Python's own library and the installed packages live under these (a virtual environment's too)


def raised(e: BaseException) -> str:
    """An exception from an environment's own code, as a sentence: its type, message (its first line, shortened: an
    environment's message can be as long as it likes) and where it was raised (where_in)."""
    text = (str(e).splitlines() or [""])[0]
    text = text if len(text) <= 200 else f"{text[:200]}... ({len(text):,} characters)"
    return f"{type(e).__name__}: {text} ({where_in(e.__traceback__)})"


def where_in(tb, drop: int = 0) -> str:
    """The line a traceback names for the environment's author: its innermost frame outside Python's own library and
    the installed packages (a tool's loop, not numpy's; a reset that sleeps, not time.sleep), else its innermost.
    drop: frames to leave off its end (a signal handler's own)."""
    frames = traceback.extract_tb(tb)
    frames = frames[:len(frames) - drop]
    theirs = [f for f in frames if not str(Path(f.filename).resolve()).startswith(PYTHONS_OWN)] or frames
    return f"{Path(theirs[-1].filename).name} line {theirs[-1].lineno}, in {theirs[-1].name}" if theirs else "?"
