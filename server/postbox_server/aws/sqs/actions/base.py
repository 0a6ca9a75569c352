"""What every SQS action gets: the shared call (postbox_server/aws/call.py), plus the
queue the request names, and the table of SQS's actions."""

from __future__ import annotations

from postbox_server.aws import call
from postbox_server.aws.call import Actions, Result, bounded
from postbox_server.aws.errors import missing_parameter
from postbox_server.aws.sqs import naming

__all__ = ["HANDLERS", "Call", "Result", "action", "bounded"]

# Action name -> handler; filled in by the action modules.
HANDLERS = Actions()
action = HANDLERS.action


class Call(call.Call):
    def queue(self) -> str:
        """The queue the request names: QueueUrl, or the URL it was posted to."""
        url = self.params.get("QueueUrl")
        if url:
            return naming.queue_from_url(url, self.settings)
        if self.path.strip("/"):
            return naming.queue_from_path(self.path, self.settings)
        raise missing_parameter("QueueUrl")

    def queue_url(self, name: str) -> str:
        return naming.queue_url(self.settings.public_url or self.base_url, self.settings, name)
