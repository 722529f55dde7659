"""SiteCalendar weekends follow the ``holidays`` calendar per date and subdivision, with its weekend working days."""

from __future__ import annotations

from datetime import date

import holidays
import pytest
from forumpulse.detectors.calendar import SiteCalendar


@pytest.mark.parametrize(("subdiv", "day", "offday"), [
    ("KTN", date(2026, 3, 13), True),    # Kelantan: Friday + Saturday weekend
    ("KTN", date(2026, 3, 14), True),
    ("KTN", date(2026, 3, 15), False),   # ... Sunday is a workday
    ("KDH", date(2026, 3, 13), True),    # Kedah
    ("TRG", date(2026, 3, 13), True),    # Terengganu
    ("JHR", date(2024, 12, 27), True),   # Johor: Friday + Saturday from 2014 to 2024
    ("JHR", date(2024, 12, 29), False),
    ("JHR", date(2025, 1, 3), False),    # ... Saturday + Sunday again from 2025
    ("JHR", date(2025, 1, 5), True),
    (None, date(2026, 3, 13), False),    # Malaysia without a state: Saturday + Sunday
    (None, date(2026, 3, 15), True),
])
def test_malaysian_state_weekends(subdiv: str | None, day: date, offday: bool) -> None:
    cal = SiteCalendar("MY", subdiv)
    assert cal.holiday_name(day) is None  # a plain day: only the weekend decides
    assert cal.is_offday(day) is offday
    assert cal.is_weekday_workday(day) is not offday
    assert holidays.country_holidays("MY", subdiv=subdiv).is_weekend(day) is offday


def test_friday_offday_in_kelantan_from_the_audit() -> None:
    assert SiteCalendar("MY", "KTN").is_offday(date(2026, 3, 6))


def test_weekend_working_days_are_workdays() -> None:
    """China's make-up working day Sunday 4 Feb 2024 is a workday; the Saturday before is a weekend day."""
    cal = SiteCalendar("CN")
    assert cal.holiday_name(date(2024, 2, 4)) is None
    assert cal.is_weekday_workday(date(2024, 2, 4)) and not cal.is_offday(date(2024, 2, 4))
    assert cal.is_offday(date(2024, 2, 3))


def test_no_country_weekend_is_saturday_sunday() -> None:
    cal = SiteCalendar(None)
    assert [cal.is_offday(date(2026, 3, d)) for d in range(9, 16)] == [False] * 5 + [True, True]


@pytest.mark.parametrize("code", ["MYS", "mys", "MY"])
def test_alpha3_country_keeps_the_festival_weeks(code: str) -> None:
    """``holidays`` takes "MYS"; the festival file is named by the alpha-2 code (trial 31: with "MYS" the
    Chinese New Year week was silently lost, only the official days were holidays)."""
    cal = SiteCalendar(code)
    assert cal.country == "MY"
    assert cal.holiday_name(date(2024, 2, 8)) == "Chinese New Year week"
