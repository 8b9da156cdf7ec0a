"""Errors a request can end with, each carrying its HTTP status and gRPC code."""

from __future__ import annotations

import logging
import uuid

import grpc


class RequestError(Exception):
    """A request failed; `status` is the HTTP status, `grpc_code` the gRPC status code."""

    status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"retry-after": str(max(1, round(self.retry_after_s)))}


class InvalidRequest(RequestError):
    """Malformed or out-of-limits input: the client must change the request."""


class PayloadTooLarge(RequestError):
    status = 413
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ModelNotFound(RequestError):
    status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class ModelFailed(RequestError):
    """The model raised on this request's items alone (found by bisecting the batch)."""

    status = 422
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class Unavailable(RequestError):
    """Queue full, model not ready or server draining: retry later."""

    status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RequestError):
    """The request's queue timeout expired before it could be answered."""

    status = 504
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class InternalError(RequestError):
    status = 500
    grpc_code = grpc.StatusCode.INTERNAL


class ModelNotLoaded(RequestError):
    """The model's configuration is invalid: nothing to describe or run (gRPC answers UNAVAILABLE)."""

    grpc_code = grpc.StatusCode.UNAVAILABLE


#: A request id the client sent (x-request-id) is kept when it is this short and printable; else we make one.
_MAX_REQUEST_ID = 128


def request_id(sent: str | None = None) -> str:
    """The id an unhandled error is reported under: the client's x-request-id if usable, else a new one."""
    if sent and len(sent) <= _MAX_REQUEST_ID and sent.isprintable() and sent.isascii():
        return sent
    return uuid.uuid4().hex


def report_unhandled(log: logging.Logger, exc: BaseException, where: str, rid: str) -> str:
    """Log a bug met while answering a request: one ERROR line (request id, exception type; never its
    message, which may quote the payload), the traceback at DEBUG. Returns the client's error message."""
    log.error("unhandled %s on %s (request id %s)", type(exc).__name__, where, rid)
    log.debug("traceback of request %s", rid, exc_info=exc)
    return f"internal error: {type(exc).__name__} (request id {rid})"
