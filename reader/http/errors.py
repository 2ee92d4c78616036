"""HTTP answers for every error: a status code and a JSON body naming what failed and where.

``error`` is Kafka's error name where Kafka has one (OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION,
CORRUPT_MESSAGE), so a client maps it as it maps a broker's answer. An offset outside the remote data
is 416 with the remote start and end and the broker's log start: below the remote start the data is
gone (seek to ``remote_start_offset``), above the remote end the broker takes over. A missing or corrupt
object is 502 and an unreachable store or metadata, or a memory pool without room, 503 (with
Retry-After), each naming the object key: never records from a damaged range.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from metadata.wal import WalError
from reader.errors import (
    MemoryBusy,
    NotInRemote,
    OffsetOutOfRange,
    RemoteDataCorrupt,
    RemoteObjectMissing,
    RemoteReadError,
    RemoteUnavailable,
    UnknownTopic,
)
from reader.http.records import NotUtf8
from reader.http.service import DownloadPaused, FetchService
from tiering_core.kafka_cluster import KafkaClusterError


class ErrorBody(BaseModel):
    """Every error's body. Fields that do not apply are left out."""

    error: str = Field(description="Kafka's error name where one exists, e.g. OFFSET_OUT_OF_RANGE.")
    message: str = Field(description="What failed and what to do.")
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    remote_start_offset: int | None = Field(default=None, description="First offset in remote storage.")
    remote_end_offset: int | None = Field(default=None, description="Last offset in remote storage.")
    log_start_offset: int | None = Field(default=None, description="The broker's log start offset, if it answered.")
    key: str | None = Field(default=None, description="The remote object that failed.")
    position: int | None = Field(default=None, description="Byte position in the object.")


def error_response(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


# The error responses a record endpoint documents (OpenAPI), by status code.
RECORD_ERRORS: dict[int | str, dict] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "Missing or wrong bearer token.",
        404: "UNKNOWN_TOPIC_OR_PARTITION.",
        416: "OFFSET_OUT_OF_RANGE: below the remote start (data gone) or above the remote end (the broker serves it).",
        422: "INVALID_REQUEST: a parameter is missing, malformed or beyond its bound.",
        502: "A remote object is missing or corrupt (the key is named); nothing of it is served.",
        503: "The remote store or the metadata is unreachable now, downloads of the topic are paused, or the "
        "memory pool had no room in time (MEMORY_BUSY); retry later (Retry-After).",
    }.items()
}


def install(app: FastAPI, service: FetchService) -> None:
    """Register the handlers; ``service`` tells the remote and broker offsets of an out-of-range answer."""

    def out_of_range(request: Request, exc: OffsetOutOfRange | NotInRemote) -> JSONResponse:
        tp = f"{exc.topic}-{exc.partition}"
        rx, ry = service.catalog.remote_offsets(exc.topic, exc.partition)
        lx, _ = service.broker_offsets(exc.topic, exc.partition)
        if isinstance(exc, OffsetOutOfRange) and lx is not None and lx <= exc.offset:
            message = f"{tp}: offset {exc.offset} is below the remote start {rx}; the broker serves it (log start {lx})"
        elif isinstance(exc, OffsetOutOfRange):
            message = f"{tp}: offset {exc.offset} is below the remote start {rx}: the data is gone; continue at {rx}"
        elif ry is None:
            message = f"{tp}: nothing of this partition is in remote storage; the broker serves it (log start {lx})"
        else:
            message = f"{tp}: offset {exc.offset} is above the remote end {ry}; the broker serves it (log start {lx})"
        body = ErrorBody(
            error="OFFSET_OUT_OF_RANGE", message=message, topic=exc.topic, partition=exc.partition,
            offset=exc.offset, remote_start_offset=rx, remote_end_offset=ry, log_start_offset=lx,
        )  # fmt: skip
        return error_response(416, body)

    def handler(status: int, error: str, retry: bool = False):
        def handle(request: Request, exc: Exception) -> JSONResponse:
            body = ErrorBody(error=error, message=str(exc), key=getattr(exc, "key", None),
                             position=getattr(exc, "position", None))  # fmt: skip
            return error_response(status, body, {"Retry-After": "5"} if retry else None)

        return handle

    def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or e['loc'][0]}: {e['msg']}" for e in exc.errors()
        )
        return error_response(422, ErrorBody(error="INVALID_REQUEST", message=f"invalid request: {problems}"))

    def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        names = {401: "UNAUTHORIZED", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}
        body = ErrorBody(error=names.get(exc.status_code, "HTTP_ERROR"), message=str(exc.detail))
        return error_response(exc.status_code, body, getattr(exc, "headers", None))

    app.add_exception_handler(OffsetOutOfRange, out_of_range)
    app.add_exception_handler(NotInRemote, out_of_range)
    app.add_exception_handler(UnknownTopic, handler(404, "UNKNOWN_TOPIC_OR_PARTITION"))
    app.add_exception_handler(NotUtf8, handler(422, "INVALID_REQUEST"))
    app.add_exception_handler(RemoteObjectMissing, handler(502, "REMOTE_OBJECT_MISSING"))
    app.add_exception_handler(RemoteDataCorrupt, handler(502, "CORRUPT_MESSAGE"))
    app.add_exception_handler(RemoteUnavailable, handler(503, "REMOTE_STORAGE_UNAVAILABLE", retry=True))
    app.add_exception_handler(MemoryBusy, handler(503, "MEMORY_BUSY", retry=True))
    app.add_exception_handler(DownloadPaused, handler(503, "DOWNLOAD_PAUSED", retry=True))
    app.add_exception_handler(RemoteReadError, handler(502, "REMOTE_STORAGE_ERROR"))
    app.add_exception_handler(WalError, handler(503, "METADATA_UNAVAILABLE", retry=True))
    app.add_exception_handler(KafkaClusterError, handler(503, "CLUSTER_UNAVAILABLE", retry=True))
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, handler(500, "INTERNAL_ERROR"))  # logged with its traceback by uvicorn
