"""The FastAPI application: record endpoints (raw batches and JSON), partition offsets, health, metrics.

Handlers are plain functions (FastAPI runs them on its thread pool): the remote reader is blocking
and thread-safe. Parameter bounds come from the settings, so the served OpenAPI states the real caps.
"""

import importlib.metadata
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from reader.http import errors
from reader.http.auth import BearerAuth
from reader.http.config import HttpSettings
from reader.http.records import Encoding, RecordsPage, page_records
from reader.http.service import FetchService, IsolationLevel, Page
from tiering_core.errors import TieringError

RAW_TYPE = "application/octet-stream"
_MAX_OFFSET = (1 << 63) - 1

TopicName = Annotated[
    str, Path(pattern=r"^[a-zA-Z0-9._-]{1,249}$", description="Kafka topic name.", examples=["orders"])
]
Partition = Annotated[int, Path(ge=0, le=(1 << 31) - 1, description="Partition number.")]
Offset = Annotated[int, Query(ge=0, le=_MAX_OFFSET, description="First offset wanted.")]
Isolation = Annotated[
    IsolationLevel,
    Query(description="read_committed drops aborted transactions' records and control batches, as a Kafka "
          "consumer with isolation.level=read_committed does."),
]  # fmt: skip

_RAW_HEADERS = {
    "Kafka-Next-Offset": "Where the next request continues.",
    "Kafka-Remote-Start-Offset": "The partition's first offset in remote storage.",
    "Kafka-Remote-End-Offset": "The last offset in remote storage; the broker serves what follows.",
    "Kafka-Record-Batches": "Number of record batches in the body.",
    "Kafka-Last-Stable-Offset": "read_committed only, when set: the body stops before this open transaction.",
}


class PartitionInfo(BaseModel):
    topic: str
    partition: int
    remote_start_offset: int | None
    remote_end_offset: int | None
    log_start_offset: int | None
    log_end_offset: int | None


class Status(BaseModel):
    status: Literal["ok", "unavailable"]
    message: str | None = None


def _version() -> str:
    try:
        return importlib.metadata.version("kafka-tiering-sidecar")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def create_app(service: FetchService, http: HttpSettings) -> FastAPI:
    """The application serving ``service``. Record endpoints need a bearer token unless
    ``http.allow_unauthenticated``; health, readiness, metrics and the OpenAPI description do not."""
    app = FastAPI(
        title="Kafka tiered storage: remote fetch",
        version=_version(),
        description="Records of tiered Kafka topics read from remote storage (the offsets below the broker's "
        "log start). Raw record batches, as Kafka wrote them, or decoded records as JSON. Stateless: continue "
        "at the returned next offset, on any instance.",
        docs_url=None,
        redoc_url=None,
    )
    errors.install(app, service)
    guard = [Depends(BearerAuth(http.tokens))] if http.tokens else []
    MaxBytes = Annotated[
        int,
        Query(ge=1, le=http.max_fetch_bytes,
              description="About this many bytes of batches (at least one whole batch, as Kafka's fetch)."),
    ]  # fmt: skip
    MaxRecords = Annotated[int, Query(ge=1, le=http.max_records, description="At most this many records.")]
    metrics = service.metrics

    @app.middleware("http")
    async def count(request: Request, call_next):
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")  # set by the router while routing
        metrics.http_requests.labels(route, str(response.status_code)).inc()
        return response

    partitions = APIRouter(
        prefix="/v1/topics/{topic}/partitions/{partition}", dependencies=guard, responses=errors.RECORD_ERRORS
    )

    @partitions.get(
        "/batches",
        response_class=Response,
        responses={
            200: {
                "description": "Whole record batches (v2) exactly as Kafka wrote them, back to back; the first may "
                "start before `offset` (skip its earlier records, as a Kafka client does). Empty when "
                "read_committed dropped everything in range: continue at Kafka-Next-Offset.",
                "content": {RAW_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                "headers": {n: {"description": t, "schema": {"type": "integer"}} for n, t in _RAW_HEADERS.items()},
            },
        },
        summary="Record batches from an offset, raw",
    )
    def batches(
        topic: TopicName, partition: Partition, offset: Offset,
        max_bytes: MaxBytes = http.default_fetch_bytes, isolation_level: Isolation = "read_uncommitted",
    ) -> Response:  # fmt: skip
        page = service.fetch(topic, partition, offset, max_bytes, isolation_level)
        return Response(page.data, media_type=RAW_TYPE, headers=_page_headers(page))

    @partitions.get("/records", response_model=RecordsPage, summary="Records from an offset, decoded, as JSON")
    def records(
        topic: TopicName, partition: Partition, offset: Offset,
        max_bytes: MaxBytes = http.default_fetch_bytes, isolation_level: Isolation = "read_uncommitted",
        max_records: MaxRecords = http.default_records,
        encoding: Annotated[Encoding, Query(description="How keys, values and header values are written.")] = "base64",
    ) -> JSONResponse:  # fmt: skip
        page = service.fetch(topic, partition, offset, max_bytes, isolation_level)
        out, next_offset = page_records(page, encoding, max_records, max_bytes)
        body = {
            "topic": topic, "partition": partition, "offset": offset, "next_offset": next_offset,
            "remote_start_offset": page.remote_start, "remote_end_offset": page.remote_end,
            "last_stable_offset": page.last_stable_offset if next_offset == page.next_offset else None,
            "isolation_level": isolation_level, "encoding": encoding, "records": out,
        }  # fmt: skip
        return JSONResponse(body)

    @partitions.get(
        "", response_model=PartitionInfo, summary="Where a partition's data is: remote start/end, broker log start/end"
    )
    def partition_info(topic: TopicName, partition: Partition) -> PartitionInfo:
        o = service.offsets(topic, partition)
        return PartitionInfo(
            topic=topic, partition=partition, remote_start_offset=o.remote_start, remote_end_offset=o.remote_end,
            log_start_offset=o.log_start, log_end_offset=o.log_end,
        )  # fmt: skip

    app.include_router(partitions)

    @app.get("/healthz", response_model=Status, summary="Liveness: the process answers")
    def healthz() -> Status:
        return Status(status="ok")

    @app.get(
        "/readyz",
        response_model=Status,
        responses={503: {"model": Status, "description": "The metadata is not followed or not caught up."}},
        summary="Readiness: the tiering metadata is followed and caught up",
    )
    def readyz() -> Response:
        try:
            service.ready(http.ready_timeout_seconds)
        except TieringError as exc:
            return JSONResponse(Status(status="unavailable", message=str(exc)).model_dump(), status_code=503)
        return JSONResponse(Status(status="ok").model_dump())

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _page_headers(page: Page) -> dict[str, str]:
    values = {
        "Kafka-Next-Offset": page.next_offset,
        "Kafka-Remote-Start-Offset": page.remote_start,
        "Kafka-Remote-End-Offset": page.remote_end,
        "Kafka-Record-Batches": len(page.headers),
        "Kafka-Last-Stable-Offset": page.last_stable_offset,
    }
    return {name: str(v) for name, v in values.items() if v is not None}
