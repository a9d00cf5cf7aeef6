"""A Confluent-compatible schema registry on 127.0.0.1 for tests, and Avro encoding helpers.

No real registry can run here: Karapace is not on PyPI and Confluent's is Java from Maven. This server
implements the endpoints Herald calls, with Confluent's JSON shapes, and counts the calls it receives:
GET /schemas/ids/{id}, GET /schemas/ids/{id}/versions, GET /subjects/{subject}/versions/latest,
GET /subjects/{subject}/versions, GET /subjects/{subject}/versions/{version}, POST /subjects/{subject}/versions.
An outage is played with `fail_next`: the next requests answer an error status (503 by default) instead.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler

import fastavro

from tests.support.http_server import LocalHttpServer


def avro_bytes(schema: dict, record: dict) -> bytes:
    """Plain Avro binary of `record` (what a schemaFile topic holds)."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def wire_bytes(schema_id: int, schema: dict, record: dict) -> bytes:
    """Confluent wire format: 0, the 4-byte schema id, then the Avro binary."""
    return b"\x00" + schema_id.to_bytes(4, "big") + avro_bytes(schema, record)


class SchemaRegistryServer:
    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.calls: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()  # requests answered with `fail_next`'s status, by "METHOD path"
        self._failures: list[tuple[re.Pattern, int]] = []  # (path pattern, status), one per request to fail
        self._lock = threading.Lock()
        self._server = LocalHttpServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> SchemaRegistryServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def register(self, subject: str, schema: dict | str) -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        with self._lock:
            for _schema_id, known in self.schemas.items():
                if known == text:
                    break
            else:
                schema_id = len(self.schemas) + 1
                self.schemas[schema_id] = text
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
        return schema_id

    def fail_next(self, times: int, status: int = 503, path: str = ".*") -> None:
        """The next `times` requests whose path matches the regular expression `path` answer `status` (with a
        Confluent error body), as a registry that is down or overloaded; then it answers as usual again."""
        with self._lock:
            self._failures += [(re.compile(path), status)] * times

    def _answer(self, method: str, path: str, body: bytes) -> tuple[int, object]:
        with self._lock:
            self.calls[f"{method} {path}"] += 1
            failure = next((f for f in self._failures if f[0].fullmatch(path)), None)
            if failure is not None:
                self._failures.remove(failure)
                self.failed[f"{method} {path}"] += 1
                return failure[1], {"error_code": failure[1] * 100, "message": "Service unavailable"}
        if match := re.fullmatch(r"/schemas/ids/(\d+)", path):
            schema_id = int(match.group(1))
            if schema_id in self.schemas:
                return 200, {"schema": self.schemas[schema_id]}
            return 404, {"error_code": 40403, "message": "Schema not found"}
        if match := re.fullmatch(r"/schemas/ids/(\d+)/versions", path):
            schema_id = int(match.group(1))
            return 200, [{"subject": subject, "version": ids.index(schema_id) + 1}
                         for subject, ids in self.subjects.items() if schema_id in ids]
        if match := re.fullmatch(r"/subjects/([^/]+)/versions/latest", path):
            ids = self.subjects.get(match.group(1))
            if not ids:
                return 404, {"error_code": 40401, "message": "Subject not found"}
            return 200, {"subject": match.group(1), "version": len(ids), "id": ids[-1],
                         "schema": self.schemas[ids[-1]]}
        if method == "GET" and (match := re.fullmatch(r"/subjects/([^/]+)/versions", path)):
            ids = self.subjects.get(match.group(1))
            if not ids:
                return 404, {"error_code": 40401, "message": "Subject not found"}
            return 200, list(range(1, len(ids) + 1))
        if match := re.fullmatch(r"/subjects/([^/]+)/versions/(\d+)", path):
            ids = self.subjects.get(match.group(1), [])
            version = int(match.group(2))
            if not 1 <= version <= len(ids):
                return 404, {"error_code": 40402, "message": "Version not found"}
            return 200, {"subject": match.group(1), "version": version, "id": ids[version - 1],
                         "schema": self.schemas[ids[version - 1]]}
        if method == "POST" and (match := re.fullmatch(r"/subjects/([^/]+)/versions", path)):
            return 200, {"id": self.register(match.group(1), json.loads(body)["schema"])}
        return 404, {"error_code": 404, "message": "Not found"}

    def _handler(self):
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _respond(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                status, document = registry._answer(method, self.path, body)
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802
                self._respond("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._respond("POST")

        return Handler
