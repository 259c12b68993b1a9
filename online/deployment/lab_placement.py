"""Placing a Marathon group's tasks on a set of agents the way Mesos and Marathon would.

The group's constraints are the operator's promises about failure domains: ``hostname:UNIQUE``
for the servers means no host carries two shards, so one host loss costs one shard. A lab that
ignored them would test a cluster nobody runs. This module decides, before anything starts,
which agent each task goes to, honouring every constraint Marathon documents for ``hostname``
and agent attributes, and refuses a group that cannot be placed, naming the app and the
constraint, where Marathon would leave the deployment waiting for offers forever.

Among the agents a task may go to it picks the one with the fewest tasks so far, in the agents'
order on ties: Marathon's default spreads the same way once offers arrive from every agent.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class PlacementError(ValueError):
    """The group cannot be placed on these agents."""


@dataclass
class Agent:
    hostname: str                 # what "hostname" constraints compare (the lab: the host's address)
    attributes: dict[str, str] = field(default_factory=dict)


_OPERATORS = {"UNIQUE", "CLUSTER", "GROUP_BY", "LIKE", "UNLIKE", "MAX_PER", "IS"}


def _field(agent: Agent, name: str) -> str | None:
    return agent.hostname if name == "hostname" else agent.attributes.get(name)


def _allows(constraint: Sequence[str], agent: Agent, placed_here: int, placed_values: Mapping[str | None, int],
            app_id: str) -> bool:
    """Whether one more task of the app may go to ``agent``; ``placed_here`` counts the app's tasks on
    agents with the same value of the constraint's field, ``placed_values`` all of them per value."""
    if len(constraint) < 2 or constraint[1] not in _OPERATORS:
        raise PlacementError(f"{app_id}: unknown constraint {list(constraint)} (Marathon knows "
                             f"{sorted(_OPERATORS)})")
    name, op, *rest = constraint
    value = _field(agent, name)
    arg = rest[0] if rest else None
    if op in ("LIKE", "UNLIKE", "IS", "CLUSTER", "MAX_PER") and arg is None:
        raise PlacementError(f"{app_id}: constraint {list(constraint)} needs a value")
    if op == "UNIQUE":
        return value is not None and placed_here == 0
    if op == "MAX_PER":
        return value is not None and placed_here < int(arg)
    if op in ("IS", "CLUSTER"):
        return value == arg
    if op == "LIKE":
        return value is not None and re.fullmatch(arg, value) is not None
    if op == "UNLIKE":
        return value is None or re.fullmatch(arg, value) is None
    # GROUP_BY [n]: spread evenly over the field's values; here only "not ahead of the least used value"
    return value is not None and placed_here <= min(placed_values.get(v, 0) for v in placed_values)


def place_tasks(apps: Sequence[tuple[str, int, Sequence[Sequence[str]]]], agents: Sequence[Agent]) \
        -> dict[tuple[str, int], Agent]:
    """``apps``: (app id, instances, constraints) in start order. Returns (app id, index) -> agent."""
    if not agents:
        raise PlacementError("no agents to place the group on")
    load = {a.hostname: 0 for a in agents}
    out: dict[tuple[str, int], Agent] = {}
    for app_id, instances, constraints in apps:
        mine: list[Agent] = []
        for index in range(instances):
            candidates = []
            for agent in agents:
                ok = True
                for c in constraints:
                    name = c[0] if c else ""
                    values: dict[str | None, int] = {_field(a, name): 0 for a in agents}
                    for a in mine:
                        values[_field(a, name)] = values.get(_field(a, name), 0) + 1
                    if not _allows(c, agent, values.get(_field(agent, name), 0), values, app_id):
                        ok = False
                        break
                if ok:
                    candidates.append(agent)
            if not candidates:
                raise PlacementError(
                    f"{app_id}: instance {index + 1} of {instances} fits no agent of {len(agents)} under its "
                    f"constraints {[list(c) for c in constraints]}; add hosts or lower the instances")
            chosen = min(candidates, key=lambda a: load[a.hostname])
            load[chosen.hostname] += 1
            mine.append(chosen)
            out[(app_id, index)] = chosen
    return out


def check_placement(placed: Mapping[tuple[str, int], Agent],
                    constraints: Mapping[str, Sequence[Sequence[str]]]) -> list[str]:
    """Constraint violations of a finished placement (empty when it honours them all), for tests and logs."""
    problems = []
    by_app: dict[str, list[Agent]] = {}
    for (app_id, _), agent in sorted(placed.items()):
        by_app.setdefault(app_id, []).append(agent)
    for app_id, agents in by_app.items():
        for c in constraints.get(app_id, ()):
            name, op, *rest = c
            values = [_field(a, name) for a in agents]
            if op == "UNIQUE" and len(set(values)) != len(values):
                problems.append(f"{app_id}: {name} UNIQUE but {values}")
            elif op == "MAX_PER" and any(values.count(v) > int(rest[0]) for v in values):
                problems.append(f"{app_id}: {name} MAX_PER {rest[0]} but {values}")
            elif op in ("IS", "CLUSTER") and any(v != rest[0] for v in values):
                problems.append(f"{app_id}: {name} {op} {rest[0]} but {values}")
    return problems
