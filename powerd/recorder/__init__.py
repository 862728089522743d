"""Where the controller's points go: InfluxDB (v2 or 1.x write API), or a local line-protocol file.

Every recorder takes lines of line protocol (built by ``powerd.telemetry_schema``)
through one interface::

    recorder.write(lines)   # never blocks on the network, never raises
    recorder.flush(timeout_s)   # wait until what was written so far is stored
    recorder.close()
    recorder.written, recorder.buffered, recorder.dropped, recorder.rejected, recorder.write_errors

A recorder is one ``BufferedWriter`` (``writer.py``: the bounded buffer, the
writer thread, batches, backoff, counters, logs) composed with one
``Transport`` (``transport.py``) that does a single write and says how it went
(``Outcome``): ``influx.py`` for InfluxDB's v2 API (influxdb-client, imported
only there, as the ``recorder`` extra) and 1.x's ``/write``, ``file.py`` for a
rotated file. ``InfluxRecorder``, ``Influx1Recorder`` and ``FileRecorder``
put the two together; ``open_recorder`` (``config.py``) turns the configured
URL into one of them.

While an InfluxDB server cannot be reached the points stay in the buffer,
oldest dropped first past ``max_buffer_points``, and are written when it
returns: an outage that fits in the buffer loses nothing. The file recorder
writes in the caller's thread (appending to a file does not wait on a network).
"""

from powerd.recorder.base import Recorder
from powerd.recorder.config import TOKEN_ENV, default_file_path, open_recorder, read_token
from powerd.recorder.file import (
    DEFAULT_FILE_KEEP,
    DEFAULT_FILE_MAX_BYTES,
    DEFAULT_FILE_NAME,
    FileRecorder,
    FileTransport,
)
from powerd.recorder.influx import (
    HttpStatusError,
    Influx1Recorder,
    Influx1Transport,
    Influx2Transport,
    InfluxRecorder,
)
from powerd.recorder.transport import Outcome, Result, Transport
from powerd.recorder.writer import BufferedWriter

__all__ = [
    "DEFAULT_FILE_KEEP",
    "DEFAULT_FILE_MAX_BYTES",
    "DEFAULT_FILE_NAME",
    "TOKEN_ENV",
    "BufferedWriter",
    "FileRecorder",
    "FileTransport",
    "HttpStatusError",
    "Influx1Recorder",
    "Influx1Transport",
    "Influx2Transport",
    "InfluxRecorder",
    "Outcome",
    "Recorder",
    "Result",
    "Transport",
    "default_file_path",
    "open_recorder",
    "read_token",
]
