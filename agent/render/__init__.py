"""Pictures of a node for people: `layout` (the boxes), `render_svg`, `render_png`, `render_frame`.

All pure: a Topology (and, for `topolet status`, who holds which CPUs) in, text or bytes out.
"""

from agent.render.layout import Box, Holder, Picture, Usage, layout
from agent.render.svg import render_svg

__all__ = ["Box", "Holder", "Picture", "Usage", "layout", "render_svg"]
