"""kvpool.status - the status codes of kvpool and the exceptions that carry them.

The codes are defined once, in protocol/kvpool.proto (enum Status): the names, numbers and
descriptions (the comment on each value's line) come from _status_text, plain Python generated
by protocol/gen_header.awk as the C list is, so the package imports without protobuf. The
numbers follow Mooncake Store's ErrorCode, so code written against Mooncake's return values
keeps working.

Each status other than OK has an exception class, a subclass of kvpool.Error, named after it
(OBJECT_NOT_FOUND -> ObjectNotFoundError). Error.status holds the code. ObjectNotFoundError is
also a KeyError, so `except KeyError` works for misses.

Threads: none; everything here is immutable after import.
"""

import enum

from . import _status_text

Status = enum.IntEnum("Status", [(name, value) for name, value, _ in _status_text.STATUS])
Status.__doc__ = "kvpool status codes (0 ok, negative errors; Mooncake's numbering)."

_DESCRIPTIONS = dict(_status_text.TEXT)


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
for _name, _value in ((s.name, int(s)) for s in Status if s != Status.OK):
    _text = strerror(_value)
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
