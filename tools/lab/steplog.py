"""The labs' one reader of a JSONL step log (docs/contracts.md): its
run_start and its step lines, with the non-finite values proto3's JSON
mapping writes as strings ("NaN", "Infinity", "-Infinity") read back as the
floats they are. The labellers (labeller.py, moe_labeller.py) and the lab
drivers read logs through it, so they agree on what a value is.
"""

import json
import math

NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def number(x):
    """A step log's number: None (absent) is NaN, the non-finite strings
    their floats; any other string is an error that says what it got."""
    if x is None:
        return math.nan
    if isinstance(x, str):
        try:
            return NONFINITE[x]
        except KeyError:
            raise ValueError(f"not a number of a step log: {x!r} (numbers, or "
                             f"{', '.join(NONFINITE)})") from None
    return float(x)


def read(path, keep=None):
    """(run_start dict, [step dicts]) of a JSONL step log; `keep(step)`, when
    given, chooses the steps (event lines are left out)."""
    start, steps = {}, []
    with open(path) as f:
        for line in f:
            obj = json.loads(line)
            if "run_start" in obj:
                start = obj["run_start"]
            elif "step" in obj and (keep is None or keep(obj)):
                steps.append(obj)
    return start, steps
