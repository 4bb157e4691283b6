"""bench: speed and memory, printed and written to OUT/bench.json; timed here, never inside tests.

    python agentic_rl.py bench [--device cuda] [--quick]

Decoding with the KV cache against full recompute (the two must decode the same tokens), PPO steps on packed
episodes in both views (concat, per_call), and a reference unit at the sizes the peers' figures were measured at.
"""
import json
import time
from pathlib import Path

import torch

from agentic_rl import (GPT, Config, add_config_flags, atomic_write, demonstration_episodes, make_policy, make_tokenizer, pack,
                        pack_per_call, ppo_clip_loss, resolve_device, token_logprobs, trim, writable_dir)


def bench(device: str = "cpu", quick: bool = False, out: str = "runs/bench") -> dict:
    """Speed and memory, printed and in OUT/bench.json (timed here, never in tests): decoding with the KV cache and by
    full recompute, PPO steps on packed episodes, and the reference unit the peers were measured on."""
    import resource
    dev, reps = resolve_device(device), 3 if quick else 20
    writable_dir(out, "--out")  # fail now, not after a minute of timing
    cfg = Config(device=device)
    tok = make_tokenizer(cfg.env)
    policy = make_policy(cfg, len(tok), dev).eval()
    B, P, N = (8, 8, 8) if quick else (cfg.tasks_per_iter * cfg.group_size, 20, 60)
    prompt = torch.randint(5, len(tok), (B, P), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda: None

    def timed(fn, n=1):
        fn()  # warm-up
        sync()
        t = time.perf_counter()
        for _ in range(n):
            result = fn()
        sync()
        return result, (time.perf_counter() - t) / n

    @torch.no_grad()
    def decode(use_cache: bool):
        seq, cache = prompt, policy.new_cache()
        if use_cache:
            policy(prompt[:, :-1], cache=cache)                              # prefill all but the last prompt token
        for pos in range(P - 1, P + N - 1):
            logits = policy(seq[:, pos:pos + 1], cache=cache, pos=pos)[0] if use_cache else policy(seq)[0]
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
        return seq
    with_cache, t_cache = timed(lambda: decode(True))
    recomputed, t_full = timed(lambda: decode(False))
    assert torch.equal(with_cache, recomputed), "the KV cache must decode exactly what full recompute decodes"

    def learner_step(model, opt, tokens):
        logp, _ = token_logprobs(model(tokens)[0], tokens)
        loss, _ = ppo_clip_loss(logp, logp.detach() - 0.01, torch.randn_like(logp), torch.ones_like(logp))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    demos = demonstration_episodes(cfg, tok, 8 if quick else cfg.minibatch_size, seed=1)
    views, opt = {}, torch.optim.AdamW(policy.parameters(), lr=1e-4)
    for view, rows in (("concat", pack(demos, tok, cfg.block_size)), ("per_call", pack_per_call(demos, tok, cfg.block_size))):
        tokens = trim(rows["tokens"], rows["action_mask"])[0].to(dev)  # concat: one row per episode
        _, t_learn = timed(lambda: learner_step(policy.train(), opt, tokens), reps)
        views[view] = {"rows": len(tokens), "tokens_per_episode": round(float((rows["last_pos"] + 1).sum()) / len(demos), 1),
                       "tokens_per_step": int(tokens.numel()), "ms_per_step": round(1000 * t_learn, 2)}
    t_learn = views["concat"]["ms_per_step"] / 1000
    unit = GPT(146, 64, n_layer=2, n_head=4, n_embd=72).to(dev)  # the sizes the peer figures were measured at
    unit_opt, unit_tokens = torch.optim.AdamW(unit.parameters(), lr=1e-4), torch.randint(0, 146, (64, 46), device=dev)
    _, t_unit = timed(lambda: learner_step(unit, unit_opt, unit_tokens), reps)
    peers = {"TRL 1.16 GRPOTrainer, reference unit, this 2-core CPU":
             "73 ms/step (61 ms without gradient checkpointing)",
             "Hugging Face generate, this 2-core CPU": "18.5k generated tokens/s"}
    report = {"device": str(dev), "threads": torch.get_num_threads(), "quick": quick,
              "rollout": {"batch": B, "prompt_tokens": P, "generated_tokens": N,
                          "kv_cache_tokens_per_s": round(B * (P + N) / t_cache), "full_recompute_tokens_per_s":
                          round(B * (P + N) / t_full), "kv_cache_speedup": round(t_full / t_cache, 2)},
              "learner": {**views["concat"], "tokens_per_s": round(views["concat"]["tokens_per_step"] / t_learn)},
              "views": views,
              "reference_unit": {"parameters": sum(p.numel() for p in unit.parameters()), "shape": [64, 46],
                                 "ms_per_step": round(1000 * t_unit, 2), "peers": peers},
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "cuda_max_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if dev.type == "cuda" else None}
    atomic_write(Path(out) / "bench.json", lambda f: f.write(json.dumps(report, indent=2).encode()))
    r, v = report["rollout"], views["concat"]  # per view and the peers' figures: bench.json
    print(f"device {dev}, {report['threads']} threads{' (quick: tiny sizes, not figures to quote)' if quick else ''}\n"
          f"rollout {r['kv_cache_tokens_per_s']:,} tokens/s with the KV cache (x{r['kv_cache_speedup']} over full "
          f"recompute); learner {v['ms_per_step']} ms per PPO step of {v['tokens_per_step']:,} tokens; reference unit "
          f"{report['reference_unit']['ms_per_step']} ms; peak RSS {report['peak_rss_mb']} MB; wrote {Path(out) / 'bench.json'}")
    return report


# --- Its command: python agentic_rl.py bench [--quick] [--device cuda] ----------------------------------------------
def add_arguments(command: str, parser):
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds (a smoke test, not figures)")
    parser.add_argument("--out", default="runs/bench", help="where bench.json goes (default runs/bench)")
    add_config_flags(parser, only=("device",))


def run(command: str, args, ready):
    bench(args.device, args.quick, args.out)
