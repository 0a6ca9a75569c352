"""Amazon SNS over postbox topics: its protocol (`protocol`) and actions (`actions/`)."""
