"""Names derived from a queue's name, which the servicers and the auth rules both need."""

from __future__ import annotations

# A queue name's grammar (postbox.queue_name_problem): at most this many characters, of
# A-Z a-z 0-9 _ -, then perhaps ".fifo". No other dot: the SQS shim serves the same names.
MAX_QUEUE_NAME = 80
FIFO_SUFFIX = ".fifo"
DEAD_LETTER_SUFFIX = "-dlq"


def dead_letter_queue_name(name: str) -> str:
    """The dead-letter queue CreateQueue's with_dead_letter_queue makes for `name`: `<name>-dlq`,
    or `<base>-dlq.fifo` for a FIFO queue, which needs a FIFO dead-letter queue."""
    if name.endswith(FIFO_SUFFIX):
        return name[: -len(FIFO_SUFFIX)] + DEAD_LETTER_SUFFIX + FIFO_SUFFIX
    return name + DEAD_LETTER_SUFFIX
