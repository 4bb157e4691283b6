"""Bundled text environments for agentic-rl: the course chapter's flight-booking agent.

`AgenticRL/FlightBooking-v0` is a real `gymnasium.Env` with text observation and action spaces,
registered on `import envs`. It knows nothing about the learner (this file never imports
`agentic_rl`): it exposes its words, a scripted demonstrator and an independent evaluator.

The task (seed chapter 第 20 章: "帮我订一张明天北京到上海最便宜的早班机票"): book the cheapest
*morning* flight from city A to city B for a named passenger in a given class. It is a POMDP:
the flight table, the departure times and the seat counts live in the environment; the agent sees
only what its tools return. The tools do the computing, the agent orchestrates:

    search <FROM> <TO>               list tomorrow's flights on the route (number, hour, price)
    filter morning                   keep flights leaving 06h-11h, sorted cheapest first
    seats <FLIGHT>                   seats left for the passenger's class (hidden until checked)
    book <FLIGHT> <PASSENGER> <CLASS>  side effect; ends the episode (booked, or waitlisted if sold out)
    finish                           declare the task done without booking; ends the episode

One word per token: flight numbers are F1..F9, cities are three-letter codes, names and classes come
from fixed word lists (`WORDS` holds every word an observation or a valid action can contain).

A worked episode (task where the cheapest morning flight is sold out; reward 1):

    obs   user : book the cheapest morning flight from OSL to ROM for ana in economy
    act   search OSL ROM
    obs   found F4 07h 260 F2 09h 180 F7 10h 230 F1 14h 120 F5 19h 150
    act   filter morning
    obs   ana economy morning by price : F2 F7 F4
    act   seats F2
    obs   ana economy F2 : sold out next F7
    act   seats F7
    obs   ana economy F7 : 3 seats
    act   book F7 ana economy
    obs   booked F7 ana economy        (terminated=True, reward=1.0)

Booking F2 without checking would have written a waitlist entry and ended with reward 0; booking
F1 (cheapest overall, but an afternoon flight) is a wrong booking, also 0. Result pages start with
the booking header (traveller, class), as booking sites do: a tiny transformer trained from scratch
copies words reliably from nearby context, much less so from the first line of a long episode. In about 15 % of tasks
no morning flight has seats: the right move is then to check and say `finish` (reward 1).

Rules every environment here follows (Gymnasium's contract, see shared/reference/envs.md §2):
- `reset(seed, options={"split": "train"|"holdout", "task_id": k})` -> (obs, info) with `task_id`,
  `env_version`, `split` and `task` (the structured request the host knows: from, to, passenger,
  class). Task content is a pure function of `task_id`; the same seed gives the same task.
- Split rule: an ordered city pair (a, b), by index in `CITIES`, is held out iff (3a + b) % 5 == 0
  (11 of the 56 pairs). Train and holdout tasks therefore never share a route, while every city still
  appears in training as an origin and as a destination.
- `terminated` when the agent books or says `finish`; `truncated` when `max_turns` actions have been
  taken without that. A malformed action never raises: error observation, reward 0, `invalid=True`.
- Reward 1.0 only when the environment's own state holds exactly the correct booking (or, for a task
  with no seats, no booking and a `finish`). `evaluate_flight_episode` re-derives that verdict with
  separate code so that the evaluation never trusts the training reward.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "AgenticRL/FlightBooking-v0"
ENV_VERSION = "flight-1"  # bump whenever task generation, tools or reward change
REWARD_VERSION = "flight-state-1"

CITIES = ("OSL", "ROM", "PAR", "BER", "MAD", "LIS", "VIE", "ATH")
PASSENGERS = ("ana", "ben", "chen", "dara", "eli", "fay", "gus", "hana")
CLASSES = ("economy", "business")
FLIGHT_NUMBERS = tuple(f"F{i}" for i in range(1, 10))
MORNING_HOURS = tuple(f"{h:02d}h" for h in range(6, 12))        # 06h..11h
LATER_HOURS = tuple(f"{h:02d}h" for h in range(12, 23))         # 12h..22h
PRICES = tuple(str(p) for p in range(100, 500, 10))             # one fare word per flight
SEAT_COUNTS = tuple(str(n) for n in range(1, 5))
TIME_WINDOWS = ("morning", "afternoon", "evening")
TOOLS = ("search", "filter", "seats", "book", "finish")
# tool -> kinds of its arguments, in order (the host gate and the parser both read this schema)
TOOL_SCHEMA = {
    "search": ("city", "city"),
    "filter": ("window",),
    "seats": ("flight",),
    "book": ("flight", "passenger", "class"),
    "finish": (),
}
ARGUMENT_WORDS = {"city": CITIES, "window": TIME_WINDOWS, "flight": FLIGHT_NUMBERS,
                  "passenger": PASSENGERS, "class": CLASSES}
TOOL_COST = {"search": 1.0, "filter": 0.2, "seats": 0.5, "book": 2.0, "finish": 0.0}  # simulated credits
FIXED_WORDS = ("user", ":", "book", "the", "cheapest", "morning", "flight", "from", "to", "for", "in",
               "found", "no", "flights", "by", "price", "seats", "sold", "out", "booked", "waitlisted",
               "error", "unknown", "action", "use", "search", "filter", "finish", "first", "finished",
               "without", "booking", "episode", "over", "afternoon", "evening", "next", "none", "left")
WORDS = tuple(dict.fromkeys(FIXED_WORDS + CITIES + PASSENGERS + CLASSES + FLIGHT_NUMBERS + MORNING_HOURS
                            + LATER_HOURS + PRICES + SEAT_COUNTS + TIME_WINDOWS + TOOLS))

# Gymnasium's default Text charset has no space and min_length defaults to 1: spell both out.
CHARSET = string.ascii_letters + string.digits + " :;.,_-"
NO_SEATS_PROB = 0.15      # share of tasks where every morning flight is sold out in the asked class
SOLD_OUT_PROB = 0.4       # otherwise, each morning flight is sold out with this probability


def split_of(origin: str, dest: str) -> str:
    """Held-out routes: ordered pairs (a, b) with (3a + b) % 5 == 0, by index in CITIES."""
    a, b = CITIES.index(origin), CITIES.index(dest)
    return "holdout" if (3 * a + b) % 5 == 0 else "train"


@dataclass
class Flight:
    number: str
    hour: str
    price: int
    seats: int  # seats left in the task's class; 0 = sold out


@dataclass
class FlightTask:
    task_id: int
    origin: str
    dest: str
    passenger: str
    travel_class: str
    flights: list  # list[Flight], in departure order

    def as_host_dict(self) -> dict:
        """What the host (gate, evaluator) knows of the request: the user's words, not the answer."""
        return {"from": self.origin, "to": self.dest, "passenger": self.passenger, "class": self.travel_class}


def make_task(task_id: int) -> FlightTask:
    """Task content is a pure function of task_id (its own RNG), so a task can be replayed anywhere."""
    rng = np.random.default_rng(task_id)
    a, b = rng.choice(len(CITIES), size=2, replace=False)
    n_flights, n_morning = int(rng.integers(4, 7)), int(rng.integers(2, 4))
    numbers = rng.choice(FLIGHT_NUMBERS, size=n_flights, replace=False)
    hours = sorted(rng.choice(MORNING_HOURS, size=n_morning, replace=False)) + \
        sorted(rng.choice(LATER_HOURS, size=n_flights - n_morning, replace=False))
    prices = rng.choice(np.arange(100, 500, 10), size=n_flights, replace=False)
    seats = rng.integers(1, 5, size=n_flights)
    if rng.random() < NO_SEATS_PROB:
        seats[:n_morning] = 0
    else:
        sold_out = rng.random(n_morning) < SOLD_OUT_PROB
        if sold_out.all():  # this branch promises at least one morning seat
            sold_out[rng.integers(n_morning)] = False
        seats[:n_morning][sold_out] = 0
    flights = [Flight(str(n), str(h), int(p), int(s)) for n, h, p, s in zip(numbers, hours, prices, seats)]
    return FlightTask(task_id, CITIES[a], CITIES[b], str(rng.choice(PASSENGERS)),
                      str(rng.choice(CLASSES)), flights)


def parse_action(text: str):
    """'book F2 ana economy' -> ('book', ['F2', 'ana', 'economy']); None if it breaks the schema."""
    words = text.split() if isinstance(text, str) else []
    if not words or words[0] not in TOOL_SCHEMA:
        return None
    tool, args = words[0], words[1:]
    kinds = TOOL_SCHEMA[tool]
    if len(args) != len(kinds) or any(a not in ARGUMENT_WORDS[k] for a, k in zip(args, kinds)):
        return None
    return tool, args


@dataclass
class FlightState:
    """Everything the environment knows; the agent sees none of it directly."""
    task: FlightTask
    turns: int = 0
    listed: list = field(default_factory=list)    # last search result (flight numbers)
    bookings: list = field(default_factory=list)  # (flight, passenger, class) executed bookings
    waitlist: list = field(default_factory=list)  # bookings attempted on a sold-out flight
    finished: bool = False                         # the agent ended the episode (book or finish)
    expected: list = field(default_factory=list)  # the correct bookings, fixed at reset (the verifier's key)


class FlightBookingEnv(gym.Env):
    """Book the cheapest morning flight with seats; see the module docstring for a worked episode."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, max_turns: int = 8, render_mode: str | None = None):
        if max_turns < 2:
            raise ValueError(f"max_turns={max_turns}: needs at least 2 (search ... book); use 8")
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=400, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=64, min_length=0, charset=CHARSET)
        self.state: FlightState | None = None
        self.host_task: dict | None = None
        self._last_obs = ""

    # -- reset / step (the Gymnasium contract) ---------------------------------------------
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        split = options.get("split", "train")
        if split not in ("train", "holdout"):
            raise ValueError(f"options['split']={split!r}: use 'train' or 'holdout'")
        task_id = options.get("task_id")
        if task_id is None:  # rejection-sample a task id from the requested split
            while True:
                task_id = int(self.np_random.integers(0, 1_000_000))
                task = make_task(task_id)
                if split_of(task.origin, task.dest) == split:
                    break
        task = make_task(int(task_id))
        morning = [f for f in task.flights if f.hour in MORNING_HOURS and f.seats > 0]
        best = min(morning, key=lambda f: f.price) if morning else None
        self.state = FlightState(task=task, expected=[(best.number, task.passenger, task.travel_class)] if best else [])
        self.host_task = task.as_host_dict()  # what a host gate may read; the answer is not in it
        t = task
        obs = (f"user : book the cheapest morning flight from {t.origin} to {t.dest} "
               f"for {t.passenger} in {t.travel_class}")
        self._last_obs = obs
        info = {"task_id": t.task_id, "env_version": ENV_VERSION, "reward_version": REWARD_VERSION,
                "split": split_of(t.origin, t.dest), "task": t.as_host_dict(), "max_turns": self.max_turns}
        return obs, info

    def step(self, action):
        if self.state is None:
            raise RuntimeError("step() before reset(): call env.reset(seed=...) first")
        s = self.state
        if s.finished:  # stepping a finished episode is the caller's bug, but we never raise mid-rollout
            return self._result("error : episode over", 0.0, True, False, "none", invalid=True)
        s.turns += 1
        parsed = parse_action(action)
        if parsed is None:
            obs = "error : unknown action . use search filter seats book finish"
            return self._result(obs, 0.0, False, s.turns >= self.max_turns, "none", invalid=True)
        tool, args = parsed
        obs, terminated = getattr(self, f"_tool_{tool}")(*args)
        reward = self._reward() if terminated else 0.0
        truncated = (not terminated) and s.turns >= self.max_turns
        return self._result(obs, reward, terminated, truncated, tool, invalid=False)

    def _result(self, obs, reward, terminated, truncated, tool, invalid):
        self._last_obs = obs
        info = {"receipt": {"tool": tool, "turn": self.state.turns, "result": obs},
                "cost": TOOL_COST.get(tool, 0.0), "invalid": invalid}
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self):
        return self._last_obs if self.render_mode == "ansi" else None

    # -- tools: the environment computes, the agent orchestrates --------------------------
    def _flight(self, number):
        return next((f for f in self.state.task.flights if f.number == number), None)

    def _tool_search(self, origin, dest):
        t = self.state.task
        if (origin, dest) != (t.origin, t.dest):
            self.state.listed = []
            return f"found no flights from {origin} to {dest}", False
        self.state.listed = [f.number for f in t.flights]
        return "found " + " ".join(f"{f.number} {f.hour} {f.price}" for f in t.flights), False

    def _tool_filter(self, window):
        if not self.state.listed:
            return "error : search first", False
        hours = {"morning": MORNING_HOURS, "afternoon": LATER_HOURS[:6], "evening": LATER_HOURS[6:]}[window]
        kept = sorted((self._flight(n) for n in self.state.listed if self._flight(n).hour in hours),
                      key=lambda f: f.price)
        t = self.state.task  # result pages carry the booking header (traveller, class), as booking sites do
        if not kept:
            return f"{t.passenger} {t.travel_class} no {window} flights", False
        return f"{t.passenger} {t.travel_class} {window} by price : " + " ".join(f.number for f in kept), False

    def _tool_seats(self, number):
        f = self._flight(number)
        if f is None:
            return f"error : no flight {number}", False
        t = self.state.task
        head = f"{t.passenger} {t.travel_class} {number} :"
        if f.seats:
            return f"{head} {f.seats} seats", False
        if f.hour not in MORNING_HOURS:
            return f"{head} sold out", False
        # like a booking site, a sold-out morning flight comes with the next cheapest morning option
        morning = sorted((g for g in t.flights if g.hour in MORNING_HOURS), key=lambda g: g.price)
        later = morning[morning.index(f) + 1:]
        return f"{head} sold out " + (f"next {later[0].number}" if later else "none left"), False

    def _tool_book(self, number, passenger, travel_class):
        f = self._flight(number)
        if f is None:
            return f"error : no flight {number}", False
        self.state.finished = True
        # seats are tracked for the requested class only; another class is booked (and is wrong)
        if f.seats == 0 and travel_class == self.state.task.travel_class:
            self.state.waitlist.append((number, passenger, travel_class))  # a side effect, but no seat
            return f"waitlisted {number} {passenger} {travel_class} : sold out", True
        if travel_class == self.state.task.travel_class:
            f.seats -= 1
        self.state.bookings.append((number, passenger, travel_class))
        return f"booked {number} {passenger} {travel_class}", True

    def _tool_finish(self):
        self.state.finished = True
        return "finished without booking" if not self.state.bookings else "finished", True

    # -- the training reward (verifier): read the environment's own state -----------------
    def _reward(self) -> float:
        s = self.state
        return float(s.finished and s.bookings == s.expected and not s.waitlist)


gym.register(id=ENV_ID, entry_point=FlightBookingEnv, kwargs={"max_turns": 8})


# ----------------------------------------------------------------------------------------------
# Independent evaluator: a separate implementation of "was the job done", from the final state.
# ----------------------------------------------------------------------------------------------
def evaluate_flight_episode(env) -> bool:
    """True iff the final state holds exactly the right outcome. Does not call the reward function.

    Recomputes the answer from a fresh copy of the task (seats as at reset): the cheapest morning
    flight with seats; success = that single booking, or no booking at all plus `finish` when no
    morning flight had seats. Waitlist entries and extra bookings are failures.
    """
    state = env.unwrapped.state
    fresh = make_task(state.task.task_id)  # untouched seat counts
    best_price, best = None, None
    for f in fresh.flights:
        is_morning = 6 <= int(f.hour[:2]) <= 11
        if is_morning and f.seats > 0 and (best_price is None or f.price < best_price):
            best_price, best = f.price, f.number
    expected = [] if best is None else [(best, fresh.passenger, fresh.travel_class)]
    return bool(state.finished) and list(state.bookings) == expected and not state.waitlist


# ----------------------------------------------------------------------------------------------
# Scripted demonstrator (for the supervised warm start), with a documented bad habit.
# ----------------------------------------------------------------------------------------------
class FlightDemonstrator:
    """Reads only the observations, like the policy. Bad habit: with probability `skip_seat_check`
    per episode it books the cheapest morning flight without checking seats, so it fails whenever
    that flight is sold out (about half the tasks). Imitation copies the habit; RL can fix it,
    because only the environment's outcome tells the two behaviours apart."""

    def __init__(self, skip_seat_check: float = 0.6, seed: int | None = None):
        self.skip_seat_check = skip_seat_check
        self.rng = np.random.default_rng(seed)

    def reset(self, first_obs: str):
        words = first_obs.split()
        self.origin, self.dest = words[words.index("from") + 1], words[words.index("to") + 1]
        self.passenger, self.travel_class = words[words.index("for") + 1], words[words.index("in") + 1]
        self.candidates, self.checking = [], None
        self.skips = self.rng.random() < self.skip_seat_check

    def act(self, obs: str) -> str:
        words = obs.split()
        if words[0] == "user":
            return f"search {self.origin} {self.dest}"
        if words[0] == "found":
            return "filter morning"
        if words[2:5] == ["morning", "by", "price"]:
            self.candidates = words[words.index(":") + 1:]
            if self.skips:
                return f"book {self.candidates[0]} {self.passenger} {self.travel_class}"
            self.checking = self.candidates.pop(0)
            return f"seats {self.checking}"
        if words[2:3] == [self.checking] and words[-1] == "seats":
            return f"book {self.checking} {self.passenger} {self.travel_class}"
        if words[2:3] == [self.checking] and self.candidates:  # sold out: check the next cheapest
            self.checking = self.candidates.pop(0)
            return f"seats {self.checking}"
        return "finish"
