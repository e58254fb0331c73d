"""`render_svg(picture) -> str`: a laid-out picture as an SVG document (the same picture, the same bytes).

Each box is a `<g>` (its id the box's key, its class the kind, `data-cpus` its CPU list) holding its
rectangle, header band and text, and the `<g>` of every box that sits in it, so the SVG's nesting is
the picture's nesting.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from agent.render.layout import FONT_PX, PAD, Box, Picture, line_top

_BASELINE = FONT_PX - 1  # from a text line's top to its baseline


def _open(box: Box, out: list[str], indent: str) -> None:
    out.append(f'{indent}<g id={quoteattr(box.key)} class="{box.kind}" data-cpus="{box.cpus.cpulist()}">')
    out.append(f'{indent} <rect x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" '
               f'fill="{box.fill}" stroke="#000000"/>')
    if box.band and box.band_h:
        out.append(f'{indent} <rect x="{box.x + 1}" y="{box.y + 1}" width="{box.w - 2}" '
                   f'height="{box.band_h - 1}" fill="{box.band}"/>')
    for i, line in enumerate(box.lines):
        out.append(f'{indent} <text x="{box.x + PAD}" y="{line_top(box, i) + _BASELINE}">'
                   f'{escape(line)}</text>')


def render_svg(picture: Picture) -> str:
    """The SVG text of `picture`."""
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{picture.width}" height="{picture.height}" '
        f'viewBox="0 0 {picture.width} {picture.height}">',
        f" <title>{escape(picture.title)}</title>",
        f' <style>text {{ font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; '
        f'font-size: {FONT_PX}px; fill: #000000; }}</style>',
        f' <rect width="{picture.width}" height="{picture.height}" fill="#ffffff"/>',
    ]
    open_keys: list[str] = []  # the boxes whose <g> is open, outermost first
    for box in picture.boxes:
        while open_keys and open_keys[-1] != box.parent:
            open_keys.pop()
            out.append(" " * (len(open_keys) + 1) + "</g>")
        _open(box, out, " " * (len(open_keys) + 1))
        open_keys.append(box.key)
    while open_keys:
        open_keys.pop()
        out.append(" " * (len(open_keys) + 1) + "</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
