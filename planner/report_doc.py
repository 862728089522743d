"""A small report document (headings, paragraphs, lists, tables, images) and its renderers.

``powerplan report`` assembles one :class:`Document` and writes it as Markdown
(GitHub-flavoured pipe tables) or as a self-contained HTML page that links its
PNGs by relative path. Numbers are shown as the ``--format table`` output shows
them (:func:`planner.output.cell_text`), so the report and the CLI agree. Text
(headings, paragraphs, list items, captions) may mark inline code with
backticks, as Markdown does: HTML shows it as ``<code>``. In HTML every table
sits in its own box that scrolls sideways (:data:`TABLE_BOX_CLASS`), so a wide
table never widens the page.
"""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass, field

import pandas as pd

from planner.output import cell_text


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    caption: str = ""


@dataclass(frozen=True)
class Image:
    file: str  # relative to the report
    alt: str


Block = Heading | Paragraph | Bullets | Table | Image


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(Heading(text, level))

    def paragraph(self, text: str) -> None:
        self.blocks.append(Paragraph(text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(Bullets(tuple(items)))

    def table(self, frame: pd.DataFrame, caption: str = "") -> None:
        self.blocks.append(Table(frame.reset_index(drop=True), caption))

    def image(self, file: str, alt: str) -> None:
        self.blocks.append(Image(file, alt))

    @property
    def images(self) -> list[str]:
        return [b.file for b in self.blocks if isinstance(b, Image)]


def _md_cell(value: object) -> str:
    return cell_text(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    for block in doc.blocks:
        if isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        elif isinstance(block, Bullets):
            out += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            if block.caption:
                out += [f"*{block.caption}*", ""]
            frame = block.frame
            numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
            out.append("| " + " | ".join(_md_cell(c) for c in frame.columns) + " |")
            out.append("|" + "|".join("---:" if n else ":---" for n in numeric) + "|")
            for row in frame.itertuples(index=False):
                out.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
            out.append("")
        elif isinstance(block, Image):
            out += [f"![{block.alt}]({block.file})", ""]
    return "\n".join(out)


TABLE_BOX_CLASS = "table-box"  # the <div> around each HTML table: it scrolls, not the page

_STYLE = f"""body{{font-family:system-ui,sans-serif;max-width:75rem;
margin:2rem auto;padding:0 1rem}}
.{TABLE_BOX_CLASS}{{overflow-x:auto;max-width:100%;margin:0.5rem 0 1.5rem}}
table{{border-collapse:collapse;font-size:0.85rem}}
code{{font-family:ui-monospace,monospace;font-size:0.9em;background:#f3f3f3;padding:0 0.2em}}
th,td{{border:1px solid #ccc;padding:0.2rem 0.5rem}}th{{background:#f3f3f3}}
td.n{{text-align:right;font-variant-numeric:tabular-nums}}img{{max-width:100%}}
caption{{caption-side:top;text-align:left;font-style:italic;padding:0.3rem 0}}"""


def inline_html(text: str) -> str:
    """``text`` escaped for HTML, its `backticked` spans as ``<code>``; a text with an
    unmatched backtick is plain text."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        return html.escape(text)
    return "".join(
        f"<code>{html.escape(part)}</code>" if odd else html.escape(part)
        for odd, part in zip(itertools.cycle((False, True)), parts)
    )


def to_html(doc: Document) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(doc.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{e(doc.title)}</h1>",
    ]
    for block in doc.blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{inline_html(block.text)}</p>")
        elif isinstance(block, Bullets):
            items = "".join(f"<li>{inline_html(i)}</li>" for i in block.items)
            out.append(f"<ul>{items}</ul>")
        elif isinstance(block, Table):
            frame = block.frame
            numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
            out.append(f'<div class="{TABLE_BOX_CLASS}"><table>')
            if block.caption:
                out.append(f"<caption>{inline_html(block.caption)}</caption>")
            out.append("<tr>" + "".join(f"<th>{e(str(c))}</th>" for c in frame.columns) + "</tr>")
            for row in frame.itertuples(index=False):
                cells = (
                    f'<td class="n">{e(cell_text(v))}</td>' if n else f"<td>{e(cell_text(v))}</td>"
                    for v, n in zip(row, numeric, strict=True)
                )
                out.append("<tr>" + "".join(cells) + "</tr>")
            out.append("</table></div>")
        elif isinstance(block, Image):
            out.append(f'<p><img src="{e(block.file)}" alt="{e(block.alt)}"></p>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"
