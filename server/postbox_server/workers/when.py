"""beyond-queue's `when` timing: a schedule in a few English words, read into the cron
expression it means, which is what gets stored (one canonical form for both).

The phrases: "every minute", "every N minutes", "every hour", "every N hours" (on the
hour), and "every day", "every weekday", "every weekend", "every monday" (or several
days: "every monday and friday", "every mon, wed"), each with an optional "at <time>"
(default midnight): "9am", "9:30 pm", "17:45", "noon", "midnight". "daily", "hourly"
and "weekdays" are read as "every day", "every hour" and "every weekday". Anything else
is refused, naming the phrases, rather than guessed at.
"""

from __future__ import annotations

import re

from postbox_server.errors import invalid, quoted

MAX_WHEN_LENGTH = 255
_DAYS = {
    "sunday": "SUN", "monday": "MON", "tuesday": "TUE", "wednesday": "WED",
    "thursday": "THU", "friday": "FRI", "saturday": "SAT",
}  # fmt: skip
_SHORT = {name[:3]: code for name, code in _DAYS.items()}
_GROUPS = {"day": "*", "weekday": "MON-FRI", "weekend": "SAT,SUN"}
_SYNONYMS = (("daily", "every day"), ("hourly", "every hour"), ("weekdays", "every weekday"))
_STEP = re.compile(r"every (?:(\d{1,2}) )?(minute|hour)s?")
_DAILY = re.compile(r"every (.+?)(?: at (.+))?")
_TIME = re.compile(r"(\d{1,2})(?::(\d{2}))? ?(am|pm)?")
_HELP = (
    'write it as "every 15 minutes", "every 2 hours", "every day at 9am", '
    '"every weekday at 17:30" or "every monday and friday at noon", or give a cron expression'
)


def when_to_cron(phrase: str) -> str:
    """The five-field cron expression `phrase` means; INVALID_ARGUMENT, with the phrases
    it takes, for one it does not read."""
    if len(phrase) > MAX_WHEN_LENGTH:
        raise invalid(f"when is {len(phrase)} characters; the limit is {MAX_WHEN_LENGTH}")
    text = " ".join(phrase.lower().replace(",", " , ").split()).replace(" , ", ", ")
    for short, long in _SYNONYMS:
        text = re.sub(rf"^{short}\b", long, text)
    cron = _steps(text) or _days(text)
    if cron is None:
        raise invalid(f"when is {quoted(phrase)}, which is not a phrase postbox reads: {_HELP}")
    return cron


def _steps(text: str) -> str | None:
    match = _STEP.fullmatch(text)
    if match is None:
        return None
    step = int(match[1] or 1)
    unit = match[2]
    limit = 59 if unit == "minute" else 23
    if not 1 <= step <= limit:
        raise invalid(f"every {step} {unit}s: the step must be 1 to {limit}")
    every = "*" if step == 1 else f"*/{step}"
    return f"{every} * * * *" if unit == "minute" else f"0 {every} * * *"


def _days(text: str) -> str | None:
    match = _DAILY.fullmatch(text)
    if match is None:
        return None
    days = _day_field(match[1])
    if days is None:
        return None
    hour, minute = _time(match[2]) if match[2] else (0, 0)
    return f"{minute} {hour} * * {days}"


def _day_field(words: str) -> str | None:
    if words in _GROUPS:
        return _GROUPS[words]
    codes = []
    for word in re.split(r", | and |,", words):
        word = word.strip().removesuffix("s") if word.strip() not in _DAYS else word.strip()
        code = _DAYS.get(word) or _SHORT.get(word)
        if code is None:
            return None
        if code not in codes:
            codes.append(code)
    return ",".join(codes)


def _time(text: str) -> tuple[int, int]:
    if text in ("noon", "midday"):
        return 12, 0
    if text == "midnight":
        return 0, 0
    match = _TIME.fullmatch(text)
    if match is None:
        raise invalid(f'at {quoted(text)}: write a time as "9am", "9:30 pm", "17:45" or "noon"')
    hour, minute, half = int(match[1]), int(match[2] or 0), match[3]
    if half is not None:
        if not 1 <= hour <= 12:
            raise invalid(f"at {quoted(text)}: a 12-hour time's hour is 1 to 12")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        raise invalid(f"at {quoted(text)}: hours are 0 to 23 and minutes 0 to 59")
    return hour, minute
