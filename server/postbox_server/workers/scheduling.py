"""When schedules fire: cron expressions in IANA time zones, fixed intervals, one-shot times.

The engine stores each schedule's next fire time; this module computes it, because
reading a cron expression needs a library (cronsim, which follows Debian cron,
daylight-saving changes included). Catch-up rule: a schedule that missed due times
(the servers were down) fires once for all of them, or, with a catch_up_limit, for
each of them in order up to that many fires; then its next fire time is the first
due time after now; an interval keeps its phase.
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


def canonical_cron(expression: str) -> str:
    """The expression as stored: fields single-spaced, month and day names upper case
    (cron reads them in any case, so both spell the same schedule)."""
    return " ".join(expression.split()).upper()


def describe_cron(expression: str, zone: str) -> str:
    """The expression in English, by cronsim (which reads it), with its time zone."""
    try:
        text = CronSim(expression, datetime.now(timezone.utc)).explain()
    except CronSimError as error:
        raise invalid(f"cron expression {quoted(expression)}: {str(error).lower()}") from None
    return f"{text} ({zone})"


_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def describe_interval(every: timedelta) -> str:
    """'Every 90 minutes' style: the interval in its largest whole units."""
    left = int(every.total_seconds())
    parts = []
    for unit, size in _UNITS:
        amount, left = divmod(left, size)
        if amount:
            parts.append(f"{amount} {unit}{'s' if amount > 1 else ''}")
    if parts == ["1 day"] or parts == ["1 hour"] or parts == ["1 minute"] or parts == ["1 second"]:
        return f"Every {parts[0][2:]}"
    return "Every " + " ".join(parts)


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

    def describe(self) -> str:
        """The timing in English, e.g. 'At 09:00 every day (Europe/Berlin)'."""
        if self.cron_expression is not None:
            return describe_cron(self.cron_expression, self.time_zone or DEFAULT_TIME_ZONE)
        if self.every is not None:
            return describe_interval(self.every)
        assert self.run_at is not None
        stamp = self.run_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        return f"Once at {stamp}"

    def first(self, now: datetime) -> datetime | None:
        """When a schedule with this new timing fires first; checks a cron timing and an
        interval's bounds (before any arithmetic: a huge one overflows a datetime)."""
        if self.cron_expression is not None:
            first = next_cron_time(self.cron_expression, self.time_zone or DEFAULT_TIME_ZONE, now)
            if first is None:
                raise invalid(
                    f"cron expression {quoted(self.cron_expression)} names no time in the "
                    "next 50 years"
                )
            return first
        if self.every is not None:
            if not MIN_INTERVAL <= self.every <= MAX_INTERVAL:
                raise invalid(f"interval {self.every} is outside 1 s to 366 days")
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


def fire_plan(row: Row, now: datetime) -> list[datetime | None]:
    """Engine callback for firing a claimed schedule row: per fire, the next_fire_at it
    leaves. Missed due times (those not after `now`) are fired one by one, in order, up
    to the row's catch_up_limit fires in all; the last fire leaves the first due time
    after now, skipping any missed times left."""
    timing = Timing.of(row)
    due = row["next_fire_at"]
    plan: list[datetime | None] = []
    while len(plan) + 1 < row["catch_up_limit"]:
        missed = timing.after_fire(due, due)
        if missed is None or missed > now:
            break
        plan.append(missed)
        due = missed
    plan.append(timing.after_fire(due, now))
    return plan


def next_fire_on_resume(row: Row, now: datetime) -> datetime | None:
    """Engine callback for resuming a locked schedule row."""
    return Timing.of(row).on_resume(row["next_fire_at"], now)
