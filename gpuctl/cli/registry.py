"""The verbs of `gpuctl`: name -> (where its code is, one-line summary).

A verb's code is a module exposing ``add_arguments(parser)`` and ``run(args) -> int`` (an ExitCode),
or, for modules holding several verbs of one subject, ``"module:name"``: an attribute of that
module (a :class:`Verb`) with the same two functions. The module is imported only when its verb is
parsed or run, so `gpuctl --help` imports none of them and `gpuctl status --help` only
gpuctl.cli.fleet. To add a verb: write its module, add one row here.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Verb:
    """One verb of a subject module: its two functions (a one-verb module defines them itself)."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: verb -> (module or "module:attribute", summary shown by `gpuctl --help`), in --help order.
VERBS: dict[str, tuple[str, str]] = {
    "status": ("gpuctl.cli.fleet:status", "per-node GPU telemetry and slice owners"),
    "departments": ("gpuctl.cli.fleet:departments", "slices owned by each department, in GPU-equivalents per node"),
    "reassign": ("gpuctl.cli.fleet:reassign", "move slices from one department to another"),
    "split": ("gpuctl.cli.split:split", "split one GPU into slices (e.g. --into 1/2,1/4,1/4) while none is leased"),
    "merge": ("gpuctl.cli.split:merge", "merge one GPU's slices into one whole slice (--to DEPT for several owners)"),
    "config": ("gpuctl.cli.configuration", "fleet config tools"),
    "demo": ("gpuctl.cli.console:demo",
             "start simulated node daemons (gpuctld --backend simulated) and open the console on them"),
    "console": ("gpuctl.cli.console:console", "open the console (same as bare gpuctl)"),
    "lease": ("gpuctl.cli.leases:lease", "lease free slices of a department for remote attach"),
    "release": ("gpuctl.cli.leases:release", "end a lease (its worker stops, its slices are free again)"),
    "renew": ("gpuctl.cli.leases:renew", "heartbeat a lease: its expiry moves to now + its ttl"),
    "leases": ("gpuctl.cli.leases:leases", "every lease of the fleet"),
    "run": ("gpuctl.cli.leases:run", "lease slices, run a command attached to them, release when it ends"),
    "node": ("gpuctl.cli.node", "node tools: install gpuctld on a node (bootstrap), retire a replaced GPU (forget-gpu)"),
    "schedule": ("gpuctl.cli.schedule", "reassignments the nodes execute at a time: add, list, cancel"),
    "plan": ("gpuctl.cli.plan", "plans of department ownership over time: check, show, apply"),
    "audit": ("gpuctl.cli.audit", "who changed what on the nodes, merged, newest last"),
    "report": ("gpuctl.cli.report", "GPU-hours owned, leased and used per department, node or GPU"),
}


def load(verb: str) -> Verb:
    """The two functions of `verb` (imports its module). KeyError for a verb not in VERBS."""
    target = VERBS[verb][0]
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    obj = getattr(module, attr) if attr else module
    return Verb(add_arguments=obj.add_arguments, run=obj.run)
