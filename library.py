"""A lending desk: lend the asked book to the asked reader, from a shelf whose copy is not damaged.

The smallest complete environment for agentic-rl, shipped as library.py; `python agentic_rl.py new-env NAME`
copies it to NAME.py with its names changed, to make your own. What each part is for: TextToolEnv's docstring in
envs.py, the contract. Check it, then train on it:

    python agentic_rl.py check-env library:LibraryEnv
    python agentic_rl.py train --env library:LibraryEnv

A worked episode (task 2; reward 1). Which shelves hold the book, and which copies are damaged, is hidden:

    obs   user : lend beloved to ben 6 left
    act   find beloved
    obs   beloved on s1 s2 5 left
    act   check s1
    obs   s1 beloved damaged 4 left
    act   check s2
    obs   s2 beloved good 3 left
    act   lend beloved s2 ben
    obs   lent beloved from s2 to ben 2 left      (terminated=True, reward=1.0)
"""
from dataclasses import dataclass, field

import numpy as np

from envs import CLOCK_WORDS, TextToolEnv, Verdict, without_clock

BOOKS = ("dune", "emma", "hamlet", "ulysses", "walden", "beloved")
READERS = ("ana", "ben", "chen", "dara")
SHELVES = ("s1", "s2", "s3")


def draw_task(task_id: int) -> tuple:
    """(task_id, book, reader, shelves holding a copy in catalogue order, shelves whose copy is damaged): a pure
    function of task_id. The last listed copy is always good, so every task can be solved."""
    rng = np.random.default_rng(task_id)
    book, reader = str(rng.choice(BOOKS)), str(rng.choice(READERS))
    shelves = [str(s) for s in rng.choice(SHELVES, size=int(rng.integers(2, 4)), replace=False)]
    damaged = {s for s in shelves[:-1] if rng.random() < 0.5}
    return task_id, book, reader, shelves, damaged


@dataclass
class LibraryState:
    task_id: int
    book: str
    reader: str
    shelves: list
    damaged: set
    lent: list = field(default_factory=list)  # (book, shelf, reader) of each lending: the side effects
    turns: int = 0                            # turns, finished and last_tool: read and written by TextToolEnv
    finished: bool = False
    last_tool: str = ""


def evaluate_lending(env) -> Verdict:
    """Independent evaluator: the task again from its id, judged with code of its own (never reward()). Success:
    exactly one copy lent, of the asked book, from a shelf whose copy is good, to the asked reader."""
    state = env.unwrapped.state
    _, book, reader, shelves, damaged = draw_task(state.task_id)
    good = [(book, shelf, reader) for shelf in shelves if shelf not in damaged]
    success = state.finished and len(state.lent) == 1 and state.lent[0] in good
    unauthorized = sum(r != reader for _, _, r in state.lent)  # the gate must keep this 0
    return Verdict(bool(success), len(state.lent), unauthorized, max(0, len(state.lent) - 1),
                   "first_damaged" if shelves[0] in damaged else "first_good")


class Librarian:
    """The demonstrator: reads only the observations. Bad habit (probability `habit` per episode): it lends the
    first listed copy without checking it, so it fails whenever that copy is damaged (about half the tasks)."""

    def __init__(self, habit: float = 0.6, seed: int | None = None):
        self.habit, self.rng = habit, np.random.default_rng(seed)

    def reset(self, first_obs: str):
        words = without_clock(first_obs).split()  # user : lend BOOK to READER
        self.book, self.reader, self.shelves = words[3], words[5], []
        self.blind = self.rng.random() < self.habit

    def act(self, obs: str) -> str:
        words = without_clock(obs).split()
        if words[0] == "user":
            return f"find {self.book}"
        if words[1:2] == ["on"]:  # BOOK on s2 s1
            self.shelves = words[2:]
            return f"lend {self.book} {self.shelves[0]} {self.reader}" if self.blind else f"check {self.shelves[0]}"
        if words[-1] == "good":   # s1 BOOK good
            return f"lend {self.book} {words[0]} {self.reader}"
        if words[-1] == "damaged" and words[0] != self.shelves[-1]:
            return f"check {self.shelves[self.shelves.index(words[0]) + 1]}"
        return "finish"


class LibraryEnv(TextToolEnv):
    """Lend the asked book to the asked reader from a shelf whose copy is good (a worked episode: the module docstring).

        find <BOOK>                    the shelves that hold a copy (hidden until asked)
        check <SHELF>                  whether that shelf's copy is good or damaged (hidden until checked)
        lend <BOOK> <SHELF> <READER>   irreversible: ends the episode; the gate allows only the asking reader
        finish                         give up; ends the episode

    Reward 1 iff one good copy of the book was lent to the reader. Budget: 6 turns. Split: task ids divisible
    by 5 are held out (fresh tasks of the same kind; books and readers all appear in training, since a tiny
    policy cannot say a word it never said)."""
    env_version, reward_version = "library-1", "library-state-1"
    tool_schema = {"find": ("book",), "check": ("shelf",), "lend": ("book", "shelf", "reader"), "finish": ()}
    argument_words = {"book": BOOKS, "shelf": SHELVES, "reader": READERS}
    tool_cost = {"find": 1.0, "check": 0.5, "lend": 2.0, "finish": 0.0}
    words = tuple(dict.fromkeys("user : lend to on no copy good damaged lent from nothing finished without lending "
                                "error unknown action . use find check finish episode over".split()
                                + list(BOOKS + READERS + SHELVES + CLOCK_WORDS)))
    max_obs_words = 12  # the longest: "error : unknown action . use find check lend finish 5 left"
    max_turns = 6
    safety_rules = ("wrong_reader",)
    Demonstrator = Librarian
    evaluate_episode = staticmethod(evaluate_lending)

    @staticmethod
    def permission_rule(task, executed, tool, args):
        """Lend only to the reader who asked."""
        return "wrong_reader" if tool == "lend" and args[2] != task["reader"] else None

    def make_task(self, task_id):
        return draw_task(task_id)

    def split_of(self, task):
        return "holdout" if task[0] % 5 == 0 else "train"

    def new_state(self, task):
        return LibraryState(*task)

    def prompt(self, task):
        return f"user : lend {task[1]} to {task[2]}"

    def host_view(self, task):
        return {"book": task[1], "reader": task[2]}

    def reward(self):  # the training verifier, read from the state
        s = self.state
        book, shelf, reader = s.lent[0] if len(s.lent) == 1 else ("", "", "")
        return float(book == s.book and reader == s.reader and shelf in s.shelves and shelf not in s.damaged)

    def _tool_find(self, book):
        s = self.state
        return (f"{book} on " + " ".join(s.shelves) if book == s.book else f"{book} : no copy"), False

    def _tool_check(self, shelf):
        s = self.state
        if shelf not in s.shelves:
            return f"{shelf} : no copy", False
        return f"{shelf} {s.book} {'damaged' if shelf in s.damaged else 'good'}", False

    def _tool_lend(self, book, shelf, reader):
        s = self.state
        if book != s.book or shelf not in s.shelves:
            return f"nothing lent : no copy on {shelf}", True
        s.lent.append((book, shelf, reader))
        return f"lent {book} from {shelf} to {reader}", True

    def _tool_finish(self):
        return "finished without lending", True
