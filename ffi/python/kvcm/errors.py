"""Errors of the kvcm package, one class per kind of status code (see kvcm.h).

A negative status is an error found in the library; a positive one is the server's wire
ErrorCode (e.g. 8 = INSTANCE_NOT_EXIST). Every error carries `code` and `message`.
"""

OK = 0
E_NULL_ARGUMENT = -1
E_INVALID_UTF8 = -2
E_INVALID_ARGUMENT = -3
E_UNREACHABLE = -4
E_PANIC = -5
E_OUT_OF_RANGE = -6
E_BAD_ANSWER = -7
E_DEVICE = -8
E_UNAUTHORIZED = -9

INSTANCE_NOT_EXIST = 8
"""The server's wire code for an unknown instance."""


class KvcmError(Exception):
    """A kvcm call failed: `code` is the status (kvcm.h), `message` the library's text."""

    def __init__(self, code, message):
        super().__init__(f"{message} (status {code})")
        self.code = code
        self.message = message


class InvalidArgumentError(KvcmError, ValueError):
    """An argument was refused (bad address, unknown wire, empty instance id, ...)."""


class UnreachableError(KvcmError, ConnectionError):
    """No kvcm server could be reached."""


class UnauthorizedError(KvcmError, PermissionError):
    """The server refused the API key (none, unknown, revoked, expired) or what it may call."""


class ServerError(KvcmError):
    """The server answered an error; `code` is its wire ErrorCode."""


_BY_CODE = {
    E_NULL_ARGUMENT: InvalidArgumentError,
    E_INVALID_UTF8: InvalidArgumentError,
    E_INVALID_ARGUMENT: InvalidArgumentError,
    E_UNREACHABLE: UnreachableError,
    E_UNAUTHORIZED: UnauthorizedError,
}


def error(code, message):
    """The exception of a failed call's status."""
    if code > 0:
        return ServerError(code, message)
    return _BY_CODE.get(code, KvcmError)(code, message)
