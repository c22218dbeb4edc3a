"""What an EC2 error means for Spillway: retry, fail over to the next offer, or stop.

EC2 reports errors as codes (``InsufficientInstanceCapacity``, ``RequestLimitExceeded``, ...;
see the EC2 API reference, "Error codes for the Amazon EC2 API"). :func:`classify` turns a
botocore exception into a :class:`~providers.base.Retry`, :class:`~providers.base.FailOver` or
:class:`~providers.base.Stop` whose message names the offer and says what to do.
"""

from __future__ import annotations

from providers.base import FailOver, ProviderError, Retry, Stop

# code -> what it means (the message adds what Spillway does about it)
FAILOVER_CODES: dict[str, str] = {
    "InsufficientInstanceCapacity": "AWS has no capacity for this instance type in this zone "
                                    "right now",
    "InsufficientHostCapacity": "AWS has no host capacity for this instance type in this zone",
    "InsufficientCapacity": "AWS has no capacity for this request right now",
    "MaxSpotInstanceCountExceeded": "the account's limit on running spot instances is reached",
    "SpotMaxPriceTooLow": "the spot price is above the maximum price configured",
    "Unsupported": "this instance type or market is not offered in this zone",
    "InsufficientFreeAddressesInSubnet": "the zone's subnet has no free IP address left",
}
RETRY_CODES: dict[str, str] = {
    "RequestLimitExceeded": "EC2 throttled the request (API rate limit)",
    "Throttling": "EC2 throttled the request (API rate limit)",
    "ThrottlingException": "EC2 throttled the request (API rate limit)",
    "ServiceUnavailable": "EC2 is unavailable",
    "Unavailable": "EC2 is unavailable",
    "InternalError": "EC2 had an internal error",
    "InternalFailure": "EC2 had an internal error",
    "RequestTimeout": "the request to EC2 timed out",
}
STOP_CODES: dict[str, str] = {
    "AuthFailure": "AWS refused the credentials",
    "UnauthorizedOperation": "the credentials are not allowed to make this call",
    "OptInRequired": "the account is not subscribed to EC2 (or to this AMI) in this region",
    "InstanceLimitExceeded": "the account's instance limit for this type is reached",
    "VcpuLimitExceeded": "the account's vCPU quota for this instance family is reached",
    "IdempotentParameterMismatch": "this request id was already used for a different launch",
    "PendingVerification": "the account is still being verified by AWS",
    "Blocked": "the account is blocked",
}
_STOP_PREFIXES = ("Invalid", "MissingParameter", "UnknownParameter")

_WHAT_TO_DO = {
    "retry": "Spillway retries after a backoff",
    "failover": "Spillway tries the next offer and cools this zone down",
    "stop": "no retry can help: fix the {fix} and Spillway tries again",
}


def _stop_fix(code: str, provider: str) -> str:
    if code in ("AuthFailure",):
        return "provider's credentials (AWS_ACCESS_KEY_ID, a profile or an instance role)"
    if code in ("UnauthorizedOperation",):
        return "IAM policy (docs/cloud-aws.md lists the EC2 actions needed)"
    if code in ("InstanceLimitExceeded", "VcpuLimitExceeded"):
        return "quota (ask AWS for a higher limit in Service Quotas) or this offer's count"
    if code == "IdempotentParameterMismatch":
        return "request id (each launch needs its own)"
    return (f"provider settings in the configuration (providers.{provider}: image, "
            "subnets, security_groups, key_name, iam_instance_profile)")


def error_class(code: str, status: int) -> type[ProviderError]:
    """The action an EC2 error code (and its HTTP status) calls for."""
    if code in FAILOVER_CODES:
        return FailOver
    if code in RETRY_CODES:
        return Retry
    if code in STOP_CODES or code.startswith(_STOP_PREFIXES):
        return Stop
    return Retry if status >= 500 else Stop


def classify(provider: str, err: Exception, doing: str, offer_id: str = "") -> ProviderError:
    """The ProviderError for a botocore exception raised while ``doing`` (e.g. "launch of 2 x
    p4d.24xlarge"), naming ``offer_id`` when there is one."""
    code, status, detail = _parts(err)
    cls = error_class(code, status) if code else _botocore_class(err)
    meaning = (FAILOVER_CODES.get(code) or RETRY_CODES.get(code) or STOP_CODES.get(code)
               or detail or type(err).__name__)
    todo = _WHAT_TO_DO[cls.action].format(fix=_stop_fix(code, provider))
    where = f" for offer {offer_id}" if offer_id else ""
    extra = f" [{detail}]" if detail and detail != meaning else ""
    return cls(provider, f"{doing}{where} failed: {meaning}{extra}; {todo}", code=code,
               offer_id=offer_id)


def _parts(err: Exception) -> tuple[str, int, str]:
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return "", 0, str(err)
    error = response.get("Error", {}) or {}
    meta = response.get("ResponseMetadata", {}) or {}
    return (str(error.get("Code", "")), int(meta.get("HTTPStatusCode", 0) or 0),
            str(error.get("Message", "")))


def _botocore_class(err: Exception) -> type[ProviderError]:
    """No error code: a connection problem (retry) or a local one (stop)."""
    from botocore import exceptions as bx

    if isinstance(err, (bx.EndpointConnectionError, bx.ConnectionClosedError,
                        bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        return Retry
    return Stop  # NoCredentialsError, ParamValidationError, NoRegionError, ...


def is_not_found(err: Exception) -> bool:
    """An error saying an instance id is unknown (gone, or never existed)."""
    code = _parts(err)[0]
    return code in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")
