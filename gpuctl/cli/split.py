"""`gpuctl split NODE GPU_INDEX --into 1/2,1/4,1/4` and `gpuctl merge NODE GPU_INDEX [--to DEPT]`.

Both plan with gpuctl.fleet.split on a fresh snapshot of NODE, show the plan and ask on a terminal
(never without one: `--yes`), then send it generation-checked. Refused (nothing changes) while a
slice of the GPU is leased (exit 6), for parts of several owners without `--to` (6), a MIG device
(6, the node's mig_read_only), a stale generation (6), an unknown GPU index (2); already so: 4;
node down: 7. stdout: the new slices (``--json``: ``{"plan", "slices", "generation"}``).
"""

from __future__ import annotations

import argparse

from gpuctl.cli.context import check_node, load_config, open_fleet
from gpuctl.cli.errors import CliError, UsageError
from gpuctl.cli.output import confirm, emit_json, err, fraction_label, interactive
from gpuctl.cli.registry import Verb
from gpuctl.exit_codes import ExitCode


def _gpu_index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU index: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", metavar="NODE", help="node name (fleet config)")
    p.add_argument("gpu_index", type=_gpu_index, metavar="GPU_INDEX", help="the GPU's index on the node")


def _tail(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def _split_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--into", required=True, metavar="FRACTIONS",
                   help="the new slices, e.g. 1/2,1/4,1/4 or 1/4,1/4,1/4,1/4 (1, 1/2, 1/4, 1/8 adding up to 1)")
    _tail(p)


def _merge_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--to", metavar="DEPT", help="department owning the whole GPU (needed when its parts have "
                   "several owners)")
    _tail(p)


def _run(args: argparse.Namespace, kind: str) -> int:
    from gpuctl.fleet.split import apply, parse_fractions, plan_merge, plan_split

    cfg = load_config(args)
    check_node(cfg, args.node, "NODE")
    fractions = parse_fractions(args.into) if kind == "split" else None
    to = getattr(args, "to", None)
    if to is not None and cfg.departments and to != "unassigned" and cfg.department(to) is None:
        raise UsageError(f"--to: unknown department {to!r} (known: {', '.join(d.name for d in cfg.departments)})")
    fleet = open_fleet(args, cfg)
    try:
        snap = fleet.snapshot([args.node])
        p = (plan_split(snap, args.node, args.gpu_index, fractions or []) if kind == "split"
             else plan_merge(snap, args.node, args.gpu_index, to))
        if args.dry_run:
            if args.json:
                emit_json({"plan": p.to_json(), "dry_run": True})
            else:
                print(f"would {p.describe()}")
            return ExitCode.OK
        if not args.yes:
            if not interactive(args):
                raise UsageError(f"{kind} changes the GPU's slices and no terminal is there to confirm: pass --yes "
                                 f"(or --dry-run to see the plan)")
            if not confirm(p.describe()[0].upper() + p.describe()[1:] + "?"):
                raise CliError(f"cancelled: GPU {p.gpu_index} of {p.node} unchanged", ExitCode.CONFLICT)
        answer = apply(fleet, p)
    finally:
        fleet.close()
    if args.json:
        emit_json({"plan": p.to_json(), "slices": answer.get("slices", []), "generation": answer.get("generation")})
    else:
        for s in answer.get("slices", []):
            print(f"{s['id']}  {fraction_label(s['fraction'])}  {s['department']}")
    err(f"{'merged' if kind == 'merge' else 'split'}: GPU {p.gpu_index} of {p.node} now "
        f"{' + '.join(fraction_label(s['fraction']) for s in answer.get('slices', []))} "
        f"(generation {answer.get('generation')})")
    return ExitCode.OK


split = Verb(_split_arguments, lambda args: _run(args, "split"))
merge = Verb(_merge_arguments, lambda args: _run(args, "merge"))
