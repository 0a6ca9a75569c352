"""The receive machinery behind MessageService's Receive and StreamingReceive.

- `polling.py`: one Receive call, a long poll for a batch or a continuous stream of them;
- `streaming.py`: one StreamingReceive stream, from its opening request to its last batch;
- `claims.py`: claims messages for a stream, and gives back what it could not deliver;
- `prefetch.py`: keeps a continuous stream from claiming far ahead of its consumer;
- `scan_floors.py`: where each queue's receives start their walk of the ready index.

The wake-ups a waiting receive sleeps on come from the database seam (`db/wakeup.py`).
"""
