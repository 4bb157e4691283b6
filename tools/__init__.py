"""The tools around the lesson: agentic_rl.py's command line imports each one when its command runs, and
nothing in the lesson imports them (envs.py <- envload.py <- agentic_rl.py <- tools <- course/).

    envcheck   check-env, new-env: the environment contract checked by playing; the lending desk copied
    envcalls   calling an environment's code for envcheck: each call under a time limit; fresh-process episodes
    views      show, play, and the pages: report.html, compare.html, examples --html
    examples   the chapter's worked examples, computed by the functions training uses
    compare    every route from one warm start, on the same held-out tasks
    bench      speed and memory
    meeting    not a tool: a meeting scheduler with two gate rules, an environment of one's own (README)
Their tests live beside them (test_tools.py).
"""
