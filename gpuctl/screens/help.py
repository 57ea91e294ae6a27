"""The help screen (`?`): every key of the console, the screen below's first, and the `:` commands.

Sections, in order: the keys of the screen below (its bindings, and the keys of the widgets inside
it: the board's arrows, the node detail's digits), the keys that work everywhere (the app's
bindings, `/`, ctrl+p), the `:` commands, then the keys of every other screen. A key is listed
once per section (keys bound to one action share a row: "esc / backspace"); the descriptions of
SCREEN_KEYS replace terse binding descriptions.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from gpuctl.screens.base import GpuctlModal

#: The `:` commands and what they do (GpuctlApp.run_command is the authority).
COMMAND_HELP = (
    (":nodes", "fleet screen (all GPUs)"),
    (":depts", "department board (drag slices between departments)"),
    (":leases", "all leases of the fleet"),
    (":node NAME", "detail of node NAME"),
    (":schedule", "scheduled moves per node: add (a), cancel (c)"),
    (":audit", "audit records of every node, with a filter (/)"),
    (":report", "usage report: owned, leased and used GPU-hours per department"),
    (":history [NODE [INDEX]]", "telemetry history of a GPU (SM, memory, power)"),
    (":theme NAME", "switch theme"),
    (":help", "this screen"),
    (":q  :quit", "quit"),
)

#: What the app's keys (GpuctlApp.BINDINGS) do, by key.
GLOBAL_NOTES: dict[str, str | None] = {
    "q": "quit",
    "colon": "command bar (:nodes, :depts, :leases, :node NAME, …)",
    "slash": "filter the list (fleet: node, department, GPU, state); esc clears",
    "question_mark": "this help",
    "r": "refresh now",
    "l": "leases",
    "d": "department board",
}
#: Keys that work on every screen besides the app's own bindings.
GLOBAL_EXTRA = (("ctrl+p", "command palette (themes, keys, quit)"),)

#: Per view (GpuctlScreen.VIEW): {key: description} overriding the binding's description (None
#: hides the binding), and extra rows for keys bound inside the screen's widgets.
SCREEN_KEYS: dict[str, tuple[dict[str, str | None], tuple[tuple[str, str], ...]]] = {
    "fleet": (
        {"slash": "filter the GPUs (node, department, GPU, state)", "enter": "open the node of the GPU under the cursor",
         "escape": "clear the filter"},
        (("↑ ↓ pgup pgdn", "move through the GPUs"),),
    ),
    "departments": (
        {
            "space": "select / unselect the focused card (or shift+click)",
            "m": "move the selection (or the focused card) to a department…",
            "enter": "open the node of the focused card",
            "escape": "cancel a drag, else clear the selection, else back",
        },
        (
            ("↑ ↓ ← →", "move between cards and columns"),
            ("home end", "first / last card of the column"),
            ("pgup pgdn", "a page of cards up / down"),
            ("drag", "drag a card (or the selection) onto a column to move it"),
        ),
    ),
    "node": (
        {str(i): None for i in range(10)} | {"escape": "back"},
        (("0 … 9", "show the GPU of that index"), ("↑ ↓", "choose a GPU in the list")),
    ),
    "leases": (
        {"escape": "back"},
        (("↑ ↓", "move through the leases"), ("enter", "open the node of the lease")),
    ),
}

#: Section titles of the views.
#: Cells of the key column.
KEY_WIDTH = 15

VIEW_TITLES = {"fleet": "fleet", "departments": "department board", "node": "node detail", "leases": "leases"}

_KEY_NAMES = {
    "escape": "esc",
    "colon": ":",
    "question_mark": "?",
    "slash": "/",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
}


def key_label(binding: Binding) -> str:
    """How a key is written in the help: key_display, else a short name ("esc", "?")."""
    if binding.key_display:
        return binding.key_display
    return ", ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in binding.key.split(","))


def binding_rows(bindings, notes: dict[str, str | None] | None = None) -> list[tuple[str, str]]:
    """(keys, description) for each action with a description, in binding order; keys bound to
    the same action share a row ("esc / backspace"); `notes` replace descriptions by key (None
    leaves the key out)."""
    notes = notes or {}
    rows: dict[str, tuple[list[str], str]] = {}
    for b in bindings:
        if isinstance(b, tuple):
            b = Binding(*b)
        first_key = b.key.split(",")[0].strip()
        if first_key in notes and notes[first_key] is None:
            continue
        desc = notes.get(first_key) or b.description
        if not desc:
            continue
        label = key_label(b)
        if b.action in rows:
            keys, _ = rows[b.action]
            if label not in keys:
                keys.append(label)
        else:
            rows[b.action] = ([label], desc)
    return [(" / ".join(keys), desc) for keys, desc in rows.values()]


def _dedupe(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    for key, desc in rows:
        if key not in seen:
            seen.add(key)
            out.append((key, desc))
    return out


def screen_rows(screen_class: type) -> list[tuple[str, str]]:
    """The keys of a gpuctl screen class: its bindings (described per SCREEN_KEYS), then the
    keys of its widgets; each key once."""
    view = getattr(screen_class, "VIEW", "")
    notes, extra = SCREEN_KEYS.get(view, ({}, ()))
    return _dedupe(binding_rows(getattr(screen_class, "BINDINGS", []), notes) + list(extra))


class HelpScreen(GpuctlModal[None]):
    """Keys and commands over the dimmed screen `below`; Escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1; scrollbar-size-vertical: 1; }
    HelpScreen .help-title { text-style: bold; color: $accent; }
    HelpScreen .help-section { text-style: bold underline; margin: 1 0 0 0; }
    """
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, below: Screen | None = None, *, screen_classes: Sequence[type] = ()):
        super().__init__(id="help")
        self._below = below
        self._listed_screens = list(screen_classes)

    def _screen_classes(self) -> list[type]:
        """The screen classes whose keys are listed, in order (given by the app: a screen never
        imports another)."""
        return list(self._listed_screens)

    def global_rows(self) -> list[tuple[str, str]]:
        """The app's keys (its bindings with a description) and GLOBAL_EXTRA."""
        return _dedupe(binding_rows(getattr(self.app, "BINDINGS", []), GLOBAL_NOTES) + list(GLOBAL_EXTRA))

    def help_sections(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """(title, [(keys, description), ...]) in display order (see the module doc)."""
        below = type(self._below) if self._below is not None else None
        sections: list[tuple[str, list[tuple[str, str]]]] = []
        if below is not None and getattr(below, "VIEW", None):
            view = below.VIEW
            sections.append((f"keys here ({VIEW_TITLES.get(view, view)})", screen_rows(below)))
        sections.append(("keys everywhere", self.global_rows()))
        sections.append(("commands (type : first)", list(COMMAND_HELP)))
        for cls in self._screen_classes():
            if cls is below:
                continue
            view = getattr(cls, "VIEW", cls.__name__)
            sections.append((f"on the {VIEW_TITLES.get(view, view)}", screen_rows(cls)))
        return sections

    def help_rows(self) -> list[tuple[str, str]]:
        """(key or command, what it does) of the first sections: the screen below's keys, the
        global keys and the `:` commands; a key listed once (the screen's meaning wins)."""
        rows: list[tuple[str, str]] = []
        for _title, section in self.help_sections()[:3]:
            rows.extend(section)
        return _dedupe(rows)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("gpuctl keys (esc closes)", classes="help-title")
            for title, rows in self.help_sections():
                table = Table(box=None, show_header=False, expand=True, padding=(0, 2, 0, 0))
                table.add_column("key / command", no_wrap=True, style="bold", width=KEY_WIDTH)
                table.add_column("does", ratio=1)
                for key, desc in rows:
                    table.add_row(key, desc)
                yield Static(title, classes="help-section", markup=False)
                yield Static(table)

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
