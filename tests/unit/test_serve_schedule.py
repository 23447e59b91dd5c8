"""The scheduled deployment reads operations.cron in operations.timezone (built without a server)."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect

import pytest

from tests.helpers import make_project
from unlearning.config import load_params


def params_with(tmp_path, timezone: str, cron: str = "0 2 * * *"):
    return load_params(make_project(tmp_path, {"operations": {"cron": cron, "timezone": timezone}}, inbox_files=False))


def next_runs_utc(schedule, start: dt.datetime, n: int = 1) -> list[dt.datetime]:
    """The next run times as the Prefect server computes them (its schema of the same schedule)."""
    from prefect.server.schemas.schedules import CronSchedule

    dates = CronSchedule(cron=schedule.cron, timezone=schedule.timezone).get_dates(n=n, start=start)
    if inspect.iscoroutine(dates):  # async in Prefect 3.9
        dates = asyncio.run(dates)
    return [d.astimezone(dt.timezone.utc).replace(tzinfo=None) for d in dates]


def test_cron_schedule_uses_operations_timezone(tmp_path):
    from flows.serve import cron_schedule

    schedule = cron_schedule(params_with(tmp_path, "Europe/Berlin"))
    assert (schedule.cron, schedule.timezone) == ("0 2 * * *", "Europe/Berlin")
    # 02:00 in Berlin: 01:00 UTC in winter (CET), 00:00 UTC in summer (CEST).
    utc = dt.timezone.utc
    assert next_runs_utc(schedule, dt.datetime(2027, 1, 10, 12, tzinfo=utc)) == [dt.datetime(2027, 1, 11, 1)]
    assert next_runs_utc(schedule, dt.datetime(2027, 7, 10, 12, tzinfo=utc)) == [dt.datetime(2027, 7, 11, 0)]


def test_default_timezone_is_utc(tmp_path):
    from flows.serve import cron_schedule

    schedule = cron_schedule(load_params(make_project(tmp_path, inbox_files=False)))
    assert schedule.timezone == "UTC"


def test_unknown_timezone_is_refused_with_the_key(tmp_path):
    # at load (unlearning/config.py): `unlearn serve` stops with the key before its banner, exit 2
    with pytest.raises(ValueError, match="operations.timezone = 'Mars/Olympus': not an IANA time zone name"):
        params_with(tmp_path, "Mars/Olympus")


def test_scheduled_deployment_carries_the_timezone(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from flows.serve import deployments

    params_path = make_project(tmp_path, {"operations": {"timezone": "America/New_York"}}, inbox_files=False)
    scheduled, triggered = deployments(load_params(params_path), str(params_path))
    (s,) = scheduled.schedules
    assert (s.schedule.cron, s.schedule.timezone, s.active) == ("0 2 * * *", "America/New_York", True)
    assert not triggered.schedules


def prefect_next_run(cron: str, timezone: str = "UTC"):
    """The first run time Prefect's server computes for the schedule, or the error it raises building it."""
    from prefect.server.schemas.schedules import CronSchedule

    try:
        dates = CronSchedule(cron=cron, timezone=timezone).get_dates(n=1, start=dt.datetime(2027, 1, 1,
                                                                                        tzinfo=dt.timezone.utc))
        if inspect.iscoroutine(dates):
            dates = asyncio.run(dates)
    except Exception as e:  # noqa: BLE001 (the reference's own verdict, whatever its type)
        return e
    return dates[0] if dates else None


@pytest.mark.parametrize("timezone", ["right/UTC", "posixrules"])
def test_a_zone_file_that_is_no_zone_name_is_refused_at_load_as_prefect_refuses_it(tmp_path, timezone):
    # ZoneInfo loads these files; Prefect's CronSchedule refused them and `unlearn serve` died with a traceback
    assert isinstance(prefect_next_run("0 2 * * *", timezone), Exception)
    with pytest.raises(ValueError, match=f"operations.timezone = '{timezone}': a time zone file, not one of"):
        params_with(tmp_path, timezone)


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30-31 feb *",
                                  "0 0 29 2 *", "0 0 31 2,3 *", "0 0 31 2 mon", "0 0 */10 2 *", "0 0 30/5 4 *",
                                  "0 0 1/15 2 *", "0 0 31 * *"])
def test_config_refuses_a_cron_exactly_when_prefect_finds_no_run_time(tmp_path, cron):
    # '0 0 31 2 *' loaded, serve started, and the server logged "failed to find next date": nothing ever ran
    fires = isinstance(prefect_next_run(cron), dt.datetime)
    if fires:
        assert params_with(tmp_path, "UTC", cron).operations.cron == cron
    else:
        with pytest.raises(ValueError, match="operations.cron = .*the schedule would never fire"):
            params_with(tmp_path, "UTC", cron)
