"""The page's markup: the one place where text becomes HTML. Everything else in the report produces plain text
(names, settings, paths and messages read from a store among it); these functions escape all of it, so none
becomes markup."""

from __future__ import annotations

import base64
import html
from typing import Any

PAGE_START = "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>dpeval report</title>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; font-size: 0.78em; margin: 0.6em 0; width: 100%; table-layout: auto; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.4em; text-align: right; }
th { background: #f3f3f3; font-weight: 600; white-space: normal; vertical-align: bottom; }
td { white-space: nowrap; } td.leaks { color: #a00; font-weight: 600; }
img { max-width: 100%; margin: 0.4em 0; } figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figcaption { font-size: 0.8em; color: #555; max-width: 420px; }
p.note { font-size: 0.85em; color: #444; } ul.missing { font-size: 0.8em; color: #a00; }
div.wide { overflow-x: auto; }
"""


Line = str | tuple[str, str]  # a summary line, or (a lead set in bold, the rest of the line)


def _text(value: Any, attribute: bool = False) -> str:
    return html.escape(str(value), quote=attribute)


def _class(name: str) -> str:
    return f' class="{_text(name, True)}"' if name else ""


def heading(title: str, level: int = 2) -> str:
    return f"<h{level}>{_text(title)}</h{level}>"


def paragraph(text: str, cls: str = "") -> str:
    return f"<p{_class(cls)}>{_text(text)}</p>"


def bullets(lines: list[Line], cls: str) -> str:
    items = "".join(f"<li><b>{_text(line[0])}</b>{_text(line[1])}</li>" if isinstance(line, tuple)
                    else f"<li>{_text(line)}</li>" for line in lines)
    return f"<ul{_class(cls)}>{items}</ul>"


def table_html(head: list[tuple[str, str]], rows: list[list[tuple[str, bool]]]) -> str:
    """``head``: (column key, shown on hover; header); ``rows``: cells (text, whether it is a verdict that leaks)."""
    header = "".join(f'<th title="{_text(key, True)}">{_text(name)}</th>' for key, name in head)
    body = "".join("<tr>" + "".join(f"<td{_class('leaks' if leaks else '')}>{_text(text)}</td>" for text, leaks in row)
                   + "</tr>" for row in rows)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def wide(table: str) -> str:
    """A table of ``table_html`` that may be wider than the page, scrolled sideways within it."""
    return f'<div class="wide">{table}</div>'


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{_text(alt, True)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def figure(png: bytes, caption: str) -> str:
    return f"<figure>{image(png, caption)}<figcaption>{_text(caption)}</figcaption></figure>"


def page_html(sections: list[str]) -> str:
    return f"{PAGE_START}<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>"
