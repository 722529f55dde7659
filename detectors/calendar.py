"""Site calendars: official holidays (``holidays`` package) plus holiday *periods* (festival weeks).

A day is a *holiday* when the ``holidays`` package lists it for the site's country/subdivision, when it lies in a
festival period of ``detectors/calendars/<COUNTRY>.yaml`` (e.g. Malaysia's Chinese New Year and Hari Raya weeks,
derived each year from the official days), or in one of ``SiteConfig.holiday_periods``.  An *offday* is a
weekend day or a holiday.  Weekend days are the ``holidays`` calendar's for that date and subdivision (e.g.
Friday+Saturday in Kedah, Kelantan, Terengganu, and Johor 2014-2024), except its weekend working days (make-up
workdays, e.g. China's); Saturday+Sunday without a country.

Guarantees: pure lookups on local calendar dates (the caller converts timestamps into the site's time zone);
unknown countries raise ``ValueError`` at construction (a typo must not silently disable labelling).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

CALENDAR_DIR = Path(__file__).resolve().parent / "calendars"


def _parse_day(s: str | date) -> date:
    return s if isinstance(s, date) else date.fromisoformat(str(s))


class SiteCalendar:
    """Holiday lookups for one site.  ``periods`` are ``(name, first_day, last_day)`` or objects with
    ``name/start/end`` attributes (``SiteConfig.holiday_periods``)."""

    def __init__(self, country: str | None, subdivision: str | None = None,
                 periods: Iterable[Any] = (), calendar_dir: Path | None = CALENDAR_DIR) -> None:
        country = country.strip().upper() if country else country  # "us" is the US (holidays wants "US")
        self.country = country
        self.subdivision = subdivision
        self._official: Any = None
        self.weekend: set[int] = {5, 6}  # the default weekend only: per date, see is_weekday_workday
        if country:
            import holidays

            try:
                self._official = holidays.country_holidays(country, subdiv=subdivision)
            except NotImplementedError as exc:
                raise ValueError(f"no holiday calendar for country {country!r}: {exc}") from None
            self.weekend = set(getattr(self._official, "weekend", {5, 6}))
            # the package takes alpha-3 codes too ("MYS"); the festival file is named by the alpha-2 code it
            # resolves to (with "MYS" the Chinese New Year week was silently lost: trial 31)
            country = self.country = str(getattr(self._official, "country", country) or country)
        self._periods: list[tuple[str, date, date]] = []
        for p in periods:
            if isinstance(p, tuple):
                name, start, end = p
            else:
                name, start, end = p.name, p.start, p.end
            self._periods.append((str(name), _parse_day(start), _parse_day(end)))
        self._festivals: list[dict[str, Any]] = []
        if country and calendar_dir is not None:
            f = calendar_dir / f"{country.upper()}.yaml"
            if f.is_file():
                data = yaml.safe_load(f.read_text()) or {}
                self._festivals = list(data.get("festivals") or [])
                for p in data.get("periods") or []:
                    self._periods.append((str(p["name"]), _parse_day(p["start"]), _parse_day(p["end"])))

    @lru_cache(maxsize=64)  # noqa: B019 - calendars live as long as the process
    def _festival_periods(self, year: int) -> tuple[tuple[str, date, date], ...]:
        if self._official is None:
            return ()
        import holidays

        official = holidays.country_holidays(str(self.country), subdiv=self.subdivision, years=[year - 1, year, year + 1])
        out = []
        for fest in self._festivals:
            days = sorted(d for d, n in official.items() if str(fest["match"]).lower() in str(n).lower())
            clusters: list[list[date]] = []
            for d in days:
                if clusters and (d - clusters[-1][-1]).days <= 7:
                    clusters[-1].append(d)
                else:
                    clusters.append([d])
            for c in clusters:
                start = c[0] - timedelta(days=int(fest.get("days_before", 0)))
                end = c[-1] + timedelta(days=int(fest.get("days_after", 0)))
                out.append((str(fest["name"]), start, end))
        return tuple(out)

    def holiday_name(self, d: date) -> str | None:
        """Name of the holiday or holiday period covering ``d``, else ``None``."""
        if self._official is not None:
            name = self._official.get(d)
            if name:
                return str(name)
        for name, start, end in self._periods:
            if start <= d <= end:
                return name
        for name, start, end in self._festival_periods(d.year):
            if start <= d <= end:
                return name
        return None

    def is_holiday(self, d: date) -> bool:
        return self.holiday_name(d) is not None

    def is_weekday_workday(self, d: date) -> bool:
        """``d`` is not a weekend day, or is one of the calendar's weekend working days (whatever the holidays).
        The weekend is the ``holidays`` calendar's on that date (it varies by subdivision and year)."""
        if self._official is None:
            return d.weekday() not in self.weekend
        if not self._official.is_weekend(d):  # also loads d's year, so weekend_workdays below is filled
            return True
        return d in self._official.weekend_workdays

    def is_offday(self, d: date) -> bool:
        return not self.is_weekday_workday(d) or self.is_holiday(d)


def site_calendar(site: Any) -> SiteCalendar:
    """Calendar of a ``SiteConfig`` (country, subdivision, holiday_periods)."""
    return SiteCalendar(site.country, site.subdivision, site.holiday_periods)
