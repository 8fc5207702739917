"""The objects a scene is composed of: colour emoji with their English names.

Each object is one emoji of Noto Color Emoji (Debian `fonts-noto-color-emoji`), rendered with Pillow at the
font's only bitmap size (109) and cropped to its opaque pixels; its name is the emoji's Unicode CLDR
text-to-speech annotation (Debian `unicode-cldr-core`, `annotations/en.xml`), which `check_names` compares
with the list below when the file is at hand. Plurals are written out here (CLDR has none): captions say
"two fish" and "two buses".

    apt-get download fonts-noto-color-emoji unicode-cldr-core && dpkg-deb -x <each>.deb root/
"""

from __future__ import annotations

import dataclasses
import pathlib
import xml.etree.ElementTree as ET

import numpy as np

FONT = pathlib.Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
CLDR_ANNOTATIONS = pathlib.Path("/usr/share/unicode/cldr/common/annotations/en.xml")
# The only size Noto Color Emoji's bitmaps come in.
FONT_SIZE = 109


@dataclasses.dataclass(frozen=True)
class SceneObject:
    emoji: str
    # CLDR's English tts name and its plural.
    name: str
    plural: str
    # "animal", "food", "vehicle" or "thing"; only for reports.
    category: str


def _objects(category: str, rows: str) -> list[SceneObject]:
    """'emoji name / plural; ...' -> objects (plural defaults to name + s)."""
    out = []
    for row in rows.split(";"):
        emoji, rest = row.strip().split(" ", 1)
        name, _, plural = rest.partition("/")
        out.append(SceneObject(emoji, name.strip(), plural.strip() or name.strip() + "s", category))
    return out


OBJECTS: tuple[SceneObject, ...] = tuple(
    _objects("animal", "🐕 dog; 🐈 cat; 🐄 cow; 🐖 pig; 🐎 horse; 🐇 rabbit; 🐘 elephant; 🐸 frog; 🐟 fish / fish; "
                       "🐦 bird; 🐧 penguin; 🐢 turtle; 🐙 octopus / octopuses; 🐋 whale; 🦆 duck")
    + _objects("food", "🍎 red apple; 🍌 banana; 🍉 watermelon; 🍓 strawberry / strawberries; 🍕 pizza; 🥕 carrot; "
                       "🍋 lemon; 🍍 pineapple; 🍩 doughnut; 🍄 mushroom")
    + _objects("vehicle", "🚌 bus / buses; 🚲 bicycle; 🚀 rocket; ⛵ sailboat; 🚕 taxi; 🚜 tractor; 🚁 helicopter")
    + _objects("thing", "⚽ soccer ball; 🎈 balloon; 🔑 key; 🎸 guitar; 🌻 sunflower; ⭐ star; 💡 light bulb; "
                        "☂ umbrella")
)


def check_names(path: pathlib.Path = CLDR_ANNOTATIONS, objects=OBJECTS) -> None:
    """Raises ValueError unless every object's name is its emoji's CLDR tts annotation."""
    root = ET.parse(path).getroot()
    tts = {a.get("cp"): a.text for a in root.iter("annotation") if a.get("type") == "tts"}
    wrong = [f"{o.emoji} {o.name!r} (CLDR: {tts.get(o.emoji)!r})" for o in objects if tts.get(o.emoji) != o.name]
    if wrong:
        raise ValueError(f"{path}: names differ from CLDR's: {', '.join(wrong)}")


def render_sprites(font: pathlib.Path = FONT, objects=OBJECTS) -> dict[str, np.ndarray]:
    """Object name -> (h, w, 4) uint8 RGBA emoji cropped to its opaque pixels (about 110 x 110).

    Raises:
        ValueError: the font has no colour glyph for an emoji.
    """
    from PIL import Image, ImageDraw, ImageFont

    face = ImageFont.truetype(str(font), FONT_SIZE)
    sprites = {}
    for o in objects:
        canvas = Image.new("RGBA", (160, 160), (0, 0, 0, 0))
        ImageDraw.Draw(canvas).text((10, 10), o.emoji + "\ufe0f", font=face, embedded_color=True)
        alpha = np.asarray(canvas)[..., 3]
        if (alpha > 0).sum() < 500:
            raise ValueError(f"{font}: no colour glyph for {o.emoji} ({o.name})")
        box = canvas.getbbox(alpha_only=True)
        sprites[o.name] = np.asarray(canvas.crop(box)).copy()
    return sprites


def save_sprites(path: pathlib.Path, sprites: dict[str, np.ndarray]) -> None:
    np.savez_compressed(path, **sprites)


def load_sprites(path: pathlib.Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}
