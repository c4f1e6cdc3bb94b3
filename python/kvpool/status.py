"""kvpool.status - the status codes of kvpool and the exceptions that carry them.

The codes are defined once for the wire in protocol/kvpool.proto (enum Status) and mirrored
for C in include/kvpool.h; this table mirrors them for Python (the tests check it against the
C library's kvpool_status_name, so the three cannot drift apart unnoticed). The numbers follow
Mooncake Store's ErrorCode, so code written against Mooncake's return values keeps working.

Each status other than OK has an exception class, a subclass of kvpool.Error, named after it
(OBJECT_NOT_FOUND -> ObjectNotFoundError). Error.status holds the code. ObjectNotFoundError is
also a KeyError, so `except KeyError` works for misses.

Threads: none; everything here is immutable after import.
"""

import enum

#   (name, value, description), in the order of include/kvpool.h.
_TABLE = (
    ("OK", 0, "ok"),
    ("INTERNAL_ERROR", -1, "internal error"),
    ("BUFFER_OVERFLOW", -10, "buffer too small for the value"),
    ("SEGMENT_NOT_FOUND", -101, "segment not found"),
    ("SEGMENT_ALREADY_EXISTS", -102, "segment already mounted"),
    ("NO_AVAILABLE_HANDLE", -200, "no space left in the pool"),
    ("INVALID_VERSION", -300, "unsupported protocol version"),
    ("INVALID_KEY", -400, "invalid key (empty, too long, or contains NUL)"),
    ("WRITE_FAIL", -500, "write failed"),
    ("INVALID_PARAMS", -600, "invalid parameters"),
    ("UNKNOWN_OPERATION", -601, "unknown operation"),
    ("VALUE_TOO_LARGE", -602, "value larger than the server's limit"),
    ("PROTOCOL_ERROR", -603, "malformed request"),
    ("PERMISSION_DENIED", -604, "not allowed for this client"),
    ("INVALID_WRITE", -700, "key is not being written"),
    ("INVALID_READ", -701, "invalid read"),
    ("INVALID_REPLICA", -702, "invalid replica count"),
    ("REPLICA_IS_NOT_READY", -703, "object is still being written"),
    ("OBJECT_NOT_FOUND", -704, "object not found"),
    ("OBJECT_ALREADY_EXISTS", -705, "object already exists"),
    ("OBJECT_HAS_LEASE", -706, "object has a read lease"),
    ("TRANSFER_FAIL", -800, "transfer failed"),
    ("RPC_FAIL", -900, "no reply from the server (timeout or connection failure)"),
    ("UNAVAILABLE_IN_CURRENT_STATUS", -1010, "server is shutting down or resetting"),
)

Status = enum.IntEnum("Status", [(name, value) for name, value, _ in _TABLE])
Status.__doc__ = "kvpool status codes (0 ok, negative errors; Mooncake's numbering)."

_DESCRIPTIONS = {value: text for _, value, text in _TABLE}


def strerror(status):
    """A short English description of a status code."""
    return _DESCRIPTIONS.get(int(status), "unknown status")


def status_name(status):
    """The status's name, e.g. "OBJECT_NOT_FOUND", or "UNKNOWN"."""
    try:
        return Status(int(status)).name
    except ValueError:
        return "UNKNOWN"


class Error(Exception):
    """A kvpool call failed. .status is the (negative) status code, .reason the server's text."""

    status = Status.INTERNAL_ERROR

    def __init__(self, status=None, reason=""):
        if status is not None:
            self.status = int(status)
        self.reason = reason
        super().__init__(self.status, reason)

    @property
    def name(self):
        return status_name(self.status)

    def __str__(self):
        text = "%s (%d): %s" % (self.name, self.status, strerror(self.status))
        if self.reason:
            text += ": " + self.reason
        return text


def _class_name(name):
    return "".join(part.capitalize() for part in name.split("_")) + "Error"


_CLASSES = {}
for _name, _value, _text in _TABLE[1:]:
    _bases = (Error, KeyError) if _name == "OBJECT_NOT_FOUND" else (Error,)
    _cls = type(_class_name(_name), _bases, {
        "status": _value,
        "__doc__": "Status %s (%d): %s." % (_name, _value, _text),
        "__str__": Error.__str__,
        "__module__": __name__,
    })
    _CLASSES[_value] = _cls
    globals()[_cls.__name__] = _cls
del _name, _value, _text, _bases, _cls

#   A short alias for the most common case.
NotFoundError = ObjectNotFoundError  # noqa: F821 (defined by the loop above)


def error_for(status, reason=""):
    """The exception instance for a negative status (an Error subclass when the code is known)."""
    cls = _CLASSES.get(int(status), Error)
    return cls(status, reason)


def check(status, reason=""):
    """Returns status if it is >= 0, raises the matching Error otherwise."""
    if status < 0:
        raise error_for(status, reason)
    return status


__all__ = ["Status", "Error", "NotFoundError", "strerror", "status_name", "error_for",
           "check"] + [cls.__name__ for cls in _CLASSES.values()]
