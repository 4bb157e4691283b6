"""check-env and new-env: the environment contract (envs.TextToolEnv's docstring) checked by playing, and the
smallest complete environment (library.py) copied to start your own.

    python agentic_rl.py check-env library:LibraryEnv     Gymnasium's check_env, then every rule of CONTRACT
    python agentic_rl.py new-env quote                     writes quote.py: library.py, its names changed

train runs require_contract (a few episodes of each actor) before it builds anything; check-env runs them all.
The class itself is checked first (envload.class_failures); every failure is a sentence naming the
environment, the value and the fix.
"""
import importlib.util
import sys
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

import envs
from agentic_rl import (MAX_COST_GROWTH, Config, Episode, Tokenizer, TrajectoryStore, atomic_write,
                        env_class, host_step, make_env, make_tokenizer, new_turn, start_episode, validate_config,
                        writable_dir)
from envload import class_failures, raised


CONTRACT = {  # rule -> what holds when check-env passes it
    "class": "the class attributes and methods TextToolEnv's docstring lists",
    "vocabulary": "every word of every observation and call is in words",
    "clock": "every observation is in the observation space, ends with the turns left and fits max_obs_words",
    "rewards": "rewards in [0, 1], paid only on the step that ends the episode",
    "steps": "reset and step answer every call (a malformed one with 'error : ...') and never raise",
    "endings": "terminated at an end state, truncated exactly when the budget runs out without one",
    "rules": "every rule permission_rule returned is declared in safety_rules",
    "evaluator": "evaluate_episode returns a Verdict and never calls reward()",
    "tasks": "the same task_id gives the same task, and the same seed the same episode",
    "splits": "every task is train or holdout, and neither split is empty",
    "records": "the demonstrator's calls are well formed and every episode makes a record the store admits",
    "demonstrator": "the demonstrator solves nearly every task without its habit, and fewer with it",
}


def check_contract(cfg: Config, episodes: int) -> tuple:
    """Play `episodes` episodes per split with each actor, the demonstrator without and with its habit and random
    well-formed calls (which meet the gate's rules) -> (failures {rule: [at most 3 sentences]}, facts: per habit, the
    demonstrator's train episodes, successes, cuts, denials and costs; task ids where the evaluator and the reward
    disagree; the longest observation and episode). train() runs it with a few episodes before it builds anything;
    check-env with many; both after the class itself passed class_failures (validate_config)."""
    cfg, found, cls = replace(cfg, time_limit=0, tool_latency_ms=0.0), {}, env_class(cfg.env)

    def fail(rule, text):
        if len(found.setdefault(rule, [])) < 3 and f"{cfg.env}: {text}" not in found[rule]:
            found[rule].append(f"{cfg.env}: {text}")
    tok, facts = make_tokenizer(cfg.env), {"demonstrator": {}, "disagree": [], "longest": (0, ""), "tokens": 0}
    raw = make_env(cfg).unwrapped
    splits = [raw.split_of(raw.make_task(int(t))) for t in np.random.default_rng(0).integers(0, 10**6, 50 * episodes)]
    if set(splits) != {"train", "holdout"}:
        fail("splits", f"split_of gave {dict(Counter(splits))} on {len(splits)} task ids: it must say 'train' or "
                       "'holdout', and both (report cards judge holdout tasks alone)")
        return found, facts
    random_calls = np.random.default_rng(0)

    def random_call(_obs):
        tool = list(cls.tool_schema)[random_calls.integers(len(cls.tool_schema))]
        return " ".join([tool] + [str(random_calls.choice(cls.argument_words[k])) for k in cls.tool_schema[tool]])
    for split in ("train", "holdout"):
        for habit in (0.0, 1.0, None):  # None: random calls
            played = []
            for i in range(episodes):
                demo = None if habit is None else cls.Demonstrator(habit, seed=i)
                played.append(probe_episode(cfg, tok, i, split, demo, random_call, fail, facts))
                if played[-1] is not None and demo is not None and i < 2:  # the same seed, the same episode;
                    replay_episode(cfg, tok, i, split, played[-1], fail)    # the same task_id, the same task
            if habit is not None and split == "train":
                facts["demonstrator"][habit] = demonstrator_facts([ep for ep in played if ep is not None])
    words, longest = facts["longest"]
    if words > cls.max_obs_words:
        fail("clock", f"the longest observation has {words} words ({longest!r}), above max_obs_words="
                      f"{cls.max_obs_words}: set max_obs_words = {words} or more (the host keeps that much room)")
    if facts["disagree"] and "evaluator" not in found:
        fail("evaluator", f"the evaluator and the reward disagree on {len(facts['disagree'])} of the demonstrator's "
                          f"episodes (task ids {facts['disagree'][:5]}): one of them misjudges the final state")
    best = facts["demonstrator"].get(0.0)
    if best and not best["wins"]:
        fail("demonstrator", f"without its habit the demonstrator solves 0 of its {best['episodes']} train tasks "
                             f"({best['episodes'] - best['truncated']} ended unsolved, {best['truncated']} ran out of "
                             f"turns; the gate denied {best['denied']} of its calls): "
                             "imitation cannot start from it; find what stops it (Demonstrator.act, the call that "
                             "should end the episode, permission_rule)")
    return found, facts


def demonstrator_facts(played: list) -> dict:
    """The demonstrator's train episodes of one habit: how many, solved, cut by the budget, denied calls, and the
    cost of a solved task (tool calls, action tokens, credits per success), as the release gates count them."""
    wins, turns = sum(ep.reward >= 1 for ep in played), [t for ep in played for t in ep.turns]
    per_win = lambda total: total / wins if wins else None
    return {"episodes": len(played), "wins": wins, "success": wins / max(1, len(played)),
            "truncated": sum(ep.truncated for ep in played), "denied": sum(not t.gate_allowed for t in turns),
            "tool_calls_per_success": per_win(sum(t.gate_allowed for t in turns)),
            "tokens_per_success": per_win(sum(len(t.action_tokens) for t in turns)),
            "credits_per_success": per_win(sum(t.cost for t in turns))}


def probe_episode(cfg: Config, tok: Tokenizer, seed: int, split: str, demo, random_call, fail, facts):
    """One episode through the host gate, each step checked against the contract -> its Episode, or None."""
    try:
        env, gate, ep, obs = start_episode(cfg, seed, split, f"check-{split}-{seed}", 0, 0)
    except Exception as e:
        return fail("steps", f"reset(seed={seed}, options={{'split': {split!r}}}) raised {raised(e)}")
    raw, known = env.unwrapped, set(tok.itos)
    for _ in range(raw.max_turns + 1):
        check_observation(raw, obs, known, fail, facts)
        try:
            if demo is not None and not ep.turns:
                demo.reset(obs)
            text = random_call(obs) if demo is None else demo.act(obs)
        except Exception as e:
            return fail("records", f"the demonstrator raised {raised(e)} on the observation {obs!r}")
        if demo is not None and envs.parse_action(text, raw.tool_schema, raw.argument_words) is None:
            fail("records", f"the demonstrator's call {text!r} (after {obs!r}) is not a well-formed call of tool_schema")
        try:
            next_obs, reward, terminated, truncated, info, decision = host_step(env, gate, text)
        except Exception as e:  # the gate's ValueError: a rule permission_rule returned that safety_rules lacks
            return fail("rules", str(e)) if "safety_rules" in str(e) else fail("steps", f"the call {text!r} raised "
                                                                              f"{raised(e)}: answer it, never raise")
        if not isinstance(reward, float) or not 0 <= reward <= 1:
            fail("rewards", f"reward {reward!r} after {text!r}: a reward is a float in [0, 1] (1: the task done)")
        elif reward and not terminated:
            fail("rewards", f"reward {reward} after {text!r} while the episode goes on: pay only on the step that "
                            "ends it (an outcome, no shaping)")
        if truncated != (not terminated and raw.state.turns >= raw.max_turns):
            fail("endings", f"after {text!r} at turn {raw.state.turns} of {raw.max_turns}: terminated={terminated}, "
                            f"truncated={truncated}; truncated exactly when the budget runs out without an end state")
        action = tok.encode_action(text)
        ep.turns.append(new_turn(obs, tok.encode_observation(obs), action, [-1.0] * len(action), text, 0, reward,
                                 terminated, truncated, info, decision))
        obs = next_obs
        if terminated or truncated:
            break
    else:
        return fail("endings", f"an episode went past its budget of {raw.max_turns} turns without ending")
    check_observation(raw, obs, known, fail, facts)
    ep.final_obs_tokens = tok.encode_observation(obs)
    facts["tokens"] = max(facts["tokens"], sum(len(t.obs_tokens) + len(t.action_tokens) for t in ep.turns) +
                          len(ep.final_obs_tokens))
    check_verdict(env, ep, demo is not None, fail, facts)
    try:
        if split == "train" and all(0 <= t.reward <= 1 for t in ep.turns):  # the store takes training episodes only;
            TrajectoryStore(0, len(tok)).add(ep, 0)                            # a bad reward is said once, above
    except ValueError as e:
        fail("records", f"the store refuses its episode: {e}")
    return ep


def check_observation(raw, obs, known: set, fail, facts: dict):
    """The vocabulary and the clock, on one observation."""
    words = obs.split() if isinstance(obs, str) else []
    if not isinstance(obs, str) or obs not in raw.observation_space:
        return fail("clock", f"the observation {obs!r} is not in the observation space (text of envs.CHARSET, at "
                             "most 400 characters)")
    for w in words:
        if w not in known and w not in facts.setdefault("missing", set()):  # each missing word once
            facts["missing"].add(w)
            fail("vocabulary", f"the word {w!r} (in the observation {obs!r}) is not in {type(raw).__name__}.words: "
                               "add it (the policy would read <unk>)")
    left = raw.max_turns - raw.state.turns
    if raw.show_clock and words[-2:] != [str(left), "left"]:
        fail("clock", f"the observation {obs!r} does not end with the turns left ('{left} left'): return the text "
                      "from _tool_<name> and let the base append the clock")
    facts["longest"] = max(facts["longest"], (len(words), obs))


def check_verdict(env, ep: Episode, by_demonstrator: bool, fail, facts: dict):
    """The evaluator, on one finished episode: a Verdict, reached without calling reward()."""
    raw, calls = env.unwrapped, []
    raw.reward = lambda: calls.append(1) or 0.0  # an instance attribute: shadows the method until deleted
    try:
        verdict = type(raw).evaluate_episode(env)
    except Exception as e:
        return fail("evaluator", f"evaluate_episode raised {raised(e)}")
    finally:
        del raw.reward
    if calls:
        fail("evaluator", "evaluate_episode calls reward(): re-derive success from the final state with code of its "
                          "own, so that a bug in the verifier is not repeated by the judge")
    counts = [getattr(verdict, k, None) for k in ("side_effects", "unauthorized_side_effects", "repeated_side_effects")]
    if not isinstance(getattr(verdict, "success", None), bool) or not isinstance(getattr(verdict, "category", None), str) \
            or not all(type(c) is int and c >= 0 for c in counts):
        return fail("evaluator", f"evaluate_episode returned {verdict!r}: return envs.Verdict(success (a bool), "
                                 "side_effects, unauthorized_side_effects, repeated_side_effects (ints >= 0), category)")
    if by_demonstrator and verdict.success != (ep.reward >= 1):
        facts["disagree"].append(ep.task_id)


def replay_episode(cfg: Config, tok: Tokenizer, seed: int, split: str, ep: Episode, fail):
    """The same seed gives the same episode (the same calls, the same observations); its task_id, the same task."""
    try:
        env, gate, again, obs = start_episode(cfg, seed, split, "replay", 0, 0)
        seen = [obs] + [host_step(env, gate, turn.action_text)[0] for turn in ep.turns]
    except Exception as e:
        return fail("tasks", f"replaying seed {seed}'s episode raised {raised(e)}: the same calls must play the same")
    first = [t.observation for t in ep.turns]
    if again.task_id != ep.task_id or seen[:-1] != first:
        fail("tasks", f"seed {seed} gave two different episodes (task {ep.task_id}, then {again.task_id}; "
                      f"{first[:2]} vs {seen[:2]}): draw only from self.np_random and np.random.default_rng(task_id)")
    made = []  # the same task_id, made by two environments reset with two seeds: what a host sees of it must agree
    for other in (seed, seed + 1):
        raw = make_env(cfg).unwrapped
        raw.reset(seed=other)
        task = raw.make_task(ep.task_id)
        made.append((raw.prompt(task), raw.host_view(task), raw.split_of(task)))
    if made[0] != made[1]:
        fail("tasks", f"task_id {ep.task_id} was made twice as {made[0]} and {made[1]}: make_task and split_of must "
                      "be pure functions of task_id (draw from np.random.default_rng(task_id), never self.np_random)")


def require_contract(cfg: Config):
    """Before a model is built: a few episodes of check_contract; a broken environment stops here, each rule said."""
    failures, _ = check_contract(cfg, episodes=3)
    if failures:
        raise ValueError(f"env={cfg.env!r} breaks the environment contract (TextToolEnv's docstring; python "
                         f"agentic_rl.py check-env {cfg.env} checks it all):\n  " +
                         "\n  ".join(text for texts in failures.values() for text in texts))


def check_env_command(env: str, episodes: int = 200) -> bool:
    """check-env ENV: Gymnasium's check_env, then the chapter's environment contract by playing (check_contract:
    `episodes` episodes per split and actor), then what the demonstrator's episodes say of its habit and of the
    release gates. One line per rule, each failure a sentence naming the environment, the value and the fix; notes
    for what is allowed but will cost you. Returns whether every rule held."""
    from gymnasium.utils.env_checker import check_env
    cls = env_class(env)
    print(f"check-env {env}: {cls.__module__}.{cls.__name__} ({cls.env_version or '?'} / {cls.reward_version or '?'})")
    failures, facts, notes = {}, {}, []
    for rule, text in class_failures(cls):
        failures.setdefault(rule, []).append(f"{env}: {text}")
    if not failures:  # a block_size that fits the declared observations: check-env judges the environment alone
        cfg = validate_config(Config(env=env, block_size=max(Config.block_size, 2 * (cls.max_obs_words + 2) + 6)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check_env(make_env(cfg).unwrapped, skip_render_check=True)
            except Exception as e:
                failures["gymnasium"] = [f"{env}: gymnasium's check_env: {raised(e)}"]
        notes += [f"gymnasium: {w}" for w in dict.fromkeys(str(w.message) for w in caught)]
        more, facts = check_contract(cfg, episodes)
        failures.update(more)
    off, on = (facts.get("demonstrator", {}).get(habit) for habit in (0.0, 1.0))
    if off and on and off["wins"]:
        if off["success"] < 0.9:
            failures.setdefault("demonstrator", []).append(
                f"{env}: without its habit the demonstrator solves {off['success']:.3f} of train tasks ({off['truncated']} "
                f"of {off['episodes']} ran out of turns; the gate denied {off['denied']} of its calls): imitation starts "
                "from what it shows; make it solve nearly every task")
        if on["success"] >= off["success"] - 0.02:
            failures.setdefault("demonstrator", []).append(
                f"{env}: with its habit the demonstrator solves {on['success']:.3f}, without it {off['success']:.3f}: "
                "the habit costs nothing, so imitation copies nothing for RL to fix (or reward() pays for its mistakes)")
        for key in ("tool_calls_per_success", "tokens_per_success", "credits_per_success"):
            if on[key] and off[key] > (1 + MAX_COST_GROWTH) * on[key]:
                notes.append(f"without its habit the demonstrator spends {off[key]:.3g} {key.replace('_', ' ')}, with it "
                             f"{on[key]:.3g}: a policy that drops the habit may fail that release gate (at most "
                             f"{1 + MAX_COST_GROWTH:g} x the incumbent's); price the tools for what a call costs")
    if facts.get("longest") and cls.max_obs_words > 2 * facts["longest"][0] + 4:
        notes.append(f"max_obs_words {cls.max_obs_words} is far above the longest observation played ({facts['longest'][0]} "
                     "words): the host keeps that much room free in every context; lower it")
    if facts.get("tokens", 0) > Config.block_size:
        notes.append(f"an episode played here has {facts['tokens']} tokens, more than the default block_size "
                     f"{Config.block_size}: train with --block-size {facts['tokens']} or more")
    for rule, holds in {"gymnasium": "gymnasium's check_env", **CONTRACT}.items():
        for text in failures.get(rule, []) or [None]:
            print(f"  {'FAIL' if text else 'ok  '}  {text or holds}")
    for note in notes:
        print(f"  note  {note}")
    if off and on:
        print(f"demonstrator success on train tasks: habit 0 {off['success']:.3f}, habit 1 {on['success']:.3f}; the "
              f"evaluator and the reward disagree on {len(facts['disagree'])} of its episodes; the longest observation "
              f"has {facts['longest'][0]} words (max_obs_words {cls.max_obs_words})")
    print("all rules hold" if not failures else f"{sum(map(len, failures.values()))} failure(s)")
    return not failures


LENDING_DESK = Path(__file__).resolve().parent.parent / "library.py"  # the smallest complete environment, shipped


def new_env(name: str, out: str = ".") -> Path:
    """new-env NAME: write NAME.py, a copy of library.py (the lending desk) with its module and class renamed."""
    if not name.isidentifier() or not name.islower():
        raise ValueError(f"new-env {name!r}: a module name, lowercase letters, digits and _ (e.g. quote)")
    path, cls = Path(out) / f"{name}.py", "".join(w.capitalize() for w in name.split("_")).removesuffix("Env") + "Env"
    if path.exists():
        raise ValueError(f"new-env {name}: {path} exists; choose another name or move it away")
    if name in sys.modules or importlib.util.find_spec(name) is not None:  # `import NAME` would find that one
        raise ValueError(f"new-env {name}: a module named {name} is already importable here (`import {name}` would "
                         "find it, not your file); choose another name")
    text = LENDING_DESK.read_text().replace("library:LibraryEnv", f"{name}:{cls}")
    text = text.replace("LibraryEnv", cls).replace('"library-', f'"{name}-')
    writable_dir(out, "--out")
    atomic_write(path, lambda f: f.write(text.encode()))
    print(f"wrote {path}: class {cls}, a copy of the lending desk (library.py) to make your own. Next: python "
          f"agentic_rl.py check-env {name}:{cls}, then python agentic_rl.py train --env {name}:{cls}")
    return path


# --- Their commands: python agentic_rl.py check-env ENV [--episodes N], new-env NAME [--out DIR] ------------------
def add_arguments(command: str, parser):
    if command == "check-env":
        parser.add_argument("env", help="a gymnasium id (AgenticRL/Vault-v0) or MODULE:CLASS (my_env:QuoteEnv)")
        parser.add_argument("--episodes", type=int, default=200, help="episodes per split and actor (default 200)")
    else:
        parser.add_argument("name", help="the module's name (NAME.py; the class is its CamelCase + Env)")
        parser.add_argument("--out", default=".", help="the folder to write it in (default: here)")


def prepare(command: str, args):
    if command == "check-env" and not 1 <= args.episodes <= 10**4:
        raise ValueError(f"--episodes {args.episodes}: must be in [1, 10000]")


def run(command: str, args, ready):
    if command == "check-env":
        sys.exit(0 if check_env_command(args.env, args.episodes) else 1)
    new_env(args.name, args.out)
