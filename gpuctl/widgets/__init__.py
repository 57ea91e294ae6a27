"""Widgets of the gpuctl console: header, command bar, fleet-table rows, palette, formatting.

`format` is plain Python (no textual); the others import textual and belong to the console layer.
"""
