"""Words (DESIGN.md): a slice is "leased" or "free"; "idle"/"busy" would read as load (issue 9
item 10, CLI side). Every verb's help, the departments table and JSON, and the refusal messages."""

from __future__ import annotations

import re

import pytest

from gpuctl.cli import build_parser
from gpuctl.cli.registry import VERBS

LOAD_WORDS = re.compile(r"\bbusy\b|\bidle (?:slice|again|capacity)|slices? (?:are |is )?idle\b", re.IGNORECASE)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_verb_help_says_free_and_leased(verb):
    parser = build_parser(verb)
    sub = next(a for a in parser._actions if a.dest == "verb").choices[verb]
    text = sub.format_help() + VERBS[verb][1]
    for action in sub._actions:  # sub-actions (config check, node forget-gpu, ...)
        for p in (getattr(action, "choices", None) or {}).values() if isinstance(getattr(action, "choices", None), dict) else []:
            text += p.format_help()
    assert not LOAD_WORDS.search(text), LOAD_WORDS.search(text).group(0)


def test_refusals_say_free_slices():
    from gpuctl.fleet.reassign import ReassignRequest, plan
    from gpuctl.model import FleetSnapshot

    p = plan(FleetSnapshot([]), ReassignRequest("research", "training", count=1))
    assert p.shortfall == "only 0 free slice(s) of research can move, 1 asked"
