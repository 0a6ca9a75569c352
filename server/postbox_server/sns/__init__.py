"""An Amazon SNS-compatible API over postbox topics, served by the SQS shim's process."""
