"""The console's reports page: an agent's figures per day and channel, drawn as SVG bar charts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from math import ceil, log10
from typing import Any

from aiohttp import web

from core.errors import ParleyError
from gateway.admin.api import get_report
from gateway.admin.console.render import AGENT_COOKIE, Route, admin, page, render, route, run
from gateway.admin.schemas import ReportFiguresOut, ReportOut, ReportQuery
from gateway.middlewares import status_for

PAGE = "/admin/reports"

# Okabe and Ito's palette: told apart with every common colour blindness.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")

# The chart's drawing box (SVG user units); it scales to the page's width.
WIDTH, HEIGHT = 420, 200
LEFT, RIGHT, TOP, BOTTOM = 60, 8, 10, 28
MAX_X_LABELS = 6


@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    title: str
    stacked: bool  # counts add up across channels; rates and times stand side by side
    show: Callable[[float], str]


def _count(value: float) -> str:
    return str(round(value))


def _percent(value: float) -> str:
    return f"{round(value * 100)}%"


def _ms(value: float) -> str:
    return f"{round(value)} ms"


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    return f"{value / 60:.1f} min" if value >= 90 else f"{round(value)} s"


FIGURES = (
    Figure("conversations", "Conversations", True, _count),
    Figure("questions", "Questions answered by the bot", True, _count),
    Figure("deflected", "Answered by the bot alone (no handoff)", True, _count),
    Figure("handed_to_staff", "Handed to staff", True, _count),
    Figure("resolved", "Resolved", True, _count),
    Figure("thumbs_up_rate", "Thumbs up rate", False, _percent),
    Figure("first_token_ms_median", "Time to first token, median", False, _ms),
    Figure("first_token_ms_p90", "Time to first token, 90th percentile", False, _ms),
    Figure("staff_first_response_s_median", "Staff first response, median", False, _seconds),
    Figure("cached", "Answered from the answer cache", True, _count),
    Figure("cache_hit_rate", "Answer cache hit rate", False, _percent),
)


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    label: str  # the bar's <title>: day, channel and value


@dataclass(frozen=True, slots=True)
class Tick:
    at: float
    text: str


@dataclass(frozen=True, slots=True)
class Legend:
    title: str
    colour: str


@dataclass(frozen=True, slots=True)
class TableRow:
    day: str
    values: tuple[str, ...]  # per channel, then all channels ("–": none)


@dataclass(frozen=True, slots=True)
class Chart:
    key: str
    title: str
    description: str
    bars: tuple[Bar, ...]
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    rows: tuple[TableRow, ...]
    total: tuple[str, ...]
    empty: bool


def _nice_ceiling(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten, at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** int(log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)


def _value(figures: ReportFiguresOut | None, key: str) -> float | None:
    if figures is None:
        return None
    value = getattr(figures, key)
    return None if value is None else float(value)


def _day_label(day: date) -> str:
    return f"{day.day} {day:%b}"


def chart(report: ReportOut, figure: Figure) -> Chart:
    days = [
        report.first_day + timedelta(days=i)
        for i in range((report.last_day - report.first_day).days + 1)
    ]
    channels = [c.name for c in report.channels]
    titles = {c.name: c.title for c in report.channels}
    cell = {(f.day, f.channel): f for f in report.days}
    values = {
        (day, name): _value(cell.get((day, name)), figure.key) for day in days for name in channels
    }
    if figure.stacked:
        heights = [sum(values[(d, n)] or 0 for n in channels) for d in days]
    else:
        heights = [max((values[(d, n)] or 0 for n in channels), default=0) for d in days]
    top = _nice_ceiling(max(heights, default=0))
    if figure.show is _count:
        top = max(top, 2.0)  # whole numbers on the axis: 0, 1, 2 rather than 0, 0.5, 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    band = plot_w / len(days)

    def y_of(value: float) -> float:
        return TOP + plot_h - value / top * plot_h

    bars: list[Bar] = []
    for i, day in enumerate(days):
        x = LEFT + i * band + band * 0.1
        inner = band * 0.8
        base = 0.0
        for j, name in enumerate(channels):
            value = values[(day, name)]
            if value is None or value == 0:
                continue
            colour = COLOURS[j % len(COLOURS)]
            label = f"{_day_label(day)} · {titles[name]}: {figure.show(value)}"
            if figure.stacked:
                bars.append(Bar(x, y_of(base + value), inner, value / top * plot_h, colour, label))
                base += value
            else:
                width = inner / len(channels)
                bars.append(
                    Bar(x + j * width, y_of(value), width, value / top * plot_h, colour, label)
                )
    every = ceil(len(days) / MAX_X_LABELS)
    x_ticks = tuple(
        Tick(LEFT + (i + 0.5) * band, _day_label(day))
        for i, day in enumerate(days)
        if i % every == 0
    )
    y_ticks = tuple(Tick(y_of(top * k / 2), figure.show(top * k / 2)) for k in (0, 1, 2))

    def shown(value: float | None) -> str:
        return "–" if value is None else figure.show(value)

    def all_channels(day: date) -> float | None:
        present = [v for n in channels if (v := values[(day, n)]) is not None]
        if not present:
            return None
        if figure.stacked:
            return sum(present)
        return None  # a median or rate over all channels is not the mean of the channels'

    rows = tuple(
        TableRow(
            day.isoformat(),
            (*(shown(values[(day, n)]) for n in channels), shown(all_channels(day))),
        )
        for day in days
        if any(values[(day, n)] is not None for n in channels)
    )
    per_channel = {f.channel: f for f in report.per_channel}
    total = (
        *(shown(_value(per_channel.get(n), figure.key)) for n in channels),
        shown(_value(report.total, figure.key)),
    )
    description = (
        f"{figure.title} per day from {report.first_day} to {report.last_day}, "
        + ("stacked" if figure.stacked else "side by side")
        + " by channel: "
        + ", ".join(f"{titles[n]} {total[j]}" for j, n in enumerate(channels))
        + f"; all channels {total[-1]} over the period."
    )
    return Chart(
        key=figure.key,
        title=figure.title,
        description=description,
        bars=tuple(bars),
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        rows=rows,
        total=total,
        empty=not bars,
    )


def _legend(report: ReportOut) -> list[Legend]:
    return [Legend(c.title, COLOURS[i % len(COLOURS)]) for i, c in enumerate(report.channels)]


@page
async def reports_page(request: web.Request) -> web.StreamResponse:
    agents = await admin(request).agents.list()
    remembered = request.cookies.get(AGENT_COOKIE)
    slug = request.query.get("agent") or remembered
    if slug not in {a.slug for a in agents}:
        slug = agents[0].slug if agents else None
    asked = {
        "agent": slug,
        "from": request.query.get("from") or None,
        "to": request.query.get("to") or None,
    }
    empty: dict[str, Any] = {
        "report": None,
        "asked": asked,
        "charts": [],
        "legend": [],
        "agent_name": "",
    }
    if slug is None:
        return await render(
            request, "admin/reports.html", title="Reports", section="reports", **empty
        )
    try:
        query = ReportQuery.model_validate({k: v for k, v in asked.items() if v})
        report = await run(get_report, request, ReportOut, query=query)
    except (ParleyError, ValueError) as exc:
        message = exc.message if isinstance(exc, ParleyError) else _said(exc)
        status = status_for(exc) if isinstance(exc, ParleyError) else 400
        return await render(
            request, "admin/reports.html", title="Reports", section="reports",
            status=status, error=message, **empty,
        )  # fmt: skip
    agent = next(a for a in agents if a.slug == report.agent)
    shown = list(FIGURES)
    if not report.feedback_recorded:
        shown = [f for f in shown if f.key != "thumbs_up_rate"]
    return await render(
        request,
        "admin/reports.html",
        title="Reports",
        section="reports",
        report=report,
        asked={**asked, "from": report.first_day.isoformat(), "to": report.last_day.isoformat()},
        charts=[chart(report, f) for f in shown],
        legend=_legend(report),
        agent_name=agent.name,
        chart_box=(WIDTH, HEIGHT, LEFT, TOP, HEIGHT - BOTTOM),
    )


def _said(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}".removeprefix(": ").replace("Value error, ", "")
    return str(exc)


def routes() -> list[Route]:
    # Reading the figures is part of support work: agents may, as with gaps.
    return [route("GET", PAGE, reports_page, role="agent")]
