"""Amazon SQS over postbox queues: its protocols (`protocol`) and actions (`actions/`)."""
