"""Errors a request can end with, each carrying its HTTP status and gRPC code."""

from __future__ import annotations

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
