"""The tests' HTTP servers on 127.0.0.1 (subscribers, lookups, the OAuth and schema-registry servers).

`LocalHttpServer` is the standard library's threading server with a deep accept queue. Its default, 5, is too
short for Herald: a job opens tens of connections at once, and when the test process's server accepts late (its
thread waits for the GIL on a loaded machine) the kernel drops the connections past the queue's length and the
client sends them again after 1, 3, 7, 15 s. Those attempts can time out before the server sees them: the
server, not Herald, was slow, and a test counting attempts or latencies fails for it.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer


class LocalHttpServer(ThreadingHTTPServer):
    request_queue_size = 1024  # the kernel caps it at net.core.somaxconn (4096 on current Linux)
