"""FleetTable: a DataTable whose cells are re-rendered only when they changed.

Textual's DataTable keys every render cache on one table-wide update counter, so updating one
cell re-renders every visible cell (through Padding, Styled and Console.render_lines: ~0.25 ms a
cell measured here; 57 rows x 11 columns at 200x60 was ~90 ms of UI-thread time per poll, see
bench/RESULTS.md). FleetTable keeps the rendered lines of each cell with the cell object they
came from and reuses them while the cell object (rows are built immutably in the poll worker, a
changed cell is a new Text object), its row/column position, its base style and cursor state are
the same. One-line Text cells are rendered directly (Text -> Segments, cropped and padded to the
column width, the row's and cursor's styles applied), which gives the same segments as
DataTable's own path at a tenth of the cost; anything else (headers, labels, other renderables,
multi-line rows) goes through DataTable's own path.

Relies on DataTable internals (`_data`, `_row_locations`, `_column_locations`,
`_get_styles_to_render_cell`, all present in Textual 8); where one is missing it falls back to
DataTable's own rendering, so another Textual version is slower, never wrong.
"""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual._segment_tools import line_crop
from textual.strip import Strip
from textual.widgets import DataTable

#: DataTable's rendered form of one cell: lines of segments.
SegmentLines = list[list[Segment]]


class FleetTable(DataTable):
    """A DataTable with a per-cell render cache (see the module doc). Same API as DataTable."""

    def __init__(self, *args: Any, **kwargs: Any):
        # set before DataTable.__init__, whose reactive watchers call _clear_caches
        # (row key str, column index) -> (cell object, render variant, width, segments)
        self._cell_lines: dict[tuple[Any, int], tuple[object, tuple, int, list[Segment]]] = {}
        # row key str -> (render variant, cell objects of the row, strip)
        self._row_strips: dict[Any, tuple[tuple, tuple, Strip]] = {}
        # (zebra parity, base style, pseudo-class state) -> row style
        self._row_styles: dict[tuple, Style] = {}
        # (row index, column index, row style, component style) -> a cell's style before its own
        self._pre_styles: dict[tuple, Style] = {}
        # (widget style, columns, their render widths) while a paint runs (see render_lines)
        self._paint: tuple | None = None
        # DataTable's _update_count when its own render caches were last pruned (see render_lines)
        self._caches_count = -1
        super().__init__(*args, **kwargs)

    def _forget_renders(self) -> None:
        self._cell_lines.clear()
        self._row_strips.clear()
        self._row_styles.clear()
        self._pre_styles.clear()

    def clear(self, columns: bool = False) -> "FleetTable":
        self._forget_renders()
        return super().clear(columns)

    def remove_row(self, row_key: Any) -> None:
        self._forget_renders()
        super().remove_row(row_key)

    def remove_column(self, column_key: Any) -> None:
        self._forget_renders()
        super().remove_column(column_key)

    def _clear_caches(self) -> None:
        self._forget_renders()
        super()._clear_caches()

    def notify_style_update(self) -> None:
        self._forget_renders()
        super().notify_style_update()

    def _prune_datatable_caches(self) -> None:
        """Empty DataTable's own render caches when its update counter moved on.

        Every key of DataTable's _row_render_cache, _cell_render_cache, _row_renderable_cache and
        _line_cache holds the table's _update_count, which each cell update bumps: entries of an
        older count can never be hit again, yet the LRU caches keep them until full (10,000 cells,
        1,000 rows and lines), so a live table's memory grew with every poll for ~15 minutes
        (the header row and fallback paths render through them; issue 15 item 5)."""
        count = self._update_count
        if count != self._caches_count:
            self._caches_count = count
            for cache in (self._row_render_cache, self._cell_render_cache, self._row_renderable_cache,
                          self._line_cache):
                cache.clear()
            new_segments_generation()

    def cells_changed(self) -> None:
        """Values of existing cells were replaced in the cell store (no row added, removed, moved
        or resized): move DataTable's update counter on, as update_cell does, keeping the row
        order and line offsets it computed for the old count. DataTable keys both on the counter
        and rebuilds them over every row when it moves (~8 ms a poll at 4096 rows, for an order
        that did not change). Then refresh once."""
        old = self._update_count
        try:
            ordered = self._ordered_row_cache.get((self.row_count, old))
            offsets = self._offset_cache.get(old)
        except AttributeError:  # another Textual version: nothing to carry over
            ordered = offsets = None
        self._update_count = old + 1
        if ordered is not None:
            self._ordered_row_cache.set((self.row_count, old + 1), ordered)
        if offsets is not None:
            self._offset_cache.set(old + 1, offsets)
        self.refresh()

    def render_lines(self, crop: Any) -> list[Strip]:
        self._prune_datatable_caches()
        # DataTable.render_line resolves self.rich_style (CSS lookups, ~0.1 ms), the ordered
        # columns and their widths for every line: resolve them once per paint instead
        columns = self.ordered_columns
        self._paint = (
            self.rich_style,
            tuple(columns),
            tuple(column.get_render_width(self) for column in columns),
        )
        try:
            return super().render_lines(crop)
        finally:
            self._paint = None

    def render_line(self, y: int) -> Strip:
        paint = self._paint
        if paint is None or self.fixed_rows:
            return super().render_line(y)
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        header = self.get_row_height(self._header_row_key) if self.show_header else 0
        if y >= header:
            y += scroll_y
        return self._render_line(y, scroll_x, scroll_x + width, paint[0])

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        """One line of the table. Body rows (one line high) of a row-cursor table without row
        labels or fixed columns are assembled here from the cached cells and kept per row key
        while the row's cell objects, its position, the cursor/hover on it, the widths and
        styles are the same; anything else goes through DataTable's own path."""
        if (
            self.cursor_type != "row"
            or self.fixed_columns
            or (self._labelled_row_exists and self.show_row_labels)
        ):
            return super()._render_line(y, x1, x2, base_style)
        try:
            row_key, line_no = self._get_offsets(y)
        except LookupError:
            return Strip.blank(self.size.width, base_style)
        if row_key is self._header_row_key or line_no != 0:
            return super()._render_line(y, x1, x2, base_style)
        row_data = self._data.get(row_key)
        row = self.rows.get(row_key)
        if row_data is None or row is None or row.height != 1:
            return super()._render_line(y, x1, x2, base_style)
        row_index = self._row_locations.get(row_key)
        paint = self._paint
        if paint is not None:
            columns, widths = paint[1], paint[2]
        else:
            columns = tuple(self.ordered_columns)
            widths = tuple(column.get_render_width(self) for column in columns)
        width = self.size.width
        cursor = row_index == self.cursor_coordinate.row
        hover = row_index == self.hover_coordinate.row
        cells = tuple([row_data.get(column.key) for column in columns])
        show_cursor, show_hover = self.show_cursor, self._show_hover_cursor
        variant = (
            row_index, x1, x2, width, widths, cursor, hover, base_style, show_cursor, show_hover,
            self._pseudo_class_state,
        )
        key = row_key.value
        cached = self._row_strips.get(key)
        if (
            cached is not None
            and cached[0] == variant
            and len(cached[1]) == len(cells)
            and all([a is b for a, b in zip(cached[1], cells)])
        ):
            return cached[2]
        style_key = (row_index % 2 if self.zebra_stripes else -1, base_style, self._pseudo_class_state)
        row_style = self._row_styles.get(style_key)
        if row_style is None:
            row_style = self._row_styles[style_key] = self._get_row_style(row_index, base_style)
        # per line, not per cell: reactive reads and style lookups cost microseconds each
        component_style, post_style = self._get_styles_to_render_cell(
            False,
            False,
            False,
            hover,
            cursor,
            show_cursor,
            show_hover,
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        padding = self.cell_padding
        cell_variant = (row_index, row_style, component_style, post_style, padding)
        cell_lines = self._cell_lines
        pre_styles = self._pre_styles
        console = self.app.console
        segments: list[Segment] = []
        for column_index, (cell, cell_width) in enumerate(zip(cells, widths)):
            slot = (key, column_index)
            hit = cell_lines.get(slot)
            if hit is not None and hit[0] is cell and hit[1] == cell_variant and hit[2] == cell_width:
                segments.extend(hit[3])
                continue
            if isinstance(cell, Text) and "\n" not in cell.plain:
                pre_key = (row_index, column_index, row_style, component_style)
                pre_style = pre_styles.get(pre_key)
                if pre_style is None:
                    if len(pre_styles) >= PRE_STYLES_LIMIT:
                        pre_styles.clear()
                    pre_style = pre_styles[pre_key] = (
                        row_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
                    )
                line = render_text_cell(cell, cell_width, padding, pre_style, post_style, console)
            else:
                line = self._render_cell(row_index, column_index, row_style, cell_width, cursor, hover)[0]
            cell_lines[slot] = (cell, cell_variant, cell_width, line)
            segments.extend(line)
        remaining = max(0, width - sum(widths))
        if remaining:
            extend_style, _ = self._get_styles_to_render_cell(
                False, False, False, hover, cursor, show_cursor, show_hover, False, False
            )
            extend_style = row_style + extend_style + Style.from_meta(
                {"row": row_index, "column": 0, "out_of_bounds": True}
            )
            segments.append(Segment(" " * remaining, extend_style))
        if x1 == 0 and x2 >= width and sum(widths) <= width:
            # the whole row fits from its first cell: nothing to crop, the length is `width`
            # (what the general path below gives, without its three intermediate Strips)
            strip = Strip(list(Segment.simplify(segments)), width)
        else:
            strip = Strip(line_crop(segments, x1, x2, width)).adjust_cell_length(width, base_style).simplify()
        self._row_strips[key] = (variant, cells, strip)
        return strip

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> SegmentLines:
        """DataTable's cell render, with one-line Text cells rendered by render_text_cell."""
        if row_index < 0 or column_index < 0:  # header row or row labels: DataTable's own path
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        try:
            row_key = self._row_locations.get_key(row_index)
            column_key = self._column_locations.get_key(column_index)
            cell = self._data[row_key][column_key]
            row_height = self.rows[row_key].height
        except (AttributeError, KeyError):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if not isinstance(cell, Text) or row_height != 1 or "\n" in cell.plain:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        fixed = row_index < self.fixed_rows or column_index < self.fixed_columns
        component_style, post_style = self._get_styles_to_render_cell(
            False,
            False,
            fixed,
            hover,
            cursor,
            self.show_cursor,
            self._show_hover_cursor,
            self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css",
        )
        pre_style = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
        return [render_text_cell(cell, width, self.cell_padding, pre_style, post_style, self.app.console)]


#: Bound on FleetTable's cache of cell styles by position (cleared when reached: ~57 rows x 12
#: columns are on screen; scrolling through 4096 rows adds the rest).
PRE_STYLES_LIMIT = 20_000
#: Bound on one generation of the cache of cells' own segments (cleared when reached).
BASE_SEGMENTS_LIMIT = 20_000
# (id(cell), inner width) -> (cell, its segments cropped/padded to the width, unstyled by row).
# Two generations, like the interned cells (fleet_rows.new_cell_generation): a new one starts when
# a table's update counter moved on (FleetTable._prune_datatable_caches, once per poll's paint);
# an entry found in the previous one moves to the current one; the rest is forgotten.
_base_segments: dict[tuple[int, int], tuple[Text, list[Segment]]] = {}
_base_previous: dict[tuple[int, int], tuple[Text, list[Segment]]] = {}


def new_segments_generation() -> None:
    """Start a new generation of cached cell segments (cells unused for a generation are dropped)."""
    global _base_segments, _base_previous
    _base_previous, _base_segments = _base_segments, {}


def _cell_segments(cell: Text, inner: int, console: Any) -> list[Segment]:
    """`cell` as segments exactly `inner` cells wide (cropped by its overflow mode, "fold"
    meaning crop on one line, or padded with unstyled spaces). Cached per cell object: the fleet
    rows intern their cells, so one "71°C" or "idle" is rendered once for every row."""
    slot = (id(cell), inner)
    hit = _base_segments.get(slot)
    if hit is not None and hit[0] is cell:
        return hit[1]
    hit = _base_previous.get(slot)
    if hit is not None and hit[0] is cell:
        _base_segments[slot] = hit
        return hit[1]
    text = cell
    if text.cell_len > inner:
        text = cell.copy()
        overflow = cell.overflow if cell.overflow in ("crop", "ellipsis") else "crop"
        text.truncate(inner, overflow=overflow)
    if text.spans:
        segments = list(text.render(console))
    else:
        segments = [Segment(text.plain, console.get_style(text.style) if text.style else None)]
    segments = list(Segment.simplify(Segment.adjust_line_length(segments, inner, pad=True)))
    if len(_base_segments) >= BASE_SEGMENTS_LIMIT:
        _base_segments.clear()
    _base_segments[slot] = (cell, segments)  # holds `cell`: its id is not reused while cached
    return segments


def render_text_cell(
    cell: Text, width: int, padding: int, pre_style: Style, post_style: Style | None, console: Any
) -> list[Segment]:
    """One line of `width` cells: `padding` spaces, `cell` cropped (its overflow mode, "fold"
    meaning crop on one line) or padded with spaces to width - 2 * padding, `padding` spaces;
    every segment styled pre_style + its own style + post_style. Equivalent to DataTable's
    Styled(Padding(cell, (0, padding)), pre_style, post_style) rendered one line high."""
    inner = max(0, width - 2 * padding)
    line: list[Segment] = []
    if padding:
        line.append(Segment(" " * padding))
    line.extend(_cell_segments(cell, inner, console))
    if padding:
        line.append(Segment(" " * padding))
    return list(Segment.apply_style(line, pre_style, post_style or None))
