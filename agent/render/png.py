"""`render_png(picture) -> bytes`: a laid-out picture drawn with Pillow as PNG bytes.

Pillow is imported here only, when a PNG is asked for; without it the error says how to get it.
"""

from __future__ import annotations

import io

from agent.errors import ConfigError
from agent.render.layout import FONT_PX, PAD, Picture, line_top


def render_png(picture: Picture) -> bytes:
    """The PNG bytes of `picture` (no timestamps or other metadata: the same picture, the same bytes)."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as exc:
        raise ConfigError("PNG output needs Pillow: pip install pillow (or use --format svg)") from exc
    image = Image.new("RGB", (picture.width, picture.height), "#ffffff")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=FONT_PX)
    for box in picture.boxes:
        right, bottom = box.x + box.w, box.y + box.h
        draw.rectangle((box.x, box.y, right, bottom), fill=box.fill, outline="#000000")
        if box.band and box.band_h:
            draw.rectangle((box.x + 1, box.y + 1, right - 1, box.y + box.band_h - 1), fill=box.band)
        for i, line in enumerate(box.lines):
            draw.text((box.x + PAD, line_top(box, i)), line, fill="#000000", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
