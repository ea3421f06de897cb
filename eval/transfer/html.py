"""The transfer report as one self-contained HTML page: the same tables as ``transfer.md``, cards per target, the
honest notes, and the figures inline.

    page = html_page(results, {"speedup": svg, ...})   # figures: name -> inline SVG (ooospec.eval.transfer.plots)

Speedup cells are shaded by their value (:func:`shade`); the page has no script and loads nothing.
"""

from __future__ import annotations

import html

from ooospec.eval.transfer.data import CEILING_GAIN, GAIN, dig, targets_of
from ooospec.eval.transfer.notes import HELPS, LATE, WEAK_CALLER, WRONG, headline, transfer_notes
from ooospec.eval.transfer.tables import Table, tables
from ooospec.reporting import fmt_cell
from ooospec.runtime.methods import OOOSPEC, TOOLSPEC

CSS = """
:root { --ink: #1f2328; --muted: #59636e; --rule: #d8dee4; --band: #f6f8fa; --accent: #d62728; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 28px 60px; }
h1 { font-size: 26px; margin: 0 0 6px; letter-spacing: -0.01em; }
h2 { font-size: 19px; margin: 38px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--rule); }
h3 { font-size: 15px; margin: 22px 0 6px; }
p.lead { color: var(--muted); margin: 4px 0 10px; max-width: 980px; }
.sub { color: var(--muted); max-width: 980px; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--band);
       padding: 1px 5px; border-radius: 4px; }
.cmd { display: block; white-space: pre-wrap; overflow-wrap: anywhere; padding: 8px 10px; margin: 4px 0 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(255px, 1fr)); gap: 12px; margin: 18px 0 6px; }
.card { border: 1px solid var(--rule); border-radius: 10px; padding: 12px 14px; background: #fff; }
.card h4 { margin: 0 0 2px; font-size: 14px; }
.card .chips { color: var(--muted); font-size: 12px; margin-bottom: 8px; }
.card .big { font-size: 24px; font-weight: 650; letter-spacing: -0.02em; }
.card .big small { font-size: 12px; font-weight: 400; color: var(--muted); letter-spacing: 0; }
.card .line { font-size: 12.5px; color: var(--muted); }
.card .verdict { margin-top: 6px; font-size: 12.5px; font-weight: 600; }
.good { color: #1a7f37; } .meh { color: #9a6700; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 13px; margin: 6px 0 4px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--rule); white-space: nowrap; }
th { text-align: right; font-weight: 600; background: var(--band); vertical-align: bottom; white-space: normal;
     max-width: 130px; line-height: 1.25; }
th.label, td.label { text-align: left; }
td { text-align: right; }
tbody tr:hover td { background: #fafbfc; }
ul.notes { color: var(--muted); font-size: 12.5px; margin: 4px 0 0; padding-left: 18px; }
figure { margin: 10px 0 8px; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 12.5px; max-width: 980px; }
.honest { border-left: 4px solid var(--rule); padding: 6px 12px; margin: 10px 0; background: #fcfcfd; }
.honest.helps { border-left-color: #1a7f37; } .honest.little { border-left-color: #bf8700; }
.honest ol { margin: 4px 0 0; padding-left: 20px; }
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
footer { margin-top: 40px; color: var(--muted); font-size: 12.5px; }
"""


def shade(value: float | None) -> str:
    """A background for a speedup cell: green above 1x, red below, stronger further away (log scale, capped)."""
    import math

    if value is None or value <= 0:
        return ""
    x = max(-1.0, min(1.0, math.log2(value) / 1.5))
    if abs(x) < 0.03:
        return ""
    rgb = "26,127,55" if x > 0 else "207,34,46"
    return f' style="background: rgba({rgb},{0.06 + 0.30 * abs(x):.2f})"'


def table_html(table: Table) -> str:
    esc = html.escape
    head = "".join(f'<th class="label">{esc(h)}</th>' if i < table.labels else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(table.headers))
    body = []
    for row in table.rows:
        tds = "".join(f'<td class="label">{esc(c.text)}</td>' if i < table.labels
                      else f"<td{shade(c.value)}>{esc(c.text)}</td>" for i, c in enumerate(row))
        body.append(f"<tr>{tds}</tr>")
    parts = [f'<h3 id="{esc(table.slug)}">{esc(table.title)}</h3>']
    if table.lead:
        parts.append(f'<p class="lead">{esc(table.lead)}</p>')
    parts.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
                 f"</table></div>")
    if table.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in table.notes) + "</ul>")
    return "\n".join(parts)


def cards_html(results: dict) -> str:
    """One card per target: ooospec's and toolspec's pooled speedup, the hint gain, own call accuracy, verdict."""
    esc = html.escape
    notes = {t: (verdict, reasons) for t, verdict, reasons in transfer_notes(results)}
    out = []
    for t in targets_of(results):
        info, s = results["targets"][t]["info"], results["targets"][t]["summary"]
        sp = s.get("speedup", {})
        best = OOOSPEC if OOOSPEC in sp else TOOLSPEC if TOOLSPEC in sp else None
        big = (f'{sp[best]:.2f}x <small>{esc(best)} vs AR</small>' if best else "-")
        lines = []
        if TOOLSPEC in sp and best == OOOSPEC:
            lines.append(f"{TOOLSPEC} {sp[TOOLSPEC]:.2f}x · hint gain {fmt_cell(s.get(GAIN), '{:.2f}x')}"
                         f" (ceiling {fmt_cell(s.get(CEILING_GAIN), '{:.2f}x')})")
        lines.append(f"own call right: {fmt_cell(dig(s, 'call', 'call'), '{:.0%}')} of {s['examples']} requests")
        verdict = notes[t][0]
        cls = "good" if verdict.startswith("Hints help:") else "meh"
        short = "hints help" if cls == "good" else "hints help little" if "little" in verdict else "no hints run"
        chips = f"{info['model_type']} · {info['num_params'] / 1e6:.0f}M · template: {info['chat_template']}"
        out.append(f'<div class="card"><h4>{esc(t)}</h4><div class="chips">{esc(chips)}</div>'
                   f'<div class="big">{big}</div>' + "".join(f'<div class="line">{esc(x)}</div>' for x in lines)
                   + f'<div class="verdict {cls}">{esc(short)}</div></div>')
    return '<div class="cards">' + "".join(out) + "</div>"


def honest_html(results: dict) -> str:
    esc = html.escape
    out = []
    for target, verdict, reasons in transfer_notes(results):
        cls = "helps" if verdict.startswith("Hints help:") else "little"
        items = "".join(f"<li>{esc(r)}</li>" for r in reasons)
        out.append(f'<div class="honest {cls}"><b>{esc(target)}</b>: {esc(verdict)}'
                   + (f"<ol>{items}</ol>" if items else "") + "</div>")
    return "\n".join(out)


CAPTIONS = {
    "speedup": "Each dot: a method's median per-example speedup vs AR in one cell, the line through it its "
               "bootstrap 95% interval; the cross: the ratio of mean times (the headline number). Right of the dashed "
               "line is faster than AR.",
    "accepted": "Tokens committed per target forward (accepted drafts + the bonus token), pooled over every cell. "
                "Plain decoding commits 1; every bar further right is a forward that did the work of several.",
    "timeline": "A few requests on one time axis: AR, ToolSpec and OoO-Spec decoding the same prompt, and the "
                "sidecar's wave for the OoO-Spec call (submitted at arrival; the target never waits for it).",
    "cost_gain": "Per target: seconds per request that hints save over ToolSpec (sidecar hints, and gold hints as the "
                 "ceiling) next to what the sidecar costs: its wave (compute beside the target) and the target "
                 "process's own sidecar work.",
}


def report_dir_of(results: dict) -> str:
    """The report folder the run wrote (the command's second argument), for the rebuild command."""
    words = results["command"].split()
    if len(words) > 4 and words[:3] == ["python", "-m", "ooospec.eval.transfer"]:
        return words[4]
    return "eval/reports/transfer"


def html_page(results: dict, figures: dict[str, str]) -> str:
    """The whole page; ``figures``: ``{name: inline svg}`` (see :mod:`ooospec.eval.transfer.plots`)."""
    esc = html.escape
    all_tables = tables(results)
    by_slug = {t.slug: t for t in all_tables}

    def fig(name: str, title: str) -> str:
        if name not in figures:
            return ""
        return (f'<h3 id="fig-{name}">{esc(title)}</h3><figure>{figures[name]}'
                f"<figcaption>{esc(CAPTIONS[name])}</figcaption></figure>")

    cells = "\n".join(table_html(t) for t in all_tables if t.slug.startswith("cell-"))
    body = f"""
<main>
<h1>Transfer: one frozen sidecar, every target</h1>
<p class="sub">{esc(headline(results))}</p>
{cards_html(results)}
<h2 id="headline">Speedup per target and benchmark</h2>
{fig("speedup", "Median per-example speedup with 95% intervals")}
{table_html(by_slug["speedup"])}
{table_html(by_slug["median"])}
<h2 id="honest">Transfer, honestly</h2>
<p class="lead">Where hints help little, the reasons below are the measured values that fall short
(own call accuracy under {WEAK_CALLER:.0%}, waves ready in time for under {LATE:.0%} of requests, sidecar calls right
for under {WRONG:.0%}, a gold-hint ceiling under {HELPS:.2f}x), plus what the prompt looked like.</p>
{honest_html(results)}
<h2 id="targets">Targets, calls and hints</h2>
{table_html(by_slug["targets"])}
{table_html(by_slug["gains"]) if "gains" in by_slug else ""}
{table_html(by_slug["calls"])}
{table_html(by_slug["hints"]) if "hints" in by_slug else ""}
{fig("cost_gain", "What the sidecar costs vs what it saves")}
<h2 id="decoding">How decoding went</h2>
{fig("accepted", "Accepted length per forward")}
{fig("timeline", "Target steps vs the sidecar's wave")}
<details open><summary>Cells in detail (every method, exactness, near-ties)</summary>
{cells}
</details>
<h2 id="setup">Setup</h2>
{table_html(by_slug["setup"])}
<footer>
<p>Regenerate this run: <code class="cmd">{esc(results["command"])}</code></p>
{"" if results["command"] == results["full_command"] else
 f'<p>The full matrix: <code class="cmd">{esc(results["full_command"])}</code></p>'}
<p>Every number on this page is read from <code>transfer.json</code>, the stage's output;
<code>ooospec transfer-report {report_dir_of(results)}/transfer.json --out-dir {report_dir_of(results)}</code> rebuilds
this page and <code>transfer.md</code> from it. Code fingerprint {esc(str(results.get("code")))}.</p>
</footer>
</main>"""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>ooo-spec transfer report</title><style>{CSS}</style></head><body>{body}</body></html>\n")
