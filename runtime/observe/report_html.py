"""A session as one self-contained HTML file: no request leaves the page when it is viewed
(inline CSS and JavaScript, the data inline), so it can be mailed, archived or opened offline.

What it shows, top to bottom: the outcome (reply, children by reason, tokens, cost); the
invariants ``check`` verified; the spawn tree (every agent with its terminal reason, calls,
tokens and cost; collapsible, depth 2 and beyond folded); a timeline (one row per agent: its
life, model requests, ral calls, errors); the most expensive agents and model calls and the
slowest ral calls; every error; every rejected message; damaged lines of the files read.

The facts are written as HTML, so the page reads without scripts too; the script adds the
search box (which filters the tree, the timeline and every table by agent name, reason or
text; a link ending in ``#q=TEXT`` opens with that search), expand/collapse of the tree and
the timeline's canvas. It sets ``data-ready`` on
``<body>`` when done and writes any script error into ``#script-errors``, which is how the
headless-browser test tells that the page ran clean.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from exarch_actors.runtime.observe.spans import (
    AgentSummary,
    Problem,
    SessionView,
    Span,
    most_expensive,
)

TOP = 25
KIND_CODE = {"agent": 0, "turn": 1, "model": 2, "ral": 3}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _money(cost: Decimal | None) -> str:
    return "unknown" if cost is None else f"${cost:.6f}".rstrip("0").rstrip(".")


def _tokens(a: AgentSummary) -> str:
    if a.input_tokens is None and a.output_tokens is None:
        return "?"
    return f"{a.input_tokens or 0:,} in / {a.output_tokens or 0:,} out"


def _when(view: SessionView, t: float) -> str:
    return f"+{t - view.start:.3f}s"


def _table(
    head: Iterable[str], rows: Iterable[Iterable[Any]], cls: str = "", searched: bool = True
) -> str:
    """A table; with ``searched``, each row carries the text the search box filters it by."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for row in rows:
        cells = list(row)
        search = " ".join(str(c) for c in cells).lower()
        attr = f' data-search="{_e(search)}"' if searched else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    if not body:
        return '<p class="none">none</p>'
    return (
        f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def _outcome(view: SessionView, invariants: Mapping[str, Any] | None) -> str:
    fy = view.fleet_yield
    agents = view.agents.values()
    tokens_in = sum(a.input_tokens or 0 for a in agents)
    tokens_out = sum(a.output_tokens or 0 for a in agents)
    known = all(a.cost is not None for a in agents)
    total = sum((a.cost or Decimal(0) for a in agents), Decimal(0))
    by_reason = ", ".join(f"{n} {r}" for r, n in sorted((fy.get("byReason") or {}).items()))
    verdict = "not checked"
    if invariants is not None:
        verdict = (
            "all invariants held"
            if invariants.get("ok")
            else f"{invariants.get('violated')} invariant(s) violated"
        )
    facts = [
        ("outcome", view.outcome or "(no result.json: the run did not finish)"),
        ("reply", view.reply if view.reply is not None else "(none)"),
        ("agents", f"{len(view.agents)} ({by_reason or 'no children'})"),
        ("model requests", sum(a.model_calls for a in agents)),
        ("ral calls", sum(a.ral_calls for a in agents)),
        ("tokens", f"{tokens_in:,} in / {tokens_out:,} out"),
        ("cost", _money(total) + ("" if known else " known (some agents unknown)")),
        ("wall time", f"{view.end - view.start:.3f}s"),
        ("errors", len(view.errors)),
        ("rejected messages", len(view.rejected)),
        ("invariants", verdict),
    ]
    rows = "".join(
        f'<tr><th>{_e(k)}</th><td id="fact-{_e(k.replace(" ", "-"))}">{_e(v)}</td></tr>'
        for k, v in facts
    )
    return f'<table class="facts">{rows}</table>'


def _invariants(invariants: Mapping[str, Any] | None) -> str:
    if invariants is None:
        return '<p class="none">not checked</p>'
    rows = [
        (r.get("name"), r.get("status"), r.get("checked"), "; ".join(r.get("details") or []))
        for r in invariants.get("invariants") or []
    ]
    promise = (
        f"<p>durability {_e(invariants.get('durability'))}: {_e(invariants.get('promise'))}</p>"
    )
    return promise + _table(
        ("invariant", "status", "checked", "details"), rows, "invariants", searched=False
    )


def _tree(view: SessionView) -> str:
    out: list[str] = []

    def node(a: AgentSummary) -> None:
        reason = a.outcome or "(running)"
        bad = (
            " bad" if a.status in ("down", "cancelled") or reason in ("failed", "cancelled") else ""
        )
        search = f"{a.name} {reason} {a.cause or ''}".lower()
        label = (
            f'<span class="name">{_e(a.name)}</span> <span class="reason{bad}">{_e(reason)}</span>'
            f'<span class="meta"> · {a.model_calls} requests · {a.ral_calls} ral · '
            f"{_e(_tokens(a))} · {_e(_money(a.cost))}"
            + (f" · {a.errors} errors" if a.errors else "")
            + (f" · {a.incarnations} incarnations" if a.incarnations > 1 else "")
            + (f" · {_e(a.cause)}" if a.cause else "")
            + "</span>"
        )
        attrs = f'class="agent" data-agent="{_e(a.name)}" data-search="{_e(search)}"'
        if not a.children:
            out.append(f"<li {attrs}>{label}</li>")
            return
        opened = " open" if a.depth < 1 else ""
        out.append(
            f"<li {attrs}><details{opened}><summary>{label} "
            f'<span class="count">({len(a.children)} children)</span></summary><ul>'
        )
        for child in a.children:
            node(view.agents[child])
        out.append("</ul></details></li>")

    for a in view.agents.values():
        if a.depth == 0:
            node(a)
    return f'<ul class="tree" id="tree">{"".join(out)}</ul>'


def _timeline_data(view: SessionView) -> dict[str, Any]:
    index = {name: n for n, name in enumerate(view.agents)}

    def ms(t: float) -> float:
        return round((t - view.start) * 1000, 3)

    spans = [
        [index[s.agent], KIND_CODE[s.kind], ms(s.start), ms(s.end), 1 if s.args.get("error") else 0]
        for s in view.spans
        if s.agent in index and s.kind in KIND_CODE
    ]
    marks = [[index[m.agent], m.kind, ms(m.at)] for m in view.marks if m.agent in index]
    return {
        "agents": [[a.name, a.depth, a.outcome or ""] for a in view.agents.values()],
        "spans": spans,
        "marks": marks,
        "end": ms(view.end),
    }


def _costly(view: SessionView) -> str:
    def key(a: AgentSummary) -> tuple[Decimal, int, float]:
        tokens = (a.input_tokens or 0) + (a.output_tokens or 0)
        return (a.cost or Decimal(0), tokens, a.seconds)

    agents = sorted(view.agents.values(), key=key, reverse=True)[:TOP]
    rows_a = [
        (a.name, _money(a.cost), _tokens(a), a.model_calls, f"{a.seconds:.3f}s") for a in agents
    ]
    calls = most_expensive(view.spans, TOP)
    rows_c = [
        (
            s.agent,
            s.name,
            s.args.get("cost") if s.args.get("cost") is not None else "unknown",
            f"{s.args.get('input_tokens') or '?'} in / {s.args.get('output_tokens') or '?'} out",
            f"{s.end - s.start:.3f}s",
            s.args.get("attempts", 1),
            f"{float(s.args.get('rate_wait') or 0):.3f}s",
            _when(view, s.end),
        )
        for s in calls
    ]
    slow: list[Span] = sorted(view.spans_of("ral"), key=lambda s: s.end - s.start, reverse=True)
    rows_r = [
        (s.agent, s.name, f"{s.end - s.start:.3f}s", "error" if s.args.get("error") else "ok")
        for s in slow[:TOP]
    ]
    return (
        "<h3>Agents by cost</h3>"
        + _table(("agent", "cost", "tokens", "requests", "model time"), rows_a)
        + "<h3>Model requests by cost</h3>"
        + _table(
            ("agent", "request", "cost $", "tokens", "latency", "attempts", "rate wait", "at"),
            rows_c,
        )
        + "<h3>Slowest ral calls</h3>"
        + _table(("agent", "call", "took", "result"), rows_r)
    )


def _problems(view: SessionView, problems: list[Problem]) -> str:
    rows = [(p.agent, _when(view, p.at), p.what, p.text) for p in problems]
    return _table(("agent", "at", "what", "detail"), rows, "problems")


def render_report(view: SessionView, invariants: Mapping[str, Any] | None = None) -> str:
    """The whole HTML page of ``view``; ``invariants`` is ``check``'s report as JSON
    (``InvariantReport.to_json()``), or None when it was not checked."""
    data = json.dumps(_timeline_data(view), separators=(",", ":")).replace("</", "<\\/")
    name = view.root.rstrip("/").rsplit("/", 1)[-1]
    sections = [
        ("outcome", "Outcome", _outcome(view, invariants)),
        ("invariants", "Invariants", _invariants(invariants)),
        (
            "tree",
            f"Spawn tree ({len(view.agents)} agents)",
            '<p><button id="expand">expand all</button> <button id="collapse">collapse all'
            "</button></p>" + _tree(view),
        ),
        (
            "timeline",
            "Timeline",
            '<p class="legend"><i class="k0"></i>agent <i class="k2"></i>model request '
            '<i class="k3"></i>ral call <i class="k4"></i>error <i class="k5"></i>spawn '
            '<i class="k6"></i>rejected message</p>'
            '<div id="timeline-box"><canvas id="timeline-canvas"></canvas></div>'
            '<p id="timeline-at"></p>',
        ),
        ("costly", "Where time and money went", _costly(view)),
        ("errors", f"Errors ({len(view.errors)})", _problems(view, view.errors)),
        ("rejected", f"Rejected messages ({len(view.rejected)})", _problems(view, view.rejected)),
        (
            "damage",
            f"Damaged or torn lines ({len(view.damage)})",
            _table(("where",), ((d,) for d in view.damage)),
        ),
    ]
    nav = " ".join(f'<a href="#{key}">{_e(title.split(" (")[0])}</a>' for key, title, _ in sections)
    body = "".join(
        f'<section id="{key}"><h2>{_e(title)}</h2>{content}</section>'
        for key, title, content in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>exarch-actors session {_e(name)}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<header><h1>session {_e(name)}</h1><nav>{nav}</nav>"
        '<input id="search" type="search" placeholder="search agents, reasons, errors…">'
        '<span id="matches"></span></header>'
        f'<main>{body}</main><pre id="script-errors"></pre>'
        f'<script type="application/json" id="data">{data}</script>'
        f"<script>{_JS}</script></body></html>\n"
    )


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{position:sticky;top:0;background:#1d2330;color:#fff;padding:8px 16px;z-index:2;
display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header h1{font-size:16px;margin:0}header a{color:#9cc3ff;margin-right:8px}
#search{flex:1;min-width:220px;padding:4px 8px;border-radius:4px;border:0}
main{padding:0 16px 32px}section{margin-top:20px}h2{font-size:17px;border-bottom:1px solid #d5d9e0}
h3{font-size:14px;margin-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:4px 0}
td,th{border:1px solid #dde1e7;padding:2px 8px;text-align:left;vertical-align:top;max-width:60em;
overflow-wrap:anywhere}
thead th{background:#eef1f5}.facts th{background:#eef1f5;width:11em}
.none{color:#777}.tree,.tree ul{list-style:none;padding-left:18px;margin:2px 0}
.tree li{margin:1px 0}.name{font-weight:600}.reason{color:#17803d}.reason.bad{color:#b42318}
.meta,.count{color:#667085}summary{cursor:pointer}
#timeline-box{overflow:auto;max-height:600px;border:1px solid #dde1e7;background:#fff}
.legend i{display:inline-block;width:12px;height:10px;margin:0 4px 0 12px}
.k0{background:#c9d2e0}.k2{background:#3b6fd8}.k3{background:#2e9e5b}.k4{background:#d92d20}.k5{background:#7a5af8}.k6{background:#f79009}
.hidden{display:none}#script-errors{color:#b42318}#matches{color:#c8d3e6}
#outcome,#invariants{display:inline-block;vertical-align:top;margin-right:40px}
#invariants{max-width:60em}
"""

_JS = """
(function(){
var errs=document.getElementById('script-errors');
window.addEventListener('error',function(e){errs.textContent+=String(e.message)+'\\n';});
var data=JSON.parse(document.getElementById('data').textContent);
var search=document.getElementById('search'),matches=document.getElementById('matches');
var shown=null;
function tree(q){
  var items=document.querySelectorAll('#tree li.agent'),n=0;shown={};
  for(var i=items.length-1;i>=0;i--){
    var li=items[i],hit=!q||li.dataset.search.indexOf(q)>=0;
    var kid=li.querySelector('li.agent:not(.hidden)');
    var on=hit||!!kid;li.classList.toggle('hidden',!on);
    if(on){shown[li.dataset.agent]=1;if(hit)n++;}
    if(q&&kid){var d=li.querySelector('details');if(d)d.open=true;}
  }
  return n;
}
function tables(q){
  var rows=document.querySelectorAll('tr[data-search]');
  for(var i=0;i<rows.length;i++){
    rows[i].classList.toggle('hidden',!!q&&rows[i].dataset.search.indexOf(q)<0);
  }
}
function filter(){
  var q=search.value.trim().toLowerCase();
  var n=tree(q);tables(q);draw();
  matches.textContent=q?n+' agents match':data.agents.length+' agents';
}
var colors=['#c9d2e0','#e4e8ef','#3b6fd8','#2e9e5b'];
function draw(){
  var canvas=document.getElementById('timeline-canvas'),box=document.getElementById('timeline-box');
  var rows=[],row={};
  for(var i=0;i<data.agents.length;i++){
    if(!shown||shown[data.agents[i][0]]){row[i]=rows.length;rows.push(i);}
  }
  var h=14,label=200,maxRows=Math.floor(30000/h),count=Math.min(rows.length,maxRows);
  var w=Math.max(600,(box.clientWidth||1200)-4);
  canvas.width=w;canvas.height=Math.max(h,count*h);
  var c=canvas.getContext('2d'),scale=(w-label-8)/Math.max(data.end,1);
  c.font='11px sans-serif';c.textBaseline='middle';
  for(var r=0;r<count;r++){
    var a=data.agents[rows[r]];
    if(r%2){c.fillStyle='#f5f7fa';c.fillRect(0,r*h,w,h);}
    c.fillStyle='#1d2330';c.fillText(new Array(a[1]+1).join('  ')+a[0],2,r*h+h/2,label-4);
  }
  var order=[0,1,2,3];
  for(var k=0;k<order.length;k++){
    for(var s=0;s<data.spans.length;s++){
      var sp=data.spans[s];if(sp[1]!==order[k])continue;
      var rr=row[sp[0]];if(rr===undefined||rr>=count)continue;
      var x=label+sp[2]*scale,x2=label+sp[3]*scale,pad=sp[1]<2?1+sp[1]*2:4;
      c.fillStyle=sp[4]?'#d92d20':colors[sp[1]];
      c.fillRect(x,rr*h+pad,Math.max(1,x2-x),h-2*pad);
    }
  }
  for(var m=0;m<data.marks.length;m++){
    var mk=data.marks[m],mr=row[mk[0]];if(mr===undefined||mr>=count)continue;
    if(mk[1]==='error'||mk[1]==='rejected'||mk[1]==='spawn'){
      c.fillStyle=mk[1]==='spawn'?'#7a5af8':mk[1]==='rejected'?'#f79009':'#d92d20';
      c.fillRect(label+mk[2]*scale-1,mr*h+1,3,h-2);
    }
  }
  document.getElementById('timeline-at').textContent=
    (rows.length>count?('first '+count+' of '+rows.length+' rows: search to narrow; '):'')+
    'from 0 to '+(data.end/1000).toFixed(3)+' s';
}
document.getElementById('expand').onclick=function(){
  document.querySelectorAll('#tree details').forEach(function(d){d.open=true;});};
document.getElementById('collapse').onclick=function(){
  document.querySelectorAll('#tree details').forEach(function(d){d.open=false;});};
if(location.hash.indexOf('#q=')===0){search.value=decodeURIComponent(location.hash.slice(3));}
search.addEventListener('input',filter);
window.addEventListener('resize',draw);
filter();
document.body.dataset.ready='1';
})();
"""
