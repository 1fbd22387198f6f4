"""Figures and small recorders for chapters 12-15 (serving). Drawing only: every number drawn comes
from the caller or from a run the caller made; nothing here is engine logic."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from draw import BLUE, GREEN, GREY, ORANGE, RED

API, TOK, SCHED, CLIENT = "#cfe2f3", "#d9ead3", "#fde9c9", "#eeeeee"


def _box(ax, x, y, w, h, title, detail, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#333", linewidth=0.8))
    ax.text(x + w / 2, y + h - 0.22, title, ha="center", va="top", fontsize=10, weight="bold")
    ax.text(x + w / 2, y + h - 0.55, detail, ha="center", va="top", fontsize=7.5, color="#444")


def _labelled_arrow(ax, a, b, lines: Sequence[str], side: str, color="#333"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, color=color, linewidth=1.3))
    x, y = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
    dy = 0.12 if side == "above" else -0.12
    ax.text(x, y + dy, "\n".join(lines), ha="center", va="bottom" if side == "above" else "top", fontsize=7.5, color=color)


# ---- chapter 12: who talks to whom -------------------------------------------------------------
def process_topology():
    """The server's processes and the messages each socket carries (PUSH connects, PULL binds)."""
    fig, ax = plt.subplots(figsize=(13, 4.0))
    ax.set_xlim(0, 12.6), ax.set_ylim(0.2, 3.9), ax.axis("off")
    _box(ax, 0.1, 1.3, 1.4, 1.6, "clients", "HTTP: OpenAI\nclients, curl", CLIENT)
    _box(ax, 2.2, 1.0, 1.9, 2.2, "API server", "FastAPI on asyncio;\none RequestStream\nper request", API)
    _box(ax, 6.3, 1.0, 1.9, 2.2, "tokenizer\nworker", "\n\ntext -> ids, context\ncheck; ids -> text,\nstop strings", TOK)
    _box(ax, 10.4, 1.0, 2.1, 2.2, "scheduler", "SchedulerIO: the\nengine's loop; leads\nTP ranks (ch. 16)", SCHED)
    ax.add_patch(FancyArrowPatch((1.5, 2.1), (2.2, 2.1), arrowstyle="<|-|>", mutation_scale=12, color="#777"))
    ax.text(1.85, 2.2, "HTTP", ha="center", fontsize=7.5, color="#777")
    _labelled_arrow(ax, (4.1, 2.7), (6.3, 2.7), ["TokenizeMsg", "AbortMsg (client gone)", "StatusQuery"], "above", BLUE)
    _labelled_arrow(ax, (6.3, 1.5), (4.1, 1.5), ["UserReply (new text)", "ErrorReply (HTTP 400)", "StatusMsg"], "below", GREEN)
    _labelled_arrow(ax, (8.2, 2.7), (10.4, 2.7), ["UserMsg (token ids)", "AbortMsg (gone / stop string)", "StatusQuery"], "above", BLUE)
    _labelled_arrow(ax, (10.4, 1.5), (8.2, 1.5), ["DetokenizeMsg per token,", "SchedulerErrorMsg, StatusMsg:", "one BatchMsg per step"], "below", GREEN)
    ax.set_title("Three processes, four one-way ZMQ pipes: each arrow is a PUSH socket (connects) into a PULL socket "
                 "(the receiver binds)", fontsize=10)
    fig.tight_layout()
    return fig


# ---- chapter 13: the detokenizer's two offsets -------------------------------------------------
def _printable(text: str) -> str:
    """Text as the default font can draw it: characters outside Latin-1 become U+XXXX."""
    return "".join(c if ord(c) < 0x250 and c.isprintable() else f"<U+{ord(c):04X}>" for c in text)


def record_offsets(detok, ids: Sequence[int]) -> List[Dict[str, Any]]:
    """Feed `ids` one at a time; after each, the offsets, how many ids there are, and what was sent."""
    rows = []
    for t in ids:
        piece = detok.add([t])
        rows.append({"token": int(t), "prefix_offset": detok.prefix_offset, "read_offset": detok.read_offset,
                     "ids": len(detok.ids), "sends": piece})
    return rows


def detok_offsets(rows: Sequence[Dict[str, Any]], title: str = ""):
    """One row per token arrival: which ids are sent and outside the window, sent but still in the
    window (decoded again for context), or held back; and the text that arrival sent."""
    n = max(r["ids"] for r in rows)
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.4))
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        for pos in range(r["ids"]):
            if pos < r["prefix_offset"]:
                color = "#e6e6e6"
            elif pos < r["read_offset"]:
                color = GREEN
            else:
                color = ORANGE
            ax.add_patch(plt.Rectangle((pos, y + 0.08), 0.94, 0.84, facecolor=color, edgecolor="white"))
        ax.text(n + 0.3, y + 0.5, f"sends {_printable(r['sends'])!r}" if r["sends"] else "sends nothing",
                va="center", fontsize=8.5, color="#222" if r["sends"] else "#999")
    ax.set_xlim(0, n + 4.5), ax.set_ylim(0, len(rows))
    ax.set_xticks([p + 0.47 for p in range(n)], [str(p) for p in range(n)], fontsize=8)
    ax.set_yticks([len(rows) - 1 - i + 0.5 for i in range(len(rows))], [f"+ {r['token']}" for r in rows], fontsize=8)
    ax.set_xlabel("position in the request's ids"), ax.set_ylabel("token added")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(handles=[Patch(color="#e6e6e6", label="sent, left the window"),
                       Patch(color=GREEN, label="sent, still in the window: [prefix_offset, read_offset)"),
                       Patch(color=ORANGE, label="held back: [read_offset, len(ids))")],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(rows) > 6 else -0.3), ncol=3, frameon=False, fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


# ---- chapter 14: the loop's turns --------------------------------------------------------------
def _short(msg) -> str:
    name = type(msg).__name__
    if name == "BatchMsg":
        return ", ".join(_short(m) for m in msg.msgs)
    return f"{name.replace('Msg', '').replace('Query', '?')} {getattr(msg, 'uid', '')}".strip()


def record_loop(sched) -> List[Dict[str, Any]]:
    """Log every turn of `sched.run_forever` that did something: what it received, the batch it
    stepped, and what it sent. Attach before the loop starts; the list fills as it runs."""
    turns: List[Dict[str, Any]] = []
    receive, step, put = sched.receive, sched.step, sched.send_queue.put

    def on_receive(timeout_s):
        msgs = receive(timeout_s)
        turns.append({"t": time.perf_counter(), "timeout_s": timeout_s, "received": [_short(m) for m in msgs], "batch": None, "sent": []})
        return msgs

    def on_step():
        before = len(sched.trace)
        step()
        new = sched.trace[before:]
        turns[-1]["batch"] = [(t.phase, list(t.uids)) for t in new]

    def on_put(msg):
        flat = msg.msgs if type(msg).__name__ == "BatchMsg" else [msg]
        turns[-1]["sent"] = [(m.uid, getattr(m, "token", None), getattr(m, "finish_reason", None), type(m).__name__) for m in flat]
        put(msg)

    sched.receive, sched.step, sched.send_queue.put = on_receive, on_step, on_put
    return turns


def busy_turns(turns: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The turns in which something was received, stepped or sent (idle polls dropped)."""
    return [t for t in turns if t["received"] or t["batch"] or t["sent"]]


def loop_timeline(turns: Sequence[Dict[str, Any]], title: str = ""):
    """One lane per request: its prefill and decode steps, each token sent, its abort and its end;
    above them, what each turn received and how long its receive was allowed to wait."""
    turns = busy_turns(turns)
    uids = sorted({u for t in turns for _, us in (t["batch"] or []) for u in us} | {s[0] for t in turns for s in t["sent"]})
    lane = {u: i for i, u in enumerate(uids)}
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(turns) + 3), 0.6 * len(uids) + 2.2))
    for x, t in enumerate(turns):
        for phase, us in t["batch"] or []:
            for u in us:
                ax.add_patch(plt.Rectangle((x - 0.45, lane[u] - 0.3), 0.9, 0.6, color=ORANGE if phase == "prefill" else BLUE, alpha=0.85))
        for uid, token, reason, kind in t["sent"]:
            if uid not in lane:
                continue
            if reason is not None:
                ax.text(x, lane[uid], "x" if reason == "abort" else "|", ha="center", va="center", fontsize=12,
                        color=RED if reason == "abort" else "#222", weight="bold")
                ax.text(x + 0.35, lane[uid] + 0.32, reason, fontsize=7, color=RED if reason == "abort" else "#222")
            elif token is not None:
                ax.plot([x], [lane[uid]], "o", color="white", markersize=3.5)
        label = "\n".join(t["received"][:3]) + ("\n..." if len(t["received"]) > 3 else "")
        if label:
            ax.text(x - 0.3, len(uids) - 0.35, label, ha="left", va="bottom", fontsize=6.5, color="#333", rotation=30)
        ax.text(x, -0.95, "wait" if t["timeout_s"] else "peek", ha="center", fontsize=6.5, color="#888")
    ax.set_yticks(range(len(uids)), [f"request {u}" for u in uids], fontsize=8)
    ax.set_xticks(range(len(turns)), [str(i) for i in range(len(turns))], fontsize=7)
    ax.set_xlim(-0.7, len(turns) + 0.7), ax.set_ylim(-1.1, len(uids) + 1.6)
    ax.set_xlabel("turn of the loop (received above; 'wait' = blocked in receive, 'peek' = timeout 0)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(handles=[Patch(color=ORANGE, label="prefill step"), Patch(color=BLUE, label="decode step (dot: token sent)"),
                       Patch(color=RED, label="x: ended by an abort")], loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


# ---- chapter 15: one streamed request, seen from the client ------------------------------------
def stream_timeline(streams: Dict[str, Dict[str, Any]], title: str = ""):
    """One row per streamed request, each on its own clock (0 = the request was sent): `start`,
    `events` (arrival time and payload of each SSE event), and optionally `closed` (the client
    hung up) and `idle` (the server's /health said idle again), all `time.perf_counter()` values."""
    fig, ax = plt.subplots(figsize=(11, 1.2 * len(streams) + 1.3))
    for y, (name, s) in enumerate(reversed(list(streams.items()))):
        t0 = s["start"]
        times = [t - t0 for t, _ in s["events"]]
        marks = times + [s[k] - t0 for k in ("closed", "idle") if k in s]
        ax.plot([0, max(marks)], [y, y], color=GREY, linewidth=6, solid_capstyle="butt", zorder=0)
        ax.vlines(times, y - 0.22, y + 0.22, color=BLUE, linewidth=1.2)
        if times:
            ax.annotate("", xy=(times[0], y + 0.32), xytext=(0, y + 0.32), arrowprops=dict(arrowstyle="<->", color=ORANGE, linewidth=1))
            ax.text(times[0] / 2, y + 0.38, f"first event {1000 * times[0]:.0f} ms", ha="center", fontsize=7.5, color=ORANGE)
        if len(times) > 1:
            ax.text(times[-1], y - 0.45, f"{len(times)} events, last at {1000 * times[-1]:.0f} ms", ha="right", fontsize=7.5, color=BLUE)
        if "closed" in s:
            ax.plot([s["closed"] - t0], [y], "X", color=RED, markersize=9)
            ax.text(s["closed"] - t0, y + 0.3, f"client hangs up at {1000 * (s['closed'] - t0):.0f} ms", ha="left", fontsize=7.5, color=RED)
        if "idle" in s:
            ax.plot([s["idle"] - t0], [y], "s", color=GREEN, markersize=7)
            ax.text(s["idle"] - t0, y - 0.45, f"/health idle at {1000 * (s['idle'] - t0):.0f} ms", ha="left", fontsize=7.5, color=GREEN)
    ax.set_yticks(range(len(streams)), list(reversed(list(streams))), fontsize=8.5)
    ax.set_ylim(-0.8, len(streams) - 0.2), ax.set_xlabel("seconds since the request was sent (blue: one SSE event each, as the client read it)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
