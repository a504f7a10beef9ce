"""Translate boto3/botocore exceptions into LoRA manager errors without quoting them.

botocore's own messages can echo request details; only the S3 error code, the
HTTP status and the (redacted) endpoint are used here.
"""

from __future__ import annotations

from typing import Final

from lorafleet.worker.lora._redact import redact_uri
from lorafleet.worker.lora.errors import (
    LoraInvalidUriError,
    LoraNotFoundError,
    LoraSourceError,
    LoraUnavailableError,
)

__all__ = ["translate_s3_error"]

CREDENTIAL_ERROR_CODES: Final = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidClientTokenId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
)
CREDENTIALS_HINT: Final = (
    "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the worker's role) "
    "and the bucket policy"
)


def translate_s3_error(exc: Exception, uri: str, *, endpoint: str) -> LoraSourceError:
    """Return the LoRA error for a boto3 failure while fetching ``uri`` from ``endpoint``."""
    from botocore import exceptions as boto

    endpoint = redact_uri(endpoint)
    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
        return LoraUnavailableError(uri, "no usable AWS credentials found", hint=CREDENTIALS_HINT)
    if isinstance(exc, boto.ClientError):
        return _client_error(exc, uri)
    if isinstance(exc, boto.ParamValidationError):  # refused before any request: the caller's
        return LoraInvalidUriError(
            uri,
            "not a valid S3 bucket or key",
            hint="bucket names are 3-63 lower-case letters, digits, '.' and '-'",
        )
    if isinstance(exc, boto.EndpointConnectionError | boto.ConnectionError):
        return LoraUnavailableError(
            uri,
            f"cannot connect to the S3 endpoint {endpoint}",
            hint="check AWS_ENDPOINT_URL / AWS_REGION and the network; retry later",
        )
    return LoraUnavailableError(
        uri,
        f"the S3 download failed ({type(exc).__name__})",
        hint=f"retry later; the endpoint is {endpoint}",
    )


def _client_error(exc: Exception, uri: str) -> LoraSourceError:
    response = getattr(exc, "response", {}) or {}
    code = str(response.get("Error", {}).get("Code", "Unknown"))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    if code == "NoSuchBucket":
        return LoraNotFoundError(
            uri,
            "the bucket does not exist",
            hint="check the bucket name, AWS_ENDPOINT_URL and AWS_REGION",
        )
    if code in ("NoSuchKey", "404"):
        return LoraNotFoundError(
            uri, "an object vanished during the download", hint="retry once the upload is complete"
        )
    if code in CREDENTIAL_ERROR_CODES or status == 403:
        return LoraUnavailableError(
            uri, f"S3 refused the credentials ({code}, HTTP {status})", hint=CREDENTIALS_HINT
        )
    return LoraUnavailableError(
        uri, f"S3 answered {code} (HTTP {status})", hint="retry later; see the S3 server's logs"
    )
