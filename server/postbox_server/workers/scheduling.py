"""When schedules fire: cron expressions in IANA time zones, fixed intervals, one-shot times.

The engine stores each schedule's next fire time; this module computes it, because
reading a cron expression needs a library (cronsim, which follows Debian cron,
daylight-saving changes included). Catch-up rule: a schedule that missed due times
(the servers were down) fires once for all of them, and its next fire time is the
first due time after now; an interval keeps its phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from postbox_server.db.engine import Row
from postbox_server.errors import invalid, quoted

CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
DEFAULT_TIME_ZONE = "UTC"
# The engine's limits (postbox._check_schedule), checked here too for PreviewSchedule,
# which stores nothing.
MAX_CRON_LENGTH = 255
# The longest IANA name is 32 characters (America/Argentina/ComodRivadavia).
MAX_TIME_ZONE_LENGTH = 64
MIN_INTERVAL = timedelta(seconds=1)
MAX_INTERVAL = timedelta(days=366)


def time_zone(name: str) -> ZoneInfo:
    """The IANA time zone of that name; INVALID_ARGUMENT naming it if there is none."""
    refusal = invalid(
        f"time zone {quoted(name)} is not an IANA time zone name such as 'Europe/Berlin' or 'UTC'"
    )
    # zoneinfo reads the name as a file path: a long one fails in the file system
    # (ENAMETOOLONG, an OSError), not as an unknown zone. IANA names are far shorter.
    if len(name) > MAX_TIME_ZONE_LENGTH:
        raise refusal
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise refusal from None


def next_cron_time(expression: str, zone: str, after: datetime) -> datetime | None:
    """The first time strictly after `after` that the expression names, in UTC.

    None when it names no time in the next 50 years (a 31st of a short month, say).
    INVALID_ARGUMENT, naming the problem, for a bad expression or time zone.
    """
    fields = expression.split()
    if len(fields) != len(CRON_FIELDS):
        raise invalid(
            f"cron expression {quoted(expression)} has {len(fields)} fields; it needs 5: "
            + " ".join(CRON_FIELDS)
        )
    start = after.astimezone(time_zone(zone))
    try:
        times = CronSim(" ".join(fields), start)
    except CronSimError as error:
        # cronsim says which field, as Debian's cron does ("Bad minute").
        raise invalid(f"cron expression {quoted(expression)}: {str(error).lower()}") from None
    upcoming = next(times, None)
    return None if upcoming is None else upcoming.astimezone(timezone.utc)


def next_interval_time(due: datetime, every: timedelta, after: datetime) -> datetime:
    """The first time of the grid due + k * every (k >= 1) strictly after `after`."""
    if after < due:
        return due + every
    return due + every * ((after - due) // every + 1)


@dataclass(frozen=True)
class Timing:
    """One of: a cron expression in a time zone, a fixed interval, a one-shot time."""

    cron_expression: str | None = None
    time_zone: str | None = None
    every: timedelta | None = None
    run_at: datetime | None = None

    @classmethod
    def of(cls, row: Row) -> Timing:
        """The timing of a postbox.schedules row."""
        return cls(row["cron_expression"], row["time_zone"], row["every"], row["run_at"])

    def first(self, now: datetime) -> datetime | None:
        """When a schedule with this new timing fires first; checks a cron timing."""
        if self.cron_expression is not None:
            first = next_cron_time(self.cron_expression, self.time_zone or DEFAULT_TIME_ZONE, now)
            if first is None:
                raise invalid(
                    f"cron expression {quoted(self.cron_expression)} names no time in the "
                    "next 50 years"
                )
            return first
        if self.every is not None:
            return now + self.every
        return self.run_at

    def preview(self, start: datetime, count: int) -> list[datetime]:
        """The first `count` fire times after `start` of a schedule created then (one for
        run_at); INVALID_ARGUMENT for a timing CreateSchedule refuses."""
        if self.cron_expression is not None and len(self.cron_expression) > MAX_CRON_LENGTH:
            raise invalid(
                f"cron expression is {len(self.cron_expression)} characters; "
                f"the limit is {MAX_CRON_LENGTH}"
            )
        if self.every is not None and not MIN_INTERVAL <= self.every <= MAX_INTERVAL:
            raise invalid(f"interval {self.every} is outside 1 s to 366 days")
        first = self.first(start)
        if first is None:
            raise invalid("a schedule needs its timing: cron, interval or run_at")
        if self.run_at is not None:
            return [max(first, start)]  # a time that has passed fires at once
        times = [first]
        while len(times) < count:
            following = self.after_fire(times[-1], times[-1])
            if following is None:
                break
            times.append(following)
        return times

    def after_fire(self, due: datetime, now: datetime) -> datetime | None:
        """When a schedule that was due at `due` and fires now fires next (None: never)."""
        if self.cron_expression is not None:
            return next_cron_time(self.cron_expression, self.time_zone or DEFAULT_TIME_ZONE, now)
        if self.every is not None:
            return next_interval_time(due, self.every, now)
        return None

    def on_resume(self, stored: datetime | None, now: datetime) -> datetime | None:
        """When a resumed schedule fires next: skips the times it was paused for.

        A one-shot time that passed while paused is kept, so it fires at once.
        """
        if stored is None or stored > now or self.run_at is not None:
            return stored
        return self.after_fire(stored, now)


def next_fire_after_fire(row: Row, now: datetime) -> datetime | None:
    """Engine callback for firing a claimed schedule row."""
    return Timing.of(row).after_fire(row["next_fire_at"], now)


def next_fire_on_resume(row: Row, now: datetime) -> datetime | None:
    """Engine callback for resuming a locked schedule row."""
    return Timing.of(row).on_resume(row["next_fire_at"], now)
