"""compare: every route (grpo, stepgroup, gae, reinforce, rs_sft, dpo) from one warm start per seed, with the
same environment-episode budget, judged on the same held-out test tasks -> compare.json and compare.html.

    python agentic_rl.py compare --seeds 0,1,2 [--algos grpo,dpo] [--iterations 30]
"""
import copy
import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from agentic_rl import (CHOICES, ONLY_FOR, GradMonitor, TrajectoryStore, Config, add_config_flags, atomic_write, collect, evaluate, learn, make_policy,
                        make_tokenizer, resolve_device, seed_everything, validate_config, warm_start, writable_dir)
from tools.envcheck import require_contract
from tools.views import write_compare


def compare(cfg: Config, seeds, algos, out: str = "runs/compare", progress: bool = True) -> dict:
    """Every route from one warm start per seed, the same episode budget, judged on the same held-out test tasks."""
    device, runs = resolve_device(cfg.device), {"warm start": []} | {a: [] for a in algos}  # (seed, report, s, history)
    writable_dir(out, "--out")
    for seed in seeds:
        base = route_config(replace(cfg, seed=seed), "grpo")
        require_contract(base)
        seed_everything(seed)
        tok = make_tokenizer(base.env)
        policy, t = make_policy(base, len(tok), device), time.time()
        warm_start(policy, tok, base, device, progress)
        warm_seconds, warm = time.time() - t, copy.deepcopy(policy.state_dict())
        runs["warm start"].append((seed, evaluate(policy, tok, base, "test"), warm_seconds, []))
        for algo in algos:
            run_cfg = route_config(base, algo)
            seed_everything(seed)            # every route starts from the same weights and the same random state
            policy.load_state_dict(warm)
            optimizer = torch.optim.AdamW(policy.parameters(), lr=run_cfg.lr, weight_decay=0.0)
            ref = copy.deepcopy(policy).eval() if algo == "dpo" or run_cfg.kl_coef > 0 else None
            store, grads, history, t = TrajectoryStore(run_cfg.max_staleness, len(tok)), GradMonitor(), [], time.time()
            for it in tqdm(range(run_cfg.iterations), desc=f"seed {seed} {algo}", disable=not progress, leave=False):
                history.append(learn(policy, optimizer, ref, tok, run_cfg, store, grads,
                                     collect(policy, tok, run_cfg, it, it), it))
            runs[algo].append((seed, evaluate(policy, tok, run_cfg, "test"), time.time() - t, history))
    per_route, k = {}, f"pass^{cfg.pass_k}"
    for route, rs in runs.items():
        start_only, success = route == "warm start", [r["success"] for _, r, _, _ in rs]
        curves = [[round(m["success"], 4) for m in h] for *_, h in rs]
        per_seed = [{"seed": seed, "success": r["success"], "ci95": r["ci95"], "pass^k": r[k],
                     "first_at_0.9": next((i for i, x in enumerate(curve) if x >= 0.9), None),
                     "test_truncation": r["truncation_rate"], "train_truncation": None if start_only else
                     round(float(np.mean([m["truncation_rate"] for m in h])), 4),
                     "explained_variance": h[-1]["explained_variance"] if h else None}
                    for (seed, r, _, h), curve in zip(rs, curves)]
        per_route[route] = {"test_success_mean": round(float(np.mean(success)), 4), "min": min(success), "max": max(success),
                            "per_seed": per_seed, "pass^k_mean": round(float(np.mean([r[k] for _, r, _, _ in rs])), 4),
                            "env_episodes": 0 if start_only else cfg.iterations * cfg.tasks_per_iter * cfg.group_size,
                            "wall_seconds_mean": round(float(np.mean([s for _, _, s, _ in rs])), 1),
                            **{key: int(np.mean([sum(m[key] for m in h) for *_, h in rs]))
                               for key in ("generated_tokens", "tool_calls", "learner_steps")}, "curves": curves}
    result = {"env": cfg.env, "seeds": list(seeds), "iterations": cfg.iterations, "episodes_per_iteration":
              cfg.tasks_per_iter * cfg.group_size, "eval_episodes": cfg.eval_episodes, "part": "test",
              "routes": per_route, "config": asdict(cfg)}
    atomic_write(Path(out) / "compare.json", lambda f: f.write(json.dumps(result, indent=2).encode()))
    print(f"\n{cfg.env}: held-out test success over seeds {list(seeds)}, {cfg.eval_episodes} tasks each; every route "
          f"spends {cfg.iterations} x {cfg.tasks_per_iter * cfg.group_size} environment episodes")
    for route, r in per_route.items():  # the rest of each route's figures: compare.json and compare.html
        print(f"  {route:<11} mean {r['test_success_mean']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}), "
              f"pass^{cfg.pass_k} {r['pass^k_mean']:.3f}, {r['wall_seconds_mean']:.1f} s")
    print(f"wrote {Path(out) / 'compare.json'} and {write_compare(Path(out) / 'compare.html', result)}")
    return result


def route_config(cfg: Config, algo: str) -> Config:
    """cfg as one route runs it: a setting only some routes use (ONLY_FOR) is set back to its default on the
    others, so `compare --deny-credit shared` changes the PPO credits and runs rs_sft and dpo as they are."""
    unused = {name: getattr(Config, name) for name, (key, needed) in ONLY_FOR.items() if algo not in needed}
    return validate_config(replace(cfg, algo=algo, **unused))


# --- Its command: python agentic_rl.py compare [--seeds 0,1,2] [--algos grpo,dpo] [Config flags] ------------------
def add_arguments(command: str, parser):
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--algos", default=",".join(CHOICES["algo"]), help="comma-separated routes (default: all)")
    parser.add_argument("--out", default="runs/compare", help="where compare.json goes (default runs/compare)")
    add_config_flags(parser, only=[f.name for f in fields(Config) if f.name not in
                                   ("algo", "seed", "run_dir", "overwrite", "resume", "async_rollout")])


def prepare(command: str, args) -> tuple:
    """The flags checked before anything runs -> (cfg, seeds, algos)."""
    cfg = Config(**{f.name: getattr(args, f.name) for f in fields(Config) if hasattr(args, f.name)})
    seeds, algos = [int(x) for x in args.seeds.split(",") if x.strip().isdigit()], args.algos.split(",")
    if len(seeds) != len(args.seeds.split(",")):
        raise ValueError(f"--seeds {args.seeds}: use comma-separated whole numbers, e.g. 0,1,2")
    if not set(algos) <= set(CHOICES["algo"]) or not algos:
        raise ValueError(f"--algos {args.algos}: use some of {', '.join(CHOICES['algo'])}")
    for flag, values in (("--seeds", seeds), ("--algos", algos)):
        if len(set(values)) != len(values):  # a repeated seed would count one run twice as evidence
            raise ValueError(f"{flag} {','.join(map(str, values))}: each value once")
    for name, (key, needed) in ONLY_FOR.items():  # a setting only some routes use: said, and refused if none does
        users, value = [a for a in algos if a in needed], getattr(cfg, name)
        if value != getattr(Config, name) and not users:
            raise ValueError(f"{name}={value}: only used with {key} in {'/'.join(needed)}; drop it or add one of "
                             f"them to --algos")
        if value != getattr(Config, name) and len(users) < len(algos):
            print(f"note: {name}={value} applies to {', '.join(users)}; the other routes run without it")
    for algo in algos:                            # every route's settings checked before anything runs
        route_config(cfg, algo)
    return cfg, seeds, algos


def run(command: str, args, ready):
    compare(*ready, args.out)
